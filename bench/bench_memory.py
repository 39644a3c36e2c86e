"""Peak memory of `smerge cgm|rtm|wjoin --local` at 1M and 8M records per input (issue 11).

For each input format (Parquet, CSV, Arrow IPC, netCDF) and each output format, `smerge gen`
writes A and B (2% displaced records, B's coordinates jittered), then `smerge cgm --local` runs
in a child process whose peak resident set (``wait4``'s ``ru_maxrss``) is recorded. The target:
the 8M run within 1.3x of the 1M run (memory bounded by the window plus a batch, not by the
stream). Each child caps its address space at 6 GB so a regression fails instead of taking the
machine.

``rtm --local`` and ``wjoin --local`` run over the Parquet inputs the same way. RTM's embedded
index server holds B whole by design (docs/semantics.md section 5: the server holds stream B and
answers range queries over all of it), so RTM is measured three ways: A and B both growing
(O(|B|): the index), A growing with B fixed at the small size (the streamed side: the 1.3x
target), and B growing with A fixed (the index's bytes per B record). The W-join (sorted
``smerge gen`` streams without displacement, ``--on lat,lon --window 6h``) streams every input.

Usage: .venv/bin/python bench/bench_memory.py [--small 1000000] [--large 8000000] [--write BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402 - bench/common.py

SMERGE = str(Path(sys.executable).with_name("smerge"))
CASES = [("parquet", "parquet"), ("csv", "parquet"), ("arrow", "parquet"), ("nc", "parquet"),
         ("parquet", "csv"), ("parquet", "arrow"), ("nc", "nc")]
CAP = 6 << 30


def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))


def peak_mib(cmd: list[str]) -> float:
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=_cap)
    _, status, usage = os.wait4(p.pid, 0)
    err = p.stderr.read().decode()
    p.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} failed: {err.strip()[-300:]}")
    return usage.ru_maxrss / 1024


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", type=int, default=1_000_000)
    ap.add_argument("--large", type=int, default=8_000_000)
    ap.add_argument("--write", default=None)
    ap.add_argument("--no-cgm", dest="cgm", action="store_false", help="skip the cgm rows")
    ap.add_argument("--no-engines", dest="engines", action="store_false", help="skip the rtm and wjoin rows")
    a = ap.parse_args(argv)
    rows, engines = [], []
    with tempfile.TemporaryDirectory(dir=os.environ.get("SMERGE_BENCH_DIR")) as tmp:
        d = Path(tmp)
        for n in (a.small, a.large):
            for ext in sorted({c[0] for c in CASES}) if a.cgm else ["parquet"]:
                for side, seed, extra in (("a", 1, []), ("b", 2, ["--jitter", "0.001"])):
                    subprocess.run([SMERGE, "gen", str(d / f"{side}{n}.{ext}"), "--records", str(n), "--randomize",
                                    "2", "--seed", str(seed), *extra], check=True, capture_output=True)
        if a.engines:
            for n in (a.small, a.large):
                for side, seed in (("a", 1), ("b", 2)):
                    subprocess.run([SMERGE, "gen", str(d / f"s{side}{n}.parquet"), "--records", str(n), "--seed",
                                    str(seed)], check=True, capture_output=True)
            engines = engine_rows(d, a)
        for fin, fout in CASES if a.cgm else ():
            peaks = []
            for n in (a.small, a.large):
                peaks.append(peak_mib([SMERGE, "cgm", str(d / f"a{n}.{fin}"), str(d / f"b{n}.{fin}"), "--keys",
                                       "time,lat,lon", "--eps", "lat=0.002,lon=0.002", "--local", "-o",
                                       str(d / f"o.{fout}"), "--overwrite"]))
            rows.append((fin, fout, *peaks, peaks[1] / peaks[0]))
            print(f"{fin} -> {fout}: {peaks[0]:.0f} MiB at {a.small:,}, {peaks[1]:.0f} MiB at {a.large:,}: "
                  f"{peaks[1] / peaks[0]:.2f}x", flush=True)
    if a.write and a.cgm:
        write_section(a, rows)
    if a.write and a.engines:
        write_engines_section(a, engines)
    return 0


def engine_rows(d: Path, a) -> list[tuple[str, str, float, float]]:
    """(engine, what grows, MiB small, MiB large) for rtm and wjoin over Parquet."""
    S, L = a.small, a.large

    def rtm(na: int, nb: int) -> float:
        return peak_mib([SMERGE, "rtm", str(d / f"a{na}.parquet"), str(d / f"b{nb}.parquet"), "--keys",
                         "time,lat,lon", "--eps", "lat=0.002,lon=0.002", "--local", "-o", str(d / "o.parquet"),
                         "--overwrite"])

    def wjoin(n: int) -> float:
        return peak_mib([SMERGE, "wjoin", str(d / f"sa{n}.parquet"), str(d / f"sb{n}.parquet"), "--time", "time",
                         "--on", "lat,lon", "--window", "6h", "--local", "-o", str(d / "o.parquet"), "--overwrite"])

    cases = [("rtm", "A and B", (S, S), (L, L)), ("rtm", f"A only (B at {S:,})", (S, S), (L, S)),
             ("rtm", f"B only (A at {S:,})", (S, S), (S, L))]
    out = []
    for engine, what, small, large in cases:
        ps, pl = rtm(*small), rtm(*large)
        out.append((engine, what, ps, pl))
    out.append(("wjoin", "both streams", wjoin(S), wjoin(L)))
    for engine, what, ps, pl in out:
        print(f"{engine} ({what} growing): {ps:.0f} MiB at {S:,}, {pl:.0f} MiB at {L:,}: {pl / ps:.2f}x", flush=True)
    return out


def write_section(a, rows) -> None:
    lines = ["Machine:", "", common.machine_markdown(), "",
             f"Peak resident memory of `smerge cgm --local` (whole process, `wait4`'s ru_maxrss) at {a.small:,} and "
             f"{a.large:,} records per input; `smerge gen` data (2% displaced, B jittered), keys time,lat,lon, "
             "window 5,000. Target: the large run within 1.3x of the small one. Reproduce: "
             f"`.venv/bin/python bench/bench_memory.py --write BENCHMARKS.md` (or `/usr/bin/time -v` on each run).", "",
             f"| input | output | MiB at {a.small:,} | MiB at {a.large:,} | ratio |", "|---|---|---|---|---|"]
    for fin, fout, s, l, r in rows:
        lines.append(f"| {fin} | {fout} | {s:.0f} | {l:.0f} | {r:.2f}x{'' if r <= 1.3 else ' (over)'} |")
    common.replace_section("memory", "\n".join(lines), a.write, heading="Memory against stream length (cgm --local)")


def write_engines_section(a, engines) -> None:
    S, L = a.small, a.large
    lines = ["Machine:", "", common.machine_markdown(), "",
             f"Peak resident memory (whole process, `wait4`'s ru_maxrss, address space capped at {CAP >> 30} GB) of "
             f"`smerge rtm --local` and `smerge wjoin --local` at {S:,} and {L:,} records per input, Parquet in and "
             "out. RTM: the cgm data above, keys time,lat,lon, eps lat=0.002,lon=0.002, window 5,000, B served by "
             "the embedded index server. W-join: `smerge gen` streams in time order (seeds 1 and 2), "
             "`--on lat,lon --window 6h`. Target: the large run within 1.3x of the small one. Reproduce: "
             "`.venv/bin/python bench/bench_memory.py --no-cgm --write BENCHMARKS.md`.", "",
             f"| engine | growing | MiB at {S:,} | MiB at {L:,} | ratio |", "|---|---|---|---|---|"]
    for engine, what, ps, pl in engines:
        r = pl / ps
        lines.append(f"| {engine} | {what} | {ps:.0f} | {pl:.0f} | {r:.2f}x{'' if r <= 1.3 else ' (over)'} |")
    per_b = [(pl - ps) * (1 << 20) / (L - S) for engine, what, ps, pl in engines if what.startswith("B only")]
    if per_b:
        lines += ["", f"RTM's index of B: {per_b[0]:.0f} bytes of resident memory per B record (the B-only row's "
                  f"growth over {L - S:,} records)."]
    common.replace_section("memory-engines", "\n".join(lines), a.write,
                           heading="Memory against stream length (rtm and wjoin --local)")


if __name__ == "__main__":
    sys.exit(main())
