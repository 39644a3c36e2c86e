"""`smerge cgm` on Spark beside the Spark as-of joins a user would pick (issue 25 item 4;
BENCHMARKS.md, section "Spark peers").

Data: A and B of N records each with one float64 key `k`, a row number `i` (int64) and a float32
payload `v`, Parquet. A's keys are 0, 1, 2, ... plus noise of +-0.1; each B key lies 0-0.01 *below*
its A key (so the backward as-of join that tempo does and the nearest match that smerge and
pandas-on-Spark do find the same partner); each stream in arrival order with 2% of its records
moved up to 1,000 positions (partially sorted, as bench/bench_asof.py's data: its `displaced`).
With a tolerance of 0.05 every A record has exactly one B record within it, so every tool must
find the same N pairs (checked: the pair count of every run, and the set of (A.i, B.i) pairs of
each tool's first run; `--check-pairs N` limits that to sizes up to N).

Tools, each a whole process with its own JVM, master local[2], Parquet in, one Parquet output:
- smerge: `smerge cgm A B --keys k --eps 0.05 --master local[2] -o out.parquet`;
- tempo: dbl-tempo's `TSDF(a, ts_col="k").asofJoin(TSDF(b, ts_col="k"), right_prefix="b",
  tolerance=0.05)` (backward: the last B at or before A), unmatched rows dropped, written by Spark;
  with no partition column tempo's window spans the whole data set, so the whole join runs in one
  task (`tempo` row); `tempo tsPartitionVal` brackets the key by 100,000 units (fraction 0.5) to
  spread it over tasks, tempo's own skew option;
- pandas-on-Spark: `pyspark.pandas.merge_asof(a, b, on="k", direction="nearest",
  tolerance=0.05)` (Spark's own as-of join plan), unmatched rows dropped, `to_parquet`. Spark
  plans it as a broadcast nested-loop join (every A key against every B record), so it is run at
  small sizes only (`--tools pandas --records 2e4`; at 200k + 200k it had not finished after 6
  minutes).
spark-pit (`pip install spark-pit`) is a Python wrapper of a Scala library whose published jar
targets Scala 2.12 / Spark 3; pyspark 4 runs Scala 2.13, so it is not run.

Every process gets the same Spark settings (`--driver-memory`, default 4g, as
`spark.driver.memory`; UI off; UTC), an address-space cap of `--as-limit` GiB (default 20: the JVM
reserves several GiB of virtual space for heap, code cache and metaspace, and pyspark's Python
workers inherit the cap), and a sampler that sums the resident memory of the process tree
(Python driver + JVM + Python workers) every 0.2 s: "peak RSS" is the largest sum seen. Rounds
alternate the tools (round r runs every tool once); reported are medians, the median of the
per-round ratios to smerge, and the load average before every run.

Peers installed by hand into the venv (they are not in setup.cfg's extras):
    .venv/bin/pip install dbl-tempo ipython scipy      # tempo imports IPython and scipy, undeclared

Usage:
    .venv/bin/python bench/bench_spark_peers.py [--records 8e6] [--repeat 5] [--tools smerge,tempo,...]
                                                [--dir /tmp/smerge-peers] [--write]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time
from importlib import metadata
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402 - bench/common.py
from bench_asof import displaced  # noqa: E402 - the as-of bench's partial order

PY = sys.executable
EPS = 0.05
RESULTS = common.RESULTS / "spark_peers.json"

SESSION = """
import sys, json, time
t0 = time.perf_counter()
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[2]").appName("peer")
         .config("spark.driver.memory", sys.argv[4]).config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false").config("spark.sql.session.timeZone", "UTC")
         .config("spark.pyspark.python", sys.executable).getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
