# The two commands of the README: `make demo` and `make test`.
NCAR ?= /usr/share/ncarg/data/cdf
OUT ?= out

.PHONY: setup demo test bench clean

setup:
	bash scripts/setup.sh

demo: setup
	mkdir -p $(OUT)
	.venv/bin/smerge cgm $(NCAR)/Pstorm.cdf $(NCAR)/Tstorm.cdf -o $(OUT)/Pstorm+Tstorm.parquet --overwrite --kappa-max --stats $(OUT)/Pstorm+Tstorm.json

test: setup
	.venv/bin/python -m pytest -q

bench: setup
	.venv/bin/python bench/run_all.py

clean:
	rm -rf $(OUT) .pytest_cache .hypothesis
