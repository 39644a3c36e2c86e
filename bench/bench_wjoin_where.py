"""W-join with `--where` predicates the planner turns into hash probes, beside DuckDB (issue 11).

Station-like data: each stream holds N reports of 400 stations (a 20 x 20 lat/lon grid), times
uniform over two days and sorted, a temperature T ~ N(15, 8). The two queries of the issue:

  3-way: S1.lat = S2.lat and S2.lon = S3.lon and S1.T > S3.T + 8, window 30 min, S1-S3 10 min
  2-way: S1.lat = S2.lat and S1.T > S2.T + 8, window 30 min

smerge streams the inputs (65,536-row batches) through `smerge.merge.wjoin.wjoin`; DuckDB runs the
equivalent SQL as one batch (2 threads) over the same Arrow tables. Both counts are asserted
equal. Peak memory: this process's RSS high-water mark is read after each engine (the bench
caps its own address space at 8 GB so a regression fails instead of taking the machine).

Usage: .venv/bin/python bench/bench_wjoin_where.py [--records 48000] [--repeat 3] [--write BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import math
import resource
import sys
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from smerge.merge.values import Duration
from smerge.merge.wjoin import wjoin
from smerge.merge.wjoin_params import WJoinParams
from smerge.merge.wjoin_stats import WJoinStats

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402 - bench/common.py

MIN_US = 60 * 10**6
QUERIES = {
    "3-way": dict(n=3, where="S1.lat = S2.lat and S2.lon = S3.lon and S1.T > S3.T + 8",
                  sql="s1.lat = s2.lat AND s2.lon = s3.lon AND s1.T > s3.T + 8",
                  window=30, pairs={(0, 2): 10}),
    "2-way": dict(n=2, where="S1.lat = S2.lat and S1.T > S2.T + 8", sql="s1.lat = s2.lat AND s1.T > s2.T + 8",
                  window=30, pairs={}),
}


def stations(records: int, seed: int, n_stations: int = 400, days: float = 2) -> pa.Table:
    """``records`` reports of ``n_stations`` stations on a square lat/lon grid (20 x 20 for 400),
    times uniform over ``days`` days and sorted, a temperature T ~ N(15, 8)."""
    rng = np.random.default_rng(seed)
    side = math.isqrt(n_stations - 1) + 1
    st = rng.integers(0, n_stations, records)
    t = np.sort(rng.integers(0, int(days * 86400 * 10**6), records)).astype(np.int64)
    return pa.table({"time": pa.array(t, pa.timestamp("us")), "lat": (st // side).astype(np.float64) * 0.5 + 40,
                     "lon": (st % side).astype(np.float64) * 0.5 - 5, "T": rng.normal(15, 8, records)})


def run_smerge(tables, q) -> tuple[float, int]:
    pw = tuple((i, j, Duration(w, "min")) for (i, j), w in q["pairs"].items())
    p = WJoinParams(q["n"], ("time",), window=Duration(q["window"], "min"), pair_windows=pw, where=q["where"])
    stats = WJoinStats()
    t0 = time.perf_counter()
    for _ in wjoin([t.to_batches(max_chunksize=65536) for t in tables], [t.schema for t in tables], p, stats=stats):
        pass
    return time.perf_counter() - t0, stats.tuples


def run_duckdb(tables, q) -> tuple[float, int]:
    con = duckdb.connect()
    con.execute("SET threads TO 2")
    n = q["n"]
    for i, t in enumerate(tables):
        con.register(f"s{i + 1}", t)
    conds = []
    for i in range(n):
        for j in range(i + 1, n):
            w = q["pairs"].get((i, j), q["window"]) * MIN_US
            conds.append(f"abs(epoch_us(s{i + 1}.time) - epoch_us(s{j + 1}.time)) <= {w}")
    conds.append(f"({q['sql']})")
    cols = ", ".join(f"s{i + 1}.*" for i in range(n))
    sql = f"SELECT {cols} FROM {', '.join(f's{i + 1}' for i in range(n))} WHERE {' AND '.join(conds)}"
    t0 = time.perf_counter()
    rows = con.sql(sql).to_arrow_table().num_rows
    dt = time.perf_counter() - t0
    con.close()
    return dt, rows


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=48000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--write", default=None)
    a = ap.parse_args(argv)
    resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))
    rows = []
    for name, q in QUERIES.items():
        tables = [stations(a.records, seed=10 + i) for i in range(q["n"])]
        ts, td = float("inf"), float("inf")
        for _ in range(a.repeat):  # interleaved, best of each (a shared 2-core machine)
            t, n_s = run_smerge(tables, q)
            ts = min(ts, t)
            t, n_d = run_duckdb(tables, q)
            td = min(td, t)
            assert n_s == n_d, (name, n_s, n_d)
        rows.append(dict(name=name, tuples=n_s, smerge=ts, duckdb=td, ratio=td / ts))
        print(f"{name}: {n_s:,} tuples | smerge {ts:.2f} s | DuckDB {td:.2f} s | throughput ratio {td / ts:.2f}x "
              f"| peak RSS so far {peak_mib():.0f} MiB", flush=True)
    if a.write:
        write_section(a, rows)
    return 0


def write_section(a, rows) -> None:
    lines = ["Machine:", "", common.machine_markdown(), "",
             f"Station-like streams of {a.records:,} reports each (400 stations, two days, sorted times, a "
             "temperature T); the W-join plans the `--where` equalities as hash probes and applies the band "
             "conjunct as soon as its streams are bound. DuckDB runs the equivalent SQL (2 threads) over the "
             f"same Arrow tables; tuple counts asserted equal; best of {a.repeat} interleaved runs. Reproduce: "
             f"`.venv/bin/python bench/bench_wjoin_where.py --records {a.records} --write BENCHMARKS.md`.", "",
             "| query | tuples | smerge wjoin s | DuckDB s | smerge throughput / DuckDB's |", "|---|---|---|---|---|"]
    for r in rows:
        q = QUERIES[r["name"]]
        lines.append(f"| {r['name']}: `{q['where']}` | {r['tuples']:,} | {r['smerge']:.2f} | {r['duckdb']:.2f} | "
                     f"{r['ratio']:.2f}x |")
    common.replace_section("wjoin-where", "\n".join(lines), a.write, heading="W-join with `--where` (planned predicates)")


if __name__ == "__main__":
    sys.exit(main())
