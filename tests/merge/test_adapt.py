"""Adaptive delta control (docs/semantics.md section 10): every pass is section 3 with the K in
force, K is recorded per report window, the controller's rule, and the delta target on gen data."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cgm_reference import cgm_reference
from smerge.errors import UsageError
from smerge.merge import CGMParams, MergeKeys, MergeStats, cgm_merge
from smerge.merge.adapt import DeltaController
from smerge.merge.stats import MAX_SERIES, ReportWindows


def params(keys=("k",), eps=0.0, n=8, ka=1, kb=None, **kw) -> CGMParams:
    eps_t = tuple(eps) if isinstance(eps, (tuple, list)) else (float(eps),) * len(keys)
    return CGMParams(keys=MergeKeys(tuple(keys), tuple(keys)), eps=eps_t, window_size=n,
                     least_increment_a=ka, least_increment_b=kb if kb is not None else ka, **kw)


def run(a_keys, b_keys, p, batch=3):
    names = p.keys.a
    arr_a = np.asarray(a_keys, dtype=np.float64).reshape(len(a_keys), len(names))
    arr_b = np.asarray(b_keys, dtype=np.float64).reshape(len(b_keys), len(names))
    ta = pa.table({nm: arr_a[:, j] for j, nm in enumerate(names)})
    tb = pa.table({nm: arr_b[:, j] for j, nm in enumerate(names)})
    st_ = MergeStats("cgm")
    un = {"a": [], "b": []}
    out = list(cgm_merge(ta.to_batches(max_chunksize=batch), tb.to_batches(max_chunksize=batch), p,
                         schema_a=ta.schema, schema_b=tb.schema, stats=st_, unmatched=lambda s, b: un[s].append(b)))
    pairs = [(x, y) for t in out for x, y in zip(t["a_row"].to_pylist(), t["b_row"].to_pylist())]
    ua = sorted(r for t in un["a"] for r in t.column("a_row").to_pylist())
    ub = sorted(r for t in un["b"] for r in t.column("b_row").to_pylist())
    return pairs, ua, ub, st_


def controller_schedule(a, b, p, recorded):
    """The K of every report window closed by the reference's passes and of the passes after the
    last one: the controller's answers to the reference's windows, in turn. (A short group at the
    end joins the last report window, so the statistics list K per window and the K of those last
    passes is not among them; the reference needs it.) Passes up to a window's close depend only
    on the K's before it, so each window is read off a reference run with the schedule so far."""
    n = p.window_size
    c = DeltaController(p)
    schedule = [c.ks]
    while True:
        *_, passes = cgm_reference([(x,) for x in a], [(y,) for y in b], n, p.least_increment_a,
                                   p.least_increment_b, p.eps, k_schedule=schedule)
        closed, m_acc, r_acc = [], 0, 0
        for m, r in passes:
            m_acc, r_acc = m_acc + m, r_acc + r
            if r_acc >= n:
                closed.append(m_acc / r_acc)
                m_acc = r_acc = 0
        if len(closed) < len(schedule):
            return schedule
        schedule.append(c.update(closed[len(schedule) - 1]))


def reference_kappas(passes, n, a_records, matched_total):
    """Report windows of the reference's passes (docs/semantics.md section 4), then the end's unmatched A;
    every window retires at least N records of A: a short last group joins the window before."""
    counts, m_acc, r_acc = [], 0, 0
    for m, r in passes:
        m_acc, r_acc = m_acc + m, r_acc + r
        if r_acc >= n:
            counts.append((m_acc, r_acc))
            m_acc = r_acc = 0
    rest = a_records - sum(r for _, r in passes)
    while rest > 0:
        k = min(rest, max(1, n - r_acc))
        r_acc += k
        rest -= k
        if r_acc >= n:
            counts.append((m_acc, r_acc))
            m_acc = r_acc = 0
    if r_acc:
        if counts:
            m_acc, r_acc = m_acc + counts[-1][0], r_acc + counts[-1][1]
            counts.pop()
        counts.append((m_acc, r_acc))
    assert sum(m for m, _ in counts) == matched_total and sum(r for _, r in counts) == a_records
    assert all(r >= n for _, r in counts) or len(counts) == 1
    return [m / r for m, r in counts]


