"""GRIB 1 and 2 files written by ecCodes from its sample templates are read through the netCDF
reader (cfgrib's CF mapping): they pair with a netCDF copy of the same data cell for cell, B is
read in A's order, missing values are nulls, several hypercubes are chosen with --vars or
refused listing them."""

from __future__ import annotations

import json

import netCDF4
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cloud_files import GRIB_LATS, GRIB_LONS, grib_field, write_grib

from smerge.cli.main import main
from smerge.datasets import open_input

DAYS = 3


def run(capsys, *args):
    rc = main([str(a) for a in args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def surface(path, sample="regular_ll_sfc_grib2", *, upper=False, missing=False):
    msgs = []
    for d in range(DAYS):
        values = grib_field(d)
        if missing and d == 1:
            values = values.copy()
            values[0, :3] = np.nan
        msgs.append(({"dataDate": 20240101 + d, "dataTime": 1200, "shortName": "2t"}, values))
        if upper:
            msgs.append(({"dataDate": 20240101 + d, "dataTime": 1200, "shortName": "t", "typeOfLevel": "isobaricInhPa",
                          "level": 850}, grib_field(d, 1000)))
    return write_grib(path, sample, msgs)


def netcdf_copy(path, order=("time", "latitude", "longitude")) -> str:
    """The same 2 m temperatures in a netCDF file (hours since a date, ascending latitudes)."""
    data = np.stack([grib_field(d) for d in range(DAYS)])  # (time, lat as in GRIB, lon)
    coords = {"time": np.arange(DAYS) * 24.0 + 12, "latitude": GRIB_LATS, "longitude": GRIB_LONS}
    with netCDF4.Dataset(path, "w") as ds:
        for d in order:
            ds.createDimension(d, len(coords[d]))
        for d, units in (("time", "hours since 2024-01-01 00:00"), ("latitude", "degrees_north"),
                         ("longitude", "degrees_east")):
            v = ds.createVariable(d, "f8", (d,))
            v.units = units
            v[:] = coords[d]
        v = ds.createVariable("t2m", "f4", order)
        v[:] = np.transpose(data, [("time", "latitude", "longitude").index(d) for d in order])
    return str(path)


@pytest.mark.parametrize("sample", ["regular_ll_sfc_grib2", "regular_ll_sfc_grib1"])
def test_grib_pairs_with_its_netcdf_copy_cell_for_cell(sample, tmp_path, capsys):
    g = surface(tmp_path / "s.grib", sample)
    src = open_input(g)
    assert src.keys == ("time", "latitude", "longitude") and src.schema.names[-1] == "t2m"
    assert pa.types.is_timestamp(src.schema.field("time").type)
    nc = netcdf_copy(tmp_path / "s.nc", order=("longitude", "time", "latitude"))
    out = tmp_path / "o.parquet"
    rc, so, se = run(capsys, "cgm", g, nc, "--local", "-o", out, "--json")
    assert rc == 0, se
    stats = json.loads(so)
    assert stats["matched"] == stats["a_records"] == stats["b_records"] == DAYS * 40
    assert stats["b_order"] == "A's key order"
    t = pq.read_table(out)
    for k in ("time", "latitude", "longitude", "t2m"):
        assert t[k].to_pylist() == t[f"{k}_b"].to_pylist(), k
    # each pair holds the value ecCodes wrote at its place
    fields = np.stack([grib_field(d) for d in range(DAYS)])
    day = (t["time"].cast(pa.int64()).to_numpy() // 86_400_000_000) - 19723  # 2024-01-01
    row = np.searchsorted(-GRIB_LATS, -t["latitude"].to_numpy())
    col = np.searchsorted(GRIB_LONS, t["longitude"].to_numpy())
    assert np.allclose(t["t2m"].to_numpy(), fields[day, row, col], atol=0.01)


def test_grib1_and_grib2_of_the_same_data_pair_everything(tmp_path, capsys):
    a = surface(tmp_path / "a.grib2")
    b = surface(tmp_path / "b.grib1", "regular_ll_sfc_grib1")
    rc, so, se = run(capsys, "cgm", a, b, "--local", "-o", tmp_path / "o.parquet", "--json")
    assert rc == 0, se
    assert json.loads(so)["matched"] == DAYS * 40


def test_missing_values_of_a_message_are_nulls(tmp_path):
    g = surface(tmp_path / "m.grib2", missing=True)
    t = pa.Table.from_batches(list(open_input(g, batch_rows=40).batches()))
    col = t["t2m"].to_pylist()
    assert t["t2m"].null_count == 3 and col[40:43] == [None] * 3 and col[43] is not None


def test_several_hypercubes_exit_2_listing_them_unless_vars_chooses(tmp_path, capsys):
    g = surface(tmp_path / "u.grib2", upper=True)
    nc = netcdf_copy(tmp_path / "s.nc")
    rc, _, se = run(capsys, "cgm", g, nc, "--local", "-o", tmp_path / "o.parquet")
    assert rc == 2 and len(se.strip().splitlines()) == 1
    assert "its GRIB messages form 2 hypercubes: t2m (heightAboveGround; instant" in se
    assert "t (isobaricInhPa; instant" in se and "choose one with --vars-a or --vars-b" in se
    rc, so, se = run(capsys, "cgm", g, nc, "--local", "--vars-a", "t2m", "--vars-b", "t2m", "-o",
                     tmp_path / "o.parquet", "--json")
    assert rc == 0, se
    assert json.loads(so)["matched"] == DAYS * 40
    src = open_input(g, variables=["t"])
    t = pa.Table.from_batches(list(src.batches()))
    assert np.allclose(t["t"].to_numpy()[:40], grib_field(0, 1000).reshape(-1), atol=0.01)
    rc, _, se = run(capsys, "cgm", g, nc, "--local", "--vars-a", "t2m,t", "-o", tmp_path / "p.parquet")
    assert rc == 2 and "are in different hypercubes" in se


def test_corrupt_grib_is_one_line(tmp_path, capsys):
    g = surface(tmp_path / "s.grib2")
    data = open(g, "rb").read()
    with open(tmp_path / "cut.grib2", "wb") as f:
        f.write(data[: len(data) // 2 + 10])
    nc = netcdf_copy(tmp_path / "s.nc")
    rc, _, se = run(capsys, "cgm", tmp_path / "cut.grib2", nc, "--local", "-o", tmp_path / "o.parquet")
    assert rc == 2 and "cut.grib2" in se and "Traceback" not in se and len(se.strip().splitlines()) == 1, se
