"""Round trips for every reader and writer, format detection, and `smerge gen`."""

from __future__ import annotations

import hashlib

import netCDF4
import numpy as np
import pyarrow as pa
import pytest

from smerge.datasets import open_input, open_output
from smerge.datasets.gen import GenParams, generate, stream_order, write_netcdf
from smerge.errors import InputError, OutputError, UsageError


def sample(n=1000) -> pa.Table:
    rng = np.random.default_rng(1)
    return pa.table({
        "time": np.arange(n, dtype=np.float64) * 6,
        "lat": rng.uniform(-90, 90, n).astype(np.float32),
        "lon": rng.uniform(-180, 180, n).astype(np.float32),
        "p": rng.standard_normal(n).astype(np.float32),
        "n": np.arange(n, dtype=np.int64),
    })


@pytest.mark.parametrize("ext", [".parquet", ".csv", ".arrow"])
def test_tabular_roundtrip(tmp_path, ext):
    t = sample()
    path = str(tmp_path / f"x{ext}")
    with open_output(path, t.schema) as w:
        for b in t.to_batches(max_chunksize=300):
            w.write(b)
    src = open_input(path, keys=["time", "lat", "lon"], batch_rows=128)
    assert src.keys == ("time", "lat", "lon")
    batches = list(src.batches())
    assert max(b.num_rows for b in batches) <= 128
    back = pa.Table.from_batches(batches)
    if ext == ".csv":  # CSV keeps values, not float32 widths
        for c in t.schema.names:
            np.testing.assert_allclose(back[c].to_numpy().astype(np.float64), t[c].to_numpy().astype(np.float64),
                                       rtol=1e-6)
    else:
        assert back.equals(t)


def test_row_ranges(tmp_path):
    t = sample(100)
    path = str(tmp_path / "x.parquet")
    with open_output(path, t.schema) as w:
        w.write(t.to_batches()[0])
    src = open_input(path, keys=["time"], batch_rows=7)
    part = pa.Table.from_batches(list(src.batches(30, 55)))
    assert part["n"].to_pylist() == list(range(30, 55))


def test_arrow_stream_format(tmp_path):
    t = sample(50)
    path = tmp_path / "x.arrows"
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_stream(f, t.schema) as w:
        w.write_table(t)
    back = pa.Table.from_batches(list(open_input(str(path), keys=["time"]).batches()))
    assert back.equals(t)


def test_netcdf_grid_roundtrip_and_point_list(tmp_path):
    p = GenParams(records=2 * 5000, seed=3)
    path = str(tmp_path / "g.nc")
    write_netcdf(path, p)
    src = open_input(path)
    assert src.keys == ("time", "lat", "lon") and src.grid.shape == (2, 50, 100)
    got = pa.Table.from_batches(list(src.batches()))
    want = pa.Table.from_batches(list(generate(p)))
    assert got.equals(want)
    # A shuffled data set is written as a CF point list; keys come from `coordinates`.
    ps = GenParams(records=7000, randomize=10, seed=3)
    path2 = str(tmp_path / "s.nc")
    write_netcdf(path2, ps)
    src2 = open_input(path2)
    assert src2.keys == ("time", "lat", "lon") and src2.grid.dims == ("record",)
    assert pa.Table.from_batches(list(src2.batches())).equals(pa.Table.from_batches(list(generate(ps))))


def test_netcdf_scale_offset_and_fill(tmp_path):
    path = str(tmp_path / "s.nc")
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("time", 3)
        ds.createDimension("x", 2)
        ds.createVariable("time", "f8", ("time",))[:] = [0, 1, 2]
        ds.createVariable("x", "f4", ("x",))[:] = [10, 20]
        v = ds.createVariable("v", "i2", ("time", "x"), fill_value=-999)
        v.scale_factor = 0.5
        v.add_offset = 100.0
        v[:] = np.ma.masked_array([[1.0 + 100, 2 + 100], [3 + 100, 0], [5 + 100, 6 + 100]],
                                  mask=[[0, 0], [0, 1], [0, 0]])
    t = pa.Table.from_batches(list(open_input(path).batches()))
    assert t["v"].to_pylist() == [101.0, 102.0, 103.0, None, 105.0, 106.0]
    assert t["x"].to_pylist() == [10, 20] * 3


