"""CGM engine (docs/semantics.md sections 2-4): worked example, oracle equality, invariants."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cgm_reference import cgm_reference, kappa_max_reference
from smerge.errors import KeyNaNError, UsageError
from smerge.merge import CGMParams, MergeKeys, MergeStats, cgm_merge, cgm_merge_table
from smerge.merge import _kernel


def params(keys=("k",), eps=0.0, n=8, ka=1, kb=None, **kw) -> CGMParams:
    eps_t = tuple(eps) if isinstance(eps, (tuple, list)) else (float(eps),) * len(keys)
    return CGMParams(keys=MergeKeys(tuple(keys), tuple(keys)), eps=eps_t, window_size=n,
                     least_increment_a=ka, least_increment_b=kb if kb is not None else ka, **kw)


def table(keys: list, names=("k",), extra: str | None = None) -> pa.Table:
    arr = np.asarray(keys, dtype=np.float64).reshape(len(keys), len(names))
    cols = {nm: arr[:, j] for j, nm in enumerate(names)}
    if extra:
        cols[extra] = np.arange(len(keys), dtype=np.int64) * 10
    return pa.table(cols)


def run(a_keys, b_keys, p, batch=3, **kw):
    names = p.keys.a
    ta, tb = table(a_keys, names, "va"), table(b_keys, names, "vb")
    st_ = MergeStats("cgm")
    un = {"a": [], "b": []}
    out = list(cgm_merge(ta.to_batches(max_chunksize=batch), tb.to_batches(max_chunksize=batch),
                         p, schema_a=ta.schema, schema_b=tb.schema, stats=st_,
                         unmatched=lambda s, b: un[s].append(b), **kw))
    res = pa.Table.from_batches(out, schema=out[0].schema) if out else None
    return res, st_, un


def test_worked_example_one_sweep():
    """The paper's example (docs/semantics.md section 3): one sweep emits exactly (6,5), (11,13), (20,18)."""
    a = np.array([6, 7, 8, 9, 10, 11, 20, 21], np.float64).reshape(-1, 1)
    b = np.array([5, 13, 14, 15, 16, 17, 18, 21], np.float64).reshape(-1, 1)
    ma, mb = np.zeros(8, bool), np.zeros(8, bool)
    pa_, pb_ = np.empty(8, np.int64), np.empty(8, np.int64)
    m, i, j = _kernel.sweep(a, 8, b, 8, np.array([2.0]), ma, mb, pa_, pb_)
    assert m == 3
    assert [(a[x, 0], b[y, 0]) for x, y in zip(pa_[:m], pb_[:m])] == [(6, 5), (11, 13), (20, 18)]
    assert i == 8  # window A is behind


def test_worked_example_engine_first_pass():
    """Through the engine with N = 8: the first pass gives the paper's three pairs first."""
    res, stats, _ = run([6, 7, 8, 9, 10, 11, 20, 21], [5, 13, 14, 15, 16, 17, 18, 21],
                        params(eps=2.0, n=8, ka=1, with_ids=True), batch=8)
    got = list(zip(res["k"].to_pylist(), res["k_b"].to_pylist()))
    assert got[:3] == [(6, 5), (11, 13), (20, 18)]
    # The run goes on (spec step 6): after A's window is behind with m = 3 >= K, nothing is
    # evicted and the next sweep pairs 21 with 21; then only 7..10 and 14..17 remain.
    assert got == [(6, 5), (11, 13), (20, 18), (21, 21)]
    assert stats.matched == 4 and stats.a_unmatched == 4 and stats.b_unmatched == 4


def test_output_layout_and_values():
    ta = pa.table({"k": [1.0, 2.0, 3.0], "x": [10, 20, 30]})
    tb = pa.table({"k": [1.0, 3.0], "x": [100, 300], "y": ["a", "c"]})
    t = cgm_merge_table(ta, tb, params(n=4, with_ids=True))
    assert t.schema.names == ["k", "x", "k_b", "x_b", "y", "a_row", "b_row"]
    assert t.to_pydict() == {"k": [1.0, 3.0], "x": [10, 30], "k_b": [1.0, 3.0], "x_b": [100, 300],
                             "y": ["a", "c"], "a_row": [0, 2], "b_row": [0, 1]}


def test_identical_sorted_streams_match_fully():
    keys = np.arange(10_000, dtype=np.float64)
    res, stats, _ = run(keys, keys, params(n=500, ka=100), batch=777)
    assert stats.matched == 10_000 and stats.a_unmatched == 0 and stats.b_unmatched == 0
    assert res["k"].to_pylist() == res["k_b"].to_pylist()


def test_multi_key_tolerance_per_key():
    a = [(0, 10.0, 20.0), (0, 10.0, 21.0), (6, 10.0, 20.0)]
    b = [(0, 10.004, 19.996), (0, 10.0, 21.3), (6, 9.99, 20.0)]
    res, stats, _ = run(a, b, params(keys=("time", "lat", "lon"), eps=(0, 0.005, 0.005), n=4, with_ids=True))
    assert list(zip(res["a_row"].to_pylist(), res["b_row"].to_pylist())) == [(0, 0)]
    assert stats.matched == 1 and stats.a_unmatched == 2 and stats.b_unmatched == 2


