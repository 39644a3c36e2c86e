"""Peak memory of `smerge cgm --local` at 1M and 8M records per input, per format (issue 11).

For each input format (Parquet, CSV, Arrow IPC, netCDF) and each output format, `smerge gen`
writes A and B (2% displaced records, B's coordinates jittered), then `smerge cgm --local` runs
in a child process whose peak resident set (``wait4``'s ``ru_maxrss``) is recorded. The target:
the 8M run within 1.3x of the 1M run (memory bounded by the window plus a batch, not by the
stream). Each child caps its address space at 6 GB so a regression fails instead of taking the
machine.

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
    a = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("SMERGE_BENCH_DIR")) as tmp:
        d = Path(tmp)
        for n in (a.small, a.large):
            for ext in sorted({c[0] for c in CASES}):
                for side, seed, extra in (("a", 1, []), ("b", 2, ["--jitter", "0.001"])):
                    subprocess.run([SMERGE, "gen", str(d / f"{side}{n}.{ext}"), "--records", str(n), "--randomize",
                                    "2", "--seed", str(seed), *extra], check=True, capture_output=True)
        for fin, fout in CASES:
            peaks = []
            for n in (a.small, a.large):
                peaks.append(peak_mib([SMERGE, "cgm", str(d / f"a{n}.{fin}"), str(d / f"b{n}.{fin}"), "--keys",
                                       "time,lat,lon", "--eps", "lat=0.002,lon=0.002", "--local", "-o",
                                       str(d / f"o.{fout}"), "--overwrite"]))
            rows.append((fin, fout, *peaks, peaks[1] / peaks[0]))
            print(f"{fin} -> {fout}: {peaks[0]:.0f} MiB at {a.small:,}, {peaks[1]:.0f} MiB at {a.large:,}: "
                  f"{peaks[1] / peaks[0]:.2f}x", flush=True)
    if a.write:
        write_section(a, rows)
    return 0


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


if __name__ == "__main__":
    sys.exit(main())
