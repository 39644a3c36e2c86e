"""Gridded netCDF files built to be awkward: any dimension order, reversed or auxiliary
coordinates, sub-regions and strided subsets, dimensions without coordinates."""

from __future__ import annotations

import itertools

import netCDF4
import numpy as np

SIZES = {"time": 4, "level": 3, "lat": 24, "lon": 30}


def coords(dims=("time", "lat", "lon"), sizes=None):
    sizes = {**SIZES, **(sizes or {})}
    c = {"time": np.arange(sizes["time"]) * 6.0, "level": np.array([1000.0, 850.0, 500.0, 250.0])[:sizes["level"]],
         "lat": np.linspace(-60.0, 60.0, sizes["lat"]), "lon": np.arange(sizes["lon"]) * 3.0}
    return {d: c[d] for d in dims}


def field(c: dict) -> np.ndarray:
    """A value unique to each place: it tells which cell a pair joined."""
    dims = list(c)
    grids = np.meshgrid(*[c[d] for d in dims], indexing="ij")
    scale = {"time": 1e6, "level": 1e4, "lat": 1e2, "lon": 1.0}
    return sum(g * scale[d] for g, d in zip(grids, dims)).astype("f8")


def write_grid(path, order, *, dims=("time", "lat", "lon"), sizes=None, flip=(), dim_names=None,
               select=None, coord_vars=True, mark=True, fmt="NETCDF4"):
    """The field on ``dims`` stored with its dimensions in ``order``.

    ``flip``: dimensions stored backwards; ``dim_names``: dimension names that differ from the
    coordinate variables (``{"lat": "latitude"}``: ``lat(latitude)``); ``select``: a slice per
    dimension (sub-regions, strided subsets); ``coord_vars=False``: no coordinate variables at all
    (dimensions keyed by index); ``mark=False``: auxiliary coordinates without CF marks."""
    c = coords(dims, sizes)
    for d, sl in (select or {}).items():
        c[d] = c[d][sl]
    for d in flip:
        c[d] = c[d][::-1]
    data = field(c)
    names = {d: (dim_names or {}).get(d, d) for d in dims}
    with netCDF4.Dataset(path, "w", format=fmt) as ds:
        for d in order:
            ds.createDimension(names[d], len(c[d]))
        if coord_vars:
            for d in dims:
                v = ds.createVariable(d, "f8", (names[d],))
                if mark:
                    v.units = {"time": "hours since 2000-01-01 00:00", "level": "hPa", "lat": "degrees_north",
                               "lon": "degrees_east"}[d]
                    if d == "level":
                        v.positive = "down"
                v[:] = c[d]
        v = ds.createVariable("T", "f8", tuple(names[d] for d in order))
        v[:] = np.transpose(data, [dims.index(d) for d in order])
    return str(path)


def permutations(dims):
    return list(itertools.permutations(dims))