t1 = time.perf_counter()
"""
DONE = """
print(json.dumps({"session_start_seconds": t1 - t0, "total_seconds": time.perf_counter() - t1}))
"""
TEMPO = SESSION + """
from tempo import TSDF
a = TSDF(spark.read.parquet(sys.argv[1]), ts_col="k")
b = TSDF(spark.read.parquet(sys.argv[2]), ts_col="k")
j = a.asofJoin(b, right_prefix="b", tolerance={eps}{extra}).df
j.where(j["b_k"].isNotNull()).write.mode("overwrite").parquet(sys.argv[3])
""" + DONE
PANDAS_ON_SPARK = SESSION + """
import pyspark.pandas as ps
a = ps.read_parquet(sys.argv[1]); b = ps.read_parquet(sys.argv[2])
b = b.rename(columns={c: "b_" + c for c in b.columns}).assign(k=b["k"])
o = ps.merge_asof(a, b, on="k", direction="nearest", tolerance={eps})
o = o[o["b_k"].notnull()]
o.to_parquet(sys.argv[3], mode="overwrite")
""" + DONE


def fill(script: str, extra: str = "") -> str:
    return script.replace("{eps}", str(EPS)).replace("{extra}", extra)


def make(d: Path, n: int) -> tuple[str, str]:
    rng = np.random.default_rng(7)
    base = np.arange(n, dtype=np.float64) + rng.uniform(-0.1, 0.1, n)
    ia, ib = displaced(n, rng), displaced(n, rng)
    a, b = base[ia], (base - rng.uniform(0, 0.01, n))[ib]
    paths = []
    for name, k, order in (("a", a, ia), ("b", b, ib)):
        p = d / f"{name}{n}.parquet"
        if not p.exists():
            # i = the record's row in its file; the pair (A.i, B.i) names a match
            pq.write_table(pa.table({"k": k, "i": np.arange(n, dtype=np.int64),
                                     "v": rng.normal(size=n).astype("f4")}), p, row_group_size=262144)
        paths.append(str(p))
    return paths[0], paths[1]


def tree_rss(root: int) -> int:
    """Resident bytes of ``root`` and all its descendants (from /proc)."""
    kids: dict[int, list[int]] = {}
    for e in os.listdir("/proc"):
        if e.isdigit():
            try:
                with open(f"/proc/{e}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(e))
    total, todo = 0, [root]
    while todo:
        p = todo.pop()
        todo += kids.get(p, [])
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            pass
    return total


def run(cmd: list[str], as_limit: int, timeout: float | None = None) -> dict:
    """One whole process: wall time, its JSON line, peak RSS of its process tree. A run past
    ``timeout`` seconds is stopped (its process group killed) and recorded as such."""
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (as_limit, as_limit))

    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=cap,
                         start_new_session=True)
    peak, stop = [0], threading.Event()

    def sample():
        while not stop.wait(0.2):
            peak[0] = max(peak[0], tree_rss(p.pid))

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # the run's own group: its driver, JVM and Python workers
        p.communicate()
        stop.set()
        th.join()
        return {"timeout": True, "wall": time.perf_counter() - t0, "peak_rss": peak[0], "load": load}
    wall = time.perf_counter() - t0
    stop.set()
    th.join()
    if p.returncode != 0:  # recorded with the first lines naming an error (a Java trace's cause)
        why = [ln.strip() for ln in err.splitlines() if re.search(r"(Error|Exception)\b.*:", ln) and "\tat " not in ln]
        print(err[-3000:], file=sys.stderr)
        return {"failed": True, "error": why[:6], "wall": wall, "peak_rss": peak[0], "load": load}
    try:
        s = json.loads(out)  # smerge --json: one indented object
    except json.JSONDecodeError:
        s = json.loads(out.strip().splitlines()[-1])
    sess = s.get("session_start_seconds") or 0.0
    # smerge's total_seconds counts its session start; the peers' scripts count from theirs on
    job = s["total_seconds"] - sess if "matched" in s else s["total_seconds"]
    return {"wall": wall, "job": job, "session": sess,
            "peak_rss": peak[0], "load": load, "matched": s.get("matched")}


def pairs_of(out: str) -> tuple[int, np.ndarray | None]:
    """The number of output rows and the sorted (A.i, B.i) pairs of an output file or folder."""
    names = pq.read_schema(out).names if os.path.isfile(out) else pq.read_table(out).column_names
    bcol = "i_b" if "i_b" in names else "b_i"  # smerge suffixes B's columns, tempo prefixes them
    t = pq.read_table(out, columns=["i", bcol])
    ai, bi = t["i"].to_numpy(), t[bcol].to_numpy()
    return t.num_rows, np.unique(ai * (1 << 32) + bi)


def tools(fa: str, fb: str, mem: str) -> dict:
    smerge = str(Path(PY).with_name("smerge"))
    return {
        "smerge cgm": lambda o: [smerge, "cgm", fa, fb, "--keys", "k", "--eps", str(EPS), "--master", "local[2]",
                                 "--conf", f"spark.driver.memory={mem}", "-o", o, "--overwrite", "--json"],
        "tempo asofJoin": lambda o: [PY, "-c", fill(TEMPO, extra=""), fa, fb, o, mem],
        "tempo asofJoin, tsPartitionVal": lambda o: [
            PY, "-c", fill(TEMPO, extra=", tsPartitionVal=100000, fraction=0.5, suppress_null_warning=True"),
            fa, fb, o, mem],
        "pandas-on-Spark merge_asof": lambda o: [PY, "-c", fill(PANDAS_ON_SPARK), fa, fb, o, mem],
    }


def versions() -> str:
    v = lambda d: metadata.version(d)  # noqa: E731
    return (f"pyspark {v('pyspark')}, dbl-tempo {v('dbl-tempo')}, pandas {v('pandas')}, pyarrow {v('pyarrow')}, "
            f"smerge {v('smerge') if _has('smerge') else 'checkout'}")


def _has(d: str) -> bool:
    try:
        metadata.version(d)
        return True
    except metadata.PackageNotFoundError:
        return False


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=float, default=8e6)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--tools", default=None, help="comma-separated tool names (prefixes) to run; default all")
    ap.add_argument("--dir", default="/tmp/smerge-peers")
    ap.add_argument("--driver-memory", default="4g")
    ap.add_argument("--as-limit", type=float, default=20, help="address-space cap per process, GiB")
    ap.add_argument("--timeout", type=float, default=None,
                    help="stop a run after this many seconds (a tool stopped once is not run again)")
    ap.add_argument("--check-pairs", type=float, default=1e9,
                    help="compare the pair sets (not just counts) at this many records or fewer")
    ap.add_argument("--results", default=str(RESULTS), help="where the raw runs are saved (JSON)")
    ap.add_argument("--render", action="store_true", help="only the table of the saved results (no runs)")
    ap.add_argument("--also", action="append", default=[],
                    help="saved results (JSON) of another size whose table follows the main one (repeatable)")
    ap.add_argument("--write", action="store_true", help="write the table into BENCHMARKS.md")
    a = ap.parse_args(argv)
    if a.render:
        saved = json.loads(Path(a.results).read_text())
    else:
        saved = measure(a)
    text = render(saved)
    for other in a.also:
        o = json.loads(Path(other).read_text())
        text += f"\n\n### {o['records'] / 1e6:g}M + {o['records'] / 1e6:g}M records\n\n" + render(o)
    print(text)
    if a.write:
        common.replace_section("spark-peers", text, heading="Spark peers")
    return 0


def measure(a) -> dict:
    n = int(a.records)
    d = Path(a.dir)
    d.mkdir(parents=True, exist_ok=True)
    fa, fb = make(d, n)
    routes = tools(fa, fb, a.driver_memory)
    if a.tools:
        want = [t.strip() for t in a.tools.split(",")]
        routes = {k: v for k, v in routes.items() if any(k.startswith(w) for w in want)}
    saved = {"records": n, "eps": EPS, "driver_memory": a.driver_memory, "as_limit_gib": a.as_limit,
             "timeout": a.timeout, "repeat": a.repeat, "tools": a.tools, "machine": common.machine(), "versions": versions(),
             "runs": {k: [] for k in routes}, "pairs": {}, "load_start": os.getloadavg()}
    ref = None
    for r in range(a.repeat):
        for name, cmd in routes.items():
            if any(x.get("timeout") or x.get("failed") for x in saved["runs"][name]):
                continue
            out = str(d / f"out{n}-{'-'.join(re.findall(r'[a-z]+', name.lower()))}.parquet")
            m = run(cmd(out), int(a.as_limit * 2**30), a.timeout)
            m["round"] = r
            saved["runs"][name].append(m)
            if m.get("timeout") or m.get("failed"):
                print(f"round {r}: {name}: {'failed' if m.get('failed') else 'stopped'} after {m['wall']:.0f} s, "
                      f"load {m['load']:.1f}: {m.get('error')}", file=sys.stderr, flush=True)
            else:
                rows, pairs = pairs_of(out)
                m["rows"] = rows
                if n <= a.check_pairs and name not in saved["pairs"]:
                    if ref is None:
                        ref = pairs
                    saved["pairs"][name] = {"rows": rows, "distinct": int(pairs.size),
                                            "same_as_first": bool(np.array_equal(pairs, ref))}
                print(f"round {r}: {name}: job {m['job']:.1f} s, wall {m['wall']:.1f} s, rows {rows:,}, "
                      f"peak RSS {m['peak_rss'] / 2**30:.2f} GiB, load {m['load']:.1f}", file=sys.stderr, flush=True)
            saved["load_end"] = os.getloadavg()
            Path(a.results).parent.mkdir(parents=True, exist_ok=True)
            Path(a.results).write_text(json.dumps(saved, indent=1))
    return saved


def render(saved: dict) -> str:
    n, runs = saved["records"], saved["runs"]
    first = next(iter(runs))
    # only rounds that ran every tool (a stopped measurement may end inside a round)
    full = set.intersection(*({x.get("round", i) for i, x in enumerate(v)} for v in runs.values() if
                              not any(y.get("timeout") or y.get("failed") for y in v)))
    runs = {k: [x for i, x in enumerate(v) if x.get("round", i) in full or x.get("timeout") or x.get("failed")]
            for k, v in runs.items()}
    done = {k: [x for x in v if not (x.get("timeout") or x.get("failed"))] for k, v in runs.items()}
    rounds = max(len(v) for v in done.values())
    loads = [m["load"] for v in runs.values() for m in v]
    m = saved["machine"]
    lines = [f"{n / 1e6:g}M + {n / 1e6:g}M records, one float64 key, partially sorted (2% of each stream displaced up "
             f"to 1,000 positions), tolerance {saved['eps']}, each A record with exactly one B record within it. "
             f"Machine: {m['cpu']}, {m['nproc']} cores shared with other jobs, {m['memory_gb']} GB; {m['java']}; "
             f"{saved['versions']}. Every run a whole process with its own JVM on `local[2]`, "
             f"`spark.driver.memory={saved['driver_memory']}`, address space capped at {saved['as_limit_gib']:g} GiB; "
             f"medians of {rounds} alternating rounds (of {saved.get('repeat', rounds)} asked); load average (1 min) "
             f"{min(loads):.1f}-{max(loads):.1f} before the runs. \"job\" is the time after the Spark session is up "
             "(reading, joining, writing); \"process wall\" is the whole process (interpreter, imports, JVM and "
             f"session start). Reproduce: `.venv/bin/python bench/bench_spark_peers.py --records {n} "
             f"--repeat {saved.get('repeat', rounds)}"
             + (f" --timeout {saved['timeout']:g}" if saved.get("timeout") else "")
             + (f" --tools {saved['tools']}" if saved.get("tools") else "")
             + " --write` (peers installed by hand: the script's docstring).", "",
             "| tool | job s (median) | best job s | job vs smerge | process wall s | wall vs smerge | "
             "session start s | peak RSS of the process tree GiB | pairs |", "|---|---|---|---|---|---|---|---|---|"]
    ref = {x["round"]: x for x in done[first]}

    def ratio(v, key):
        rs = [x[key] / ref[x["round"]][key] for x in v if x["round"] in ref]
        return f"{statistics.median(rs):.2f}x" if rs else "-"

    for name, v in done.items():
        stopped = [x for x in runs[name] if x.get("timeout") or x.get("failed")]
        if not v:
            x = stopped[0]
            what = (f"failed after {x['wall']:.0f} s: {'; '.join(x['error'][:2]) or 'no error line'}"
                    if x.get("failed") else f"did not finish: stopped after {x['wall']:.0f} s")
            lines.append(f"| {name} | {what} | | | | | | {x['peak_rss'] / 2**30:.2f} (at the end) | - |")
            continue
        lines.append(f"| {name} | {statistics.median(x['job'] for x in v):.1f} | {min(x['job'] for x in v):.1f} | "
                     f"{ratio(v, 'job')} | {statistics.median(x['wall'] for x in v):.1f} | {ratio(v, 'wall')} | "
                     f"{statistics.median(x['session'] for x in v):.1f} | "
                     f"{statistics.median(x['peak_rss'] for x in v) / 2**30:.2f} | "
                     f"{', '.join(sorted({format(x['rows'], ',') for x in v}))}"
                     + (f" ({len(stopped)} run stopped)" if stopped else "") + " |")
    if saved["pairs"]:
        same = all(p["same_as_first"] for p in saved["pairs"].values())
        lines += ["", f"Pair sets: {'identical' if same else '**different**'} across "
                  f"{', '.join(saved['pairs'])} (the sorted (A.i, B.i) pairs of one run of each tool compared)."]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
