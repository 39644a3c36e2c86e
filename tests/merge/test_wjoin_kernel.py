"""The W-join's compiled kernels (merge/_wjoin_kernel.py over merge/_wjoin_ckernel.c) against
numpy references on random data: the arrival order of a chunk is what a lexsort of (time,
stream, position) gives."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from smerge.merge._wjoin_kernel import arrivals


def _arrivals_reference(times, base):
    n = len(times)
    S = np.concatenate([np.full(t.shape[0], i, np.int64) for i, t in enumerate(times)])
    T = np.concatenate(times)
    P = np.concatenate([np.arange(t.shape[0], dtype=np.int64) for t in times])
    order = np.lexsort((P, S, T))
    arr_s = S[order]
    pe = np.array([base[j] + np.cumsum(arr_s == j) - (arr_s == j) for j in range(n)]).reshape(n, -1)
    last = np.array([np.flatnonzero(arr_s == j)[-1] if (arr_s == j).any() else -1 for j in range(n)], np.int64)
    return arr_s, base[arr_s] + P[order], T[order], pe, last


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
    s, pos, tt, pe, last = arrivals(t, np.array([10, 0, 4], np.int64))
    assert s.tolist() == [1, 0, 0, 0, 1]  # time 3: stream 0's two records, then stream 1's
    assert pos.tolist() == [0, 10, 11, 12, 1]
    assert tt.tolist() == [0, 1, 3, 3, 3]
    assert pe.tolist() == [[10, 10, 11, 12, 13], [0, 1, 1, 1, 1], [4, 4, 4, 4, 4]]
    assert last.tolist() == [3, 4, -1]
