"""Zarr stores (v2 and v3, consolidated or not, written by xarray and zarr-python) are read by
the netCDF reader through its adapter: the same records, keys, CF times, packing and masks as
the netCDF file they copy, slab by slab, reading only the chunks a slab needs."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xarray as xr
import zarr
from cloud_files import LATS, LONS, TIMES, cf_grid, zarr_copy

from smerge.cli.main import main
from smerge.datasets import open_input
from smerge.errors import InputError

FORMATS = [(2, True), (2, False), (3, False), (3, True)]


def table(src) -> pa.Table:
    return pa.Table.from_batches(list(src.batches()), schema=src.schema)


def run(capsys, *args):
    rc = main([str(a) for a in args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.mark.parametrize("zarr_format,consolidated", FORMATS)
def test_a_zarr_copy_reads_as_the_netcdf_file(zarr_format, consolidated, tmp_path):
    nc = cf_grid(tmp_path / "g.nc")
    store = zarr_copy(nc, tmp_path / "g.zarr", zarr_format=zarr_format, consolidated=consolidated,
                      chunks={"time": 2})
    # slabs of 3 times against chunks of 2: slabs that straddle chunks. (A store lists its
    # arrays by name, a netCDF file in creation order: the default variables come in another
    # order, so both are named here.)
    assert set(open_input(store).schema.names) == set(open_input(nc).schema.names)
    want = open_input(nc, variables=["tas", "pr"], batch_rows=3 * LATS * LONS)
    got = open_input(store, variables=["tas", "pr"], batch_rows=3 * LATS * LONS)
    assert got.keys == want.keys == ("time", "lat", "lon")
    assert got.grid.dims == ("time", "y", "lon")
    tw, tg = table(want), table(got)
    assert tg.schema.equals(want.schema, check_metadata=True)
    assert tg.equals(tw)
    assert tg.num_rows == TIMES * LATS * LONS
    # the CF rules were applied, not just copied: noleap days, masks, unpacking
    assert tg["time"].to_pylist()[LATS * LONS * 2] == tg["time"].to_pylist()[0] + 2 * 86_400_000_000
    above = int((xr.open_dataset(nc)["tas"].values > 2).sum())  # valid_max = 2
    assert above >= 3 and tg["tas"].to_pylist()[:3] == [None] * 3
    assert tg["tas"].null_count == above and tg["pr"].null_count == 2
    assert got.counters["masked"] == want.counters["masked"] == above
    # xarray's own decoding of the same store agrees (its masks, its unpacking)
    xs = xr.open_zarr(store, decode_times=False)
    assert np.allclose(np.asarray(tg["pr"].to_numpy(zero_copy_only=False), dtype="f8"),
                       xs["pr"].values.reshape(-1), equal_nan=True)


def test_a_zarr_copy_merges_with_its_netcdf_file_pair_for_pair(tmp_path, capsys):
    nc = cf_grid(tmp_path / "g.nc", packed=False)
    store = zarr_copy(nc, tmp_path / "g.zarr", zarr_format=3, consolidated=False, chunks={"time": 4})
    out = tmp_path / "o.parquet"
    rc, so, se = run(capsys, "cgm", nc, store, "--local", "-o", out, "--json")
    assert rc == 0, se
    stats = json.loads(so)
    assert stats["matched"] == stats["a_records"] == stats["b_records"] == TIMES * LATS * LONS
    t = pq.read_table(out)
    for k in ("time", "lat", "lon", "tas"):
        assert t[k].to_pylist() == t[f"{k}_b"].to_pylist(), k


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_transposed_zarr_b_is_read_in_a_order(zarr_format, tmp_path, capsys):
    nc = cf_grid(tmp_path / "g.nc", packed=False)
    store = zarr_copy(nc, tmp_path / "t.zarr", zarr_format=zarr_format, consolidated=False,
                      transpose=("lon", "time", "y"), chunks={"lon": 3, "time": 4})
    out = tmp_path / "o.parquet"
    rc, so, se = run(capsys, "cgm", nc, store, "--local", "-o", out, "--json", "--window", "50", "--increment", "10")
    assert rc == 0, se
    stats = json.loads(so)
    assert stats["matched"] == TIMES * LATS * LONS and stats["b_order"] == "A's key order"
    t = pq.read_table(out)
    for k in ("time", "lat", "lon", "tas"):
        assert t[k].to_pylist() == t[f"{k}_b"].to_pylist(), k


def _zarr_python_store(path, zarr_format: int, *, fill_value, attrs=None):
    """A store written by zarr-python alone (no xarray): 4 times x 3 lats, chunks of 2 times."""
    g = zarr.open_group(str(path), mode="w", zarr_format=zarr_format)
    names = {}

    def array(name, data, dims, chunks, fill=None, extra=None):
        kw = {"dimension_names": dims} if zarr_format == 3 else {}
        a = g.create_array(name, shape=data.shape, dtype=data.dtype, chunks=chunks, fill_value=fill, **kw)
        a[...] = data
        if zarr_format == 2:
            a.attrs["_ARRAY_DIMENSIONS"] = list(dims)
        a.attrs.update(extra or {})
        names[name] = a
        return a

    array("time", np.array([0, 6, 12, 18], dtype="i8"), ("time",), (4,), None,
          {"units": "hours since 1999-12-30 00:00", "calendar": "360_day"})
    array("lat", np.array([10.0, 20.0, 30.0]), ("lat",), (3,), None, {"units": "degrees_north"})
    data = np.arange(12, dtype="f4").reshape(4, 3)
    array("v", data, ("time", "lat"), (2, 3), fill_value, attrs)
    return str(path), names


def test_zarr_python_v2_missing_chunk_reads_as_fill_value_then_masked(tmp_path):
    """v2: the array's fill_value is its _FillValue (as xarray reads v2): a missing chunk is missing."""
    path, _ = _zarr_python_store(tmp_path / "s.zarr", 2, fill_value=-1.0)
    os.remove(os.path.join(path, "v", "1.0"))  # times 2 and 3
    t = table(open_input(path, batch_rows=3))
    assert t["v"].to_pylist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0] + [None] * 6
    assert t["time"].type == pa.int64() and t.schema.field("time").metadata[b"calendar"] == b"360_day"
    xs = xr.open_zarr(path).load()
    assert np.isnan(xs["v"].values[2:]).all()


