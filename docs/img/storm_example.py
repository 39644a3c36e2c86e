"""Make docs/img/storm_cgm.png: Pstorm merged with a partly shuffled point list of Tstorm.

20% of Tstorm's records are moved by up to +-10,000 positions (the displacement model of
`smerge gen`, seed 14), so a window of N = 1,000 drops some: kappa varies per report window.
Run from the repository root: python docs/img/storm_example.py (writes into a temporary folder,
then the PNG here).
"""

import os
import subprocess
import sys
import tempfile

import numpy as np
import xarray as xr

NCAR = "/usr/share/ncarg/data/cdf"
HERE = os.path.dirname(os.path.abspath(__file__))


def shuffled_points(path: str, pct: float = 20.0, displacement: int = 10000, seed: int = 14) -> None:
    t = xr.open_dataset(os.path.join(NCAR, "Tstorm.cdf")).t.load()
    flat = t.stack(record=("timestep", "lat", "lon")).reset_index("record")
    n = flat.sizes["record"]
    rng = np.random.default_rng(seed)
    pos = np.arange(n, dtype=np.float64)
    moved = rng.choice(n, size=round(pct / 100 * n), replace=False)
    pos[moved] = np.clip(pos[moved] + rng.integers(-displacement, displacement + 1, moved.size), 0, n - 1)
    order = np.argsort(pos + np.arange(n) * 1e-9, kind="stable")
    pts = flat.isel(record=order)
    ds = xr.Dataset({"t": ("record", pts.values, dict(t.attrs))},
                    coords={k: ("record", pts[k].values) for k in ("timestep", "lat", "lon")})
    ds.to_netcdf(path)


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        b = os.path.join(d, "Tpoints.nc")
        shuffled_points(b)
        stats = os.path.join(d, "run.json")
        smerge = [sys.executable, "-m", "smerge"]
        subprocess.run(smerge + ["cgm", "--local", os.path.join(NCAR, "Pstorm.cdf"), b, "--eps", "lat=0.001,lon=0.001",
                                 "--window", "1000", "--increment", "500", "--delta", "0.05",
                                 "-o", os.path.join(d, "o.parquet"), "--stats", stats], check=False)
        subprocess.run(smerge + ["plot", stats, "-o", os.path.join(HERE, "storm_cgm.png"), "--overwrite",
                                 "--title", "cgm: Pstorm.cdf + Tstorm.cdf (20% of B moved up to 10,000 records), "
                                 "N = 1,000, K = 500"], check=True)


if __name__ == "__main__":
    main()