def _stream(draw, n, lo, hi, far):
    keys = sorted(draw(st.integers(lo, hi)) / 2 for _ in range(n))
    for _ in range(draw(st.integers(0, n // 2))):  # moves, some far (out of the window)
        i = draw(st.integers(0, max(0, n - 1)))
        j = min(n - 1, max(0, i + draw(st.integers(-far, far))))
        if n:
            keys.insert(j, keys.pop(i))
    return keys


@st.composite
def adapt_case(draw):
    n = draw(st.integers(1, 8))
    na, nb = draw(st.integers(0, 120)), draw(st.integers(0, 120))
    a = _stream(draw, na, 0, 80, 3 * n + 2)
    b = _stream(draw, nb, 0, 80, 3 * n + 2)
    eps = draw(st.sampled_from([0.0, 0.5, 1.0]))
    ka, kb = draw(st.integers(1, n)), draw(st.integers(1, n))
    delta = draw(st.sampled_from([0.0, 0.05, 0.2, 0.5]))
    m = draw(st.integers(1, 4))
    return a, b, n, ka, kb, eps, delta, m, draw(st.integers(1, 9))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(adapt_case())
def test_adapt_passes_equal_reference_with_recorded_k(case):
    """With --adapt every pass is section 3 with the K in force: the reference driven with the
    recorded K of each report window gives the same pairs, passes, unmatched records, kappas."""
    a, b, n, ka, kb, eps, delta, m, batch = case
    p = params(eps=eps, n=n, ka=ka, kb=kb, with_ids=True, delta=delta, delta_windows=m, adapt=True)
    pairs, ua, ub, stats = run(a, b, p, batch=batch)
    recorded = [tuple(k) for k in stats.k_windows]
    assert len(recorded) == len(stats.kappas)
    assert all(1 <= x <= n for k in recorded for x in k)
    start = max(1, n // 32)  # the controller starts at min(given K, N / 32)
    assert not recorded or recorded[0] == (min(ka, start), min(kb, start))
    schedule = controller_schedule(a, b, p, recorded)
    assert recorded == schedule[:len(recorded)] + [schedule[-1]] * (len(recorded) - len(schedule))
    ref_pairs, ref_ua, ref_ub, ref_passes = cgm_reference([(x,) for x in a], [(y,) for y in b], n, ka, kb, (eps,),
                                                          k_schedule=schedule)
    assert pairs == ref_pairs
    assert stats.passes == len(ref_passes)
    assert ua == sorted(ref_ua) and ub == sorted(ref_ub)
    assert stats.kappas == pytest.approx(reference_kappas(ref_passes, n, len(a), len(ref_pairs)))
    # invariants: eps on every pair, at most once per record, exact accounting
    assert all(abs(a[x] - b[y]) <= eps for x, y in pairs)
    assert len({x for x, _ in pairs}) == len(pairs) == len({y for _, y in pairs})
    assert stats.matched + stats.a_unmatched == len(a) == stats.a_records
    assert stats.matched + stats.b_unmatched == len(b) == stats.b_records
    assert sorted(ua + [x for x, _ in pairs]) == list(range(len(a)))
    assert sorted(ub + [y for _, y in pairs]) == list(range(len(b)))
    # the statistics record the K of each window, and the parameters say K was adapted
    d = stats.as_dict()
    assert d["k_per_window"] == [list(k) for k in recorded]
    assert d["params"]["adapt"] is True and d["params"]["adapt_k_range"] == [1, n]


def test_k_changes_between_windows_and_matches_reference():
    """A case where the controller moves K both ways; the reference with that schedule agrees
    (a K schedule that did not change would not test anything)."""
    rng = np.random.default_rng(7)
    base = np.arange(3000, dtype=np.float64)
    a, b = base.copy(), base.copy()
    for arr, seed in ((a, 1), (b, 2)):
        r = np.random.default_rng(seed)
        idx = r.choice(arr.size, 300, replace=False)
        arr[idx] = arr[idx] + r.integers(-150, 150, idx.size)  # 10% displaced, some beyond the window
    del rng
    p = params(n=128, ka=128, with_ids=True, delta=0.3, delta_windows=4, adapt=True)
    pairs, ua, ub, stats = run(list(a), list(b), p, batch=97)
    ks = [k[0] for k in stats.k_windows]
    assert any(y > x for x, y in zip(ks, ks[1:])) and any(y < x for x, y in zip(ks, ks[1:]))
    ref_pairs, ref_ua, ref_ub, ref_passes = cgm_reference(list(a[:, None]), list(b[:, None]), 128, 4, 4, (0.0,),
                                                          k_schedule=[tuple(k) for k in stats.k_windows])
    assert pairs == ref_pairs and stats.passes == len(ref_passes)
    assert ua == sorted(ref_ua) and ub == sorted(ref_ub)


def test_fixed_k_records_constant_k_but_no_series():
    pairs, _, _, stats = run([1, 2, 3, 4, 5], [1, 2, 3, 4, 5], params(n=2, ka=2, with_ids=True, delta=0.1))
    assert stats.k_windows and set(stats.k_windows) == {(2, 2)}
    d = stats.as_dict()
    assert "k_per_window" not in d and "adapt" not in d["params"]


def test_adapt_needs_delta():
    with pytest.raises(UsageError, match="^adapt tunes K .* under delta; give delta D too$"):
        params(n=8, ka=2, adapt=True)
    assert params(n=8, ka=2, adapt=True, delta=0.1).as_dict()["adapt_k_range"] == [1, 8]


def test_short_last_group_joins_the_report_window_before_it():
    """Spec section 4: report windows retire at least N records of A. The run's end leaves a group
    short of N; it joins the last window (kappa of the union), so a handful of unmatched records
    at the very end weigh by their number, not as one whole window of the moving average."""
    w = ReportWindows(10)
    w.add(9, 10)
    w.add(8, 12)
    w.add(0, 5)                                  # the end of the run: 5 records, none matched
    w.finish()
    assert w.counts == [(9, 10), (8, 17)] and w.kappas == [0.9, 8 / 17]
    w = ReportWindows(10)
    w.add(3, 4)                                  # fewer than N in all: the one short window
    w.finish()
    assert w.counts == [(3, 4)] and w.kappas == [0.75]
    w = ReportWindows(10)
    w.add(9, 10)
    w.finish()                                   # nothing open: nothing changes
    assert w.counts == [(9, 10)]
    w = ReportWindows(4)
    w.add(4, 4)
    w.add_unmatched(9)                           # tail of 9 unmatched: windows of 4, 4 and 1 -> 4 and 5
    w.finish()
    assert w.counts == [(4, 4), (0, 4), (0, 5)]


def test_a_short_tail_does_not_decide_delta_ok():
    """The benchmark's 33% / D = 0.05 case in small: every window but the run's last 5 records
    matched 99%; the end's 5 unmatched records lift the moving drop rate by 5 / (N + 5) / m,
    not by 1 / m."""
    n, m = 1000, 10
    w = ReportWindows(n)
    for _ in range(30):
        w.add(990, 1000)
    w.add(0, 5)
    w.finish()
    s = MergeStats("cgm", a_records=sum(r for _, r in w.counts), matched=sum(c for c, _ in w.counts))
    s.kappas, s.params = w.kappas, {"delta": 0.05, "delta_windows": m}
    d = s.as_dict()
    assert d["report_windows"] == 30
    assert d["drop_rate_moving_max"] == pytest.approx(1 - ((m - 1) * 0.99 + 990 / 1005) / m)
    assert d["delta_ok"] is True


def test_k_per_window_is_bounded_and_aligned_with_kappas():
    s = MergeStats("cgm")
    s.params = {"delta": 0.1, "delta_windows": 10, "adapt": True}
    s.kappas = [1.0] * (2 * MAX_SERIES + 3)
    s.k_windows = [(i, i + 1) for i in range(len(s.kappas))]
    d = s.as_dict()
    assert len(d["k_per_window"]) == len(d["kappa_per_window"]) <= MAX_SERIES
    stride = d["series_stride"]
    assert stride == 3 and d["k_per_window"][:2] == [[0, 1], [stride, stride + 1]]


# ------------------------------------------------------------------ the controller's rule

def controller(n=100, ka=40, kb=20, delta=0.1, m=3) -> DeltaController:
    return DeltaController(params(n=n, ka=ka, kb=kb, delta=delta, delta_windows=m, adapt=True))


def test_rule_starts_low_and_holds_while_k_does_not_bind():
    c = controller(n=320, ka=300, kb=5)
    assert c.ks == (10, 5)                      # min(given K, N / 32)
    for _ in range(5):
        assert c.update(1.0) == (10, 5)         # nothing dropped: K did not bind, a larger K changes nothing


def test_rule_doubles_while_drops_are_within_half_delta_and_stops_at_n():
    c = controller(n=64, ka=2, kb=2, delta=0.1)
    assert c.update(1.0 - 0.02) == (4, 4)       # dropped something, <= delta/2: K binds, probe up
    assert c.update(1.0 - 0.02) == (8, 8)
    for _ in range(5):
        ks = c.update(1.0 - 0.02)
    assert ks == (64, 64)                       # bounded by N


def test_rule_cascade_after_a_doubling_returns_and_caps_for_good():
    c = controller(n=640, ka=20, kb=20, delta=0.1, m=3)
    assert c.update(1.0 - 0.02) == (40, 40)     # probe
    assert c.update(1.0 - 0.3) == (20, 20)      # over delta/2 right after the doubling: back
    assert c.ceiling == [20, 20]
    for _ in range(2):
        assert c.update(1.0 - 0.2) == (20, 20)  # held for m windows: echoes of the evictions
    for _ in range(10):
        ks = c.update(1.0 - 0.01)
    assert ks == (20, 20)                       # never above a K that cascaded


def test_rule_a_rise_after_a_doubling_is_a_cascade_even_under_half_delta():
    c = controller(n=640, ka=20, kb=20, delta=0.2)
    assert c.update(1.0 - 0.01) == (40, 40)
    assert c.update(1.0 - 0.05) == (20, 20)     # 0.05 > 2 x 0.01 + delta / 8


def test_rule_halves_on_too_many_drops_down_to_a_floor():
    c = controller(n=640, ka=20, kb=20, delta=0.1, m=1)
    assert c.update(1.0 - 0.2) == (10, 10)      # over delta/2, not after a probe: halve
    assert c.update(1.0 - 0.2) == (10, 10)      # held m windows
    assert c.update(1.0 - 0.2) == (10, 10)      # the floor: start / 2; delta is out of reach
    assert c.ceiling == [10, 10]


def test_rule_bounds_k_to_one():
    c = controller(n=4, ka=1, kb=1)
    assert c.update(0.0) == (1, 1)


# ------------------------------------------------------------------ the delta target on gen data

def test_delta_met_on_gen_where_a_fixed_k_meets_it():
    """smerge gen data (33% displaced up to 20,000 records, N = 5,000): fixed K = 4,000 misses
    delta = 0.05, fixed K = 1,000 meets it; --adapt from K = 4,000 meets it too."""
    from smerge.datasets.gen import GenParams, generate

    rec, keys = 300_000, ("time", "lat", "lon")
    ta = pa.Table.from_batches(list(generate(GenParams(rec, 33, 20_000, seed=1))))
    tb = pa.Table.from_batches(list(generate(GenParams(rec, 33, 20_000, seed=2))))

    def merge(k, adapt):
        p = CGMParams(keys=MergeKeys(keys, keys), eps=(0.01,) * 3, window_size=5000, least_increment_a=k,
                      least_increment_b=k, delta=0.05, adapt=adapt)
        s = MergeStats("cgm")
        for _ in cgm_merge(ta.to_batches(max_chunksize=65536), tb.to_batches(max_chunksize=65536), p,
                           schema_a=ta.schema, schema_b=tb.schema, stats=s):
            pass
        return s.as_dict()

    assert merge(4000, False)["delta_ok"] is False
    assert merge(1000, False)["delta_ok"] is True
    for start in (1000, 4000):
        d = merge(start, True)
        assert d["delta_ok"] is True, (start, d["drop_rate_moving_max"])
        ks = [k[0] for k in d["k_per_window"]]
        assert max(ks) <= 5000 // 32 and min(ks) >= 1
