"""Longitudes in -180..180 against 0..360: keys are compared as numbers (never wrapped), so the
run is exit 2 when both inputs' ranges are known before it (a grid's coordinate, Parquet
statistics) and show the two conventions; ranges that agree, keys that are not longitudes and
inputs whose range is unknown before reading (CSV) run as before."""

from __future__ import annotations

import json

import netCDF4
import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from smerge.cli.main import main


def grid(path, lons, lon_name="lon", units="degrees_east"):
    with netCDF4.Dataset(path, "w") as d:
        d.createDimension("lat", 5)
        d.createDimension(lon_name, len(lons))
        v = d.createVariable("lat", "f8", ("lat",))
        v.units = "degrees_north"
        v[:] = np.arange(5.0)
        v = d.createVariable(lon_name, "f8", (lon_name,))
        if units:
            v.units = units
        v[:] = lons
        v = d.createVariable("T2", "f4", ("lat", lon_name))
        v[:] = np.arange(5 * len(lons)).reshape(5, len(lons))
    return str(path)


def stations(path, lons, name="lon"):
    t = pa.table({"lat": [1.0, 2.0, 3.0, 4.0][:len(lons)], name: lons})
    if str(path).endswith(".csv"):
        pacsv.write_csv(t, path)
    else:
        pq.write_table(t, path)
    return str(path)


@pytest.mark.parametrize("cmd", ["cgm", "rtm"])
def test_stations_west_of_0_against_a_0_360_grid_is_exit_2(tmp_path, capsys, cmd):
    a = stations(tmp_path / "st.parquet", [-10.0, -1.0, 5.0, 170.0])
    b = grid(tmp_path / "g360.nc", np.arange(360.0))
    out = tmp_path / "o.parquet"
    assert main([cmd, a, b, "--local", "--keys", "lat,lon", "--eps", "0.1", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "runs -10 to 170" in err[0] and "runs 0 to 359" in err[0], err
    assert "A counts longitudes from -180 to 180 and B from 0 to 360" in err[0]
    assert not out.exists()


def test_two_grids_in_the_two_conventions_is_exit_2(tmp_path, capsys):
    a = grid(tmp_path / "g180.nc", np.arange(-180.0, 180.0, 10.0))
    b = grid(tmp_path / "g360.nc", np.arange(0.0, 360.0, 10.0))
    assert main(["cgm", a, b, "--local", "-o", str(tmp_path / "o.parquet")]) == 2
    assert "B counts longitudes from -180 to 180" not in capsys.readouterr().err  # A is the -180..180 one


@pytest.mark.parametrize("lons", [[5.0, 170.0, 179.0, 0.0], [-10.0, -1.0, 5.0, 170.0]])
def test_ranges_that_agree_run(tmp_path, capsys, lons):
    """Stations east of 0 only fit either convention; a -180..180 grid fits stations west of 0."""
    a = stations(tmp_path / "st.parquet", lons)
    b = grid(tmp_path / "g.nc", np.arange(360.0) if min(lons) >= 0 else np.arange(-180.0, 180.0))
    assert main(["cgm", a, b, "--local", "--keys", "lat,lon", "--eps", "0.1", "-o", str(tmp_path / "o.parquet"),
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["matched"] == 4


def test_keys_that_are_not_longitudes_are_not_checked(tmp_path, capsys):
    a = stations(tmp_path / "st.parquet", [-10.0, -1.0, 5.0, 170.0], name="x")
    b = grid(tmp_path / "g.nc", np.arange(360.0), lon_name="x", units=None)
    assert main(["cgm", a, b, "--local", "--keys", "lat,x", "--eps", "0.1", "-o", str(tmp_path / "o.parquet"),
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["matched"] == 2


def test_a_range_unknown_before_reading_is_not_checked(tmp_path, capsys):
    """CSV has no statistics: the run goes ahead and the stations west of 0 are counted unmatched."""
    a = stations(tmp_path / "st.csv", [-10.0, -1.0, 5.0, 170.0])
    b = grid(tmp_path / "g360.nc", np.arange(360.0))
    assert main(["cgm", a, b, "--local", "--keys", "lat,lon", "--eps", "0.1", "-o", str(tmp_path / "o.parquet"),
                 "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert (s["matched"], s["a_unmatched"]) == (2, 2)


def test_a_grid_offset_by_noise_across_0_is_not_the_other_convention(tmp_path, capsys):
    """B = A's 0..359 grid moved by -0.01 (float noise, a half-cell offset): min -0.01 is not a
    -180..180 grid; the run pairs every cell (the margin is one degree)."""
    a = grid(tmp_path / "a.nc", np.arange(0.0, 360.0, 10.0))
    b = grid(tmp_path / "b.nc", np.arange(0.0, 360.0, 10.0) - 0.01)
    assert main(["cgm", a, b, "--local", "--eps", "lat=0,lon=0.02", "-o", str(tmp_path / "o.parquet"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["matched"] == 5 * 36
