"""Spark execution vs in-process, side by side in one run (BENCHMARKS.md, section "Spark execution").

    .venv/bin/python bench/bench_spark.py [--dir /tmp/smerge-bench] [--records 8000000] [--growth 1e6,4e6,16e6]
                                          [--repeat 2] [--write]

Every configuration runs the real CLI (`smerge cgm A B --json`) in a fresh process:
`--local`, `--master local[1]` and `--master local[2]` (single Parquet file), `local[2]` writing a
Parquet dataset folder, `local[1]` with the task's reader/writer threads off and `local[2]` with
them on (`--conf smerge.task.prefetch=false|true`; the default `auto` turns them on only when the
tasks leave cores free: on for local[1]'s one task, off for local[2]'s two), on
the same NCAR-like inputs (`smerge gen`, 5% randomized, point lists). "job" is the run's
`total_seconds` (everything after the Spark session is up: planning, merge job, output
assembly); session start is reported apart. Runs are interleaved (round r runs every
configuration once) and the best of `--repeat` rounds is kept (noise only makes runs slower).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMERGE = [sys.executable, "-m", "smerge"]


def machine() -> str:
    import pyarrow
    import pyspark

    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    mem = int(next(ln.split()[1] for ln in open("/proc/meminfo") if ln.startswith("MemTotal"))) / 2**20
    return (f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM, Python {platform.python_version()}, "
            f"pyarrow {pyarrow.__version__}, pyspark {pyspark.__version__}, Java 17")


def gen(path: str, records: int, seed: int) -> None:
    if not os.path.exists(path):
        subprocess.run([*SMERGE, "gen", path, "--records", str(records), "--randomize", "5", "--seed", str(seed)],
                       check=True, capture_output=True)


def run(a: str, b: str, out: str, mode: list[str]) -> dict:
    t = time.perf_counter()
    if "--dataset" in mode:
        mode = [m for m in mode if m != "--dataset"]
        out = os.path.splitext(out)[0] + "-ds/"
    r = subprocess.run([*SMERGE, "cgm", a, b, "-o", out, "--overwrite", "--json", *mode], capture_output=True, text=True)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(mode)} failed: {r.stderr}")
    s = json.loads(r.stdout)
    s["wall"] = wall
    return s


def best_of(a, b, out, modes: dict, repeat: int) -> dict:
    """Every mode once per round (interleaved), best total_seconds per mode."""
    runs: dict = {name: [] for name in modes}
    for _ in range(repeat):
        for name, mode in modes.items():
            runs[name].append(run(a, b, out, mode))
    return {name: min(rs, key=lambda s: s["total_seconds"]) for name, rs in runs.items()}


NOPF = ["--conf", "smerge.task.prefetch=false"]
PF = ["--conf", "smerge.task.prefetch=true"]


def _count_rows(batches):
    import pyarrow as pa

    n = 0
    for b in batches:
        n += b.num_rows
    yield pa.RecordBatch.from_pydict({"rows": [n]})


def shuffle_vs_slabs(a: str, b: str, out: str, repeat: int) -> list[str]:
    """Slab pairing (the CGM plan: each task reads its slabs of A and B, no shuffle) against
    the data movement of a shuffle plan (netCDF data source -> key-range partition id in the
    JVM -> repartition -> sort by (pid, src, row) -> mapInArrow), in one warm local[2] session.
    The shuffle side runs no engine and writes nothing: it is a lower bound of that plan."""
    from pyspark.sql import functions as F

    from smerge.jobs import CGMJob, prepare
    from smerge.spark import run_cgm_spark, start_session
    from smerge.spark_netcdf import register

    spark = start_session("local[2]", {"spark.sql.shuffle.partitions": "2"})
    register(spark)
    slab, shuffle = [], []
    for _ in range(repeat + 1):  # the first round warms the session
        st = run_cgm_spark(prepare(CGMJob(a=a, b=b, output=out, overwrite=True)), partitions=2, spark=spark)
        slab.append(st["total_seconds"])
        bounds = st["bounds"]
        t = time.perf_counter()
        dfs = []
        for tag, path in (("a", a), ("b", b)):
            df = spark.read.format("smerge_netcdf").option("path", path).option("numPartitions", 2).load()
            k1 = df.columns[0]
            pid = sum(((F.col(k1) >= F.lit(x)).cast("int") for x in bounds), F.lit(0))
            dfs.append(df.withColumn("pid", pid).withColumn("src", F.lit(tag)))
        rows = (dfs[0].unionByName(dfs[1]).repartition(2, "pid").sortWithinPartitions("pid", "src", "_row")
                .mapInArrow(_count_rows, "rows long").collect())
        shuffle.append(time.perf_counter() - t)
        assert sum(r.rows for r in rows) == st["a_records"] + st["b_records"]
    spark.stop()
    s, m = min(slab[1:]), min(shuffle[1:])
    return ["| plan (local[2], warm session, 2 partitions) | seconds |", "|---|---|",
            f"| slab pairing: whole CGM run (plan + merge job + single-file output) | {s:.2f} |",
            f"| shuffle: data source read + repartition + sort + mapInArrow, no engine, no output | {m:.2f} |",
            "", f"Shuffle data movement alone / slab pairing whole run: **{m / s:.2f}x**."]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/smerge-bench")
    ap.add_argument("--records", type=float, default=8e6)
    ap.add_argument("--growth", default="1e6,4e6,16e6")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--write", action="store_true", help="write the results into BENCHMARKS.md")
    ap.add_argument("--shuffle", action="store_true",
                    help="only measure slab pairing against a shuffle plan (prints a table; no --write)")
    args = ap.parse_args()
    if args.shuffle:
        n = int(args.records)
        a, b = (os.path.join(args.dir, f"{s}{n}.nc") for s in ("a", "b"))
        gen(a, n, 1)
        gen(b, n, 2)
        print("\n".join(shuffle_vs_slabs(a, b, os.path.join(args.dir, "out-shuffle.parquet"), args.repeat)))
        return
    os.makedirs(args.dir, exist_ok=True)
    lines = [f"Machine: {machine()}. Reproduce: `.venv/bin/python bench/bench_spark.py --write` "
             f"(repeat {args.repeat}, best run kept; load average at start {os.getloadavg()[0]:.1f}).", ""]

    n = int(args.records)
    a, b = (os.path.join(args.dir, f"{s}{n}.nc") for s in ("a", "b"))
    gen(a, n, 1)
    gen(b, n, 2)
    out = os.path.join(args.dir, "out.parquet")
    res = best_of(a, b, out, {
        "--local": ["--local"], "local[1]": ["--master", "local[1]"], "local[2]": ["--master", "local[2]"],
        "local[2] dataset": ["--master", "local[2]", "--dataset"],
        "local[1] 1 thread/task": ["--master", "local[1]", *NOPF],
        "local[2] threads in tasks": ["--master", "local[2]", *PF]}, args.repeat)
    loc = res["--local"]["total_seconds"]
    lines += [f"### {n / 1e6:g}M + {n / 1e6:g}M records (point lists, 5% randomized, eps 0)", "",
              "| run | job s | vs --local | session start s | plan s (how) | merge job s | slowest task s | task threads | assemble s | partitions | matched | process wall s |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in res.items():
        sp = s.get("execution") == "spark"
        how = s.get("plan", {}).get("a", "-")
        lines.append(f"| {name} | {s['total_seconds']:.2f} | {s['total_seconds'] / loc:.2f}x | "
                     f"{s.get('session_start_seconds', 0):.2f} | {s.get('plan_seconds', 0):.2f} ({how}) | "
                     f"{s.get('spark_job_seconds', 0) if sp else s['merge_seconds']:.2f} | "
                     f"{max(s.get('task_seconds') or [0]):.2f} | {s.get('task_threads', '-')} | "
                     f"{s.get('assemble_seconds', 0):.2f} | {s.get('partitions', '-')} | {s['matched']:,} | {s['wall']:.1f} |")
    t = {k: v["total_seconds"] for k, v in res.items()}
    task = {k: max(v.get("task_seconds") or [0]) for k, v in res.items()}
    lines += ["", f"- local[2] vs local[1] (default settings): **{t['local[1]'] / t['local[2]']:.2f}x** faster "
              f"(target >= 1.6x: {'met' if t['local[1]'] / t['local[2]'] >= 1.6 else 'missed'}); "
              f"both with one thread per task: **{t['local[1] 1 thread/task'] / t['local[2]']:.2f}x** "
              f"(merge tasks alone: **{task['local[1] 1 thread/task'] / task['local[2]']:.2f}x**).",
              f"- local[2] job vs --local: **{t['local[2]'] / loc:.2f}x** (target <= 1.5x: "
              f"{'met' if t['local[2]'] / loc <= 1.5 else 'missed'}); writing a dataset folder: "
              f"**{t['local[2] dataset'] / loc:.2f}x**; with threads inside the two tasks: "
              f"**{t['local[2] threads in tasks'] / loc:.2f}x**.",
              ""]

    sizes = [int(float(x)) for x in args.growth.split(",") if x]
    if sizes:
        lines += ["### Cost growth, local[2] (job seconds per million records of A)", "",
                  "| records per input | --local s | local[2] job s | partitions | local[2] us/record | vs smallest | local[2] / --local |",
                  "|---|---|---|---|---|---|---|"]
        base = None
        for m in sizes:
            ga, gb = (os.path.join(args.dir, f"{s}{m}.nc") for s in ("a", "b"))
            gen(ga, m, 1)
            gen(gb, m, 2)
            r = best_of(ga, gb, out, {"lo": ["--local"], "s2": ["--master", "local[2]"]}, args.repeat)
            lo, s2 = r["lo"], r["s2"]
            per = s2["total_seconds"] / m * 1e6
            base = base or per
            lines.append(f"| {m / 1e6:g}M | {lo['total_seconds']:.2f} | {s2['total_seconds']:.2f} | {s2['partitions']} | {per:.3f} | "
                         f"{per / base:.2f}x | {s2['total_seconds'] / lo['total_seconds']:.2f}x |")
        lines.append("")
    lines += ["### Slab pairing vs shuffle (8M + 8M, the issue's two plans)", ""]
    lines += shuffle_vs_slabs(a, b, os.path.join(args.dir, "out-shuffle.parquet"), args.repeat)
    lines += ["", "Kept: slab pairing (every CGM run uses it). The shuffle plan (records read through the",
              "`smerge_netcdf` data source, moved into key ranges by Spark and handed back as Arrow) is",
              "not built for CGM: its data movement alone costs more than the whole slab-paired run.", ""]
    text = "\n".join(lines)
    print(text)
    if args.write:
        path = os.path.join(ROOT, "BENCHMARKS.md")
        doc = open(path).read()
        begin, end = "<!-- spark: begin -->", "<!-- spark: end -->"
        i, j = doc.index(begin) + len(begin), doc.index(end)
        open(path, "w").write(doc[:i] + "\n" + text + "\n" + doc[j:])


if __name__ == "__main__":
    main()
