"""Run every bench/bench_*.py that exists (``make bench``); ``run_all.py cgm rtm`` runs only those.

Each script writes its own section of BENCHMARKS.md. Exit status: the number of failed scripts.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    scripts = sorted(HERE.glob("bench_*.py"))
    if argv:
        scripts = [s for s in scripts if any(a in s.stem for a in argv)]
    failed = []
    for s in scripts:
        print(f"== {s.name}", flush=True)
        r = subprocess.run([sys.executable, str(s)], cwd=HERE.parent)
        if r.returncode != 0:
            failed.append(s.name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return len(failed)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
