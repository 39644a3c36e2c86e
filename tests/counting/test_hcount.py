"""The hCount sketch: never under-counts, error = the least-loaded row's collisions, eFreq output."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smerge.errors import UsageError
from smerge.counting.hcount import HCount, item_keys, parse_sketch


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-50, 400), min_size=0, max_size=600), st.integers(1, 8), st.integers(1, 40),
       st.integers(0, 5))
def test_never_under_counts_and_error_is_the_collisions(items, depth, width, seed):
    s = HCount(depth, width, seed=seed)
    keys = item_keys(np.asarray(items, np.int64))
    s.update(keys)
    u, true = np.unique(keys, return_counts=True)
    est = s.estimate(u)
    assert (est >= true).all()
    assert (est - true <= len(items) - true).all()
    # exactly the least-loaded row's collisions: brute force over the distinct items
    cells = s.cells(u)
    for j in range(len(u)):
        others = [int(true[(cells[i] == cells[i, j])].sum() - true[j]) for i in range(depth)]
        assert est[j] - true[j] == min(others)


def test_error_bound_on_a_skewed_stream():
    rng = np.random.default_rng(3)
    n, width, depth = 200_000, 100, 5
    items = rng.zipf(1.3, n) % 50_000
    s = HCount(depth, width, seed=1)
    s.update(item_keys(items))
    u, true = np.unique(items, return_counts=True)
    err = s.estimate(item_keys(u)) - true
    assert (err >= 0).all()
    # count-min: P(error > e * n / m) <= exp(-depth) for each item; allow 3x slack
    assert (err > np.e * n / width).mean() <= 3 * np.exp(-depth)


def test_frequent_threshold_cap_and_order():
    s = HCount(30, 30)
    items = np.array([1] * 500 + [2] * 300 + [3] * 200 + list(range(100, 1100)))
    s.update(item_keys(items))
    u = np.unique(item_keys(items))
    pos, est = s.frequent(u, support=0.05, max_frequent=2)
    assert len(pos) == 2 and list(est) == sorted(est, reverse=True)
    assert set(u[pos]) <= set(item_keys(np.array([1, 2, 3])))
    assert (est >= 0.05 * s.n).all()
    pos, _ = s.frequent(u, support=1.0)
    assert len(pos) == 0
    s.reset()
    assert s.n == 0 and len(s.frequent(u)[0]) == 0


def test_item_keys_strings_floats_and_bad_types():
    a = item_keys(pa.array(["x", "y", "x"]))
    assert a[0] == a[2] != a[1]
    assert item_keys(pa.array([0.0]))[0] == item_keys(pa.array([-0.0]))[0]
    d = item_keys(pa.array(["x", "y", "x"]).dictionary_encode())
    assert (d == a).all()
    with pytest.raises(UsageError, match="cannot be counted"):
        item_keys(pa.array([[1]]))


def test_parse_sketch():
    assert parse_sketch("30x30") == (30, 30) and parse_sketch("4X100") == (4, 100)
    for bad in ("30", "0x5", "ax3", "5x"):
        with pytest.raises(UsageError, match="HxM"):
            parse_sketch(bad)
    with pytest.raises(UsageError):
        HCount(0, 3)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 100), max_size=300), st.integers(1, 5), st.integers(1, 20))
def test_weighted_update_equals_one_by_one(items, depth, width):
    a, b = HCount(depth, width, seed=7), HCount(depth, width, seed=7)
    keys = item_keys(np.asarray(items, np.int64))
    a.update(keys)
    u, c = np.unique(keys, return_counts=True)
    b.update(u, c)
    assert (a.counters == b.counters).all() and a.n == b.n


def test_efreq_without_collisions_is_the_exact_support_set():
    """With no collision eFreq returns exactly the items whose count is >= support * n (at most F,
    highest first): on Zipf 1 over 1..10,000 at support 0.5% that is the top floor(1 / (s H_D)) = 20
    items (the bound of docs/transport.md)."""
    rng = np.random.default_rng(5)
    d = 10_000
    p = 1.0 / np.arange(1, d + 1)
    p /= p.sum()
    items = rng.choice(np.arange(1, d + 1), 200_000, p=p)
    u, true = np.unique(items, return_counts=True)
    s = HCount(4, 1 << 20, seed=2)
    s.update(item_keys(u), true)
    assert (s.estimate(item_keys(u)) == true).all()  # no collision in the least-loaded row
    pos, est = s.frequent(item_keys(u), support=0.005, max_frequent=300)
    want = np.nonzero(true >= 0.005 * len(items))[0]
    assert sorted(pos) == sorted(want) and (est == true[pos]).all()
    assert set(u[want]) == set(range(1, 21))  # 1 / (0.005 * H_10000) = 20.4
    pos, _ = s.frequent(item_keys(u), support=0.005, max_frequent=7)
    assert list(u[pos]) == list(u[want][np.argsort(-true[want], kind="stable")][:7])


def test_a_30x30_sketch_admits_every_item_of_a_zipf_stream():
    """The 30 x 30 sketch's collisions exceed 0.5% of n for every item of this stream, so eFreq at
    support 0.5% admits them all and the FDI's cap (not the support) decides: why the defaults filter
    more than the exact support set would."""
    rng = np.random.default_rng(6)
    d = 10_000
    p = 1.0 / np.arange(1, d + 1)
    p /= p.sum()
    items = rng.choice(np.arange(1, d + 1), 100_000, p=p)
    u, true = np.unique(items, return_counts=True)
    s = HCount(30, 30)
    s.update(item_keys(u), true)
    est = s.estimate(item_keys(u))
    assert (est >= true).all() and (est - true > 0.005 * len(items)).all()
    pos, _ = s.frequent(item_keys(u), support=0.005, max_frequent=300)
    assert len(pos) == 300
    assert set(range(1, 21)) <= set(u[pos])  # the truly frequent ones are among them
