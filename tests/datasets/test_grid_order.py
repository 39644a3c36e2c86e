"""B in another dimension order, reversed coordinates, auxiliary coordinates and sub-regions:
gridded inputs pair the same places whatever the window (B is read in A's key order)."""

from __future__ import annotations

import json

import netCDF4
import numpy as np
import pyarrow.parquet as pq
import pytest
import xarray as xr
from grid_files import coords, field, permutations, write_grid

from smerge.datasets import open_input
from cli_run import run_cli  # noqa: E402 (tests/helpers: the shared CLI test helper)

SMALL_WINDOW = ("--window", "50", "--increment", "10")  # one time slice is 720 or more records


def merge(capsys, a, b, out, *extra, engine="cgm"):
    window = SMALL_WINDOW if engine == "cgm" else SMALL_WINDOW[:2]
    rc, so, se = run_cli(capsys, engine, a, b, "--local", "-o", out, "--json", *window, *extra)
    assert rc == 0, se
    return json.loads(so), pq.read_table(out)


def assert_same_places(t, keys=("time", "lat", "lon")):
    assert t.num_rows > 0
    assert np.array_equal(np.asarray(t["T"]), np.asarray(t["T_b"]))
    for k in keys:
        assert t[k].to_pylist() == t[f"{k}_b"].to_pylist(), k


@pytest.mark.parametrize("order", permutations(("time", "lat", "lon")))
def test_every_permutation_of_a_3d_grid_pairs_everything(order, tmp_path, capsys):
    a = write_grid(tmp_path / "a.nc", ("time", "lat", "lon"))
    b = write_grid(tmp_path / "b.nc", order)
    stats, t = merge(capsys, a, b, tmp_path / "o.parquet")
    assert stats["matched"] == stats["a_records"] == 4 * 24 * 30
    assert stats["a_unmatched"] == stats["b_unmatched"] == 0
    assert stats["b_order"] == ("as stored" if order == ("time", "lat", "lon") else "A's key order")
    assert_same_places(t)
    # A's order: the pairs come out in A's stored order
    assert np.array_equal(np.asarray(t["T"]), field(coords()).reshape(-1))


@pytest.mark.parametrize("order", permutations(("time", "level", "lat", "lon")))
def test_every_permutation_of_a_4d_grid_pairs_everything(order, tmp_path, capsys):
    dims = ("time", "level", "lat", "lon")
    sizes = {"time": 3, "lat": 8, "lon": 12}
    a = write_grid(tmp_path / "a.nc", dims, dims=dims, sizes=sizes)
    b = write_grid(tmp_path / "b.nc", order, dims=dims, sizes=sizes, fmt="NETCDF3_CLASSIC")
    stats, t = merge(capsys, a, b, tmp_path / "o.parquet")
    assert stats["matched"] == stats["a_records"] == 3 * 3 * 8 * 12
    assert_same_places(t, dims)


@pytest.mark.parametrize("flip", [("lat",), ("lon",), ("time", "lat")])
def test_coordinates_stored_backwards_pair_everything(flip, tmp_path, capsys):
    a = write_grid(tmp_path / "a.nc", ("time", "lat", "lon"))
    b = write_grid(tmp_path / "b.nc", ("time", "lon", "lat"), flip=flip)
    stats, t = merge(capsys, a, b, tmp_path / "o.parquet")
    assert stats["matched"] == stats["a_records"]
    assert_same_places(t)


def test_rtm_pairs_a_transposed_b(tmp_path, capsys):
    a = write_grid(tmp_path / "a.nc", ("time", "lat", "lon"))
    b = write_grid(tmp_path / "b.nc", ("lat", "time", "lon"), flip=("lat",))
    stats, t = merge(capsys, a, b, tmp_path / "o.parquet", engine="rtm")
    assert stats["matched"] == stats["a_records"]
    assert_same_places(t)


def test_b_is_read_in_a_order_by_the_reader(tmp_path):
    """The reader itself gives B's records in the order asked for, values and masks included."""
    b = write_grid(tmp_path / "b.nc", ("lon", "time", "lat"), flip=("lat",))
    with netCDF4.Dataset(b, "a") as ds:
        ds["T"].valid_max = 3e6  # masks the later times
    src = open_input(b, keys=["time", "lat", "lon"], order=[("time", 1), ("lat", 1), ("lon", 1)], batch_rows=100)
    assert src.grid.dims == ("time", "lat", "lon") and src.grid.reordered
    got = pa_concat(src.batches())
    want = field(coords()).reshape(-1)
    vals = got["T"].to_numpy(zero_copy_only=False)
    assert np.array_equal(np.isnan(vals), want > 3e6)
    assert np.array_equal(vals[want <= 3e6], want[want <= 3e6])
    assert src.counters["masked"] == int((want > 3e6).sum())
    lat = got["lat"].to_numpy()
    assert np.array_equal(lat[:30 * 24:30], coords()["lat"])  # ascending, as asked


