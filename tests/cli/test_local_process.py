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


WJOIN_PROBE = """
import json, os, sys, threading
started = []
_start = threading.Thread.start
def start(self):
    started.append(self.name)
    _start(self)
threading.Thread.start = start
sys.argv = ["smerge", "wjoin", *sys.argv[1:]]
from smerge.cli.main import main
rc = main()
heavy = ("pandas", "numba", "pyspark", "pyarrow.compute", "pyarrow.dataset", "netCDF4", "xarray", "numpy.ma",
         "pydantic", "smerge.datasets.netcdf", "smerge.cli.cgm", "_hashlib")
print(json.dumps({"rc": rc, "loaded": sorted(m for m in heavy if m in sys.modules), "threads": started,
                  # OS threads other than jemalloc's (Arrow's thread pool and Python's threads are "python")
                  "os_threads": sum(open(f"/proc/self/task/{t}/comm").read().strip() == "python"
                                    for t in os.listdir("/proc/self/task")),
                  "purge": os.environ.get("MIMALLOC_PURGE_DELAY"), "thp": os.environ.get("MIMALLOC_ALLOW_THP")}))
"""


def test_local_wjoin_process_loads_no_heavy_module(tmp_path):
    """A `smerge wjoin --local` run over Parquet with an equality, a band and a residual conjunct
    (abs: evaluated by Arrow's kernels) loads none of pandas, numba, pyspark, pyarrow.compute,
    pyarrow.dataset, the netCDF stack, numpy.ma, the cgm command or OpenSSL's libcrypto (hashlib's
    ~4 MB), leaves mimalloc's purge delay alone (kept pages raise a join's peak memory), starts no
    thread (small inputs are read in the join's thread, their Parquet columns decoded without
    Arrow's thread pool: ~1 MB and ~6 MB of peak memory), and writes the tuples DuckDB finds."""
    from wjoin_oracle import oracle_tuples

    rng = np.random.default_rng(25)
    n, paths, tables = 3000, [], []
    for i in range(2):
        t = pa.table({"time": pa.array(np.sort(rng.integers(0, 86_400, n)) * 1_000_000, pa.timestamp("us")),
                      "lat": rng.integers(0, 5, n).astype(np.float64), "lon": rng.integers(0, 3, n).astype(np.float64),
                      "T": rng.normal(15, 8, n)})
        tables.append(t)
        paths.append(str(tmp_path / f"s{i + 1}.parquet"))
        pq.write_table(t, paths[-1])
    out = tmp_path / "o.parquet"
    where = "S1.lat = S2.lat and S1.T > S2.T + 8 and abs(S1.lon - S2.lon) < 1"
    r = subprocess.run([sys.executable, "-c", WJOIN_PROBE, *paths, "--time", "time", "--window", "30min",
                        "--where", where, "--with-ids", "--local", "--batch-rows", "700", "-o", str(out)],
                       capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items() if not k.startswith("MIMALLOC_")})
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == {"rc": 0, "loaded": [], "threads": [], "os_threads": 1, "purge": None, "thp": "0"}
    res = pq.read_table(out)
    want = oracle_tuples(tables, "time", {(0, 1): 1800 * 10**9},
                         "s1.lat = s2.lat and s1.T > s2.T + 8 and abs(s1.lon - s2.lon) < 1", datetime=True)
    assert len(want) > 100
    assert sorted(zip(res["S1_row"].to_pylist(), res["S2_row"].to_pylist())) == want
