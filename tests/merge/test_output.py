"""RowStore.take against a plain reference: every path (one segment, consecutive plain segments,
compacted segments, a string column) returns exactly the records asked for, in the order asked."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smerge.merge.output import RowStore

SCHEMA = pa.schema([("k", pa.float64()), ("v", pa.float32()), ("s", pa.string())])


def batch(first: int, n: int) -> pa.RecordBatch:
    r = np.arange(first, first + n)
    return pa.RecordBatch.from_arrays([pa.array(r * 0.5), pa.array((r % 7).astype("f4")),
                                       pa.array([f"r{i}" for i in r])], schema=SCHEMA)


def expected(rows) -> dict:
    rows = [int(r) for r in rows]
    return {"k": [r * 0.5 for r in rows], "v": [float(r % 7) for r in rows], "s": [f"r{r}" for r in rows]}


@settings(max_examples=80)
@given(sizes=st.lists(st.integers(1, 3000), min_size=1, max_size=5), data=st.data())
def test_take_equals_the_reference(sizes, data):
    store, first = RowStore(SCHEMA), 0
    for n in sizes:
        store.append(batch(first, n), first)
        first += n
    # optionally release some rows first (more than 4096 dead rows: the old segments are
    # compacted into one that lists its row ids)
    if data.draw(st.booleans()) and first > 1:
        live = sorted(data.draw(st.sets(st.integers(0, first - 1), min_size=1)))
        cut = data.draw(st.integers(0, first))
        store.release(np.array(live, np.int64), cut)
        alive = [r for r in range(first) if r in set(live) or r >= cut]
    else:
        alive = list(range(first))
    rows = data.draw(st.lists(st.sampled_from(alive), max_size=60))
    got = store.take(np.array(rows, np.int64))
    assert got.schema == SCHEMA
    assert got.to_pydict() == expected(rows)


@pytest.mark.parametrize("rows", [[5, 6, 7, 8], [3], [12, 11, 40, 0, 25, 25], list(range(0, 64, 3))])
def test_take_over_consecutive_segments(rows):
    store = RowStore(SCHEMA)
    for first in range(0, 64, 16):
        store.append(batch(first, 16), first)
    assert store.take(np.array(rows)).to_pydict() == expected(rows)



def test_take_after_compaction():
    """Rows from a compacted segment (it lists its row ids) and the plain ones after it."""
    store = RowStore(SCHEMA)
    for first in range(0, 12000, 3000):
        store.append(batch(first, 3000), first)
    live = np.arange(0, 9000, 10)
    store.release(live, 9000)
    assert store._segs[0][1] is not None  # compacted
    alive = np.concatenate([live, np.arange(9000, 12000)])
    rows = np.random.default_rng(5).choice(alive, 500)
    assert store.take(rows).to_pydict() == expected(rows)
    assert store.take(live[::-1]).to_pydict() == expected(live[::-1])
    assert store.take(np.arange(9500, 9600)).to_pydict() == expected(range(9500, 9600))


NUMERIC = pa.schema([("k", pa.float64()), ("v", pa.float32()), ("i", pa.int16()), ("u", pa.uint64())])


@settings(max_examples=60)
@given(n=st.integers(1, 400), offset=st.integers(0, 5), data=st.data())
def test_numpy_gather_equals_arrows_take(n, offset, data):
    """Fixed-width numbers without nulls are gathered by numpy (no Arrow compute functions):
    the same batch as Arrow's take, on sliced batches too; a position outside the batch is
    refused, never clamped."""
    from smerge.merge.output import _numpy_take

    r = np.arange(n + offset)
    b = pa.RecordBatch.from_arrays([pa.array(r * 0.25), pa.array((r % 9).astype("f4")), pa.array((r % 300).astype("i2")),
                                    pa.array(r.astype("u8") * 3)], schema=NUMERIC).slice(offset, n)
    pos = np.array(data.draw(st.lists(st.integers(0, n - 1), max_size=80)), np.int64)
    got = _numpy_take(b, pos)
    assert got.equals(b.take(pa.array(pos, pa.int64())))
    with pytest.raises(IndexError):
        _numpy_take(b, np.array([0, n], np.int64))
    with pytest.raises(IndexError):
        _numpy_take(b, np.array([-1], np.int64))


def test_numpy_gather_steps_aside_for_nulls_and_strings():
    from smerge.merge.output import _numpy_take

    assert _numpy_take(pa.record_batch({"x": pa.array([1.0, None])}), np.array([1], np.int64)) is None
    assert _numpy_take(pa.record_batch({"s": ["a", "b"]}), np.array([1], np.int64)) is None
    store = RowStore(pa.schema([("x", pa.float64())]))
    store.append(pa.record_batch({"x": pa.array([1.0, None, 3.0])}), 0)
    assert store.take(np.array([2, 1, 0])).column(0).to_pylist() == [3.0, None, 1.0]


def test_numpy_gather_takes_times_and_dates_as_arrow_does():
    from smerge.merge.output import _numpy_take

    r = np.arange(20)
    b = pa.RecordBatch.from_arrays([pa.array(r * 10**6, pa.timestamp("us", "UTC")), pa.array(r.astype("i4"), pa.date32()),
                                    pa.array(r * 7, pa.duration("ms"))], names=["t", "d", "dt"]).slice(3, 15)
    pos = np.array([14, 0, 3, 3, 7], np.int64)
    got = _numpy_take(b, pos)
    assert got is not None and got.equals(b.take(pa.array(pos, pa.int64())))