def pa_concat(batches):
    import pyarrow as pa

    return pa.Table.from_batches(list(batches))


# ---- auxiliary coordinates, sub-regions and strided subsets --------------------------------------


def test_auxiliary_coordinates_key_a_sub_region_by_place(tmp_path, capsys):
    names = {"lat": "latitude", "lon": "longitude"}
    a = write_grid(tmp_path / "a.nc", ("time", "lat", "lon"), dim_names=names)
    b = write_grid(tmp_path / "b.nc", ("time", "lat", "lon"), dim_names=names,
                   select={"lat": slice(5, 17), "lon": slice(3, 20)})
    src = open_input(a)
    assert src.keys == ("time", "lat", "lon")
    stats, t = merge(capsys, a, b, tmp_path / "o.parquet")
    assert stats["matched"] == stats["b_records"] == 4 * 12 * 17 and stats["b_unmatched"] == 0
    assert_same_places(t)


def test_strided_subset_transposed_pairs_by_place(tmp_path, capsys):
    names = {"lat": "y", "lon": "x"}
    a = write_grid(tmp_path / "a.nc", ("time", "lat", "lon"), dim_names=names)
    b = write_grid(tmp_path / "b.nc", ("lon", "lat", "time"), dim_names=names,
                   select={"lat": slice(1, None, 2), "lon": slice(None, None, 3)}, flip=("lat",))
    stats, t = merge(capsys, a, b, tmp_path / "o.parquet")
    assert stats["matched"] == stats["b_records"] == 4 * 12 * 10
    assert_same_places(t)


def test_netcdf_output_keeps_auxiliary_coordinates(tmp_path, capsys):
    names = {"lat": "latitude", "lon": "longitude"}
    a = write_grid(tmp_path / "a.nc", ("time", "lat", "lon"), dim_names=names)
    b = write_grid(tmp_path / "b.nc", ("time", "lat", "lon"), dim_names=names, select={"lat": slice(0, 12)})
    out = tmp_path / "o.nc"
    rc, so, se = run_cli(capsys, "cgm", a, b, "--local", "-o", out, *SMALL_WINDOW)
    assert rc == 0, se
    with xr.open_dataset(out) as ds:
        assert ds["lat"].dims == ("latitude",) and ds["lon"].dims == ("longitude",)
        assert np.array_equal(ds["lat"].values, coords()["lat"])
        t, tb = ds["T"].values, ds["T_b"].values
        have = np.isfinite(tb)
        assert have.sum() == 4 * 12 * 30 and have[:, :12, :].all()
        assert np.array_equal(t[have], tb[have])


@pytest.mark.parametrize("mark", ["units", "axis", "standard_name", "coordinates"])
def test_each_cf_mark_makes_a_coordinate(mark, tmp_path):
    path = tmp_path / "a.nc"
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("t", 2)
        ds.createDimension("y", 3)
        v = ds.createVariable("time", "f8", ("t",))
        v.units = "days since 2000-01-01"
        v[:] = [0, 1]
        y = ds.createVariable("yc", "f8", ("y",))
        y[:] = [1, 2, 3]
        d = ds.createVariable("T", "f4", ("t", "y"))
        d[:] = np.ones((2, 3))
        if mark == "units":
            y.units = "degrees_north"
        elif mark == "axis":
            y.axis = "Y"
        elif mark == "standard_name":
            y.standard_name = "projection_y_coordinate"
        else:
            d.coordinates = "yc"
    assert open_input(str(path)).keys == ("time", "yc")


def test_two_candidate_coordinates_are_refused(tmp_path, capsys):
    path = tmp_path / "a.nc"
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("station", 3)
        for n, u in (("lat", "degrees_north"), ("lon", "degrees_east")):
            v = ds.createVariable(n, "f8", ("station",))
            v.units = u
            v[:] = [1, 2, 3]
        ds.createVariable("T", "f4", ("station",))[:] = [1, 2, 3]
    rc, so, se = run_cli(capsys, "cgm", path, path, "--local", "-o", tmp_path / "o.parquet")
    assert rc == 2 and "dimension 'station'" in se and "--keys" in se and len(se.strip().splitlines()) == 1
    assert not (tmp_path / "o.parquet").exists()


