"""Keys by name (docs/data.md, "Keys are matched by name") and values (section 3) on netCDF files built to be awkward:
transposed dimensions, packed and masked variables, char variables, all-fill coordinates."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import netCDF4
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smerge.cli.main import main
from smerge.datasets import open_input
from cli_run import run_cli  # noqa: E402 (tests/helpers: the shared CLI test helper)

SMERGE = [sys.executable, "-m", "smerge"]


def pairs(path, a_cols=("lat", "lon"), b_cols=()):
    t = pq.read_table(path)
    cols = [c for c in ("a_row", "b_row") if c in t.column_names]
    return sorted(zip(*(t[c].to_pylist() for c in cols)))


def transposed(src, dst, order):
    import xarray as xr

    with xr.open_dataset(src, decode_times=False, mask_and_scale=False) as ds:
        ds.transpose(*order).to_netcdf(dst)
    return str(dst)


# ---- keys by name -------------------------------------------------------------------------


def test_transposed_storm_pairs_the_same_places(ncar_dir, tmp_path, capsys):
    a, b = f"{ncar_dir}/Pstorm.cdf", f"{ncar_dir}/Tstorm.cdf"
    bt = transposed(b, tmp_path / "Tstorm_t.nc", ("timestep", "lon", "lat"))
    ref, got = tmp_path / "ref.parquet", tmp_path / "got.parquet"
    for bb, out in ((b, ref), (bt, got)):
        rc, so, se = run_cli(capsys, "cgm", a, bb, "--local", "-o", out, "--with-ids", "--json")
        assert rc == 0, se
        assert json.loads(so)["matched"] == 76032
    r, g = pq.read_table(ref), pq.read_table(got)
    # Every pair joins the same place: equal lat and lon, and the same temperature.
    assert (np.asarray(g["lat"]) == np.asarray(g["lat_b"])).all() and (np.asarray(g["lon"]) == np.asarray(g["lon_b"])).all()
    key = lambda t: sorted(zip(t["timestep"].to_pylist(), t["lat"].to_pylist(), t["lon"].to_pylist(), t["t"].to_pylist()))  # noqa: E731
    assert key(r) == key(g)


def test_rtm_transposed_b_pairs_by_name(ncar_dir, tmp_path, capsys):
    a = f"{ncar_dir}/Pstorm.cdf"
    bt = transposed(f"{ncar_dir}/Tstorm.cdf", tmp_path / "Tstorm_t.nc", ("timestep", "lon", "lat"))
    out = tmp_path / "o.parquet"
    rc, so, se = run_cli(capsys, "rtm", a, bt, "--local", "-o", out, "--json")
    assert rc == 0, se
    g = pq.read_table(out)
    assert json.loads(so)["matched"] == 76032
    assert (np.asarray(g["lat"]) == np.asarray(g["lat_b"])).all() and (np.asarray(g["lon"]) == np.asarray(g["lon_b"])).all()


def small_grid(path, order, seed=0):
    """A (t, y, x) field written with its dimensions in ``order``."""
    rng = np.random.default_rng(seed)
    sizes = {"t": 3, "y": 4, "x": 5}
    coords = {"t": np.arange(3.0) * 6, "y": np.linspace(-10, 10, 4), "x": np.linspace(0, 40, 5)}
    field = rng.normal(size=(3, 4, 5)).astype("f4")
    perm = ["t", "y", "x"]
    with netCDF4.Dataset(path, "w") as ds:
        for d in order:
            ds.createDimension(d, sizes[d])
            ds.createVariable(d, "f8", (d,))[:] = coords[d]
        ds.createVariable("v", "f4", tuple(order))[:] = np.transpose(field, [perm.index(d) for d in order])
    return str(path)


@settings(max_examples=6, deadline=None)
@given(order=st.permutations(["t", "y", "x"]))
def test_any_permutation_of_b_gives_the_same_pairs(tmp_path_factory, order):
    d = tmp_path_factory.mktemp("perm")
    a = small_grid(d / "a.nc", ["t", "y", "x"])
    b0 = small_grid(d / "b0.nc", ["t", "y", "x"], seed=1)
    bp = small_grid(d / "bp.nc", list(order), seed=1)
    outs = []
    for b in (b0, bp):
        out = d / f"o{len(outs)}.parquet"
        # The whole stream fits the window: the pairs cannot depend on B's arrival order.
        assert main(["cgm", a, b, "--local", "-o", str(out)]) == 0
        t = pq.read_table(out)
        outs.append(sorted(zip(*(t[c].to_pylist() for c in ("t", "y", "x", "v", "t_b", "y_b", "x_b", "v_b")))))
    assert outs[0] == outs[1] and len(outs[0]) == 60


def test_b_missing_a_key_name_is_exit_2_suggesting_keys_b(tmp_path, capsys):
    a = small_grid(tmp_path / "a.nc", ["t", "y", "x"])
    with netCDF4.Dataset(tmp_path / "b.nc", "w") as ds:
        for d, n in (("t", 3), ("lat", 4), ("x", 5)):
            ds.createDimension(d, n)
            ds.createVariable(d, "f8", (d,))[:] = np.arange(n)
        ds.createVariable("v", "f4", ("t", "lat", "x"))[:] = 1
    rc, so, se = run_cli(capsys, "cgm", a, tmp_path / "b.nc", "--local", "-o", tmp_path / "o.parquet")
    assert rc == 2 and "'y'" in se and "--keys-b" in se and len(se.strip().splitlines()) == 1
    rc, so, se = run_cli(capsys, "cgm", a, tmp_path / "b.nc", "--local", "-o", tmp_path / "o.parquet",
                         "--keys-b", "t,lat,x", "--json")
    assert rc == 0, se


@pytest.mark.parametrize("args,msg", [
    (["--keys", "y,y"], "named twice"),
    (["--eps", "y=1,y=2"], "twice"),
    (["--vars-a", "v,v"], "named twice"),
])
def test_names_given_twice_are_exit_2(tmp_path, capsys, args, msg):
    a = small_grid(tmp_path / "a.nc", ["t", "y", "x"])
    b = small_grid(tmp_path / "b.nc", ["t", "y", "x"])
    rc, so, se = run_cli(capsys, "cgm", a, b, "--local", "-o", tmp_path / "o.parquet", *args)
    assert rc == 2 and msg in se and len(se.strip().splitlines()) == 1, se
    assert not (tmp_path / "o.parquet").exists()


@pytest.mark.slow
def test_rtm_server_keys_matched_by_name(tmp_path):
    a = str(tmp_path / "a.parquet")
    b = str(tmp_path / "b.parquet")
    pq.write_table(pa.table({"lat": [1.0, 2.0, 3.0], "lon": [10.0, 20.0, 30.0], "x": [1, 2, 3]}), a)
    pq.write_table(pa.table({"lat": [1.0, 2.0, 3.0], "lon": [10.0, 20.0, 30.0], "y": [4, 5, 6]}), b)
    (tmp_path / "tok").write_text("keys-by-name-token")
    p = subprocess.Popen(SMERGE + ["serve", b, "--keys", "lat,lon", "--port", "0", "--token-file",
                                   str(tmp_path / "tok")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = p.stdout.readline().strip()
        common = ["--token-file", str(tmp_path / "tok"), "--local", "--json"]
        r = subprocess.run(SMERGE + ["rtm", a, "--server", url, "--keys", "lon,lat", "-o",
                                     str(tmp_path / "o1.parquet")] + common, capture_output=True, text=True)
        assert r.returncode == 2 and "another order" in r.stderr and "--keys lat,lon" in r.stderr
        assert not (tmp_path / "o1.parquet").exists()
        r = subprocess.run(SMERGE + ["rtm", a, "--server", url, "--keys", "lat,lon", "-o",
                                     str(tmp_path / "o2.parquet")] + common, capture_output=True, text=True)
        assert r.returncode == 0 and json.loads(r.stdout)["matched"] == 3, r.stderr
    finally:
        p.terminate()
        p.wait(30)


# ---- values ---------------------------------------------------------------------------------


def test_packed_and_masked_values_equal_netcdf4_and_count_range_masks(tmp_path, capsys):
    path = str(tmp_path / "a.nc")
    raw = np.array([[-1, 0, 50, 99], [101, -5, 20, 100]], dtype="i2")
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("t", 2)
        ds.createDimension("x", 4)
        ds.createVariable("t", "f8", ("t",))[:] = [0, 1]
        ds.createVariable("x", "f8", ("x",))[:] = [0, 1, 2, 3]
        v = ds.createVariable("v", "i2", ("t", "x"), fill_value=-1)
        v.scale_factor, v.add_offset = 0.5, 10.0
        v.valid_range = np.array([0, 100], "i2")
        v.missing_value = np.int16(99)
        v.set_auto_maskandscale(False)
        v[:] = raw
        w = ds.createVariable("w", "f4", ("t", "x"))
        w.missing_value = np.float32(-999)
        w[:] = [[1, -999, 3, 4], [5, 6, -999, 8]]
    with netCDF4.Dataset(path) as ds:
        want_v = ds["v"][:].reshape(-1)
        want_w = ds["w"][:].reshape(-1)
    t = pa.Table.from_batches(list(open_input(path).batches()))
    assert t["v"].to_pylist() == [None if m else float(x) for x, m in zip(want_v.data, np.ma.getmaskarray(want_v))]
    assert t["w"].to_pylist() == [None if m else float(x) for x, m in zip(want_w.data, np.ma.getmaskarray(want_w))]
    # 101 and -5 are outside valid_range (the CF rule): masked and counted; -1 (fill), 99 (missing) are not counted.
    rc, so, se = run_cli(capsys, "cgm", path, path, "--local", "-o", tmp_path / "o.parquet", "--json")
    assert rc == 0, se
    s = json.loads(so)
    assert s["a_masked"] == 2 and s["b_masked"] == 2


def test_char_variable_is_one_string_per_record(tmp_path):
    path = str(tmp_path / "st.nc")
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("station", 3)
        ds.createDimension("strlen", 8)
        ds.createVariable("lat", "f4", ("station",))[:] = [1, 2, 3]
        ds.createVariable("lon", "f4", ("station",))[:] = [4, 5, 6]
        ds.createVariable("name", "S1", ("station", "strlen"))[:] = netCDF4.stringtochar(
            np.array(["OSLO", "BERGEN", "TROMSO"], dtype="S8"))
        p = ds.createVariable("p", "f4", ("station",))
        p.coordinates = "lat lon"
        p[:] = [1000, 1001, 1002]
    src = open_input(path, keys=["lat", "lon"], variables=["name", "p"])
    t = pa.Table.from_batches(list(src.batches()))
    assert t.num_rows == 3 and t["name"].to_pylist() == ["OSLO", "BERGEN", "TROMSO"]
    assert t.schema.field("name").type == pa.string()


def test_char_key_is_exit_2(tmp_path, capsys):
    path = str(tmp_path / "st.nc")
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("station", 2)
        ds.createDimension("strlen", 4)
        ds.createVariable("name", "S1", ("station", "strlen"))[:] = netCDF4.stringtochar(np.array(["A", "B"], "S4"))
        ds.createVariable("p", "f4", ("station",))[:] = [1, 2]
    rc, so, se = run_cli(capsys, "cgm", path, path, "--keys", "name", "--local", "-o", tmp_path / "o.parquet")
    assert rc == 2 and "'name'" in se and "numeric" in se and len(se.strip().splitlines()) == 1


def test_all_fill_integer_coordinate_is_a_missing_key_not_a_crash(tmp_path, capsys):
    path = str(tmp_path / "f.nc")
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("t", 2)
        ds.createDimension("x", 3)
        ds.createVariable("t", "f8", ("t",))[:] = [0, 1]
        xv = ds.createVariable("x", "i4", ("x",), fill_value=-99)
        xv.set_auto_mask(False)
        xv[:] = [-99, -99, -99]
        ds.createVariable("v", "f4", ("t", "x"))[:] = np.ones((2, 3))
    rc, so, se = run_cli(capsys, "cgm", path, path, "--local", "-o", tmp_path / "o.parquet")
    assert rc == 2 and "'x'" in se and "--nan-keys unmatched" in se and "fill_value" not in se
    rc, so, se = run_cli(capsys, "cgm", path, path, "--local", "-o", tmp_path / "o.parquet", "--nan-keys",
                         "unmatched", "--json")
    assert rc == 0, se
    s = json.loads(so)
    assert s["matched"] == 0 and s["a_unmatched"] == 6 and s["b_unmatched"] == 6


def test_groups_file_says_groups_are_not_read(tmp_path, capsys):
    path = str(tmp_path / "g.nc")
    with netCDF4.Dataset(path, "w", format="NETCDF4") as ds:
        g = ds.createGroup("forecast")
        g.createDimension("t", 2)
        g.createVariable("v", "f4", ("t",))[:] = [1, 2]
    rc, so, se = run_cli(capsys, "cgm", path, path, "--local", "-o", tmp_path / "o.parquet")
    assert rc == 2 and "groups" in se and "forecast" in se and len(se.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "o.parquet")


def test_curvilinear_2d_keys_broadcast_by_dimension_name(tmp_path, capsys):
    """lat2d(y, x) and a lon2d written as (x, y) are keys of a (time, y, x) field."""
    def curv(path, order):
        with netCDF4.Dataset(path, "w") as ds:
            for d, n in (("time", 2), ("y", 3), ("x", 4)):
                ds.createDimension(d, n)
            t = ds.createVariable("time", "f8", ("time",))
            t.units = "hours since 2000-01-01"
            t[:] = [0, 6]
            ds.createVariable("lat2d", "f4", ("y", "x"))[:] = np.arange(12).reshape(3, 4)
            ds.createVariable("lon2d", "f4", ("x", "y"))[:] = 100 + np.arange(12).reshape(4, 3)
            v = ds.createVariable("p", "f4", order)
            v.coordinates = "lat2d lon2d"
            field = np.arange(24, dtype="f4").reshape(2, 3, 4)
            v[:] = np.transpose(field, [("time", "y", "x").index(d) for d in order])
        return str(path)

    a = curv(tmp_path / "a.nc", ("time", "y", "x"))
    t = pa.Table.from_batches(list(open_input(a, keys=["time", "lat2d", "lon2d"]).batches()))
    # record (time 0, y 0, x 1): lat2d[0, 1] = 1, lon2d[x=1, y=0] = 103
    assert t.slice(1, 1).to_pylist()[0]["lat2d"] == 1.0 and t.slice(1, 1).to_pylist()[0]["lon2d"] == 103.0
    b = curv(tmp_path / "b.nc", ("time", "x", "y"))
    out = tmp_path / "o.parquet"
    rc, so, se = run_cli(capsys, "cgm", a, b, "--keys", "time,lat2d,lon2d", "--local", "-o", out, "--json")
    assert rc == 0, se
    o = pq.read_table(out)
    assert json.loads(so)["matched"] == 24 and o["p"].to_pylist() == o["p_b"].to_pylist()


def test_default_choice_skips_bounds_and_text_labels(tmp_path):
    """lat_bnds(y, x, nv) is not data; `coordinates = "time lat lon station_name"` keys on the
    numeric names and leaves the text label out of the keys."""
    path = str(tmp_path / "s.nc")
    with netCDF4.Dataset(path, "w") as ds:
        for d, n in (("station", 3), ("strlen", 6), ("nv", 2)):
            ds.createDimension(d, n)
        t = ds.createVariable("time", "f8", ("station",))
        t.units = "hours since 2000-01-01"
        t[:] = [0, 1, 2]
        lat = ds.createVariable("lat", "f4", ("station",))
        lat.bounds = "lat_bnds"
        lat[:] = [1, 2, 3]
        ds.createVariable("lat_bnds", "f4", ("station", "nv"))[:] = np.zeros((3, 2))
        ds.createVariable("lon", "f4", ("station",))[:] = [4, 5, 6]
        ds.createVariable("station_name", "S1", ("station", "strlen"))[:] = netCDF4.stringtochar(
            np.array(["A", "B", "C"], dtype="S6"))
        p = ds.createVariable("p", "f4", ("station",))
        p.coordinates = "time lat lon station_name"
        p[:] = [7, 8, 9]
    src = open_input(path)
    assert src.keys == ("time", "lat", "lon") and src.grid.variables == ("p",)
