"""Spark execution vs in-process, side by side in one run (BENCHMARKS.md, section "Spark execution").

The last table compares the two co-partitioning plans as built: slab pairing and the shuffle
plan that inputs at URLs take (Spark's own readers); `--shuffle` runs only that table.

`--parallelism` (BENCHMARKS.md, "spark-parallelism"; the model in docs/spark.md, "Parallelism
model") measures what predicts scaling on a cluster from Spark's own task metrics: `smerge cgm`
at P = 1, 8, 32 (`--ps`) on `--par-master` (default local[1]: tasks run one after another, so
each task's time is its own) with one thread per task, on gridded and point-list `smerge gen`
inputs of `--par-records` (16M) each. Each run writes Spark's event log
(`spark.eventLog.enabled`), read back for every task's Executor Run Time, launch and finish
times, input and shuffle bytes; the stats give each merge task's Python CPU time
(`task_cpu_seconds`). Driver-side serial time = job (`total_seconds`) minus the time when at
least one task runs. Medians of `--par-repeat` interleaved rounds; raw runs in
bench/results/spark_parallelism.json. Processes are capped at 16 GiB of address space. Before
every run the previous output is removed and the page cache written back (`sync`), outside the
measured process.

    .venv/bin/python bench/bench_spark.py --parallelism [--par-records 16e6] [--ps 1,8,32] [--par-repeat 3] [--write]

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
import math
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMERGE = [sys.executable, "-m", "smerge"]
RESULTS = os.path.join(ROOT, "bench", "results")


def machine() -> str:
    import pyarrow
    import pyspark

    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    mem = int(next(ln.split()[1] for ln in open("/proc/meminfo") if ln.startswith("MemTotal"))) / 2**20
    return (f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM, Python {platform.python_version()}, "
            f"pyarrow {pyarrow.__version__}, pyspark {pyspark.__version__}, Java 17")


def gen(path: str, records: int, seed: int, randomize: float = 5) -> None:
    """``smerge gen`` data: a CF point list (randomize > 0) or a grid (randomize 0)."""
    if not os.path.exists(path):
        subprocess.run([*SMERGE, "gen", path, "--records", str(records), "--randomize", f"{randomize:g}",
                        "--seed", str(seed)], check=True, capture_output=True)


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


def to_parquet(nc: str) -> str:
    """A Parquet copy of a generated input (same records, same order)."""
    import pyarrow.parquet as pq

    from smerge.datasets import open_input

    out = os.path.splitext(nc)[0] + ".parquet"
    if not os.path.exists(out):
        src = open_input(nc)
        with pq.ParquetWriter(out + ".tmp", src.schema) as w:
            for b in src.batches():
                w.write_batch(b)
        os.replace(out + ".tmp", out)
    return out


def slabs_vs_spark_readers(a: str, b: str, out: str, repeat: int) -> list[str]:
    """The issue's two plans as built, whole CGM runs in one warm local[2] session (2 partitions):
    slab pairing (each task reads its slabs of A and B with smerge's readers, no shuffle) against
    the shuffle plan (records read by Spark -- the smerge_netcdf data source for netCDF, Spark's
    Parquet reader for file:// URLs -- tagged with row ids and partitions, shuffled, cogrouped)."""
    from smerge.jobs import CGMJob, prepare
    from smerge.spark.cgm.runner import run_cgm_spark
    from smerge.spark.session import start_session

    pa_, pb_ = to_parquet(a), to_parquet(b)
    url = lambda p: "file://" + os.path.abspath(p)  # noqa: E731
    spark = start_session("local[2]")
    slab_nc, spark_nc = "netCDF, slab pairing", "netCDF, Spark reads (smerge.reader=spark: data source + shuffle)"
    slab_pq, spark_pq = "Parquet, slab pairing", "Parquet at file:// URLs, Spark's Parquet reader + shuffle"
    keys = ("time", "lat", "lon")
    cases = {
        slab_nc: lambda: run_cgm_spark(prepare(CGMJob(a=a, b=b, output=out, overwrite=True)), partitions=2,
                                       spark=spark),
        spark_nc: lambda: run_cgm_spark(CGMJob(a=a, b=b, output=out, overwrite=True), partitions=2,
                                        conf={"smerge.reader": "spark"}, spark=spark),
        slab_pq: lambda: run_cgm_spark(prepare(CGMJob(a=pa_, b=pb_, keys_a=keys, output=out, overwrite=True)),
                                       partitions=2, spark=spark),
        spark_pq: lambda: run_cgm_spark(CGMJob(a=url(pa_), b=url(pb_), keys_a=keys, output=out, overwrite=True),
                                        partitions=2, spark=spark),
    }
    ref = {slab_nc: slab_nc, spark_nc: slab_nc, slab_pq: slab_pq, spark_pq: slab_pq}
    best: dict = {}
    for r in range(repeat + 1):  # the first round warms the session
        for name, fn in cases.items():
            st = fn()
            print(f"round {r}: {name}: {st['total_seconds']:.2f} s", file=sys.stderr)
            if r and (name not in best or st["total_seconds"] < best[name]["total_seconds"]):
                best[name] = st
    spark.stop()
    lines = ["| inputs, plan (local[2], warm session, 2 partitions) | job s | plan s | merge job s | matched | vs slab pairing |",
             "|---|---|---|---|---|---|"]
    for name, st in best.items():
        lines.append(f"| {name} | {st['total_seconds']:.2f} | {st['plan_seconds']:.2f} | {st['spark_job_seconds']:.2f} | "
                     f"{st['matched']:,} | {st['total_seconds'] / best[ref[name]]['total_seconds']:.2f}x |")
    return lines


# --------------------------------------------------------------------------------------------
# Parallelism from Spark's own task metrics (issue 15 item 3)

AS_LIMIT = 16 << 30  # RLIMIT_AS per process: the CLI's Python, and the JVM and Python workers it starts (they
#                      inherit it; the JVM alone reserves several GiB of address space for its heap and code)
EVENT_LOG = ["--conf", "spark.eventLog.enabled=true", "--conf", "spark.eventLog.compress=false",
             "--conf", "spark.eventLog.rolling.enabled=false"]


def _cap_address_space() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals: the time when at least one task runs."""
    total, end = 0.0, -math.inf
    for s, e in sorted(intervals):
        if e > end:
            total += e - max(s, end)
            end = e
    return total


def task_metrics(log_dir: str) -> list[dict]:
    """Spark's own metrics of every task of the run, read from its event log (one JSON event a
    line, written by the driver's listener bus; ``spark.eventLog.*``). Only tasks of smerge's job
    groups count: the session's worker warm-up runs before the run's clock starts."""
    names = [f for f in os.listdir(log_dir) if not f.startswith(".") and not f.endswith(".inprogress")]
    if len(names) != 1:
        raise SystemExit(f"{log_dir}: expected one finished event log, found {names}")
    with open(os.path.join(log_dir, names[0])) as f:
        events = [json.loads(ln) for ln in f]
    stage_job: dict[int, int] = {}
    for e in events:
        if e["Event"] == "SparkListenerJobStart":
            if str((e.get("Properties") or {}).get("spark.jobGroup.id", "")).startswith("smerge-"):
                stage_job.update({s["Stage ID"]: e["Job ID"] for s in e["Stage Infos"]})
    tasks = []
    for e in events:
        if e["Event"] != "SparkListenerTaskEnd" or e["Stage ID"] not in stage_job:
            continue
        info, m = e["Task Info"], e.get("Task Metrics") or {}
        rd = m.get("Shuffle Read Metrics", {})
        tasks.append({
            "job": stage_job[e["Stage ID"]], "ok": e["Task End Reason"]["Reason"] == "Success",
            "launch": info["Launch Time"] / 1e3, "finish": info["Finish Time"] / 1e3,
            "run": m.get("Executor Run Time", 0) / 1e3, "jvm_cpu": m.get("Executor CPU Time", 0) / 1e9,
            "deserialize": m.get("Executor Deserialize Time", 0) / 1e3,
            "input_bytes": m.get("Input Metrics", {}).get("Bytes Read", 0),
            "shuffle_read_bytes": rd.get("Local Bytes Read", 0) + rd.get("Remote Bytes Read", 0),
            "shuffle_write_bytes": m.get("Shuffle Write Metrics", {}).get("Shuffle Bytes Written", 0),
            "result_bytes": m.get("Result Size", 0)})
    return tasks


def measure_run(a: str, b: str, out: str, master: str, parts: int, log_dir: str) -> dict:
    """One ``smerge cgm`` process on ``master`` with ``parts`` partitions and one thread per
    task; its stats and Spark's task metrics folded into the figures of the model."""
    shutil.rmtree(log_dir, ignore_errors=True)
    os.makedirs(log_dir)
    # Every run starts alike: no output of an earlier run to replace (unlinking a 400 MB file
    # still being written back took 0.3-1 s of the driver's time), nothing left to write back.
    if os.path.exists(out):
        os.remove(out)
    os.sync()
    mode = ["--master", master, "--partitions", str(parts), *NOPF, *EVENT_LOG,
            "--conf", f"spark.eventLog.dir=file://{os.path.abspath(log_dir)}"]
    t = time.perf_counter()
    r = subprocess.run([*SMERGE, "cgm", a, b, "-o", out, "--overwrite", "--json", *mode], capture_output=True,
                       text=True, preexec_fn=_cap_address_space)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"{master} P={parts} failed: {r.stderr}")
    s = json.loads(r.stdout)
    tasks = task_metrics(log_dir)
    shutil.rmtree(log_dir, ignore_errors=True)
    merge_job = max(t_["job"] for t_ in tasks)
    merge = [t_ for t_ in tasks if t_["job"] == merge_job]
    if len(merge) != s["partitions"] or not all(t_["ok"] for t_ in tasks):
        raise SystemExit(f"P={parts}: {len(merge)} merge tasks for {s['partitions']} partitions, or a failed task")
    busy = union_seconds([(t_["launch"], t_["finish"]) for t_ in tasks])
    run = [t_["run"] for t_ in merge]
    cpu = s.get("task_cpu_seconds")  # the Python worker's CPU seconds per merge task (not in Spark's metrics)
    return {
        "P": s["partitions"], "job": s["total_seconds"], "session": s["session_start_seconds"],
        "plan": s["plan_seconds"], "merge_job": s["spark_job_seconds"], "assemble": s["assemble_seconds"],
        "task_total": sum(t_["run"] for t_ in tasks), "scan_total": sum(t_["run"] for t_ in tasks if t_["job"] != merge_job),
        "merge_total": sum(run), "task_max": max(run), "task_mean": sum(run) / len(run),
        "cpu_total": sum(cpu) if cpu else None, "cpu_max": max(cpu) if cpu else None,
        "cpu_mean": sum(cpu) / len(cpu) if cpu else None,
        "jvm_cpu_total": sum(t_["jvm_cpu"] for t_ in tasks), "deserialize_total": sum(t_["deserialize"] for t_ in tasks),
        "busy": busy, "serial": s["total_seconds"] - busy,
        "input_bytes": sum(t_["input_bytes"] for t_ in tasks),
        "shuffle_bytes": sum(t_["shuffle_read_bytes"] + t_["shuffle_write_bytes"] for t_ in tasks),
        "result_bytes": sum(t_["result_bytes"] for t_ in tasks),
        "tasks": len(tasks), "matched": s["matched"], "wall": wall, "task_run": run, "task_cpu": cpu,
    }


def _median(runs: list[dict], key: str):
    vals = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def predict(one: dict, at_n: dict, n: int) -> dict:
    """The model: P = n tasks on n cores run in one wave, so the job takes the driver's serial
    time plus its slowest task. T(n) = S_n + b_n * W_n / n with W_n the total task time at P = n
    (c_n = W_n / W_1 the cost of partitioning) and b_n = slowest / mean task (balance); speedup
    T_1 / T(n) with T_1 the P = 1 job. (Amdahl's law with serial fraction S_n / T_1, its
    parallel part stretched by c_n and b_n.)"""
    c = at_n["task_total"] / one["task_total"]
    b = at_n["task_max"] / at_n["task_mean"]
    t = at_n["serial"] + b * at_n["task_total"] / n
    return {"n": n, "S": at_n["serial"], "W": at_n["task_total"], "c": c, "b": b, "T": t,
            "speedup": one["job"] / t, "speedup_session": (one["job"] + one["session"]) / (t + at_n["session"]),
            "amdahl": 1 / (at_n["serial"] / one["job"] + (1 - at_n["serial"] / one["job"]) / n)}


KEYS = ("job", "session", "plan", "merge_job", "assemble", "task_total", "scan_total", "merge_total", "task_max",
        "task_mean", "cpu_total", "cpu_max", "cpu_mean", "jvm_cpu_total", "deserialize_total", "busy", "serial",
        "input_bytes", "shuffle_bytes", "result_bytes", "tasks", "wall")


PAR_JSON = os.path.join(RESULTS, "spark_parallelism.json")


def parallelism(args) -> dict:
    """Spark's task metrics at P = 1 and larger P (one thread per task, ``--par-master``) on
    gridded and point-list inputs, saved to ``PAR_JSON`` after every run (``--render`` makes the
    tables from what a stopped measurement saved)."""
    n = int(args.par_records)
    inputs = {}
    for kind, rnd in (("gridded", 0), ("point list", 5)):
        tag = "g" if rnd == 0 else "p"
        a, b = (os.path.join(args.dir, f"{s}{n}{tag}.nc") for s in ("a", "b"))
        gen(a, n, 1, randomize=rnd)
        gen(b, n, 2, randomize=rnd)
        inputs[kind] = (a, b)
    ps = [int(x) for x in args.ps.split(",")]
    if 1 not in ps:
        ps = [1, *ps]
    out = os.path.join(args.dir, "out-par.parquet")
    log_dir = os.path.join(args.dir, "eventlog")
    saved = {"records": n, "master": args.par_master, "ps": ps, "repeat": args.par_repeat, "machine": machine(),
             "load": [os.getloadavg()], "fresh_output": True, "runs": {f"{k} P={p}": [] for k in inputs for p in ps}}
    os.makedirs(RESULTS, exist_ok=True)
    for r in range(args.par_repeat):  # interleaved: round r runs every configuration once
        for kind, (a, b) in inputs.items():
            for p in ps:
                m = measure_run(a, b, out, args.par_master, p, log_dir)
                m["load"] = os.getloadavg()[0]
                saved["runs"][f"{kind} P={p}"].append(m)
                saved["load_now"] = os.getloadavg()
                with open(PAR_JSON + ".tmp", "w") as f:
                    json.dump(saved, f, indent=1)
                os.replace(PAR_JSON + ".tmp", PAR_JSON)
                print(f"round {r}: {kind} P={p}: job {m['job']:.2f} s, tasks {m['task_total']:.2f} s, "
                      f"max/mean {m['task_max'] / m['task_mean']:.2f}, serial {m['serial']:.2f} s, "
                      f"load {m['load']:.1f}", file=sys.stderr)
    return saved


def render_parallelism(saved: dict) -> list[str]:
    """The tables, targets and predicted speedups of a (possibly stopped) --parallelism run."""
    n, ps = saved["records"], saved["ps"]
    inputs = list(dict.fromkeys(k.rsplit(" P=", 1)[0] for k in saved["runs"]))
    runs = {(k, p): saved["runs"][f"{k} P={p}"] for k in inputs for p in ps if saved["runs"].get(f"{k} P={p}")}
    rounds = min(len(rs) for rs in runs.values())
    load = [saved["load"][0], saved.get("load_now", saved["load"][0])]
    med = {key: {k: _median(rs, k) for k in KEYS} for key, rs in runs.items()}
    args = argparse.Namespace(par_master=saved["master"], ps=",".join(map(str, ps)), par_repeat=saved["repeat"])
    inputs = [k for k in inputs if (k, 1) in med]
    ps = [p for p in ps if all((k, p) in med for k in inputs)]
    cpu = all(m["cpu_total"] is not None for m in med.values())
    lines = [f"### Parallelism from Spark's task metrics ({n / 1e6:g}M + {n / 1e6:g}M records, {args.par_master}, "
             "one thread per task)", "",
             f"Machine: {saved['machine']}. "
             f"Reproduce: `.venv/bin/python bench/bench_spark.py --parallelism --par-records {n:g} --ps {args.ps} "
             f"--par-repeat {args.par_repeat} --write` (every run a fresh `smerge cgm` process; medians of "
             f"{rounds} interleaved rounds{'' if rounds == args.par_repeat else f' of {args.par_repeat} asked (stopped)'}; load average {load[0][0]:.1f} / {load[0][1]:.1f} at the start, "
             f"{load[1][0]:.1f} / {load[1][1]:.1f} at the end (1 / 5 min), {min(r['load'] for rs in runs.values() for r in rs):.1f}-"
             f"{max(r['load'] for rs in runs.values() for r in rs):.1f} after the runs"
             + ("; before every run the previous output removed and the page cache written back, outside the "
                "measured process" if saved.get("fresh_output") else "") + "). Task figures are Spark's own metrics "
             "from the run's event log (`spark.eventLog.enabled`): Executor Run Time per task, launch and "
             "finish times; \"Python CPU\" is the Python worker's CPU time per merge task (`task_cpu_seconds` "
             "in the stats; Spark's Executor CPU Time counts only the JVM's task thread, which waits for the "
             "Python worker: " + ", ".join(f"{med[(k, 1)]['jvm_cpu_total']:.2f} s against {med[(k, 1)]['task_total']:.1f} s run time"
                                          for k in inputs if med[(k, 1)]['jvm_cpu_total'] is not None) + ").", "",
             "| inputs | P | job s | task time s (scan + merge) | vs P=1 | slowest / mean task | "
             + ("merge tasks' Python CPU s | vs P=1 | CPU slowest / mean | " if cpu else "")
             + "busy s | driver serial s | % of job | plan s | assemble s | input / shuffle bytes | session s |",
             "|---|---|---|---|---|---|" + ("---|---|---|" if cpu else "") + "---|---|---|---|---|---|---|"]
    for kind in inputs:
        for p in ps:
            m, one = med[(kind, p)], med[(kind, 1)]
            row = (f"| {kind} | {p} | {m['job']:.2f} | {m['task_total']:.2f} ({m['scan_total']:.2f} + {m['merge_total']:.2f}) | "
                   f"{m['task_total'] / one['task_total']:.2f}x | {m['task_max'] / m['task_mean']:.2f} | ")
            if cpu:
                row += f"{m['cpu_total']:.2f} | {m['cpu_total'] / one['cpu_total']:.2f}x | {m['cpu_max'] / m['cpu_mean']:.2f} | "
            row += (f"{m['busy']:.2f} | {m['serial']:.2f} | {100 * m['serial'] / m['job']:.1f}% | {m['plan']:.2f} | "
                    f"{m['assemble']:.2f} | {m['input_bytes']:.0f} / {m['shuffle_bytes']:.0f} | {m['session']:.1f} |")
            lines.append(row)
    lines += ["", "Predicted speedup on n cores (P = n; model in docs/spark.md, \"Parallelism model\"): "
              "T(n) = S_n + b_n W_n / n, speedup T_1 / T(n).", "",
              "| inputs | n | driver serial S_n s | task time W_n s | c_n = W_n / W_1 | b_n | T(n) s | speedup | "
              "with session start | Amdahl (S_n only) |", "|---|---|---|---|---|---|---|---|---|---|"]
    preds = {}
    for kind in inputs:
        for p in ps:
            if p == 1:
                continue
            e = preds[(kind, p)] = predict(med[(kind, 1)], med[(kind, p)], p)
            lines.append(f"| {kind} | {p} | {e['S']:.2f} | {e['W']:.2f} | {e['c']:.2f} | {e['b']:.2f} | {e['T']:.2f} | "
                         f"**{e['speedup']:.1f}x** | {e['speedup_session']:.1f}x | {e['amdahl']:.1f}x |")
    lines.append("")
    ok = lambda x: "met" if x else "**missed**"  # noqa: E731
    for kind in inputs:
        p8 = 8 if 8 in ps else max(ps)
        m, one = med[(kind, p8)], med[(kind, 1)]
        c, b, s = m["task_total"] / one["task_total"], m["task_max"] / m["task_mean"], m["serial"] / m["job"]
        line = (f"- {kind}, P = {p8}: total task time {c:.2f}x P = 1 (target <= 1.2x: {ok(c <= 1.2)}); slowest task "
                f"{b:.2f}x the mean (target <= 1.3x: {ok(b <= 1.3)}); driver serial {100 * s:.1f}% of the job "
                f"(target < 10%: {ok(s < 0.1)})")
        if cpu:
            line += (f"; by the merge tasks' Python CPU time: {m['cpu_total'] / one['cpu_total']:.2f}x P = 1 (plus "
                     f"{m['scan_total']:.2f} s of scan tasks' run time), slowest {m['cpu_max'] / m['cpu_mean']:.2f}x "
                     "the mean")
        lines.append(line + ".")
    lines.append("")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/smerge-bench")
    ap.add_argument("--records", type=float, default=8e6)
    ap.add_argument("--growth", default="1e6,4e6,16e6")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--write", action="store_true", help="write the results into BENCHMARKS.md")
    ap.add_argument("--shuffle", action="store_true",
                    help="only measure slab pairing against the shuffle plan (prints a table; no --write)")
    ap.add_argument("--parallelism", action="store_true",
                    help="only the task-metrics measurement (with --write: only its part of BENCHMARKS.md)")
    ap.add_argument("--par-records", type=float, default=16e6, help="records per input for --parallelism")
    ap.add_argument("--ps", default="1,8,32", help="partition counts (P = 1 is always run)")
    ap.add_argument("--par-master", default="local[1]")
    ap.add_argument("--par-repeat", type=int, default=3)
    ap.add_argument("--render", action="store_true",
                    help="the --parallelism tables from bench/results/spark_parallelism.json (no measurement)")
    args = ap.parse_args()
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))
    os.makedirs(args.dir, exist_ok=True)
    if args.parallelism or args.render:
        if args.render:
            with open(PAR_JSON) as f:
                saved = json.load(f)
        else:
            saved = parallelism(args)
        text = "\n".join(render_parallelism(saved))
        print(text)
        if args.write:
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            import common

            common.replace_section("spark-parallelism", text)
        return
    if args.shuffle:
        n = int(args.records)
        a, b = (os.path.join(args.dir, f"{s}{n}.nc") for s in ("a", "b"))
        gen(a, n, 1)
        gen(b, n, 2)
        print("\n".join(slabs_vs_spark_readers(a, b, os.path.join(args.dir, "out-shuffle.parquet"), args.repeat)))
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
              "(no target on a 2-core machine: scaling is predicted from task metrics, \"Parallelism\" below); "
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
    lines += [f"### Slab pairing vs shuffle ({n / 1e6:g}M + {n / 1e6:g}M, the issue's two plans)", ""]
    lines += slabs_vs_spark_readers(a, b, os.path.join(args.dir, "out-shuffle.parquet"), args.repeat)
    lines += ["", "Rule: slab pairing for local paths; the shuffle plan (Spark's own readers) for inputs at",
              "URLs, which smerge's readers cannot open (docs/spark.md, \"Inputs at URLs\").", ""]
    text = "\n".join(lines)
    print(text)
    if args.write:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import common

        common.replace_section("spark", text)


if __name__ == "__main__":
    main()
