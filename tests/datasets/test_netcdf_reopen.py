"""A netCDF source rebuilt from ``InputSource.reopen`` (what a Spark task does instead of reading
the file's metadata again) reads exactly what the source it came from reads, and every read --
of either -- refuses a file that changed since its metadata was read."""

from __future__ import annotations

import pickle

import netCDF4
import numpy as np
import pyarrow as pa
import pytest

from smerge.datasets import open_input
from smerge.errors import InputError


def _grid(path, nt=6, ny=3, nx=4, dtype="f4"):
    with netCDF4.Dataset(path, "w") as ds:
        for d, n in (("time", nt), ("lat", ny), ("lon", nx)):
            ds.createDimension(d, n)
        t = ds.createVariable("time", "f8", ("time",))
        t.units = "hours since 2001-02-03"
        t.calendar = "noleap"
        t[:] = np.arange(nt) * 6.0
        ds.createVariable("lat", "f4", ("lat",))[:] = np.linspace(-10, 10, ny)
        ds.createVariable("lon", "f4", ("lon",))[:] = np.linspace(0, 30, nx)
        v = ds.createVariable("v", dtype, ("time", "lat", "lon"), fill_value=-1)
        v.valid_max = 100
        data = np.arange(nt * ny * nx, dtype=np.float64).reshape(nt, ny, nx)
        v[:] = np.ma.masked_where(data % 7 == 0, data)
    return str(path)


def _table(src, start=0, stop=None):
    return pa.Table.from_batches(list(src.batches(start, stop)), schema=src.schema)


def test_reopened_source_reads_the_same(tmp_path):
    path = _grid(tmp_path / "g.nc")
    src = open_input(path, batch_rows=24)
    fn, args = pickle.loads(pickle.dumps(src.reopen))  # as a task receives it
    again = fn(*args)
    assert again.schema == src.schema and again.keys == src.keys
    assert (again.num_rows, again.outer_size, again.inner_size) == (src.num_rows, src.outer_size, src.inner_size)
    assert _table(again).equals(_table(src))
    assert _table(again, 2, 5).equals(_table(src, 2, 5))
    assert again.counters is not src.counters  # each source counts its own reads


@pytest.mark.parametrize("change", ["longer", "retyped", "gone"])
def test_a_changed_file_is_refused_by_every_read(tmp_path, change):
    path = _grid(tmp_path / "g.nc")
    src = open_input(path)
    fn, args = pickle.loads(pickle.dumps(src.reopen))
    if change == "longer":
        _grid(path, nt=7)
    elif change == "retyped":
        _grid(path, dtype="f8")
    else:
        with netCDF4.Dataset(path, "w") as ds:
            ds.createDimension("time", 6)
            ds.createVariable("time", "f8", ("time",))[:] = np.arange(6.0)
    for source in (src, fn(*args)):
        with pytest.raises(InputError, match="changed since it was opened"):
            _table(source)
