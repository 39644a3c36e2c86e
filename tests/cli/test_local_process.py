"""What a `smerge cgm --local` process loads and how it sets Arrow's allocator up (issue 11's
start-up cost): no pandas, no pyarrow.compute (its wrappers alone cost 60-200 ms), no netCDF
backend for Parquet inputs, no pydantic (cli/coerce.py), no other command's module (cli/main.py
builds only the named command), mimalloc's huge pages off unless the user set MIMALLOC_ALLOW_THP, its freed pages kept (MIMALLOC_PURGE_DELAY),
one OpenBLAS thread unless the user set OPENBLAS_NUM_THREADS, and the collector's objects frozen
once the command has returned (no walk over every module's objects at shutdown).
The run's output is checked too."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

PROBE = """
import gc, json, os, sys
sys.argv = ["smerge", "cgm", sys.argv[1], sys.argv[2], "--keys", "k", "--eps", "0.05", "--local", "-o", sys.argv[3]]
from smerge.cli.main import main
rc = main()
print(json.dumps({"rc": rc, "pandas": "pandas" in sys.modules, "compute": "pyarrow.compute" in sys.modules,
                  "thp": os.environ.get("MIMALLOC_ALLOW_THP"), "purge": os.environ.get("MIMALLOC_PURGE_DELAY"), "blas": os.environ.get("OPENBLAS_NUM_THREADS"),
                  "gc_frozen": gc.get_freeze_count() > 0, "netcdf": "smerge.datasets.netcdf" in sys.modules,
                  "netCDF4": "netCDF4" in sys.modules, "pydantic": "pydantic" in sys.modules,
                  "other_commands": sorted(m for m in ("rtm", "wjoin", "serve", "index", "batch", "gen", "count", "archive")
                                           if "smerge.cli." + m in sys.modules)}))
"""


def run(tmp_path, env_extra=None):
    rng = np.random.default_rng(2)
    n = 300_000  # several batches and a few output flushes: every take path runs
    base = np.arange(n, dtype=np.float64)
    a = base[np.argsort(base + rng.integers(0, 50, n))]
    b = a + rng.uniform(-0.01, 0.01, n)
    pq.write_table(pa.table({"k": a, "v": np.arange(n, dtype=np.int64)}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"k": b, "w": np.arange(n, dtype=np.int64)}), tmp_path / "b.parquet")
    env = {k: v for k, v in os.environ.items() if k not in ("MIMALLOC_ALLOW_THP", "MIMALLOC_PURGE_DELAY", "OPENBLAS_NUM_THREADS")}
    env.update(env_extra or {})
    r = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet"),
                        str(tmp_path / "o.parquet")], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1]), pq.read_table(tmp_path / "o.parquet")


def test_local_cgm_process_loads_neither_pandas_nor_pyarrow_compute(tmp_path):
    got, out = run(tmp_path)
    assert got == {"rc": 0, "pandas": False, "compute": False, "thp": "0", "purge": "-1", "blas": "1", "gc_frozen": True,
                   "netcdf": False, "netCDF4": False,
                   "pydantic": False, "other_commands": []}
    # every A record meets the B record made from it (B = A + jitter < eps), in order of A's key
    assert out.num_rows == 300_000
    assert out["v"].to_pylist() == out["w"].to_pylist()


def test_a_users_mimalloc_and_openblas_settings_are_kept(tmp_path):
    got, _ = run(tmp_path, {"MIMALLOC_ALLOW_THP": "1", "MIMALLOC_PURGE_DELAY": "10", "OPENBLAS_NUM_THREADS": "2"})
    assert got["thp"] == "1" and got["purge"] == "10" and got["blas"] == "2" and got["rc"] == 0


def test_the_command_table_names_what_each_module_registers():
    import importlib

    import typer.main

    from smerge.cli.main import COMMANDS, make_app

    for name, module in COMMANDS.items():
        registered = set(typer.main.get_command(make_app([module])).commands)
        assert name in registered, (name, module, registered)
    full = set(typer.main.get_command(make_app()).commands)
    assert full == set(COMMANDS)
    for module in set(COMMANDS.values()):
        assert hasattr(importlib.import_module(module), "app")


def test_default_route_of_a_small_run_imports_neither_pandas_nor_pyspark(tmp_path):
    """The auto route decides from the inputs' sizes, without pyspark; an in-process run then
    keeps pandas out as --local does (its import was 0.46 s of a 0.6 s run)."""
    pq.write_table(pa.table({"k": np.arange(1000.0), "v": np.arange(1000)}), tmp_path / "a.parquet")
    probe = PROBE.replace('"--local", ', "").replace(
        '"gc_frozen"', '"pyspark": any(m.startswith("pyspark") for m in sys.modules), "gc_frozen"')
    r = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "a.parquet"), str(tmp_path / "a.parquet"),
                        str(tmp_path / "o.parquet")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["rc"] == 0 and got["pandas"] is False and got["pyspark"] is False
    assert pq.read_table(tmp_path / "o.parquet").num_rows == 1000
