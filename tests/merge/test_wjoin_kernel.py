"""The W-join's compiled kernels (merge/_wjoin_kernel.py over merge/_wjoin_ckernel.c) against
numpy references on random data: the arrival order of a chunk is what a lexsort of (time,
stream, position) gives; the purge walk is the purge rule applied after every arrival; a key index probe gives every record of the probe's hash that arrived
before it inside its period (and passes the band conjuncts), newest first, probe by probe."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from smerge.merge._wjoin_kernel import BAND_OPS, INT_NEG, INT_POS, Band, KeyIndex, arrivals, purge_walk


def _arrivals_reference(times, base):
    n = len(times)
    S = np.concatenate([np.full(t.shape[0], i, np.int64) for i, t in enumerate(times)])
    T = np.concatenate(times)
    P = np.concatenate([np.arange(t.shape[0], dtype=np.int64) for t in times])
    order = np.lexsort((P, S, T))
    arr_s = S[order]
    pe = np.array([base[j] + np.cumsum(arr_s == j) - (arr_s == j) for j in range(n)]).reshape(n, -1)
    rank = np.empty(order.shape[0], np.int64)
    rank[order] = np.arange(order.shape[0])
    return arr_s, base[arr_s] + P[order], T[order], pe, rank


@st.composite
def chunk_times(draw):
    n = draw(st.integers(1, 5))
    floats = draw(st.booleans())
    elem = (st.sampled_from([-0.0, 0.0, 1.5, -2.0, 1e300, -np.inf, np.inf]) | st.floats(-3, 3, allow_nan=False)
            if floats else st.integers(-3, 3) | st.sampled_from([-(2**63), 2**63 - 1]))
    times = [np.sort(np.array(draw(st.lists(elem, max_size=12)), np.float64 if floats else np.int64))
             for _ in range(n)]
    base = np.array(draw(st.lists(st.integers(0, 50), min_size=n, max_size=n)), np.int64)
    return times, base


@settings(max_examples=300, deadline=None)
@given(chunk_times())
def test_arrivals_are_the_lexsort_of_time_stream_position(case):
    times, base = case
    got = arrivals(times, base)
    want = _arrivals_reference(times, base)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


def test_arrivals_worked_example():
    t = [np.array([1, 3, 3], np.int64), np.array([0, 3], np.int64), np.array([], np.int64)]
    s, pos, tt, pe, rank = arrivals(t, np.array([10, 0, 4], np.int64))
    assert s.tolist() == [1, 0, 0, 0, 1]  # time 3: stream 0's two records, then stream 1's
    assert pos.tolist() == [0, 10, 11, 12, 1]
    assert tt.tolist() == [0, 1, 3, 3, 3]
    assert pe.tolist() == [[10, 10, 11, 12, 13], [0, 1, 1, 1, 1], [4, 4, 4, 4, 4]]
    assert rank.tolist() == [1, 2, 3, 0, 4]  # stream 0's records arrive 1, 2, 3; stream 1's 0, 4
    assert arrivals(t, np.array([10, 0, 4], np.int64), with_pe=False)[3] is None


def _probe_reference(hashes, times, h, lo, hi, ta, strict, band_ops, cv, pv):
    parent, cand = [], []
    for p in range(h.shape[0]):
        for q in reversed(range(hashes.shape[0])):
            ok = hashes[q] == h[p] and lo[p] <= times[q] <= hi[p] and (times[q] < ta[p] or (times[q] == ta[p]
                                                                                            and not strict))
            for op, c, v in zip(band_ops, cv, pv):
                ok = ok and {0: c[q] < v[p], 1: c[q] <= v[p], 2: c[q] > v[p], 3: c[q] >= v[p]}[op]
            if ok:
                parent.append(p)
                cand.append(q)
    return np.array(parent, np.int64), np.array(cand, np.int64)


@st.composite
def probe_case(draw):
    nrec, m = draw(st.integers(0, 40)), draw(st.integers(0, 30))
    floats = draw(st.booleans())
    dt = np.float64 if floats else np.int64
    keys = st.sampled_from([0, 1, 2, 3, 2**64 - 1])  # few keys: long groups, collisions in the table
    hashes = np.array(draw(st.lists(keys, min_size=nrec, max_size=nrec)), np.uint64)
    times = np.sort(np.array(draw(st.lists(st.integers(-5, 5), min_size=nrec, max_size=nrec)), dt))
    h = np.array(draw(st.lists(keys, min_size=m, max_size=m)), np.uint64)
    lo = np.array(draw(st.lists(st.integers(-7, 5), min_size=m, max_size=m)), dt)
    hi = lo + np.array(draw(st.lists(st.integers(-1, 8), min_size=m, max_size=m)), dt)
    ta = np.array(draw(st.lists(st.integers(-6, 6), min_size=m, max_size=m)), dt)
    nb = draw(st.integers(0, 2))
    vals = st.sampled_from([-1.0, 0.0, 1.0, float("nan")])
    ops = [draw(st.sampled_from(list(BAND_OPS.values()))) for _ in range(nb)]
    cv = [np.array(draw(st.lists(vals, min_size=nrec, max_size=nrec)), np.float64) for _ in range(nb)]
    pv = [np.array(draw(st.lists(vals, min_size=m, max_size=m)), np.float64) for _ in range(nb)]
    return hashes, times, h, lo, hi, ta, draw(st.booleans()), ops, cv, pv


@settings(max_examples=400, deadline=None)
@given(probe_case(), st.integers(0, 40))
def test_key_index_probe_is_the_brute_force_scan(case, limit):
    hashes, times, h, lo, hi, ta, strict, ops, cv, pv = case
    index = KeyIndex(hashes, times)
    want_p, want_c = _probe_reference(hashes, times, h, lo, hi, ta, strict, ops, cv, pv)
    band = Band(ops, cv, pv) if ops and hashes.shape[0] and h.shape[0] else None
    got_p, got_c = index.probe(h, lo, hi, ta, strict, band=band)
    np.testing.assert_array_equal(got_p, want_p)
    np.testing.assert_array_equal(got_c, want_c)
    # stopped after limit + 1 pairs: those are the first ones
    lim_p, lim_c = index.probe(h, lo, hi, ta, strict, limit, band)
    k = min(want_p.shape[0], limit + 1)
    np.testing.assert_array_equal(lim_p, want_p[:k])
    np.testing.assert_array_equal(lim_c, want_c[:k])


def test_key_index_probe_grows_its_output():
    # one probe with 1,000 pairs into an output sized for 2 * 3 + 16: grown, resumed, complete
    n = 1000
    index = KeyIndex(np.full(n, 7, np.uint64), np.arange(n, dtype=np.int64))
    h = np.array([7, 8, 7], np.uint64)
    p, c = index.probe(h, np.array([0, 0, 990], np.int64), np.array([n, n, n], np.int64),
                       np.array([n, n, 995], np.int64), True)
    assert p.tolist() == [0] * n + [2] * 5
    assert c.tolist() == list(range(n - 1, -1, -1)) + [994, 993, 992, 991, 990]


def test_key_index_probe_ties_follow_the_stream_order():
    # records at the arriving record's time arrived before it only from a lower-numbered stream
    index = KeyIndex(np.zeros(4, np.uint64), np.array([1, 2, 2, 3], np.int64))
    args = (np.zeros(1, np.uint64), np.array([0], np.int64), np.array([9], np.int64), np.array([2], np.int64))
    assert index.probe(*args, False)[1].tolist() == [2, 1, 0]
    assert index.probe(*args, True)[1].tolist() == [0]


def _purge_reference(arr_s, arr_t, times_flat, offsets, base, ptr, latest, dist, slack, final_rank, drop_at, peak,
                     peak_total, neg, pos):
    """The purge rule, literally: after every arrival, for every stream j, cut = min over k != j
    of latest[k] - dist[j, k] (neg / pos as they are; int64 saturating: a cut below the range
    drops nothing); records of j below the cut are dropped."""
    n = ptr.shape[0]
    arrived = base.copy()
    pt = peak_total
    for a in range(arr_s.shape[0]):
        i = arr_s[a]
        arrived[i] += 1
        latest[i] = arr_t[a] if final_rank[i] != a else pos
        for j in range(n):
            cut = pos
            for k in range(n):
                if k != j:
                    lk = latest[k]
                    c = neg if lk == neg else pos if lk == pos else (
                        (lk - dist[j, k]) if latest.dtype == np.float64 else
                        np.int64(min(max(int(lk) - int(dist[j, k]), -(2**63)), 2**63 - 1)))  # saturates
                    cut = min(cut, c)
            if cut == neg:
                continue
            p = ptr[j]
            if cut == pos:
                p = arrived[j]
            else:
                while p < arrived[j] and times_flat[offsets[j] + p] + slack < cut:
                    p += 1
            drop_at[offsets[j] + ptr[j]:offsets[j] + p] = a
            ptr[j] = p
        for j in range(n):
            peak[j] = max(peak[j], arrived[j] - ptr[j])
        pt = max(pt, int((arrived - ptr).sum()))
    return pt


@st.composite
def purge_case(draw):
    n = draw(st.integers(2, 4))
    floats = draw(st.booleans())
    dt = np.float64 if floats else np.int64
    neg, pos = (-np.inf, np.inf) if floats else (INT_NEG, INT_POS)
    small = st.integers(-6, 6)
    chunk = [np.sort(np.array(draw(st.lists(small, max_size=8)), dt)) for _ in range(n)]
    buf = [np.sort(np.array(draw(st.lists(small, max_size=5)), dt)) - 6 for _ in range(n)]
    times = [np.concatenate([b, c]) for b, c in zip(buf, chunk)]
    base = np.array([b.shape[0] for b in buf], np.int64)
    ptr = np.array([draw(st.integers(0, int(b))) for b in base], np.int64)
    dvals = st.sampled_from([0, 1, 2, 5]) | (st.just(np.inf) if floats else st.sampled_from([INT_POS, 2**62]))
    dist = np.array([[draw(dvals) for _ in range(n)] for _ in range(n)], dt)
    latest = np.array([draw(st.sampled_from([neg, pos]) | small.map(lambda v: v - 7)) for _ in range(n)], dt)
    arr_s, _, arr_t, _, _ = arrivals(chunk, base)
    last = [int(np.flatnonzero(arr_s == j)[-1]) if (arr_s == j).any() else -1 for j in range(n)]
    final_rank = np.array([last[j] if draw(st.booleans()) else -1 for j in range(n)], np.int64)
    peak = np.array([draw(st.integers(0, 4)) for _ in range(n)], np.int64)
    return arr_s, arr_t, times, base, ptr, latest, dist, final_rank, peak, draw(st.integers(0, 6)), neg, pos


@settings(max_examples=400, deadline=None)
@given(purge_case())
def test_purge_walk_is_the_rule_after_every_arrival(case):
    arr_s, arr_t, times, base, ptr, latest, dist, final_rank, peak, peak_total, neg, pos = case
    n = ptr.shape[0]
    offsets = np.zeros(n + 1, np.int64)
    offsets[1:] = np.cumsum([t.shape[0] for t in times])
    flat = np.concatenate(times)
    slack = latest.dtype.type(0)
    want = [x.copy() for x in (ptr, latest, peak)] + [np.full(flat.shape[0], -1, np.int64)]
    want_total = _purge_reference(arr_s, arr_t, flat, offsets, base, want[0], want[1], dist, slack, final_rank,
                                  want[3], want[2], peak_total, neg, pos)
    got = [x.copy() for x in (ptr, latest, peak)] + [np.full(flat.shape[0], -1, np.int64)]
    got_total = purge_walk(arr_s, arr_t, flat, offsets, base, got[0], got[1], dist, slack, final_rank, got[3], got[2],
                           peak_total, neg, pos)
    assert got_total == want_total
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


FLOAT_VALUES = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([-0.0, 0.0, float("nan"), 2.0**53 + 1])


@settings(max_examples=200, deadline=None)
@given(st.lists(FLOAT_VALUES, max_size=30), st.lists(st.integers(-(2**63), 2**63 - 1), max_size=30))
def test_compiled_key_hashes_are_the_numpy_formula(floats, ints):
    from smerge.merge.hashing import mix64
    from smerge.merge.wjoin_hashing import hash_column, hash_values

    def numpy_hash(v):  # the formula: mix64 of the float64 bits, NaN as 0.0, -0.0 as 0.0
        v = np.asarray(v).astype(np.float64)
        return mix64((np.where(np.isnan(v), 0.0, v) + 0.0).view(np.uint64))

    f = pa.array(floats, pa.float64())
    i = pa.array(ints, pa.int64())
    np.testing.assert_array_equal(hash_column(f, "num"), numpy_hash(floats))
    np.testing.assert_array_equal(hash_column(i, "num"), numpy_hash(np.array(ints, np.int64)))
    k = min(len(floats), len(ints))
    cols = [(f.slice(0, k), "num"), (i.slice(0, k), "num")]
    with np.errstate(over="ignore"):
        want = np.zeros(k, np.uint64)
        for col, kind in cols:
            want = mix64(want * np.uint64(31) + hash_column(col, kind))
    np.testing.assert_array_equal(hash_values(cols, k), want)


def test_numeric_key_hash_worked_values():
    from smerge.merge.wjoin_hashing import hash_column

    h = hash_column(pa.array([0.0, -0.0, float("nan"), None, 1.0], pa.float64()), "num").tolist()
    assert h[0] == h[1] == h[2] == h[3] == 0  # mix64(0) = 0: -0.0, NaN and NULL hash as 0.0
    assert h[4] == 0x2A20CD80798DAE26  # splitmix64's finaliser of 1.0's bits, 0x3FF0000000000000
