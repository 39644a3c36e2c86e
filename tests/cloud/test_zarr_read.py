"""How a Zarr store is read: the blocks read ahead give exactly the values a direct read gives,
whatever ranges are asked (aligned or straddling, forward, backward, another axis), hold at
most about ``depth`` reads' worth ahead, and are dropped at close; importing zarr scans the installed
packages' entry points once."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st

from smerge.datasets.zarr_store import _ReadAhead


@pytest.fixture(scope="module")
def array(tmp_path_factory):
    path = tmp_path_factory.mktemp("ra") / "a.zarr"
    a = zarr.create_array(str(path), shape=(23, 5, 3), chunks=(4, 5, 2), dtype="i4", fill_value=-1)
    a[:] = np.arange(23 * 5 * 3, dtype="i4").reshape(23, 5, 3)
    a[20:] = -1  # the last chunk's values are the fill value (the chunk may be absent)
    return zarr.open_array(str(path), mode="r")


def key(ax: int, lo: int, hi: int, ndim: int = 3) -> tuple:
    return tuple(slice(lo, hi) if i == ax else slice(None) for i in range(ndim))


ranges = st.lists(st.tuples(st.sampled_from([0, 0, 0, 2]), st.integers(0, 22), st.integers(1, 9)),
                  min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(ranges, st.integers(0, 4))
def test_reads_ahead_equal_direct_reads(array, asks, depth):
    read = _ReadAhead(array, depth)
    longest = 0
    try:
        for ax, lo, n in asks:
            hi = min(lo + n, array.shape[ax])
            lo = min(lo, hi - 1)
            got = read(key(ax, lo, hi))
            assert np.array_equal(got, array[key(ax, lo, hi)])
            ahead = read._ahead
            longest = max(longest, hi - lo)
            # memory: at most depth reads (and the last one begun) past this one
            assert sum(b - max(a, hi) for a, b in ahead if b > hi) <= (depth + 1) * longest
            assert all(b > lo for _, b in ahead)  # nothing behind the read is kept
    finally:
        read.close()
    assert read._ahead == {}


def test_slabs_of_two_chunks_are_read_ahead_and_served_from_the_prefetch(array):
    read = _ReadAhead(array, 2)
    assert np.array_equal(read(key(0, 0, 8)), array[0:8])
    assert sorted(read._ahead) == [(8, 16), (16, 23)]
    read._ahead[(8, 16)].result()
    calls = []
    direct = read._array

    class Spy:
        shape = direct.shape

        def __getitem__(self, k):
            calls.append(k)
            return direct[k]

    read._array = Spy()
    assert np.array_equal(read(key(0, 8, 16)), array[8:16])
    assert calls == []  # served from the reads ahead: nothing read again
    assert np.array_equal(read(key(0, 16, 23)), array[16:23])
    assert np.array_equal(read(key(0, 16, 23))[-1], np.full((5, 3), -1))
    read.close()


def test_other_reads_are_direct(array):
    read = _ReadAhead(array, 3)
    assert np.array_equal(read((slice(0, 4), slice(0, 2), slice(None))), array[0:4, 0:2])
    assert np.array_equal(read((3, slice(None), slice(None))), array[3])
    assert np.array_equal(read((slice(0, 9, 2), slice(None), slice(None))), array[0:9:2])
    assert read._ahead == {}


def test_importing_zarr_scans_entry_points_once():
    code = (
        "import importlib.metadata as md\n"
        "calls = []\n"
        "real = md.entry_points\n"
        "def counted(**p):\n"
        "    calls.append(p)\n"
        "    return real(**p)\n"
        "md.entry_points = counted\n"
        "from smerge.datasets import zarr_store\n"
        "z = zarr_store._zarr()\n"
        "import numcodecs, fsspec\n"
        "assert md.entry_points is counted\n"
        "assert z.storage.LocalStore and numcodecs.get_codec({'id': 'zlib'}) is not None\n"
        "print(len(calls))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["1"]
