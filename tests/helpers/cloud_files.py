"""CF grids written by netCDF4/xarray and their Zarr copies (v2 and v3, as xarray and zarr-python
write them), for the Zarr, GRIB and object-store tests."""

from __future__ import annotations

import netCDF4
import numpy as np
import xarray as xr

TIMES, LATS, LONS = 6, 5, 8


def cf_grid(path, *, packed=True, calendar="noleap") -> str:
    """A netCDF-4 grid with every CF rule the reader applies: CF times in a noleap calendar,
    a packed int16 variable (scale_factor, add_offset, _FillValue, missing_value), a float
    variable with valid_max, latitude as an auxiliary coordinate ``lat(y)``."""
    rng = np.random.default_rng(7)
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("time", TIMES)
        ds.createDimension("y", LATS)
        ds.createDimension("lon", LONS)
        t = ds.createVariable("time", "i4", ("time",))
        t.units, t.calendar = "days since 2001-02-27", calendar
        t[:] = np.arange(TIMES)  # 2001-02-27, 02-28, 03-01 (no Feb 29 in any year), ...
        lat = ds.createVariable("lat", "f8", ("y",))
        lat.units = "degrees_north"
        lat[:] = np.linspace(-20, 20, LATS)
        lon = ds.createVariable("lon", "f8", ("lon",))
        lon[:] = np.arange(LONS) * 45.0
        v = ds.createVariable("tas", "f4", ("time", "y", "lon"))
        v.valid_max = np.float32(2.0)
        data = rng.normal(size=(TIMES, LATS, LONS)).astype("f4")
        data[0, 0, :3] = 5.0  # outside valid_max: masked
        v[:] = data
        if packed:
            p = ds.createVariable("pr", "i2", ("time", "y", "lon"), fill_value=np.int16(-32767))
            p.scale_factor, p.add_offset = 0.01, 10.0
            p.missing_value = np.int16(-32766)
            p.set_auto_maskandscale(False)
            raw = rng.integers(-1000, 1000, size=(TIMES, LATS, LONS)).astype("i2")
            raw[1, 2, 3] = -32767
            raw[2, 3, 4] = -32766
            p[:] = raw
    return str(path)


def zarr_copy(nc: str, store: str, *, zarr_format: int, consolidated: bool, transpose=None, chunks=None) -> str:
    """The netCDF file as stored (not decoded: packing, fill values, CF times kept) in a Zarr store."""
    ds = xr.open_dataset(nc, decode_cf=False, mask_and_scale=False, decode_times=False)
    if transpose:
        ds = ds.transpose(*transpose)
    enc = {}
    for n, v in ds.data_vars.items():
        enc[n] = {"chunks": tuple((chunks or {}).get(d, s) for d, s in zip(v.dims, v.shape))}
    ds.to_zarr(store, zarr_format=zarr_format, consolidated=consolidated, mode="w", encoding=enc)
    ds.close()
    return str(store)
