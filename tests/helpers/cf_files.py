"""Small CF files with geolocation (station reports, curvilinear grids, bounds and grid
mappings) and a check that every variable an attribute names exists in a file."""

from __future__ import annotations

import netCDF4
import numpy as np

# Attributes whose values name variables (CF 1.8): plain name lists, and "key: name" pairs.
NAME_ATTRS = ("coordinates", "bounds", "climatology", "ancillary_variables")
PAIR_ATTRS = ("cell_measures", "formula_terms")


def referenced(var) -> dict[str, list[str]]:
    """attribute -> the variable names it references, for one netCDF4 variable."""
    out = {}
    for a in var.ncattrs():
        v = var.getncattr(a)
        if not isinstance(v, str):
            continue
        toks = v.split()
        if a in NAME_ATTRS:
            out[a] = toks
        elif a in PAIR_ATTRS:
            out[a] = [t for t in toks if not t.endswith(":")]
        elif a == "grid_mapping":
            out[a] = [t.rstrip(":") for t in toks]
    return out


def dangling(path: str) -> list[str]:
    """``var.attr -> name`` for every referenced name that is not a variable of the file."""
    bad = []
    with netCDF4.Dataset(path) as ds:
        for n, v in ds.variables.items():
            for a, names in referenced(v).items():
                bad += [f"{n}.{a} -> {x}" for x in names if x not in ds.variables]
    return bad


def station_report(path, *, b: bool = False, drop: int | None = None, coordinates: str | None = None) -> None:
    """A point list of 6 stations: lat/lon packed as short, time in hours since 2000-01-01 in the
    noleap calendar, a station_name char variable; A's payload ``p``, B's ``q``. B (``b=True``)
    may leave out station ``drop`` and names a B-only ``b_id`` in its ``coordinates``."""
    idx = [i for i in range(6) if i != drop]
    n = len(idx)
    with netCDF4.Dataset(path, "w") as ds:
        ds.featureType = "timeSeries"
        ds.createDimension("station", n)
        ds.createDimension("strlen", 8)
        lat = ds.createVariable("lat", "i2", ("station",), fill_value=np.int16(-32767))
        lat.setncatts({"units": "degrees_north", "standard_name": "latitude", "scale_factor": 0.01,
                       "add_offset": 0.0})
        lon = ds.createVariable("lon", "i2", ("station",), fill_value=np.int16(-32767))
        lon.setncatts({"units": "degrees_east", "standard_name": "longitude", "scale_factor": 0.01,
                       "add_offset": 100.0})
        t = ds.createVariable("time", "f8", ("station",))
        t.setncatts({"units": "hours since 2000-01-01 00:00", "calendar": "noleap", "standard_name": "time"})
        name = ds.createVariable("station_name", "S1", ("station", "strlen"))
        name.cf_role = "timeseries_id"
        v = ds.createVariable("q" if b else "p", "f4", ("station",), fill_value=np.float32(-999))
        v.units = "hPa"
        v.coordinates = coordinates or ("time lat lon b_id" if b else "time lat lon station_name")
        lat[:] = np.array([10.5, 11.25, 12.0, 13.75, 14.5, 15.0])[idx]
        lon[:] = np.array([-10.0, -5.5, 0.0, 5.25, 10.0, 20.0])[idx]
        t[:] = (np.arange(6) * 6.0 + 8760 * 3)[idx]  # three noleap years on
        name[:] = netCDF4.stringtochar(np.array([f"ST{i:03d}" for i in idx], dtype="S8"))
        v[:] = (np.arange(6, dtype=np.float32) + (100 if b else 0))[idx]
        if b:
            bid = ds.createVariable("b_id", "S1", ("station", "strlen"))
            bid[:] = netCDF4.stringtochar(np.array([f"B{i}" for i in idx], dtype="S8"))


