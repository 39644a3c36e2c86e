"""Zarr output (-o out.zarr, --format zarr): the netCDF output's content in a Zarr v3 store, read
back by xarray (xr.open_zarr) equal to the netCDF output of the same merge (values, coordinates,
attributes, calendars, stored packing); written bucket by bucket in chunks along the outer
dimension; committed whole (a staging folder renamed into place, smerge's marker in it)."""

from __future__ import annotations

import os

import netCDF4
import numpy as np
import pytest
import xarray as xr
from cf_files import station_report
from cloud_files import cf_grid, zarr_copy

from smerge.cli.main import main

ARGS = ("--keys", "time,lat,lon", "--eps", "time=0s,lat=0.1,lon=0.1", "--local")


def run(capsys, *args):
    rc = main([str(a) for a in args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def grid_b(a: str, path) -> str:
    """B: A's grid moved by 0.01 degree, one variable; the last longitude moved by 1 degree (no pair)."""
    with netCDF4.Dataset(a) as s, netCDF4.Dataset(path, "w") as d:
        for n, dim in s.dimensions.items():
            d.createDimension(n, len(dim))
        for n in ("time", "lat", "lon"):
            v = d.createVariable(n, s[n].dtype, s[n].dimensions)
            v.setncatts({k: s[n].getncattr(k) for k in s[n].ncattrs()})
            shift = np.zeros(s[n].shape)
            if n != "time":
                shift += 0.01
            if n == "lon":
                shift[-1] = 1.0
            v[:] = s[n][:] + shift
        w = d.createVariable("obs", "f8", ("time", "y", "lon"))
        w.units, w.long_name = "K", "observed"
        w[:] = np.arange(np.prod(s["tas"].shape), dtype="f8").reshape(s["tas"].shape)
    return str(path)


def same(nc: str, store: str, **kw) -> None:
    """xarray reads the store as it reads the netCDF file (but for the history's time stamp)."""
    with xr.open_dataset(nc, **kw) as n, xr.open_zarr(store, **kw) as z:
        n, z = n.load(), z.load()
        assert n.attrs.pop("history").split(": ", 1)[1] == z.attrs.pop("history").split(": ", 1)[1]
        xr.testing.assert_identical(n, z)
        assert list(z.variables) and set(z.variables) == set(n.variables)
        for v in n.variables:
            if n[v].dtype.kind in "OUT" and z[v].dtype.kind in "OUT":
                continue  # text: xarray gives a netCDF string variable as '<U', a Zarr one as StringDType
            assert z[v].dtype == n[v].dtype, v
            for k in ("units", "calendar"):
                assert z[v].encoding.get(k) == n[v].encoding.get(k), (v, k)


def test_zarr_output_equals_the_netcdf_output(tmp_path, capsys):
    a = cf_grid(tmp_path / "a.nc", packed=True, calendar="noleap")
    b = grid_b(a, tmp_path / "b.nc")
    rc, _, se = run(capsys, "cgm", a, b, *ARGS, "-o", tmp_path / "out.nc")
    assert rc == 0, se
    rc, _, se = run(capsys, "cgm", a, b, *ARGS, "-o", tmp_path / "out.zarr")
    assert rc == 0, se
    nc, store = str(tmp_path / "out.nc"), str(tmp_path / "out.zarr")
    same(nc, store)  # decoded: noleap times, unpacked pr, masks
    same(nc, store, decode_cf=False, mask_and_scale=False, decode_times=False)  # as stored: int16 pr, raw days
    with xr.open_zarr(store) as z:
        assert z.time.encoding["calendar"] == "noleap" and z.time.encoding["units"] == "days since 2001-02-27"
        assert np.isnan(z.obs.values[:, :, -1]).all() and not np.isnan(z.obs.values[:, :, :-1]).any()
        assert z.pr.encoding["dtype"] == np.int16
    assert os.path.isfile(os.path.join(store, ".smerge-dataset"))
    # --format zarr names the format of a path without the extension
    rc, _, se = run(capsys, "cgm", a, b, *ARGS, "-o", tmp_path / "out2", "--format", "zarr")
    assert rc == 0, se
    same(nc, str(tmp_path / "out2"))


def test_written_bucket_by_bucket_in_chunks(tmp_path, capsys, monkeypatch):
    """Buckets of one time slab (the writer's spill buckets): one chunk per slab, same values."""
    from smerge.datasets import netcdf_writer

    a = cf_grid(tmp_path / "a.nc", packed=False)
    b = grid_b(a, tmp_path / "b.nc")
    rc, _, se = run(capsys, "cgm", a, b, *ARGS, "-o", tmp_path / "out.nc")
    assert rc == 0, se
    monkeypatch.setattr(netcdf_writer, "BUCKET_CELLS", 40)  # 5 x 8 cells: one slab per bucket
    rc, _, se = run(capsys, "cgm", a, b, *ARGS, "-o", tmp_path / "out.zarr")
    assert rc == 0, se
    same(str(tmp_path / "out.nc"), str(tmp_path / "out.zarr"))
    with xr.open_zarr(tmp_path / "out.zarr") as z:
        assert z.obs.encoding["chunks"] == (1, 5, 8) and z.tas.encoding["chunks"] == (1, 5, 8)


def test_zarr_output_of_a_zarr_store_and_of_a_station_report(tmp_path, capsys):
    a = cf_grid(tmp_path / "a.nc", packed=True)
    b = grid_b(a, tmp_path / "b.nc")
    za = zarr_copy(a, tmp_path / "a.zarr", zarr_format=3, consolidated=False, chunks={"time": 2})
    rc, _, se = run(capsys, "cgm", a, b, *ARGS, "-o", tmp_path / "ref.nc")
    assert rc == 0, se
    for out in ("z.zarr", "z.nc"):  # A a Zarr store: both grid outputs hold what A=netCDF gives
        rc, _, se = run(capsys, "cgm", za, b, *ARGS, "-o", tmp_path / out)
        assert rc == 0, se
    with xr.open_dataset(tmp_path / "ref.nc") as r, xr.open_dataset(tmp_path / "z.nc") as n, \
            xr.open_zarr(tmp_path / "z.zarr") as z:
        for d in (n, z):
            xr.testing.assert_equal(r.load(), d.load())
            assert d.time.encoding["calendar"] == "noleap"
    # a station report: text variables and auxiliary coordinates of A copied as in the netCDF output
    sa, sb = tmp_path / "sa.nc", tmp_path / "sb.nc"
    station_report(sa)
    station_report(sb, b=True, drop=3)
    rc, _, se = run(capsys, "cgm", sa, sb, "--keys", "time,lat,lon", "--local", "-o", tmp_path / "s.nc")
    assert rc == 0, se
    rc, _, se = run(capsys, "cgm", sa, sb, "--keys", "time,lat,lon", "--local", "-o", tmp_path / "s.zarr")
    assert rc == 0, se
    same(str(tmp_path / "s.nc"), str(tmp_path / "s.zarr"))


def test_zarr_output_is_committed_whole(tmp_path, capsys):
    a = cf_grid(tmp_path / "a.nc", packed=False)
    b = grid_b(a, tmp_path / "b.nc")
    out = tmp_path / "out.zarr"
    rc, _, se = run(capsys, "cgm", a, b, *ARGS, "-o", out)
    assert rc == 0, se
    before = sorted(os.listdir(out))
    rc, _, se = run(capsys, "cgm", a, b, *ARGS, "-o", out)
    assert rc == 2 and "already exists; pass --overwrite" in se, se
    rc, _, se = run(capsys, "cgm", a, b, *ARGS, "-o", out, "--overwrite")
    assert rc == 0 and sorted(os.listdir(out)) == before, se
    os.mkdir(tmp_path / "theirs.zarr")
    (tmp_path / "theirs.zarr" / "notes.txt").write_text("x")
    rc, _, se = run(capsys, "cgm", a, b, *ARGS, "-o", tmp_path / "theirs.zarr", "--overwrite")
    assert rc == 2 and "smerge did not write" in se, se
    # a failed run (B's last key is NaN) leaves neither the store nor a staging folder
    with netCDF4.Dataset(b, "a") as d:
        d["lon"][-1] = np.nan
    rc, _, se = run(capsys, "cgm", a, b, *ARGS, "-o", tmp_path / "failed.zarr")
    assert rc == 2 and len(se.strip().splitlines()) == 1, se
    assert not (tmp_path / "failed.zarr").exists()
    assert not [n for n in os.listdir(tmp_path) if ".smerge-" in n]


def test_zarr_output_on_s3(s3, tmp_path, capsys):
    bucket, fs = s3
    a = cf_grid(tmp_path / "a.nc", packed=True)
    b = grid_b(a, tmp_path / "b.nc")
    rc, _, se = run(capsys, "cgm", a, b, *ARGS, "-o", tmp_path / "out.nc")
    assert rc == 0, se
    rc, _, se = run(capsys, "cgm", a, b, *ARGS, "-o", f"s3://{bucket}/out.zarr")
    assert rc == 0, se
    fs.get(f"{bucket}/out.zarr", str(tmp_path / "back.zarr"), recursive=True)
    same(str(tmp_path / "out.nc"), str(tmp_path / "back.zarr"))
    assert fs.exists(f"{bucket}/out.zarr/.smerge-dataset")


def test_wjoin_refuses_zarr(tmp_path, capsys):
    a = cf_grid(tmp_path / "a.nc", packed=False)
    rc, _, se = run(capsys, "wjoin", a, a, "--time", "time", "--window", "1d", "--local", "-o", tmp_path / "w.zarr")
    assert rc == 2 and "not on a grid" in se, se