def test_nan_keys_error_names_column_and_row():
    with pytest.raises(KeyNaNError) as e:
        run([1, 2, np.nan, 4], [1, 2, 3, 4], params(n=2), batch=2)
    assert "'k'" in str(e.value) and "row 2" in str(e.value)


def test_nan_keys_unmatched_are_counted_and_written():
    res, stats, un = run([1, 2, np.nan, 4], [1, np.nan, 3, 4], params(n=2, nan_keys="unmatched", with_ids=True))
    assert stats.matched == 2 and stats.a_nan_keys == 1 and stats.b_nan_keys == 1
    assert stats.a_unmatched == 2 and stats.b_unmatched == 2
    un_a = pa.Table.from_batches(un["a"])
    assert sorted(un_a["a_row"].to_pylist()) == [1, 2]


def test_empty_stream():
    res, stats, un = run([], [1, 2, 3], params(n=2))
    assert res is None and stats.matched == 0 and stats.b_unmatched == 3 and stats.a_records == 0


@pytest.mark.parametrize("bad", [dict(n=0), dict(n=4, ka=0), dict(n=4, ka=5), dict(eps=-1.0)])
def test_bad_params(bad):
    with pytest.raises(UsageError):
        params(**bad)


def _partially_sorted(draw, n, d, lo, hi):
    keys = sorted(tuple(draw(st.integers(lo, hi)) / 2 for _ in range(d)) for _ in range(n))
    # Local shuffles: move a few records a few places.
    for _ in range(draw(st.integers(0, max(0, n // 3)))):
        i = draw(st.integers(0, max(0, n - 1)))
        j = min(n - 1, max(0, i + draw(st.integers(-4, 4))))
        if n:
            keys.insert(j, keys.pop(i))
    return keys


@st.composite
def merge_case(draw, max_d=3):
    d = draw(st.integers(1, max_d))
    na, nb = draw(st.integers(0, 40)), draw(st.integers(0, 40))
    a = _partially_sorted(draw, na, d, 0, 30)
    b = _partially_sorted(draw, nb, d, 0, 30)
    eps = tuple(draw(st.sampled_from([0.0, 0.5, 1.0, 2.5])) for _ in range(d))
    n = draw(st.integers(1, 12))
    ka = draw(st.integers(1, n))
    kb = draw(st.integers(1, n))
    batch = draw(st.integers(1, 7))
    return a, b, d, eps, n, ka, kb, batch


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(merge_case())
def test_engine_equals_reference_and_invariants(case):
    a, b, d, eps, n, ka, kb, batch = case
    names = tuple(f"k{j}" for j in range(d))
    p = params(keys=names, eps=eps, n=n, ka=ka, kb=kb, with_ids=True)
    res, stats, un = run(a, b, p, batch=batch)
    pairs = list(zip(res["a_row"].to_pylist(), res["b_row"].to_pylist())) if res is not None else []
    ref_pairs, ref_ua, ref_ub, ref_passes = cgm_reference(a, b, n, ka, kb, eps)
    assert stats.passes == len(ref_passes)
    # Oracle equality: the same pairs in the same order.
    assert pairs == ref_pairs
    # Every pair within eps on every key.
    for ra, rb in pairs:
        for j in range(d):
            assert abs(a[ra][j] - b[rb][j]) <= eps[j]
    # Each record in at most one pair.
    assert len({x for x, _ in pairs}) == len(pairs) and len({y for _, y in pairs}) == len(pairs)
    # Exact accounting, and the unmatched side outputs hold exactly the rest.
    assert stats.matched + stats.a_unmatched == len(a) == stats.a_records
    assert stats.matched + stats.b_unmatched == len(b) == stats.b_records
    ua = sorted(r for t in un["a"] for r in t.column("a_row").to_pylist())
    ub = sorted(r for t in un["b"] for r in t.column("b_row").to_pylist())
    assert ua == sorted(ref_ua) and ub == sorted(ref_ub)
    assert sorted(ua + [x for x, _ in pairs]) == list(range(len(a)))
    # Same output twice.
    res2, _, _ = run(a, b, p, batch=batch)
    assert (res2 is None and res is None) or res2.equals(res)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_single_key_unbounded_window_equals_kappa_max(data):
    """Single key, N >= both stream lengths, K = 1: the match count equals kappa_max's."""
    na, nb = data.draw(st.integers(1, 40)), data.draw(st.integers(1, 40))
    a = _partially_sorted(data.draw, na, 1, 0, 25)
    b = _partially_sorted(data.draw, nb, 1, 0, 25)
    eps = data.draw(st.sampled_from([0.0, 0.5, 1.0, 3.0]))
    p = params(eps=eps, n=max(na, nb), ka=1)
    _, stats, _ = run(a, b, p, batch=5, compute_kappa_max=True)
    expected = kappa_max_reference(a, b, (eps,))
    assert stats.matched == expected
    # the greedy unbounded sweep; kappa_max is the ceiling (a maximum matching), never below a run
    assert stats.kappa_greedy == pytest.approx(expected / na)
    assert stats.kappa_max >= stats.matched / na - 1e-12


def test_kappa_max_engine_equals_reference_multikey():
    rng = np.random.default_rng(3)
    a = [tuple(x) for x in rng.integers(0, 6, size=(300, 2)) / 2]
    b = [tuple(x) for x in rng.integers(0, 6, size=(250, 2)) / 2]
    _, stats, _ = run(a, b, params(keys=("x", "y"), eps=(0.5, 0.5), n=20, ka=5), compute_kappa_max=True)
    assert stats.kappa_greedy == pytest.approx(kappa_max_reference(a, b, (0.5, 0.5)) / 300)
    assert stats.kappa_max >= stats.kappa_greedy


def test_unmatched_ids_stay_right_when_written_later():
    # The sink may keep batches and write them later (a background writer): the ids of an
    # unmatched batch must not change when later passes reuse the engine's buffers.
    # sorted streams, half of A without a partner: evicted pass after pass, emitted at every flush
    # (more evictions than the engine's buffers hold, so they are emitted in several flushes)
    a = np.arange(100_000) / 4
    b = np.where(np.arange(a.size) % 2 == 0, a, a + 0.1)
    res, stats, un = run(a, b, params(n=64, ka=8, with_ids=True, eps=0.05), batch=4096)
    assert len(un["a"]) > 1
    for side, keys in (("a", a), ("b", b)):
        t = pa.Table.from_batches(un[side])
        rows = t.column(f"{side}_row").to_numpy()
        assert np.array_equal(t.column("k").to_numpy(), keys[rows])
        paired = res.column(f"{side}_row").to_numpy() if res is not None else np.empty(0, np.int64)
        assert np.array_equal(np.sort(np.concatenate([rows, paired])), np.arange(keys.size))
    assert stats.a_unmatched == 50_000


@pytest.mark.parametrize("nan_a", [0, 3])
def test_report_windows_do_not_depend_on_batch_sizes(nan_a):
    # Records left unmatched at the end fill whole report windows of N, however they were read
    # (the Spark plans read the same records in other batches than --local).
    a = np.concatenate([np.arange(100.0), np.full(nan_a, np.nan)])
    b = np.array([1.0, 50.0, 99.0])
    got = []
    for batch in (64, 10, 5, 3):
        _, stats, _ = run(a, b, params(n=8, ka=2, nan_keys="unmatched"), batch=batch)
        got.append((stats.kappas, stats.report_counts))
    assert all(g == got[0] for g in got)
    counts = got[0][1]
    assert [r for _, r in counts[:-1]] == [8] * (len(counts) - 1)  # every window but the last closes at N
    assert sum(r for _, r in counts) == a.size and sum(m for m, _ in counts) == 3


def test_report_windows_and_delta():
    # 1000 records each, identical: every report window has kappa 1.
    keys = np.arange(1000.0)
    _, stats, _ = run(keys, keys, params(n=100, ka=10, delta=0.0, delta_windows=3))
    d = stats.as_dict()
    assert d["report_windows"] == 10 and d["kappa_min"] == 1.0
    assert d["drop_rate_moving_max"] == 0.0 and d["delta_ok"] is True
    # B holds only every other key: half of A is dropped overall (the odd keys linger in the
    # window while m >= K, so single report windows drop more) -> delta 0.1 is violated.
    _, stats, _ = run(keys, keys[::2], params(n=100, ka=10, delta=0.1, delta_windows=3))
    d = stats.as_dict()
    assert d["matched"] == 500 and d["a_unmatched"] == 500
    assert 0.5 <= d["drop_rate_moving_max"] <= 1.0 and d["kappa_min"] < 0.5
    assert d["delta_ok"] is False


def test_memory_is_bounded_by_window():
    """A long stream with lingering out-of-order records: the row store stays O(N + batch)."""
    n = 200
    rng = np.random.default_rng(0)
    keys = np.arange(200_000, dtype=np.float64)
    a = keys.copy()
    far = rng.choice(len(a), 500, replace=False)
    a[far] = a[far] + 1e9  # never match, linger at the window's end until evicted
    ta, tb = pa.table({"k": a}), pa.table({"k": keys})
    from smerge.merge import cgm as cgm_mod

    held = []
    orig = cgm_mod.RowStore.release

    def spy(self, live, next_row):
        orig(self, live, next_row)
        held.append(self.rows_held)

    cgm_mod.RowStore.release = spy
    try:
        stats = MergeStats("cgm")
        for _ in cgm_merge(ta.to_batches(max_chunksize=5000), tb.to_batches(max_chunksize=5000),
                           params(n=n, ka=50), stats=stats):
            pass
    finally:
        cgm_mod.RowStore.release = orig
    assert stats.matched + stats.a_unmatched == 200_000
    assert max(held) < 2 * (65536 + 2 * n) + 3 * 5000
