"""The pair gather from several input batches (``merge.output.RowStore.take`` over several
segments): fixed-width columns are gathered by the C kernel from the batches as they are
(``merge._kernel.gather_segments``), without concatenating them; the result is Arrow's take of
the batches' concatenation, for every fixed-width type, sliced batches, compacted segments and
positions in any order; a position outside is refused; columns the kernel cannot read (nulls,
strings, booleans) go to Arrow's take."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smerge.merge import _kernel
from smerge.merge.output import RowStore, _numpy_take

SCHEMA = pa.schema([("f8", pa.float64()), ("f4", pa.float32()), ("i2", pa.int16()), ("u1", pa.uint8()),
                    ("ts", pa.timestamp("ns")), ("d32", pa.date32()), ("u8", pa.uint64())])


def _batch(first: int, n: int, offset: int = 0) -> pa.RecordBatch:
    r = np.arange(first - offset, first + n)
    b = pa.RecordBatch.from_arrays([
        pa.array(r * 0.25), pa.array((r % 97).astype("f4")), pa.array((r % 3000 - 1500).astype("i2")),
        pa.array((r % 256).astype("u1")), pa.array(r * 1_000_000_007, pa.timestamp("ns")),
        pa.array((r % 20000).astype("i4"), pa.date32()), pa.array(r.astype("u8") * (2**40 + 1))], schema=SCHEMA)
    return b.slice(offset, n)


@settings(max_examples=80, deadline=None)
@given(sizes=st.lists(st.integers(1, 60), min_size=2, max_size=5), offset=st.integers(0, 3), data=st.data())
def test_gather_from_several_batches_equals_arrows_take(sizes, offset, data):
    batches, first = [], 0
    for n in sizes:
        batches.append(_batch(first, n, offset))
        first += n
    pos = np.array(data.draw(st.lists(st.integers(0, first - 1), max_size=150)), np.int64)
    got = _numpy_take(batches, pos)
    expect = pa.Table.from_batches(batches).take(pa.array(pos, pa.int64()))
    assert pa.Table.from_batches([got]).equals(expect.combine_chunks())
    for bad in ([first], [-1], [0, first + 5]):
        with pytest.raises(IndexError):
            _numpy_take(batches, np.array(bad, np.int64))


def test_row_store_gathers_across_plain_and_compacted_segments():
    store = RowStore(SCHEMA)
    for k in range(4):
        store.append(_batch(100 * k, 100), 100 * k)
    live = np.concatenate([np.arange(0, 100, 3), np.arange(150, 400, 7)])
    store.release(live, 200)  # the first segments compacted into one of the live rows
    rows = np.concatenate([live[::-1], np.arange(200, 400)])
    rng = np.random.default_rng(1)
    rng.shuffle(rows)
    got = store.take(rows)
    full = pa.Table.from_batches([_batch(0, 400)])
    assert pa.Table.from_batches([got]).equals(full.take(pa.array(rows, pa.int64())).combine_chunks())


def test_columns_the_kernel_cannot_read_go_to_arrow():
    schema = pa.schema([("x", pa.float64()), ("s", pa.string()), ("b", pa.bool_())])
    b1 = pa.record_batch({"x": [1.0, None], "s": ["a", "b"], "b": [True, False]}, schema=schema)
    b2 = pa.record_batch({"x": [3.0, 4.0], "s": ["c", "d"], "b": [False, True]}, schema=schema)
    assert _numpy_take([b1, b2], np.array([3, 0], np.int64)) is None
    store = RowStore(schema)
    store.append(b1, 0)
    store.append(b2, 2)
    got = store.take(np.array([3, 1, 0, 2]))
    assert got.to_pydict() == {"x": [4.0, None, 1.0, 3.0], "s": ["d", "b", "a", "c"], "b": [True, False, True, False]}


def test_kernel_gather_segments_checks_its_arrays():
    out = np.empty(2, np.float64)
    _kernel.gather_segments([np.array([1.0, 2.0]), np.array([3.0])], np.array([2, 0]), out)
    assert out.tolist() == [3.0, 1.0]
    with pytest.raises(ValueError):
        _kernel.gather_segments([np.array([1.0]), np.array([1], np.int32)], np.array([0]), out)
    with pytest.raises(ValueError):
        _kernel.gather_segments([np.array([b"abc"], "S3")], np.array([0]), np.empty(1, "S3"))
