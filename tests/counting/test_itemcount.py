"""ItemCounts' exact counting against a plain Python oracle (collections.Counter): any batches, items
and times; intervals (--every) and one range (--from/--to); the in-place (bincount) and the sorting
paths of a batch, compaction, and bodies added on top."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

import smerge.counting.itemcount as ic
from smerge.counting.itemcount import ItemCounts


def oracle(items, times, every=None, start=None, stop=None):
    c = Counter()
    for it, t in zip(items, times):
        if every is not None:
            c[(t // every * every, it)] += 1
        elif start <= t < stop:
            c[(start, it)] += 1
    return c


def answer(ct: ItemCounts, lifetime=None):
    t = ct.table(lifetime)
    return {(r["start"], r["item"]): r["count"] for r in t.to_pylist()}, t


rows = st.lists(st.tuples(st.integers(-3, 40), st.integers(-10**6, 10**6)), max_size=300)


@settings(max_examples=80, deadline=None)
@given(rows, st.sampled_from([1, 7, 1000, 10**5, 10**9]), st.integers(1, 64), st.booleans())
def test_every_equals_the_oracle(data, every, batch, strings):
    items = [f"s{i}" if strings else i for i, _ in data]
    times = [t for _, t in data]
    ct = ItemCounts(pa.string() if strings else pa.int64(), pa.int64(), every=every)
    for a in range(0, len(data), batch):
        ct.add_raw(pa.array(items[a:a + batch], pa.string() if strings else pa.int64()),
                   np.asarray(times[a:a + batch], np.int64))
    got, t = answer(ct)
    assert got == dict(oracle(items, times, every=every))
    assert all(t.column("exact").to_pylist())
    keys = list(zip(t.column("start").to_pylist(), t.column("item").to_pylist()))
    assert keys == sorted(keys)  # by interval, then item


@settings(max_examples=40, deadline=None)
@given(rows, st.integers(-10**6, 10**6), st.integers(1, 10**6), st.integers(1, 64))
def test_range_equals_the_oracle(data, start, width, batch):
    items, times = [i for i, _ in data], [t for _, t in data]
    ct = ItemCounts(pa.int64(), pa.int64(), start=start, stop=start + width)
    for a in range(0, len(data), batch):
        ct.add_raw(pa.array(items[a:a + batch], pa.int64()), np.asarray(times[a:a + batch], np.int64))
    got, _ = answer(ct)
    assert got == dict(oracle(items, times, start=start, stop=start + width))


def test_compaction_and_huge_interval_spans(monkeypatch):
    """Many small parts compacted along the way; intervals of 1 tick over 2^40 ticks (the sorting
    path, no int64 overflow of interval x item keys)."""
    monkeypatch.setattr(ic, "COMPACT_ROWS", 50)
    rng = np.random.default_rng(1)
    items = rng.integers(0, 30, 5000)
    times = rng.integers(0, 2**40, 5000)
    ct = ItemCounts(pa.int64(), pa.int64(), every=1 << 30)
    for a in range(0, 5000, 97):
        ct.add_raw(pa.array(items[a:a + 97]), times[a:a + 97])
    got, _ = answer(ct)
    assert got == dict(oracle(items.tolist(), times.tolist(), every=1 << 30))
    ct = ItemCounts(pa.int64(), pa.int64(), every=1)
    ct.add_raw(pa.array(items), times)
    got, _ = answer(ct)
    assert got == dict(oracle(items.tolist(), times.tolist(), every=1))


def test_bodies_add_to_the_raw_counts_and_cancel_to_nothing():
    ct = ItemCounts(pa.int64(), pa.int64(), every=10)
    ct.add_raw(pa.array([1, 2, 2]), np.array([0, 5, 15]))
    ct.add_bodies("forecast", pa.array([2, 3]), 0, np.array([7, 4]))
    ct.add_bodies("correct", pa.array([3]), 0, np.array([-4]))  # item 3 did not occur: nothing left
    got, t = answer(ct, lifetime=10)
    assert got == {(0, 1): 1, (0, 2): 8, (10, 2): 1}
    assert all(t.column("exact").to_pylist())
