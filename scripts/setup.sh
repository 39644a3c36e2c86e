#!/usr/bin/env bash
# Set up smerge on a fresh machine: check Java 17, install NCAR sample data, create .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if ! command -v java >/dev/null 2>&1; then
  echo "smerge setup: Java 17 is needed by Spark but 'java' is not on PATH." >&2
  echo "  Debian/Ubuntu: sudo apt-get install -y openjdk-17-jre-headless   (then re-run)" >&2
  exit 2
fi
jv=$(java -version 2>&1 | awk -F'"' '/version/ {print $2}' | cut -d. -f1)
if [ "${jv:-0}" -lt 17 ]; then
  echo "smerge setup: Java 17 or newer is needed by Spark; found Java ${jv:-unknown}." >&2
  echo "  Debian/Ubuntu: sudo apt-get install -y openjdk-17-jre-headless" >&2
  exit 2
fi

if ! command -v cc >/dev/null 2>&1 && ! command -v gcc >/dev/null 2>&1; then
  echo "smerge setup: a C compiler is needed to build smerge's merge kernels (merge/*.c)." >&2
  echo "  Debian/Ubuntu: sudo apt-get install -y build-essential python3-dev" >&2
  exit 2
fi

# Real NCAR data (Pstorm.cdf, Tstorm.cdf, ...) from Debian's libncarg-data.
if [ ! -f /usr/share/ncarg/data/cdf/Pstorm.cdf ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "smerge setup: installing Debian's libncarg-data (NCAR sample netCDF files)" >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libncarg-data >/dev/null
  else
    echo "smerge setup: NCAR sample data missing; install it with: sudo apt-get install -y libncarg-data" >&2
  fi
fi

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# What the install depends on: when none of it changed since the last successful install (the
# stamp), pip is not run again (it took 7 of make demo's 8.8 s).
stamp=$(cat setup.cfg setup.py pyproject.toml merge/*.c scripts/setup.sh 2>/dev/null | sha256sum | cut -c1-16)
stamp="$stamp $(.venv/bin/python -c 'import sys; print(sys.version.split()[0])')"
if [ "$(cat .venv/.smerge-setup 2>/dev/null)" = "$stamp" ] && .venv/bin/python -c "import smerge.merge._ckernel, smerge.merge._wjoin_ckernel" 2>/dev/null; then
  echo "smerge setup: up to date (nothing changed since the last set-up)" >&2
else
  rm -f .venv/.smerge-setup
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  if ! .venv/bin/python -m pip install -q -e ".[test,bench]" >.venv/install.log 2>&1; then
    tail -n 40 .venv/install.log >&2
    echo "smerge setup: pip install failed (full log: .venv/install.log)" >&2
    exit 1
  fi
  echo "$stamp" > .venv/.smerge-setup
fi
# Byte-compile smerge's modules once, as installing a wheel does: with PYTHONDONTWRITEBYTECODE
# set, an editable install would otherwise compile them from source in every process.
.venv/bin/python -m compileall -q smerge cli merge index transport datasets spark jobs counting >/dev/null || true
echo "smerge setup: ready (.venv/bin/smerge)" >&2
