"""The `smerge` program ends its process as soon as the run is done (``cli.main.console``):
everything it printed and wrote is there, the exit handlers ran, and the exit code is the
run's; a caller of ``main()`` keeps its process (tests/cli/test_archive_imports.py relies on it)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SCRIPT = """
import atexit, sys
atexit.register(lambda: print("exit handler ran", flush=True))
sys.argv = ["smerge", *sys.argv[1:]]
from smerge.cli.main import console
rc = console()
print("not reached: the process ended in console()")
"""


def _inputs(tmp_path):
    k = np.arange(500.0)
    pq.write_table(pa.table({"k": k, "v": np.arange(500)}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"k": k[::2] + 0.01, "w": np.arange(250)}), tmp_path / "b.parquet")
    return str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")


def _run(tmp_path, *args):
    return subprocess.run([sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True, cwd=tmp_path)


def test_a_run_ends_the_process_with_its_output_and_exit_handlers(tmp_path):
    a, b = _inputs(tmp_path)
    r = _run(tmp_path, "cgm", a, b, "--keys", "k", "--eps", "0.05", "--local", "-o", "o.parquet",
             "--stats", "s.json")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("smerge cgm: ") and "matched   250 pairs" in r.stdout
    assert lines[-1] == "exit handler ran" and "not reached" not in r.stdout
    assert pq.read_table(tmp_path / "o.parquet").num_rows == 250
    assert json.loads((tmp_path / "s.json").read_text())["matched"] == 250


def test_a_refusal_keeps_its_exit_code_and_line(tmp_path):
    a, _ = _inputs(tmp_path)
    r = _run(tmp_path, "cgm", a, str(tmp_path / "missing.parquet"), "--keys", "k", "--local")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("smerge: error: ")
    assert r.stdout == "exit handler ran\n"


def test_json_summary_is_complete_on_a_pipe(tmp_path):
    a, b = _inputs(tmp_path)
    r = subprocess.run([sys.executable, "-m", "smerge", "cgm", a, b, "--keys", "k", "--eps", "0.05", "--local",
                        "-o", "o.parquet", "--json"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["matched"] == 250
