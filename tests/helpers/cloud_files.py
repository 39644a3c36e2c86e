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


GRIB_LATS = np.array([20.0, 10.0, 0.0, -10.0, -20.0])  # GRIB's usual north-to-south rows
GRIB_LONS = np.arange(8) * 45.0


def grib_field(day: int, level: int = 0) -> np.ndarray:
    """A value unique to each place (day, row, column), in Kelvin-like range."""
    return (250.0 + day * 10 + level + np.arange(40.0).reshape(5, 8) / 8).astype("f8")


def write_grib(path, sample: str, messages) -> str:
    """GRIB messages built by ecCodes from its own sample template (``regular_ll_sfc_grib2``,
    ``regular_ll_sfc_grib1``): ``messages`` are ``(keys, values)`` on the 5 x 8 grid above;
    NaN values are written as missing (a bitmap)."""
    import eccodes

    with open(path, "wb") as f:
        for keys, values in messages:
            h = eccodes.codes_grib_new_from_samples(sample)
            try:
                for k, v in keys.items():
                    eccodes.codes_set(h, k, v)
                grid = dict(Ni=8, Nj=5, latitudeOfFirstGridPointInDegrees=20.0, longitudeOfFirstGridPointInDegrees=0.0,
                            latitudeOfLastGridPointInDegrees=-20.0, longitudeOfLastGridPointInDegrees=315.0,
                            iDirectionIncrementInDegrees=45.0, jDirectionIncrementInDegrees=10.0)
                for k, v in grid.items():
                    eccodes.codes_set(h, k, v)
                vals = np.asarray(values, dtype="f8").reshape(-1)
                if np.isnan(vals).any():
                    eccodes.codes_set(h, "bitmapPresent", 1)
                    eccodes.codes_set(h, "missingValue", 9999.0)
                    vals = np.where(np.isnan(vals), 9999.0, vals)
                eccodes.codes_set_values(h, vals)
                eccodes.codes_write(h, f)
            finally:
                eccodes.codes_release(h)
    return str(path)
