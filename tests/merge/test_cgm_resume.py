"""CGM passes over long streams against the plain reference (tests/helpers/cgm_reference.py).

The kernel resumes each pass's sweep where the windows did not change since the last one and
evicts from a window's front by moving its start (merge/_ckernel.c: sweep_resume, win_retire):
these streams are long next to the window, with partner-less records that linger at the
windows' fronts until evicted, displaced records that land inside the windows, ties, and keys
that match on the leading key only, so that passes resume, fronts move on, windows move back to
their buffers' start, and sweeps meet (or never meet) the last pass's path. Every case must give
the reference's pairs in its order, its unmatched records and its passes.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cgm_reference import cgm_reference
from smerge.merge import CGMParams, MergeKeys, MergeStats, cgm_merge


def run(a, b, d, eps, n, ka, kb, batch):
    names = tuple(f"k{j}" for j in range(d))
    p = CGMParams(keys=MergeKeys(names, names), eps=tuple(eps), window_size=n, least_increment_a=ka,
                  least_increment_b=kb, with_ids=True)
    ta = pa.table({nm: np.asarray(a, np.float64).reshape(len(a), d)[:, j] for j, nm in enumerate(names)})
    tb = pa.table({nm: np.asarray(b, np.float64).reshape(len(b), d)[:, j] for j, nm in enumerate(names)})
    stats, un = MergeStats("cgm"), {"a": [], "b": []}
    out = list(cgm_merge(ta.to_batches(max_chunksize=batch), tb.to_batches(max_chunksize=batch), p,
                         schema_a=ta.schema, schema_b=tb.schema, stats=stats,
                         unmatched=lambda s, t: un[s].extend(t.column(f"{s}_row").to_pylist())))
    pairs = [(x, y) for t in out for x, y in zip(t["a_row"].to_pylist(), t["b_row"].to_pylist())]
    return pairs, un["a"], un["b"], stats


def check(a, b, d, eps, n, ka, kb, batch):
    pairs, ua, ub, stats = run(a, b, d, eps, n, ka, kb, batch)
    ref_pairs, ref_ua, ref_ub, ref_passes = cgm_reference(a, b, n, ka, kb, eps)
    assert pairs == ref_pairs
    assert sorted(ua) == sorted(ref_ua) and sorted(ub) == sorted(ref_ub)
    assert stats.passes == len(ref_passes)
    assert stats.matched == len(ref_pairs) and sum(m for m, _ in stats.report_counts) == len(ref_pairs)


@st.composite
def platform_streams(draw):
    """Two streams in roughly ascending leading key (ties allowed), the other keys varying slowly;
    some of B's records without a partner (off on the last key), some records displaced."""
    d = draw(st.integers(1, 3))
    size = draw(st.integers(50, 260))
    steps = draw(st.lists(st.integers(0, 2), min_size=size, max_size=size))
    lead = np.cumsum(steps) / 2.0
    rest = [np.cumsum(draw(st.lists(st.integers(-1, 1), min_size=size, max_size=size))) / 2.0 for _ in range(d - 1)]
    a = np.column_stack([lead, *rest])
    b = a.copy()
    jitter = draw(st.lists(st.sampled_from([0.0, 0.5, -0.5]), min_size=size, max_size=size))
    b[:, 0] += jitter
    lost = draw(st.lists(st.integers(0, size - 1), max_size=size // 3))
    b[lost, d - 1] += 50.0
    extra = draw(st.lists(st.integers(0, size - 1), max_size=size // 4))  # A records with no partner
    a = np.concatenate([a, a[extra] + 100.0 * (d == 1) + np.r_[0.0, [40.0] * (d - 1)][None, :]])
    a = a[np.argsort(a[:, 0], kind="stable")]

    def displace(x):
        x = [tuple(r) for r in x]
        for _ in range(draw(st.integers(0, len(x) // 5))):
            i = draw(st.integers(0, len(x) - 1))
            j = min(len(x) - 1, max(0, i + draw(st.integers(-25, 25))))
            x.insert(j, x.pop(i))
        return x

    eps = tuple(draw(st.sampled_from([0.0, 0.5, 1.0])) for _ in range(d))
    n = draw(st.integers(2, 30))
    ka, kb = draw(st.integers(1, n)), draw(st.integers(1, n))
    return displace(a), displace(b), d, eps, n, ka, kb, draw(st.integers(1, 64))


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(platform_streams())
def test_long_streams_equal_reference(case):
    check(*case)


def test_front_evictions_and_window_moves_equal_reference():
    """A third of A has no partner: those records linger at window A's front and are evicted
    pass after pass (the front moves on and the window moves back to its buffer's start many
    times) while the passes pair the records behind them."""
    t = np.arange(3000) / 2.0
    a = [(x, float(i % 3 == 0) * 7.0) for i, x in enumerate(t)]
    b = [(x, 0.0) for x in t[::2]] + [(x + 0.25, 0.0) for x in t[1::2]]
    b.sort()
    for n, ka, kb, batch in ((8, 2, 2, 5), (40, 7, 13, 64), (5, 5, 1, 1000), (3, 1, 3, 7)):
        check(a, b, 2, (0.25, 0.5), n, ka, kb, batch)


def test_leading_key_ties_equal_reference():
    """Many records share each leading key and match on it alone (the sweep's steps are decided
    on the second key), with a few records displaced far back."""
    rng = np.random.default_rng(7)
    lead = np.repeat(np.arange(400.0), 5)
    a = np.column_stack([lead, rng.integers(0, 6, lead.size) / 2.0])
    b = np.column_stack([lead, rng.integers(0, 6, lead.size) / 2.0])
    for x in (a, b):
        for _ in range(60):
            i = int(rng.integers(0, len(x)))
            j = max(0, i - int(rng.integers(1, 40)))
            x[[j, i]] = x[[i, j]]
    a_l, b_l = [tuple(r) for r in a], [tuple(r) for r in b]
    for n, ka, kb, batch in ((12, 3, 4, 9), (30, 30, 1, 100), (7, 2, 7, 3)):
        check(a_l, b_l, 2, (0.0, 0.5), n, ka, kb, batch)


def test_unbound_kernel_calls_without_a_kept_work_buffer_equal_reference():
    """``_kernel.cgm_passes`` called again and again with a fresh work buffer (its output buffers
    fill every few passes): no pass resumes from a path kept in another call's buffer."""
    from smerge.merge import _kernel

    rng = np.random.default_rng(4)
    a = np.sort(rng.integers(0, 3000, 2000)).astype(np.float64) / 2
    b = np.sort(rng.integers(0, 3000, 1800)).astype(np.float64) / 2
    n, k, eps = 16, 4, (0.5,)
    st = np.zeros(16, np.int64)
    wak, wbk = np.empty((2 * n, 1)), np.empty((2 * n, 1))
    war, wbr = np.empty(2 * n, np.int64), np.empty(2 * n, np.int64)
    cap = 3 * n
    pairs_a, pairs_b, ev_a, ev_b = (np.empty(cap, np.int64) for _ in range(4))
    counts, pass_m, pass_ret = np.zeros(4, np.int64), np.empty(64, np.int64), np.empty(64, np.int64)
    ma, mb = np.empty(2 * n, np.bool_), np.empty(2 * n, np.bool_)
    spa, spb = np.empty(n, np.int64), np.empty(n, np.int64)
    ka, kb = a.reshape(-1, 1), b.reshape(-1, 1)
    ra, rb = np.arange(a.size, dtype=np.int64), np.arange(b.size, dtype=np.int64)
    pairs, un_a, un_b, calls = [], [], [], 0
    works = [np.empty(7 * n + 2, np.int64) for _ in range(2)]
    while True:
        # two buffers in turn (each holds the path of the call before last), or a fresh one
        work = works[calls % 2] if calls % 5 else None
        status = _kernel.cgm_passes(st, wak, war, wbk, wbr, ka, ra, True, kb, rb, True, eps, n, k, k, pairs_a,
                                    pairs_b, ev_a, ev_b, counts, pass_m, pass_ret, ma, mb, spa, spb, work)
        calls += 1
        pairs += list(zip(pairs_a[:counts[0]].tolist(), pairs_b[:counts[0]].tolist()))
        un_a += ev_a[:counts[1]].tolist()
        un_b += ev_b[:counts[2]].tolist()
        counts[:] = 0
        if status == 3:
            break
        assert status == 2
    un_a += war[st[8]: st[8] + st[0]].tolist() + ra[st[2]:].tolist()
    un_b += wbr[st[9]: st[9] + st[1]].tolist() + rb[st[3]:].tolist()
    ref_pairs, ref_ua, ref_ub, _ = cgm_reference([(x,) for x in a], [(x,) for x in b], n, k, k, eps)
    assert calls > 20
    assert pairs == ref_pairs
    assert sorted(un_a) == sorted(ref_ua) and sorted(un_b) == sorted(ref_ub)
