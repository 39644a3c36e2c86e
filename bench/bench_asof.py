"""`smerge cgm --local` as a whole process beside polars and pandas as-of joins (issue 11).

Data: A and B of N records each with one float64 key; A's keys are 0, 1, 2, ... plus noise of
+-0.1, B's the same keys plus +-0.01 jitter, each stream in arrival order with 2% of its records
moved up to 1,000 positions (partially sorted, as the CGM expects); one float32 payload column.
With eps = 0.05 every A record has exactly one B record within eps, so the three routes must
find the same pairs (asserted: the same number of pairs and the same checksum of B's payload).

Routes, each a fresh process timed from start to exit (imports included), Parquet in and out:
- smerge: `smerge cgm A B --keys k --eps 0.05 --local -o out.parquet`;
- polars: read both, sort, `join_asof(strategy="nearest", tolerance=0.05)`, drop the unmatched,
  write;
- pandas: the same with `merge_asof(direction="nearest", tolerance=0.05)`.
smerge's modules are byte-compiled first, as an installed package's are.
R interleaved rounds (smerge, polars, pandas, smerge, ...; a shared 2-core machine): the medians
of each route and the median of the per-round ratios (a round's routes ran back to back, so its
ratio is less moved by the machine's load drifting than the ratio of two medians); the best
runs too. Start-up cost is measured apart (`python -c "import smerge.cli.main"`, `import
polars`, `import pandas`), and the load average before and after is recorded.

Usage: .venv/bin/python bench/bench_asof.py [--records 3000000] [--repeat 3] [--write BENCHMARKS.md]
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

PY = sys.executable
EPS = 0.05

POLARS = """
import sys, polars as pl
a = pl.read_parquet(sys.argv[1]).sort("k"); b = pl.read_parquet(sys.argv[2]).sort("k")
o = a.join_asof(b.with_columns(pl.col("k").alias("k_b")), on="k", strategy="nearest", tolerance={eps}, suffix="_b")
o = o.filter(pl.col("k_b").is_not_null())
o.write_parquet(sys.argv[3])
print(o.height, float(o["v_b"].cast(pl.Float64).sum()))
"""
PANDAS = """
import sys, pandas as pd
a = pd.read_parquet(sys.argv[1]).sort_values("k", kind="stable"); b = pd.read_parquet(sys.argv[2]).sort_values("k", kind="stable")
b = b.assign(k_b=b["k"])
o = pd.merge_asof(a, b, on="k", direction="nearest", tolerance={eps}, suffixes=("", "_b")).dropna(subset=["k_b"])
o.to_parquet(sys.argv[3], index=False)
print(len(o), float(o["v_b"].astype("float64").sum()))
"""


def displaced(n: int, rng, pct: float = 2.0, dmax: int = 1000) -> np.ndarray:
    order = np.arange(n, dtype=np.float64)
    moved = rng.choice(n, int(n * pct / 100), replace=False)
    order[moved] += rng.integers(1, dmax + 1, moved.size) + 0.5
    return np.argsort(order, kind="stable")


def make(d: Path, n: int) -> tuple[str, str]:
    rng = np.random.default_rng(7)
    base = np.arange(n, dtype=np.float64) + rng.uniform(-0.1, 0.1, n)
    a = base[displaced(n, rng)]
    b = (base + rng.uniform(-0.01, 0.01, n))[displaced(n, rng)]
    pa_, pb = str(d / "a.parquet"), str(d / "b.parquet")
    pq.write_table(pa.table({"k": a, "v": rng.normal(size=n).astype("f4")}), pa_, row_group_size=262144)
    pq.write_table(pa.table({"k": b, "v": rng.normal(size=n).astype("f4")}), pb, row_group_size=262144)
    return pa_, pb


def byte_compile_smerge() -> None:
    """Write smerge's ``.pyc`` files, as installing a package does (the peers' are in
    site-packages): with ``PYTHONDONTWRITEBYTECODE`` set, an editable install otherwise
    compiles its ~40 modules from source in every process (~0.03-0.07 s)."""
    import compileall
    import importlib.util

    for pkg in ("smerge", "smerge.cli", "smerge.datasets", "smerge.jobs", "smerge.merge",
                "smerge.transport"):
        spec = importlib.util.find_spec(pkg)
        for d in (spec.submodule_search_locations or []) if spec else []:
            compileall.compile_dir(d, maxlevels=0, quiet=1)


def timed(cmd: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{cmd[:4]} failed: {r.stderr.strip()[-400:]}")
    return dt, r.stdout


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=3_000_000)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--write", default=None)
    a = ap.parse_args(argv)
    smerge = str(Path(PY).with_name("smerge"))
    with tempfile.TemporaryDirectory(dir=os.environ.get("SMERGE_BENCH_DIR")) as tmp:
        d = Path(tmp)
        fa, fb = make(d, a.records)
        byte_compile_smerge()
        routes = {
            "smerge cgm --local": lambda o: [smerge, "cgm", fa, fb, "--keys", "k", "--eps", str(EPS), "--local",
                                             "-o", o, "--overwrite", "--json"],
            "polars join_asof": lambda o: [PY, "-c", POLARS.format(eps=EPS), fa, fb, o],
            "pandas merge_asof": lambda o: [PY, "-c", PANDAS.format(eps=EPS), fa, fb, o],
        }
        times = {k: [] for k in routes}
        phases_all = []
        load_before = os.getloadavg()[0]
        for _ in range(a.repeat):
            for name, cmd in routes.items():
                out = str(d / f"{name.split()[0]}.parquet")
                dt, so = timed(cmd(out))
                times[name].append(dt)
                if name.startswith("smerge"):
                    s = json.loads(so)
                    phases_all.append({k: s[k] for k in ("fetch_seconds", "merge_seconds", "write_seconds",
                                                         "total_seconds")})
                    t = pq.read_table(out, columns=["v_b"])
                    pairs = (s["matched"], round(float(pa.compute.sum(t["v_b"].cast(pa.float64())).as_py()), 3))
                else:
                    n, chk = so.split()
                    got = (int(n), round(float(chk), 3))
                    assert got[0] == pairs[0] and abs(got[1] - pairs[1]) < 1e-3 * max(1, abs(pairs[1])), (name, got, pairs)
        startup = {k: statistics.median(timed([PY, "-c", c])[0] for _ in range(a.repeat)) for k, c in
                   (("smerge", "import smerge.cli.main"), ("polars", "import polars"), ("pandas", "import pandas"))}
        load = (load_before, os.getloadavg()[0])
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = {k: (statistics.median(x / y for x, y in zip(v, times["polars join_asof"])),
                 statistics.median(x / y for x, y in zip(v, times["pandas merge_asof"]))) for k, v in times.items()}
    rows = [(k, med[k], min(times[k]), *ratio[k]) for k in routes]
    phases = {k: statistics.median(p[k] for p in phases_all) for k in phases_all[0]}
    for r in rows:
        print(f"{r[0]}: median {r[1]:.2f} s, best {r[2]:.2f} s ({r[3]:.2f}x polars, {r[4]:.2f}x pandas, "
              "medians of the per-round ratios)")
    print("smerge phases (medians):", phases, "| start-up:", startup, "| pairs:", pairs[0], "| load:", load)
    if a.write:
        write_section(a, rows, phases, startup, pairs[0], load)
    return 0


def write_section(a, rows, phases, startup, pairs, load) -> None:
    lines = ["Machine:", "", common.machine_markdown(), "",
             f"{a.records:,} + {a.records:,} records, one float64 key (2% of each stream displaced up to 1,000 "
             f"positions), eps {EPS}; every route finds the same {pairs:,} pairs (asserted). Whole processes, Parquet "
             f"in and out, {a.repeat} interleaved rounds; load average {load[0]:.1f} before and {load[1]:.1f} after "
             "on the 2 cores. Ratios are the medians of the per-round ratios. Reproduce: "
             f"`.venv/bin/python bench/bench_asof.py --records {a.records} --repeat {a.repeat} --write BENCHMARKS.md` "
             "(or each command under `/usr/bin/time -v`).", "",
             "| route | median s | best s | vs polars | vs pandas |", "|---|---|---|---|---|"]
    for name, s, b, rp, rd in rows:
        lines.append(f"| {name} | {s:.2f} | {b:.2f} | {rp:.2f}x | {rd:.2f}x |")
    lines += ["", "smerge's own phases (its statistics, medians): " + ", ".join(f"{k} {v:.2f} s" for k, v in phases.items())
              + "; start-up (imports, medians): " + ", ".join(f"{k} {v:.2f} s" for k, v in startup.items()) + "."]
    common.replace_section("asof", "\n".join(lines), a.write, heading="CGM as a whole process beside polars and pandas as-of joins")


if __name__ == "__main__":
    sys.exit(main())