def test_netcdf_decode_times(tmp_path):
    path = str(tmp_path / "t.nc")
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("time", 2)
        tv = ds.createVariable("time", "f8", ("time",))
        tv.units = "hours since 1990-01-01 06:00"
        tv[:] = [0, 6]
        ds.createVariable("v", "f4", ("time",))[:] = [1, 2]
    t = pa.Table.from_batches(list(open_input(path, decode_times=True).batches()))
    assert [str(x) for x in t["time"].to_pylist()] == ["1990-01-01 06:00:00", "1990-01-01 12:00:00"]


def test_gen_is_reproducible_and_displacement_bounded(tmp_path):
    a, b = str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")
    p = GenParams(records=20_000, randomize=10, displacement=300, seed=5)
    for path in (a, b):
        with open_output(path, next(generate(p)).schema) as w:
            for batch in generate(p):
                w.write(batch)
    assert hashlib.sha256(open(a, "rb").read()).digest() == hashlib.sha256(open(b, "rb").read()).digest()
    order = stream_order(p)
    assert sorted(order.tolist()) == list(range(p.records))
    # The records not chosen keep their relative order: the longest increasing subsequence
    # holds at least the 90% not chosen, and not all (some chosen ones did move).
    import bisect

    tails: list[int] = []
    for x in order.tolist():
        k = bisect.bisect_left(tails, x)
        tails[k:k + 1] = [x]
    assert 0.9 * p.records <= len(tails) < p.records
    # A randomized record lands within the displacement of where it was, up to the shifts
    # caused by the others: sorting by original index, no record is more than 2x away.
    assert np.abs(order - np.arange(p.records)).max() <= 2 * 300


def test_atomic_output_abort_leaves_nothing(tmp_path):
    t = sample(10)
    path = tmp_path / "o.parquet"
    with pytest.raises(RuntimeError):
        with open_output(str(path), t.schema) as w:
            w.write(t.to_batches()[0])
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_output_errors(tmp_path):
    t = sample(10)
    (tmp_path / "o.parquet").write_bytes(b"x")
    with pytest.raises(OutputError, match="already exists"):
        open_output(str(tmp_path / "o.parquet"), t.schema)
    with pytest.raises(OutputError, match="does not exist"):
        open_output(str(tmp_path / "no" / "o.parquet"), t.schema)
    with pytest.raises(UsageError, match="cannot tell the format"):
        open_output(str(tmp_path / "o.xyz"), t.schema)


def test_input_errors(tmp_path):
    bad = tmp_path / "x.bin"
    bad.write_bytes(b"\x00\x01garbage")
    with pytest.raises(InputError, match="not a supported format"):
        open_input(str(bad))
    with pytest.raises(InputError, match="no such file"):
        open_input(str(tmp_path / "missing.nc"))


def test_format_by_content_without_extension(tmp_path):
    t = sample(20)
    for fmt, ext in (("parquet", ".parquet"), ("csv", ".csv"), ("arrow", ".arrow")):
        path = str(tmp_path / f"x{ext}")
        with open_output(path, t.schema) as w:
            w.write(t.to_batches()[0])
        bare = tmp_path / f"data_{fmt}.dat"
        (tmp_path / f"x{ext}").rename(bare)
        src = open_input(str(bare), keys=["time"])
        assert src.format == fmt and pa.Table.from_batches(list(src.batches())).num_rows == 20
    stream = tmp_path / "stream.bin"
    with pa.OSFile(str(stream), "wb") as f, pa.ipc.new_stream(f, t.schema) as w:
        w.write_table(t)
    assert open_input(str(stream), keys=["time"]).format == "arrow"
    nc = tmp_path / "grid.data"
    write_netcdf(str(nc), GenParams(records=5000, seed=1))
    assert open_input(str(nc)).format == "netcdf"
