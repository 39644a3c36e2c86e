"""smerge.xarray.merge beside xarray's reindex_like(method="nearest", tolerance) + merge.

Two netCDF grids (time x lat x lon, float32 payload), B's lat/lon carrying 1e-6 noise (so
exact alignment fails), opened lazily. Each method runs in its own process (address space
capped with RLIMIT_AS) and reports wall seconds and its peak RSS (ru_maxrss), minus that of a
process that only imports and opens. Results: the `xarray` section of BENCHMARKS.md.

    .venv/bin/python bench/bench_xarray.py [--quick] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
METHODS = ("smerge-cgm", "smerge-exact-grid", "xarray-reindex_like+merge")
AS_LIMIT = 4 << 30
NOTE = ("`smerge-cgm` merges point by point (one key record per grid point through the CGM engine, "
        "N = 2 x 180 x 360 by default), so it costs tens of times xarray's per-axis reindex on a rectilinear grid; "
        "its memory is the window (here most of it), a slab of each input and the result on A's grid, not the whole of B. `smerge-exact-grid` matches each "
        "axis on its own like reindex_like and reads B slab by slab: the choice for rectilinear grids. Both give "
        "the same values as the peer here (matched column).")


def make(d: str, nt: int) -> tuple[str, str]:
    import numpy as np
    import xarray as xr

    lat, lon = np.linspace(-89.5, 89.5, 180), np.linspace(0.5, 359.5, 360)
    rng = np.random.default_rng(0)
    a = xr.Dataset({"p": (("time", "lat", "lon"), rng.random((nt, 180, 360), dtype=np.float32))},
                   coords={"time": np.arange(nt, dtype=np.float64), "lat": lat, "lon": lon})
    b = xr.Dataset({"t": (("time", "lat", "lon"), rng.random((nt, 180, 360), dtype=np.float32))},
                   coords={"time": np.arange(nt, dtype=np.float64), "lat": lat + 1e-6, "lon": lon - 1e-6})
    pa, pb = os.path.join(d, "a.nc"), os.path.join(d, "b.nc")
    a.to_netcdf(pa)
    b.to_netcdf(pb)
    return pa, pb


def one(method: str, pa: str, pb: str, traced: str = "0") -> dict:
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))
    import numpy as np
    import xarray as xr

    import smerge.xarray as sx

    a, b = xr.open_dataset(pa), xr.open_dataset(pb)
    if traced == "1":
        import tracemalloc

        import pyarrow

        tracemalloc.start()
        arrow0 = pyarrow.default_memory_pool().max_memory()
    t0 = time.perf_counter()
    if method == "baseline":  # imports and opening only: subtracted from the others' peaks
        return {"method": method, "seconds": 0.0, "peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}
    if method == "xarray-reindex_like+merge":
        m = xr.merge([a, b.reindex_like(a, method="nearest", tolerance=1e-4)])
    else:
        m = sx.merge(a, b, eps=1e-4, how=method.split("-", 1)[1])
    t = m.t.values  # B's variable on A's grid, in memory
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if traced == "1":
        traced_mb = (tracemalloc.get_traced_memory()[1] + pyarrow.default_memory_pool().max_memory() - arrow0) / 2**20
        return {"method": method, "traced_mb": traced_mb}
    return {"method": method, "seconds": wall, "peak_kb": peak, "matched": int(np.isfinite(t).sum()),
            "points": int(t.size)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--one", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(*args.one)))
        return
    from common import machine, machine_markdown, md_table, replace_section

    nt = 4 if args.quick else 40
    with tempfile.TemporaryDirectory() as d:
        pa, pb = make(d, nt)
        rows = []
        for rep in range(2):
            for mth in ("baseline",) + METHODS:
                for traced in ("0", "1") if mth != "baseline" else ("0",):
                    out = subprocess.run([sys.executable, __file__, "--one", mth, pa, pb, traced],
                                         capture_output=True, text=True, check=True).stdout
                    rows.append(json.loads(out.strip().splitlines()[-1]))
    best = {m: min((r for r in rows if r["method"] == m and "seconds" in r), key=lambda r: r["seconds"])
            for m in METHODS}
    for m in METHODS:
        best[m]["traced_mb"] = min(r["traced_mb"] for r in rows if r["method"] == m and "traced_mb" in r)
    base_kb = min(r["peak_kb"] for r in rows if r["method"] == "baseline")
    for r in best.values():
        r["peak_mb"] = max(r["peak_kb"] - base_kb, 0) / 1024
    peer = best["xarray-reindex_like+merge"]
    table = md_table(["method", "seconds (best of 2)", "x peer time", "peak allocated MB", "x peer memory",
                      "peak RSS growth MB", "matched / points"],
                     [[m, r["seconds"], f"{r['seconds'] / peer['seconds']:.2f}", f"{r['traced_mb']:.1f}",
                       f"{r['traced_mb'] / peer['traced_mb']:.2f}", f"{r['peak_mb']:.0f}",
                       f"{r['matched']:,} / {r['points']:,}"]
                      for m, r in best.items()])
    text = (f"Grids {nt} x 180 x 360 ({nt * 180 * 360:,} points, float32 payload), B's lat/lon off by 1e-6, "
            "eps = 1e-4, both opened lazily from netCDF; each method in its own process (RLIMIT_AS 4 GiB); "
            "peak allocated = tracemalloc's peak (numpy and Python) plus the Arrow pool's, in a separate traced run; peak RSS growth = the process's ru_maxrss minus that of a process that only imports and opens the files (coarse: import-time peaks hide small growth); `python bench/bench_xarray.py`.\n\n"
            + table + "\n\n" + NOTE + "\n\nMachine:\n\n" + machine_markdown(machine()))
    print(text)
    if not args.no_write and not args.quick:
        replace_section("xarray", text)


if __name__ == "__main__":
    main()
