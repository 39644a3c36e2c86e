"""netCDF output keeps geolocation (docs/data.md, "Outputs"): every key is a variable of the
output, every name an attribute references (coordinates, bounds, grid_mapping, cell_measures)
exists, A's geolocation and time are copied as they are in A, and B's values sit on A's grid."""

from __future__ import annotations

import netCDF4
import numpy as np
import pytest
from cf_files import curvilinear, dangling, referenced, regular_bounds, station_report
from typer.testing import CliRunner

from smerge.cli.main import app

xr = pytest.importorskip("xarray")
CFTIME = xr.coders.CFDatetimeCoder(use_cftime=True)


def cgm(tmp_path, a, b, *args) -> str:
    out = str(tmp_path / "out.nc")
    r = CliRunner().invoke(app, ["cgm", str(a), str(b), "--local", "-o", out, *args])
    assert r.exit_code == 0, r.output
    return out


def raw(path, name):
    """A variable's stored values and attributes, undecoded."""
    with netCDF4.Dataset(path) as ds:
        v = ds.variables[name]
        v.set_auto_maskandscale(False)
        v.set_auto_chartostring(False)
        return v.dimensions, np.asarray(v[...]), {a: v.getncattr(a) for a in v.ncattrs()}


def assert_copied(a, out, names):
    for n in names:
        dims, vals, attrs = raw(a, n)
        dims_o, vals_o, attrs_o = raw(out, n)
        assert dims_o == dims, n
        np.testing.assert_array_equal(vals_o, vals, err_msg=n)
        assert vals_o.dtype == vals.dtype, n
        assert attrs_o.keys() == attrs.keys(), n
        for k in attrs:
            np.testing.assert_array_equal(attrs_o[k], attrs[k], err_msg=f"{n}.{k}")


def attr(path, var, name):
    with netCDF4.Dataset(path) as ds:
        v = ds.variables[var]
        return v.getncattr(name) if name in v.ncattrs() else None


def test_station_report_keeps_keys_and_auxiliary_coordinates(tmp_path):
    a, b = tmp_path / "a.nc", tmp_path / "b.nc"
    station_report(a)
    station_report(b, b=True, drop=3)
    out = cgm(tmp_path, a, b, "--keys", "time,lat,lon")
    assert dangling(out) == []
    # keys and the auxiliary station_name, as packed and typed in A (short lat/lon, noleap time)
    assert_copied(a, out, ["lat", "lon", "time", "station_name", "p"])
    assert set(attr(out, "q", "coordinates").split()) >= {"time", "lat", "lon"}
    assert "b_id" not in attr(out, "q", "coordinates").split()
    with xr.open_dataset(out, decode_times=CFTIME) as o, xr.open_dataset(a, decode_times=CFTIME) as x:
        for c in ("time", "lat", "lon", "station_name"):
            assert c in o["p"].coords and c in o["q"].coords, c
            np.testing.assert_array_equal(o[c].values, x[c].values)
        assert o["time"].values[0].calendar == "noleap"
        np.testing.assert_array_equal(o["q"].values, [100, 101, 102, np.nan, 104, 105])
        np.testing.assert_array_equal(o["p"].values, x["p"].values)


def test_station_report_default_keys_from_coordinates(tmp_path):
    a, b = tmp_path / "a.nc", tmp_path / "b.nc"
    station_report(a, coordinates="time lat lon")
    station_report(b, b=True, drop=0, coordinates="time lat lon")
    out = cgm(tmp_path, a, b)
    assert dangling(out) == []
    assert_copied(a, out, ["lat", "lon", "time"])
    with xr.open_dataset(out, decode_times=CFTIME) as o:
        assert {"time", "lat", "lon"} <= set(o["q"].coords)
        np.testing.assert_array_equal(o["q"].values, [np.nan, 101, 102, 103, 104, 105])


