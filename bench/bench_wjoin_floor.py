"""The least any smerge W-join process must do, beside DuckDB's whole run (issue 25, item 1).

For each shape of bench/bench_wjoin_duckdb.py, four processes alternate: `smerge wjoin` as in
that bench; DuckDB's `COPY (SELECT ...) TO` (2 threads); and the *floor*: a Python process that
imports what smerge's data path is built on (numpy and pyarrow), reads every input file in
batches with pyarrow's Parquet reader (in one thread, as smerge reads small inputs) and writes
an empty Parquet file with the output's columns, its process set up as the `smerge` program
sets it up (one OpenBLAS thread, mimalloc without huge pages), and nothing else: no join, no
command line. Any W-join in this process model costs at least the floor. Where the floor's time or peak memory is already at or above DuckDB's whole
run, no smerge W-join can meet "at least DuckDB's throughput, at most its memory" on that shape.
A fourth process, *floor + CLI*, does the same after loading what the `smerge wjoin` command
is made of (Typer, the command's options, its pipeline and engine modules) as `smerge` does
for one command: what is left between it and `smerge` is the join itself, the output and
the run's bookkeeping.
Medians of the per-round values (`/usr/bin/time` for peak RSS); every child under RLIMIT_AS.

Usage: .venv/bin/python bench/bench_wjoin_floor.py [--rounds 7] [--only NAME,..]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402 - bench/common.py
from bench_wjoin_duckdb import SHAPES, WORK, duckdb_sql, inputs, run_child, smerge_cmd  # noqa: E402

FLOOR = """
import os, sys
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as the smerge program sets the process up
os.environ.setdefault("MIMALLOC_ALLOW_THP", "0")
if sys.argv[1] == "--cli":
    import typer.main
    from smerge.cli.main import make_app
    typer.main.get_command(make_app(["smerge.cli.wjoin"]))  # the click command smerge builds
    import smerge.jobs.pipeline, smerge.jobs.wjoin  # what its run imports: the pipeline and the engine
    del sys.argv[1]
import numpy, pyarrow as pa
from pyarrow._parquet import ParquetReader, ParquetWriter
fields = []
for i, path in enumerate(sys.argv[2:]):
    f = pa.OSFile(path, "rb")
    r = ParquetReader()
    r.open(f, pre_buffer=False)
    fields += [pa.field(f"S{i + 1}_{x.name}", x.type) for x in r.schema_arrow]
    for b in r.iter_batches(8192, row_groups=range(r.metadata.num_row_groups), column_indices=None, use_threads=False):
        pass
    f.close()
out = pa.OSFile(sys.argv[1], "wb")
w = ParquetWriter(out, pa.schema(fields), writer_engine_version="V2")
w.close()
out.close()
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--only", default=None)
    a = ap.parse_args(argv)
    only = set(re.split(r",(?!\d{3})", a.only)) if a.only else None  # "10,000 stations" is one name
    prefix = [common.SMERGE]
    print("| shape | floor s | floor + CLI s | smerge s | DuckDB s | floor / DuckDB time | floor + CLI / DuckDB time | "
          "floor MB | floor + CLI MB | smerge MB | DuckDB MB | load |")
    print("|" + "---|" * 12)
    for sh in SHAPES:
        if only is not None and sh.name not in only:
            continue
        paths = inputs(sh)
        cmds = {"floor": [common.PYTHON, "-c", FLOOR, str(WORK / "floor_out.parquet"), *map(str, paths)],
                "cli": [common.PYTHON, "-c", FLOOR, "--cli", str(WORK / "floor_out.parquet"), *map(str, paths)],
                "smerge": smerge_cmd(prefix, sh, paths, WORK / "smerge_out.parquet"),
                "duckdb": [common.PYTHON, "-c", f"import duckdb; duckdb.connect().execute({duckdb_sql(sh, paths, WORK / 'duckdb_out.parquet')!r})"]}
        for c in cmds.values():
            run_child(c)  # untimed: inputs in the page cache, bytecode written
        t = {k: [] for k in cmds}
        m = {k: [] for k in cmds}
        loads = [os.getloadavg()[0]]
        rounds = max(3, a.rounds // 2) if sh.large else a.rounds
        for r in range(rounds):
            names = list(cmds) if r % 2 == 0 else list(cmds)[::-1]
            for k in names:
                w, mb = run_child(cmds[k])
                t[k].append(w)
                m[k].append(mb)
            loads.append(os.getloadavg()[0])
        med = {k: statistics.median(v) for k, v in t.items()}
        mem = {k: statistics.median(v) for k, v in m.items()}
        ratio = {k: statistics.median(x / y for x, y in zip(t[k], t["duckdb"])) for k in ("floor", "cli")}
        print(f"| {sh.name} | {med['floor']:.2f} | {med['cli']:.2f} | {med['smerge']:.2f} | {med['duckdb']:.2f} | "
              f"{ratio['floor']:.2f} | {ratio['cli']:.2f} | {mem['floor']:.0f} | {mem['cli']:.0f} | {mem['smerge']:.0f} | "
              f"{mem['duckdb']:.0f} | {statistics.median(loads):.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
