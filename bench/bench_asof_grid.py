"""`smerge cgm --local` beside polars and DuckDB on a grid of sizes and key shapes (issue 25, item 3).

Shapes (data of bench/bench_asof.py's kind: each stream in arrival order with 2% of its records
moved up to 1,000 positions; one float32 payload column v; row groups of 262,144):
- ``1d``: one float64 key k; A's keys are 0, 1, 2, ... plus +-0.1 noise, B's the same plus
  +-0.01 jitter; eps 0.05. Peer: polars ``join_asof(strategy="nearest", tolerance=0.05)``
  minus the unmatched rows.
- ``3key``: keys (t, lat, lon), records of moving platforms: t as k above (eps 0.05); lat, lon a
  random walk (steps of 0.01 degrees), B's within +-1e-4 of A's (eps 0.001), except 10% of B's
  records whose lat is off by 0.5 (no partner: the filter on the other keys matters). Peers:
  polars ``join_asof`` on t (the leading key) plus a filter on lat and lon; DuckDB's band join
  ``JOIN b ON b.t BETWEEN a.t - 0.05 AND a.t + 0.05 AND abs(a.lat - b.lat) <= 0.001 AND ...``
  (2 threads, ``COPY ... TO`` Parquet). On this data every A record has at most one B record
  within eps on every key, so all routes find the same pairs: the pair counts and a checksum
  of B's payload are asserted equal in every round, and the pair sets (A's t with B's t) are
  compared once on a small case before timing.

Every route is a fresh process (imports included), Parquet in and out, timed from start to exit
with its peak RSS and CPU time (user + sys) from ``/usr/bin/time``. Rounds alternate the routes
(smerge first in odd rounds, last in even ones); ratios are medians of the per-round ratios (a
round's routes ran back to back on the shared machine). The 1-minute load average is recorded
before and after each case. smerge's modules are byte-compiled first, as an installed
package's are.

Usage: .venv/bin/python bench/bench_asof_grid.py [--cases 1d:1000000,1d:3000000,...] [--rounds 5]
       [--write BENCHMARKS.md] [--smerge PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402 - bench/common.py
from bench_asof import EPS, POLARS, byte_compile_smerge, displaced  # noqa: E402

PY = sys.executable
EPS_POS = 0.001
DEFAULT_CASES = "1d:1000000,1d:3000000,1d:10000000,3key:1000000,3key:3000000"

POLARS_3KEY = """
import sys, polars as pl
a = pl.read_parquet(sys.argv[1]).sort("t"); b = pl.read_parquet(sys.argv[2]).sort("t")
o = a.join_asof(b.with_columns(pl.col("t").alias("t_b")), on="t", strategy="nearest", tolerance={eps}, suffix="_b")
o = o.filter(((pl.col("lat") - pl.col("lat_b")).abs() <= {ep}) & ((pl.col("lon") - pl.col("lon_b")).abs() <= {ep}))
o.write_parquet(sys.argv[3])
print(o.height, float(o["v_b"].cast(pl.Float64).sum()))
"""
DUCKDB_3KEY = """
import sys, duckdb
con = duckdb.connect(config={{"threads": 2}})
con.execute("SET enable_progress_bar = false")
q = ("SELECT a.t, a.lat, a.lon, a.v, b.t AS t_b, b.lat AS lat_b, b.lon AS lon_b, b.v AS v_b "
     "FROM read_parquet('{{a}}') a JOIN read_parquet('{{b}}') b ON b.t BETWEEN a.t - {eps} AND a.t + {eps} "
     "AND abs(a.lat - b.lat) <= {ep} AND abs(a.lon - b.lon) <= {ep}").format(a=sys.argv[1], b=sys.argv[2])
