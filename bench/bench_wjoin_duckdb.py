"""`smerge wjoin` with band and mixed predicates beside DuckDB, whole processes writing Parquet (issue 25).

Each side is one process from start to exit, as a user runs it: `smerge wjoin ... -o out.parquet`
and DuckDB's `COPY (SELECT ...) TO 'x.parquet'` (2 threads) on the same Parquet inputs.
Data: station reports from bench_wjoin_where.stations (a square lat/lon grid of stations, times
uniform over two days and sorted, T ~ N(15, 8)). The shapes vary one axis at a time around the
issue's case (48k + 48k reports of 2,000 stations, window 30 min,
`S1.lat = S2.lat and S1.T > S2.T + 8`): stations, window, band selectivity (the offset in
`S1.T > Sn.T + off`: 26 keeps ~1% of the pairs, 6 ~30%, 8 ~24%), ways (3 and 4 join all streams
on the station, lat and lon), 1M records per stream, and one band-only predicate (no equality).

Runs alternate smerge and DuckDB; per shape the table gives the median of the per-round time
ratios (smerge / DuckDB: below 1 is faster), each side's median wall time and median peak RSS
(`/usr/bin/time`), the tuples (asserted equal on both sides; the tuple sets are compared on
the first shape), and the load average over the shape's runs. Every child runs under an
address-space limit (RLIMIT_AS, 8 GB).

Usage: .venv/bin/python bench/bench_wjoin_duckdb.py [--rounds 5] [--rounds-large 3] [--only NAME,..]
           [--smerge "CMD"] [--write BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402 - bench/common.py
from bench_wjoin_where import stations  # noqa: E402 - the data generator of the --where bench

AS_LIMIT = 8 << 30
WORK = common.DATA / "wjoin_duckdb"


@dataclass(frozen=True)
class Shape:
    name: str
    stations: int = 2000
    window_min: int = 30
    offset: float = 8  # band: S1.T > Sn.T + offset
    ways: int = 2
    records: int = 48000
    equality: str = "lat"  # "lat": S1.lat = S2.lat (2 ways); "station": every stream on lat and lon; "none"

    def where(self) -> str:
        n = self.ways
        eq = []
        if self.equality == "lat":
            eq = [f"S{i}.lat = S{i + 1}.lat" for i in range(1, n)]
        elif self.equality == "station":
            eq = [f"S{i}.{c} = S{i + 1}.{c}" for i in range(1, n) for c in ("lat", "lon")]
        return " and ".join(eq + [f"S1.T > S{n}.T + {self.offset:g}"])

    @property
    def large(self) -> bool:
        return self.records >= 500_000


SHAPES = [
    Shape("issue case"),
    Shape("100 stations", stations=100),
    Shape("10,000 stations", stations=10_000),
    Shape("window 10 min", window_min=10),
    Shape("window 6 h", window_min=360, stations=10_000, offset=26),
    Shape("band ~1%", offset=26),
    Shape("band ~30%", offset=6),
    Shape("band only 10 min", equality="none", window_min=10, offset=26),
    Shape("3 ways", ways=3, equality="station"),
    Shape("4 ways", ways=4, equality="station", stations=100, window_min=10),
    Shape("1M records", records=1_000_000, equality="station", stations=10_000, window_min=10, offset=26),
    Shape("1M records 4 ways", records=1_000_000, ways=4, equality="station", stations=10_000, window_min=10),
]


def inputs(sh: Shape) -> list[Path]:
    d = WORK / f"{sh.records}_{sh.stations}_{sh.ways}"
    d.mkdir(parents=True, exist_ok=True)
    paths = [d / f"s{i + 1}.parquet" for i in range(sh.ways)]
    for i, p in enumerate(paths):
        if not p.exists():
            pq.write_table(stations(sh.records, seed=10 + i, n_stations=sh.stations), p)
    return paths


def smerge_cmd(prefix: list[str], sh: Shape, paths, out: Path) -> list[str]:
    return [*prefix, "wjoin", *map(str, paths), "--time", "time", "--window", f"{sh.window_min}min",
            "--where", sh.where(), "-o", str(out), "--overwrite", "--local"]


def duckdb_sql(sh: Shape, paths, out: Path) -> str:
    n = sh.ways
    w_us = sh.window_min * 60 * 10**6
    cols = ", ".join(f's{i}."{c}" AS "S{i}_{c}"' for i in range(1, n + 1) for c in ("time", "lat", "lon", "T"))
    src = ", ".join(f"read_parquet('{p}') s{i + 1}" for i, p in enumerate(paths))
    conds = [f"s{j}.time BETWEEN s{i}.time - INTERVAL '{w_us} microseconds' AND s{i}.time + INTERVAL "
             f"'{w_us} microseconds'" for i in range(1, n + 1) for j in range(i + 1, n + 1)]
    pred = re.sub(r"\bS(\d+)\.", r"s\1.", sh.where()).replace(" and ", " AND ")
    return (f"SET threads TO 2; COPY (SELECT {cols} FROM {src} WHERE {' AND '.join(conds)} AND {pred}) "
            f"TO '{out}' (FORMAT parquet)")


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


# Children compile and keep their modules' bytecode as an installed package does (pip writes it at
# install time): with PYTHONDONTWRITEBYTECODE set, every module edited since its last .pyc would
# be compiled again in every timed run.
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def run_child(cmd: list[str]) -> tuple[float, int]:
    """(wall seconds, peak RSS in MB) of one child process. Measured by ``/usr/bin/time``: a
    child forked from this (larger) process and then exec'ed would report this process's RSS at
    the fork as its own high-water mark."""
    rss_file = WORK / "rss.txt"
    t0 = time.perf_counter()
    r = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", str(rss_file), *cmd], stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, preexec_fn=_limit, env=CHILD_ENV)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)[:300]} failed ({r.returncode}): {r.stderr.decode()[-2000:]}")
    return wall, int(rss_file.read_text().split()[-1]) // 1024


def same_tuples(a: Path, b: Path) -> bool:
    ta, tb = pq.read_table(a), pq.read_table(b)
    if ta.schema.names != tb.schema.names or ta.num_rows != tb.num_rows:
        return False
    keys = [(c, "ascending") for c in ta.schema.names]
    return ta.sort_by(keys).equals(tb.cast(ta.schema).sort_by(keys))


def measure(sh: Shape, rounds: int, prefix: list[str], check_set: bool) -> dict:
    paths = inputs(sh)
    out_s, out_d = WORK / "smerge_out.parquet", WORK / "duckdb_out.parquet"
    s_cmd = smerge_cmd(prefix, sh, paths, out_s)
    d_cmd = [common.PYTHON, "-c", f"import duckdb; duckdb.connect().execute({duckdb_sql(sh, paths, out_d)!r})"]
    for cmd in (s_cmd, d_cmd):  # untimed: bytecode written, inputs in the page cache
        run_child(cmd)
    ts, td, rs, rd, loads = [], [], [], [], [os.getloadavg()[0]]
    for r in range(rounds):
        order = [(s_cmd, ts, rs), (d_cmd, td, rd)]
        for cmd, tl, rl in (order if r % 2 == 0 else order[::-1]):  # alternate which goes first
            t, m = run_child(cmd)
            tl.append(t)
            rl.append(m)
        loads.append(os.getloadavg()[0])
    n_s, n_d = pq.ParquetFile(out_s).metadata.num_rows, pq.ParquetFile(out_d).metadata.num_rows
    assert n_s == n_d, (sh.name, n_s, n_d)
    if check_set:
        assert same_tuples(out_s, out_d), f"{sh.name}: smerge and DuckDB wrote different tuples"
    ratio = statistics.median(a / b for a, b in zip(ts, td))
    return dict(shape=sh, rounds=rounds, tuples=n_s, ratio=ratio, smerge_s=statistics.median(ts),
                duckdb_s=statistics.median(td), smerge_mb=statistics.median(rs), duckdb_mb=statistics.median(rd),
                load=statistics.median(loads), set_checked=check_set)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rounds-large", type=int, default=3, help="rounds for the 1M-record shapes")
    ap.add_argument("--only", default=None, help="comma-separated shape names (default: all)")
    ap.add_argument("--smerge", default=common.SMERGE, help="the smerge command (default: this venv's smerge)")
    ap.add_argument("--write", default=None)
    a = ap.parse_args(argv)
    only = set(re.split(r",(?!\d{3})", a.only)) if a.only else None  # "10,000 stations" is one name
    prefix = shlex.split(a.smerge)
    rows = []
    for k, sh in enumerate(s for s in SHAPES if only is None or s.name in only):
        r = measure(sh, a.rounds_large if sh.large else a.rounds, prefix, check_set=k == 0)
        rows.append(r)
        print(f"{sh.name}: {r['tuples']:,} tuples | smerge/DuckDB time {r['ratio']:.2f} | smerge {r['smerge_s']:.2f} s "
              f"{r['smerge_mb']} MB | DuckDB {r['duckdb_s']:.2f} s {r['duckdb_mb']} MB | load {r['load']:.1f}",
              flush=True)
    if a.write:
        write_section(a, rows)
    return 0


def write_section(a, rows) -> None:
    import duckdb

    lines = ["Machine:", "", common.machine_markdown(), f"- DuckDB {duckdb.__version__}", "",
             "Whole processes writing the same Parquet output: `smerge wjoin A.parquet B.parquet ... --time time "
             "--window W --where P -o out.parquet --local` beside DuckDB's `COPY (SELECT ...) TO 'x.parquet'` "
             "(2 threads, `read_parquet` on the same files, the window as `BETWEEN` bounds on every pair). "
             "Station reports (a square lat/lon grid of stations, two days, sorted times, T ~ N(15, 8)); the "
             "shapes vary one axis at a time around the issue's case (48,000 + 48,000 reports, 2,000 stations, "
             "window 30 min). Band `S1.T > Sn.T + off`: off 26 keeps ~1% of the pairs, 8 ~24%, 6 ~30%; 3 and 4 "
             "ways join every stream on the station (lat and lon). Runs alternate; `time` is the median of the "
             "per-round ratios smerge / DuckDB (below 1: smerge is faster), RSS the median peak resident memory "
             "of each process (`/usr/bin/time`), load the median 1-minute load average during the shape's runs (2 cores "
             f"shared with other jobs). {a.rounds} rounds per shape, {a.rounds_large} for the 1M-record shapes, after one "
             "untimed run of each (the modules' bytecode written, as an installed package has it; the inputs in the "
             "page cache). "
             "Tuple counts asserted equal; the tuple sets compared on the first shape. Reproduce: "
             "`.venv/bin/python bench/bench_wjoin_duckdb.py --write BENCHMARKS.md`.", "",
             "| shape | predicate | window | stations | records/stream | tuples | time smerge/DuckDB | smerge s | "
             "DuckDB s | smerge RSS MB | DuckDB RSS MB | load |", "|" + "---|" * 12]
    for r in rows:
        sh = r["shape"]
        lines.append(f"| {sh.name} | `{sh.where()}` | {sh.window_min} min | {sh.stations:,} | {sh.records:,} | "
                     f"{r['tuples']:,} | **{r['ratio']:.2f}** | {r['smerge_s']:.2f} | {r['duckdb_s']:.2f} | "
                     f"{r['smerge_mb']} | {r['duckdb_mb']} | {r['load']:.1f} |")
    common.replace_section("wjoin-duckdb", "\n".join(lines), a.write,
                           heading="W-join beside DuckDB, whole processes (band and mixed predicates)")


if __name__ == "__main__":
    sys.exit(main())