def test_zarr_python_v3_missing_chunk_reads_as_fill_value_a_value(tmp_path):
    """v3: the fill_value is a value (xarray's rule for v3); only a _FillValue attribute masks."""
    path, _ = _zarr_python_store(tmp_path / "s.zarr", 3, fill_value=-1.0)
    os.remove(os.path.join(path, "v", "c", "1", "0"))
    t = table(open_input(path, batch_rows=3))
    assert t["v"].to_pylist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0] + [-1.0] * 6
    assert np.array_equal(xr.open_zarr(path)["v"].values.reshape(-1), np.array(t["v"].to_pylist(), dtype="f4"))
    path, _ = _zarr_python_store(tmp_path / "m.zarr", 3, fill_value=-1.0, attrs={"_FillValue": -1.0})
    os.remove(os.path.join(path, "v", "c", "1", "0"))
    assert table(open_input(path))["v"].to_pylist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0] + [None] * 6


def test_slabs_read_only_the_chunks_they_need(tmp_path):
    """A corrupt chunk of the later times: the earlier slabs read, the slab that needs it fails
    with one line (so a slab never reads the variable whole)."""
    path, _ = _zarr_python_store(tmp_path / "s.zarr", 3, fill_value=0.0)
    with open(os.path.join(path, "v", "c", "1", "0"), "wb") as f:
        f.write(b"\x00garbage")
    src = open_input(path, batch_rows=3)  # one time per slab
    first = pa.Table.from_batches(list(src.batches(0, 2)))
    assert first["v"].to_pylist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    with pytest.raises(InputError, match=r"s\.zarr: cannot read variable 'v'"):
        list(src.batches(2, 4))


def test_bad_stores_are_one_line(tmp_path, capsys):
    ok = cf_grid(tmp_path / "g.nc", packed=False)
    path, arrays = _zarr_python_store(tmp_path / "s.zarr", 3, fill_value=0.0)
    g = zarr.open_group(path, mode="a")
    g.create_array("w", shape=(5, 3), dtype="f4", chunks=(5, 3), dimension_names=("time", "lat"))
    rc, _, se = run(capsys, "cgm", ok, path, "--local", "-o", tmp_path / "o.parquet")
    assert rc == 2 and "s.zarr: dimension 'time' has size " in se and "'w'" in se
    assert "metadata is inconsistent" in se and "Traceback" not in se and len(se.strip().splitlines()) == 1
    g2 = zarr.open_group(str(tmp_path / "n.zarr"), mode="w", zarr_format=3)
    g2.create_array("v", shape=(3,), dtype="f4", chunks=(3,))
    rc, _, se = run(capsys, "cgm", ok, tmp_path / "n.zarr", "--local", "-o", tmp_path / "o.parquet")
    assert rc == 2 and "array 'v' has no dimension names" in se
    os.makedirs(tmp_path / "empty.zarr")
    rc, _, se = run(capsys, "cgm", ok, tmp_path / "empty.zarr", "--local", "-o", tmp_path / "o.parquet")
    assert rc == 2 and "not a data file nor a Zarr store (no zarr.json or .zgroup)" in se
    with open(tmp_path / "s.zarr" / "zarr.json", "w") as f:
        f.write("{not json")
    rc, _, se = run(capsys, "cgm", ok, path, "--local", "-o", tmp_path / "o.parquet")
    assert rc == 2 and "cannot open as a Zarr store" in se and len(se.strip().splitlines()) == 1