# ---- dimensions keyed by index ----------------------------------------------------------------


def test_index_keys_pair_only_same_sized_dimensions(tmp_path, capsys):
    a = write_grid(tmp_path / "a.nc", ("time", "lat", "lon"), coord_vars=False)
    same = write_grid(tmp_path / "same.nc", ("time", "lon", "lat"), coord_vars=False)
    sub = write_grid(tmp_path / "sub.nc", ("time", "lat", "lon"), coord_vars=False, select={"lat": slice(2, 10)})
    stats, t = merge(capsys, a, same, tmp_path / "o.parquet")
    assert stats["matched"] == stats["a_records"]
    assert_same_places(t)
    rc, so, se = run_cli(capsys, "cgm", a, sub, "--local", "-o", tmp_path / "o2.parquet")
    assert rc == 2 and "'lat'" in se and "--keys" in se and "index" in se, se
    assert not (tmp_path / "o2.parquet").exists()


def test_index_key_against_values_is_refused(tmp_path, capsys):
    a = write_grid(tmp_path / "a.nc", ("time", "lat", "lon"), coord_vars=False)
    b = write_grid(tmp_path / "b.nc", ("time", "lat", "lon"), mark=False)
    rc, so, se = run_cli(capsys, "cgm", a, b, "--local", "-o", tmp_path / "o.parquet")
    assert rc == 2 and "by its values" in se, se


def test_tabular_b_still_best_effort(tmp_path, capsys):
    """A tabular B cannot be re-read in another order: the window decides (and kappa_max says
    what an unbounded window would find)."""
    import pyarrow as pa

    a = write_grid(tmp_path / "a.nc", ("time", "lat", "lon"))
    src = open_input(write_grid(tmp_path / "bt.nc", ("time", "lon", "lat"), select={"lat": slice(0, 24)}),
                     keys=["time", "lat", "lon"])
    pq.write_table(pa.Table.from_batches(list(src.batches())), tmp_path / "b.parquet")
    rc, so, se = run_cli(capsys, "cgm", a, tmp_path / "b.parquet", "--local", "-o", tmp_path / "o.parquet",
                         "--keys", "time,lat,lon", "--json", "--kappa-max", *SMALL_WINDOW)
    assert rc == 0, se
    stats = json.loads(so)
    assert stats["matched"] < stats["a_records"] and stats["kappa_max"] == 1.0
    assert stats["b_order"] == "as stored"
    rc, so, se = run_cli(capsys, "cgm", a, tmp_path / "b.parquet", "--local", "-o", tmp_path / "o.parquet",
                         "--overwrite", "--keys", "time,lat,lon", "--kappa-max", *SMALL_WINDOW)
    assert rc == 0 and "shortfall" in so and "read as stored" in so, so


@pytest.mark.parametrize("order", permutations(("time", "lat", "lon")))
@pytest.mark.parametrize("flip", [(), ("lat",)])
def test_a_table_as_a_reads_b_in_its_key_order(order, flip, tmp_path, capsys):
    """Station reports (a table sorted by time, lat, lon, as pandas' sort_values leaves it) against
    a grid B stored in any dimension order, latitudes either way: every report pairs its cell,
    whatever the window (B read in the keys' order, each coordinate ascending); before, a B
    stored (lon, lat, time) paired almost nothing at a small window."""
    import pyarrow as pa

    src = open_input(write_grid(tmp_path / "at.nc", ("time", "lat", "lon")), keys=["time", "lat", "lon"])
    a = pa.Table.from_batches(list(src.batches()))
    a = a.take(np.arange(0, a.num_rows, 7))  # a sparse subset of the cells: station reports
    pq.write_table(a, tmp_path / "a.parquet")
    b = write_grid(tmp_path / "b.nc", order, flip=flip)
    stats, t = merge(capsys, tmp_path / "a.parquet", b, tmp_path / "o.parquet", "--keys", "time,lat,lon")
    assert stats["matched"] == stats["a_records"] == a.num_rows
    assert stats["b_order"] == ("as stored" if order == ("time", "lat", "lon") and not flip else "A's key order")
    assert_same_places(t)