def curvilinear(path, *, b: bool = False, with_time: bool = True) -> None:
    """A 3 x 4 curvilinear grid, ``lat2d(y, x)``, ``lon2d(y, x)``; A's payload ``p``, B's ``q``
    on (time, y, x) (2 steps) or on (y, x) alone. B names a B-only ``b_mask`` in ``coordinates``."""
    nt, ny, nx = 2, 3, 4
    dims = ("time", "y", "x") if with_time else ("y", "x")
    shape = (nt, ny, nx) if with_time else (ny, nx)
    with netCDF4.Dataset(path, "w") as ds:
        if with_time:
            ds.createDimension("time", nt)
            t = ds.createVariable("time", "f8", ("time",))
            t.setncatts({"units": "days since 2000-01-01", "calendar": "360_day"})
            t[:] = [0, 1]
        ds.createDimension("y", ny)
        ds.createDimension("x", nx)
        yy, xx = np.meshgrid(np.arange(ny), np.arange(nx), indexing="ij")
        la = ds.createVariable("lat2d", "f4", ("y", "x"))
        la.setncatts({"units": "degrees_north", "standard_name": "latitude", "bounds": "lat2d_bnds"})
        la[:] = 40 + yy + 0.1 * xx
        ds.createDimension("nv4", 4)
        lb = ds.createVariable("lat2d_bnds", "f4", ("y", "x", "nv4"))
        lb[:] = (40 + yy + 0.1 * xx)[..., None] + np.array([-.5, -.5, .5, .5])
        lo = ds.createVariable("lon2d", "f4", ("y", "x"))
        lo.setncatts({"units": "degrees_east", "standard_name": "longitude"})
        lo[:] = -100 + xx + 0.1 * yy
        v = ds.createVariable("q" if b else "p", "f4", dims)
        v.coordinates = "lat2d lon2d b_mask" if b else "lat2d lon2d"
        v[:] = np.arange(np.prod(shape), dtype=np.float32).reshape(shape) + (1000 if b else 0)
        if b:
            m = ds.createVariable("b_mask", "i1", ("y", "x"))
            m[:] = 1


def regular_bounds(path, *, b: bool = False) -> None:
    """A (time, lat, lon) grid with ``lat_bnds``, a ``crs`` grid mapping and a ``cell_area``
    cell measure; B's ``q`` names a B-only grid mapping ``b_crs`` and cell measure ``b_area``."""
    nt, ny, nx = 2, 3, 4
    with netCDF4.Dataset(path, "w") as ds:
        for d, n in (("time", nt), ("lat", ny), ("lon", nx), ("nv", 2)):
            ds.createDimension(d, n)
        t = ds.createVariable("time", "f8", ("time",))
        t.units = "days since 2000-01-01"
        t[:] = [0, 1]
        la = ds.createVariable("lat", "f4", ("lat",))
        la.setncatts({"units": "degrees_north", "bounds": "lat_bnds"})
        la[:] = [0, 1, 2]
        lb = ds.createVariable("lat_bnds", "f4", ("lat", "nv"))
        lb[:] = [[-.5, .5], [.5, 1.5], [1.5, 2.5]]
        lo = ds.createVariable("lon", "f4", ("lon",))
        lo.units = "degrees_east"
        lo[:] = [0, 1, 2, 3]
        crs = ds.createVariable("b_crs" if b else "crs", "i4", ())
        crs.grid_mapping_name = "latitude_longitude"
        area = ds.createVariable("b_area" if b else "cell_area", "f4", ("lat", "lon"))
        area.units = "m2"
        area[:] = 1.0
        v = ds.createVariable("q" if b else "p", "f4", ("time", "lat", "lon"))
        v.grid_mapping = "b_crs" if b else "crs"
        v.cell_measures = "area: b_area" if b else "area: cell_area"
        v[:] = np.arange(nt * ny * nx, dtype=np.float32).reshape(nt, ny, nx) + (1000 if b else 0)