con.execute(f"COPY ({{q}}) TO '{{sys.argv[3]}}' (FORMAT parquet)")
n, s = con.execute(f"SELECT count(*), sum(v_b::DOUBLE) FROM read_parquet('{{sys.argv[3]}}')").fetchone()
print(n, float(s or 0.0))
"""


def make_3key(d: Path, n: int) -> tuple[str, str]:
    rng = np.random.default_rng(11)
    t = np.arange(n, dtype=np.float64) + rng.uniform(-0.1, 0.1, n)
    lat = 45 + np.cumsum(rng.choice([-0.01, 0.01], n))
    lon = 10 + np.cumsum(rng.choice([-0.01, 0.01], n))
    tb = t + rng.uniform(-0.01, 0.01, n)
    latb = lat + rng.uniform(-1e-4, 1e-4, n)
    latb[rng.random(n) < 0.1] += 0.5
    lonb = lon + rng.uniform(-1e-4, 1e-4, n)
    pa_, pb = str(d / "a.parquet"), str(d / "b.parquet")
    for path, cols in ((pa_, (t, lat, lon)), (pb, (tb, latb, lonb))):
        order = displaced(n, rng)
        tab = pa.table({"t": cols[0][order], "lat": cols[1][order], "lon": cols[2][order],
                        "v": rng.normal(size=n).astype("f4")})
        pq.write_table(tab, path, row_group_size=262144)
    return pa_, pb


def make_1d(d: Path, n: int) -> tuple[str, str]:
    from bench_asof import make

    return make(d, n)


def run(cmd: list[str]) -> tuple[float, float, int, str]:
    """Wall seconds, CPU seconds (user + sys), peak RSS in MB, stdout of one process. CPU and RSS
    come from ``/usr/bin/time`` (a small process): a child forked from this one would count
    this process's pages in its own peak RSS."""
    with tempfile.NamedTemporaryFile("r") as ru:
        t0 = time.perf_counter()
        r = subprocess.run(["/usr/bin/time", "-f", "%U %S %M", "-o", ru.name, *cmd], capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if r.returncode != 0:
            raise SystemExit(f"{cmd[:4]} failed: {r.stderr[-600:]}")
        user, sys_, rss_kb = ru.read().split()[-3:]
    return wall, float(user) + float(sys_), int(rss_kb) // 1024, r.stdout


def routes(shape: str, fa: str, fb: str, smerge: str) -> dict:
    if shape == "1d":
        return {
            "smerge cgm --local": lambda o: [smerge, "cgm", fa, fb, "--keys", "k", "--eps", str(EPS), "--local",
                                             "-o", o, "--overwrite", "--json"],
            "polars join_asof": lambda o: [PY, "-c", POLARS.format(eps=EPS), fa, fb, o],
        }
    return {
        "smerge cgm --local": lambda o: [smerge, "cgm", fa, fb, "--keys", "t,lat,lon", "--eps",
                                         f"t={EPS},lat={EPS_POS},lon={EPS_POS}", "--local", "-o", o, "--overwrite",
                                         "--json"],
        "polars join_asof + filter": lambda o: [PY, "-c", POLARS_3KEY.format(eps=EPS, ep=EPS_POS), fa, fb, o],
        "DuckDB band join": lambda o: [PY, "-c", DUCKDB_3KEY.format(eps=EPS, ep=EPS_POS), fa, fb, o],
    }


def result_of(name: str, so: str, out: str) -> tuple[int, float]:
    """(pairs, checksum of B's payload) a route reports."""
    if name.startswith("smerge"):
        s = json.loads(so)
        t = pq.read_table(out, columns=["v_b"])
        return s["matched"], float(pa.compute.sum(t["v_b"].cast(pa.float64())).as_py() or 0.0)
    n, chk = so.split()[-2:]
    return int(n), float(chk)


def check_pair_sets(d: Path, smerge: str) -> int:
    """Small 3-key case: every route's set of (A's t, B's t) pairs is the same; returns its size."""
    sub = d / "check"
    sub.mkdir()
    fa, fb = make_3key(sub, 100_000)
    sets = {}
    for name, cmd in routes("3key", fa, fb, smerge).items():
        out = str(sub / f"{name.split()[0]}.parquet")
        run(cmd(out))
        t = pq.read_table(out, columns=["t", "t_b"])
        sets[name] = set(zip(t["t"].to_pylist(), t["t_b"].to_pylist()))
    first = next(iter(sets.values()))
    for name, s in sets.items():
        if s != first:
            raise SystemExit(f"pair sets differ: {name} has {len(s)} pairs, {len(s ^ first)} not shared")
    return len(first)


def run_case(d: Path, shape: str, n: int, rounds: int, smerge: str) -> dict:
    sub = d / f"{shape}-{n}"
    sub.mkdir()
    fa, fb = (make_1d if shape == "1d" else make_3key)(sub, n)
    rts = routes(shape, fa, fb, smerge)
    res = {k: {"wall": [], "cpu": [], "rss": []} for k in rts}
    load0 = os.getloadavg()[0]
    pairs = None
    for r in range(rounds):
        order = list(rts) if r % 2 == 0 else list(rts)[::-1]
        for name in order:
            out = str(sub / f"{name.split()[0]}.parquet")
            wall, cpu, rss, so = run(rts[name](out))
            got = result_of(name, so, out)
            if pairs is None:
                pairs = got
            if got[0] != pairs[0] or abs(got[1] - pairs[1]) > 1e-6 * max(1.0, abs(pairs[1])):
                raise SystemExit(f"{shape} {n}: {name} found {got}, the first route {pairs}")
            for k, v in (("wall", wall), ("cpu", cpu), ("rss", rss)):
                res[name][k].append(v)
            os.remove(out)
    load1 = os.getloadavg()[0]
    sm = res["smerge cgm --local"]
    peers = [k for k in rts if not k.startswith("smerge")]
    row = {"shape": shape, "records": n, "pairs": pairs[0], "rounds": rounds, "load": (load0, load1), "routes": {}}
    for name in rts:
        x = res[name]
        row["routes"][name] = {
            "wall": statistics.median(x["wall"]), "cpu": statistics.median(x["cpu"]), "rss": max(x["rss"]),
            "ratio": statistics.median(a / b for a, b in zip(sm["wall"], x["wall"])),
            "cpu_ratio": statistics.median(a / b for a, b in zip(sm["cpu"], x["cpu"])),
        }
    # the fastest peer of each round (wall): smerge's ratio to it, median over rounds
    row["vs_fastest"] = statistics.median(sm["wall"][i] / min(res[p]["wall"][i] for p in peers)
                                          for i in range(rounds))
    return row


def print_row(row: dict) -> None:
    print(f"{row['shape']} {row['records']:,} ({row['pairs']:,} pairs, load {row['load'][0]:.1f}-{row['load'][1]:.1f}):")
    for name, x in row["routes"].items():
        print(f"  {name}: wall {x['wall']:.2f} s, cpu {x['cpu']:.2f} s, rss {x['rss']} MB; smerge/this "
              f"{x['ratio']:.2f}x wall, {x['cpu_ratio']:.2f}x cpu")
    print(f"  smerge / fastest peer of each round: {row['vs_fastest']:.2f}x")


def write_section(rows: list[dict], rounds: int, cases: str, path: str) -> None:
    lines = ["Machine:", "", common.machine_markdown(), "",
             f"polars {common._version('polars')}, DuckDB {common._version('duckdb')}. Whole processes, Parquet in and "
             f"out, {rounds} alternating rounds per case; wall and CPU (user + sys) are medians, ratios the medians of "
             "the per-round ratios (smerge's time over the peer's: below 1 is faster), peak RSS the largest of the "
             "rounds (`/usr/bin/time`). `1d`: one float64 key, eps 0.05, peer polars `join_asof` nearest. `3key`: (t, lat, "
             "lon) of moving platforms, eps (0.05, 0.001, 0.001), 10% of B off in lat; peers polars `join_asof` on t "
             "plus a filter on lat and lon, and DuckDB's band join (2 threads); pair counts and a payload checksum "
             "asserted equal in every round, pair sets compared on 100,000 records. Reproduce: "
             f"`.venv/bin/python bench/bench_asof_grid.py --cases {cases} --rounds {rounds} --write BENCHMARKS.md`.", "",
             "| case | pairs | load | route | wall s | CPU s | peak RSS MB | smerge / route (wall) | smerge / route (CPU) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        case = f"{row['shape']} {row['records'] / 1e6:g}M"
        for i, (name, x) in enumerate(row["routes"].items()):
            lead = (case, f"{row['pairs']:,}", f"{row['load'][0]:.1f}-{row['load'][1]:.1f}") if i == 0 else ("", "", "")
            ratio = "" if name.startswith("smerge") else f"{x['ratio']:.2f}x"
            cpu_ratio = "" if name.startswith("smerge") else f"{x['cpu_ratio']:.2f}x"
            lines.append(f"| {' | '.join(lead)} | {name} | {x['wall']:.2f} | {x['cpu']:.2f} | {x['rss']} | {ratio} | "
                         f"{cpu_ratio} |")
        if row["shape"] != "1d":
            lines.append(f"| | | | smerge / fastest peer of each round | | | | {row['vs_fastest']:.2f}x | |")
    common.replace_section("asof-grid", "\n".join(lines), path,
                           heading="CGM beside polars and DuckDB on a grid of sizes and key shapes")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=DEFAULT_CASES, help="shape:records,... (shapes 1d, 3key)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--write", default=None)
    ap.add_argument("--smerge", default=str(Path(PY).with_name("smerge")), help="the smerge command to time")
    ap.add_argument("--json", default=None, help="also write the raw figures here")
    ap.add_argument("--from-json", default=None, help="write the section from figures saved by --json, running nothing")
    a = ap.parse_args(argv)
    if a.from_json:
        rows = json.loads(Path(a.from_json).read_text())
        for row in rows:
            print_row(row)
        if a.write:
            write_section(rows, rows[0]["rounds"], ",".join(f"{r['shape']}:{r['records']}" for r in rows), a.write)
        return 0
    byte_compile_smerge()
    rows = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("SMERGE_BENCH_DIR")) as tmp:
        d = Path(tmp)
        if any(c.startswith("3key") for c in a.cases.split(",")):
            print(f"3key pair sets identical on 100,000 records ({check_pair_sets(d, a.smerge):,} pairs)")
        for case in a.cases.split(","):
            shape, n = case.split(":")
            rows.append(run_case(d, shape, int(n), a.rounds, a.smerge))
            print_row(rows[-1])
            if a.json:
                Path(a.json).write_text(json.dumps(rows, indent=1))
    if a.write:
        write_section(rows, a.rounds, a.cases, a.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