@pytest.mark.parametrize("keys", [[], ["--keys", "time,lat2d,lon2d"]], ids=["index-keys", "2d-keys"])
def test_curvilinear_grid_keeps_2d_coordinates(tmp_path, keys):
    a, b = tmp_path / "a.nc", tmp_path / "b.nc"
    curvilinear(a)
    curvilinear(b, b=True)
    # default keys: time and the indices of y, x. --vars: the reader's default picks the variables
    # with the most dimensions, and lat2d_bnds(y, x, nv4) ties with p(time, y, x).
    out = cgm(tmp_path, a, b, "--vars-a", "p", "--vars-b", "q", *keys)
    assert dangling(out) == []
    assert_copied(a, out, ["time", "lat2d", "lon2d", "lat2d_bnds", "p"])
    assert "b_mask" not in attr(out, "q", "coordinates").split()
    with xr.open_dataset(out, decode_times=CFTIME) as o, xr.open_dataset(a, decode_times=CFTIME) as x:
        for c in ("lat2d", "lon2d"):
            assert c in o["p"].coords and c in o["q"].coords
            np.testing.assert_array_equal(o[c].values, x[c].values)
        np.testing.assert_array_equal(o["q"].values, x["p"].values + 1000)
        assert o["time"].values[0].calendar == "360_day"


def test_curvilinear_2d_key_variables(tmp_path):
    """Keys that are the 2-D variables themselves (a field on (y, x) keyed by lat2d, lon2d)."""
    a, b = tmp_path / "a.nc", tmp_path / "b.nc"
    curvilinear(a, with_time=False)
    curvilinear(b, b=True, with_time=False)
    out = cgm(tmp_path, a, b, "--keys", "lat2d,lon2d", "--vars-a", "p", "--vars-b", "q")
    assert "b_mask" not in attr(out, "q", "coordinates").split()
    assert dangling(out) == []
    assert_copied(a, out, ["lat2d", "lon2d", "lat2d_bnds", "p"])
    with xr.open_dataset(out) as o, xr.open_dataset(a) as x:
        assert {"lat2d", "lon2d"} <= set(o["q"].coords)
        np.testing.assert_array_equal(o["q"].values, x["p"].values + 1000)


def test_regular_grid_bounds_grid_mapping_and_cell_measures(tmp_path):
    a, b = tmp_path / "a.nc", tmp_path / "b.nc"
    regular_bounds(a)
    regular_bounds(b, b=True)
    out = cgm(tmp_path, a, b)
    assert dangling(out) == []
    assert_copied(a, out, ["time", "lat", "lon", "lat_bnds", "crs", "cell_area", "p"])
    # B's values are on A's grid: A's grid mapping and cell measures describe them
    assert attr(out, "q", "grid_mapping") == "crs"
    assert attr(out, "q", "cell_measures") == "area: cell_area"
    with xr.open_dataset(out) as o, xr.open_dataset(a) as x:
        np.testing.assert_array_equal(o["q"].values, x["p"].values + 1000)
        np.testing.assert_array_equal(o["lat_bnds"].values, x["lat_bnds"].values)


def test_references_to_missing_variables_are_dropped(tmp_path):
    """A name A itself does not hold cannot be copied: the attribute loses it."""
    a, b = tmp_path / "a.nc", tmp_path / "b.nc"
    regular_bounds(a)
    regular_bounds(b, b=True)
    with netCDF4.Dataset(a, "a") as ds:
        ds.variables["p"].coordinates = "height"
        ds.variables["p"].ancillary_variables = "p_flag"
        ds.variables["lon"].bounds = "lon_bnds"
    out = cgm(tmp_path, a, b)
    assert dangling(out) == []
    assert attr(out, "p", "coordinates") is None and attr(out, "lon", "bounds") is None
    assert attr(out, "p", "grid_mapping") == "crs"


def test_referenced_parses_cf_forms():
    class V:
        def __init__(self, **kw):
            self.kw = kw

        def ncattrs(self):
            return list(self.kw)

        def getncattr(self, k):
            return self.kw[k]

    got = referenced(V(grid_mapping="crs: lat lon crs2: x y", cell_measures="area: a volume: v",
                       coordinates="lat lon", units="m"))
    assert got == {"grid_mapping": ["crs", "lat", "lon", "crs2", "x", "y"], "cell_measures": ["a", "v"],
                   "coordinates": ["lat", "lon"]}


def test_b_variable_named_like_a_copied_variable_gets_b_suffix(tmp_path):
    a, b = tmp_path / "a.nc", tmp_path / "b.nc"
    regular_bounds(a)
    regular_bounds(b, b=True)
    with netCDF4.Dataset(b, "a") as ds:
        v = ds.createVariable("cell_area", "f4", ("time", "lat", "lon"))
        v[:] = 7.0
    out = cgm(tmp_path, a, b)
    assert dangling(out) == []
    assert_copied(a, out, ["cell_area", "lat_bnds"])
    with xr.open_dataset(out) as o:
        assert (o["cell_area_b"].values == 7.0).all()
        assert o["q"].attrs["cell_measures"] == "area: cell_area"
