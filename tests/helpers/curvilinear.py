"""A rotated curvilinear grid with repeated points: time x y x x records keyed by (time, lat2d, lon2d).

The grid is rotated by 30 degrees, so along the storage order the keys are not in lexicographic
order, and its coordinates are rounded to 0.1 degree (neighbouring cells share a point), with
every 7th row / 5th column cell moved onto the point of cell (0, 0): runs of equal keys, some
longer than a window.
"""

from __future__ import annotations

import numpy as np


def curvilinear_keys(ny: int, nx: int) -> tuple[np.ndarray, np.ndarray]:
    yy, xx = np.meshgrid(np.arange(ny), np.arange(nx), indexing="ij")
    th = np.deg2rad(30.0)
    lat = np.round(20 + 0.1 * (yy * np.cos(th) - xx * np.sin(th)), 1)
    lon = np.round(-100 + 0.1 * (yy * np.sin(th) + xx * np.cos(th)), 1)
    lat[::7, ::5], lon[::7, ::5] = lat[0, 0], lon[0, 0]
    return lat, lon


def write_curvilinear(path, nt: int = 2, ny: int = 40, nx: int = 60, seed: int = 0) -> np.ndarray:
    """Write the grid as netCDF (variable ``u(time, y, x)``); returns its (time, lat, lon) key rows
    in storage (C) order."""
    import netCDF4

    lat, lon = curvilinear_keys(ny, nx)
    t = np.arange(nt) * 6.0
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("time", nt)
        ds.createDimension("y", ny)
        ds.createDimension("x", nx)
        tv = ds.createVariable("time", "f8", ("time",))
        tv.units = "hours since 2000-01-01"
        tv[:] = t
        ds.createVariable("lat2d", "f8", ("y", "x"))[:] = lat
        ds.createVariable("lon2d", "f8", ("y", "x"))[:] = lon
        ds.createVariable("u", "f4", ("time", "y", "x"))[:] = np.random.default_rng(seed).normal(size=(nt, ny, nx))
    return np.column_stack([np.repeat(t, ny * nx), np.tile(lat.ravel(), nt), np.tile(lon.ravel(), nt)])
