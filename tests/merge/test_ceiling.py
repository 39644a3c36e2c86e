"""kappa_max is a ceiling: the size of a maximum matching of the eps-graph (exact for one key by
a sweep, for several by Hopcroft-Karp, else a proven bound), never below a run's match rate;
kappa_greedy keeps the unbounded-window figure; the recovery hint, checked by re-running it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from matching_reference import eps_edges, max_matching
from smerge.cli.common import merge_summary
from smerge.merge import CGMParams, MergeKeys, MergeStats, cgm_merge
from smerge.merge import ceiling


def _run(ka, kb, names, eps, n, k, batch=64, **kw):
    d = len(names)
    ta = pa.table({nm: np.asarray(ka, np.float64).reshape(len(ka), d)[:, j] for j, nm in enumerate(names)})
    tb = pa.table({nm: np.asarray(kb, np.float64).reshape(len(kb), d)[:, j] for j, nm in enumerate(names)})
    p = CGMParams(keys=MergeKeys(names, names), eps=tuple(eps), window_size=n, least_increment_a=k,
                  least_increment_b=k, **kw)
    s = MergeStats("cgm")
    for _ in cgm_merge(ta.to_batches(max_chunksize=batch), tb.to_batches(max_chunksize=batch), p,
                       schema_a=ta.schema, schema_b=tb.schema, stats=s, compute_kappa_max=True):
        pass
    return s


@st.composite
def small_graph(draw):
    d = draw(st.integers(1, 3))
    vals = st.integers(0, 12).map(lambda v: v / 2)
    a = draw(st.lists(st.tuples(*[vals] * d), max_size=25))
    b = draw(st.lists(st.tuples(*[vals] * d), max_size=25))
    eps = tuple(draw(st.sampled_from([0.0, 0.5, 1.0, 2.5])) for _ in range(d))
    return a, b, eps


@settings(max_examples=300, deadline=None)
@given(small_graph())
def test_ceiling_equals_brute_force_maximum_matching(case):
    a, b, eps = case
    d = len(eps)
    ka, kb = np.array(a, np.float64).reshape(-1, d), np.array(b, np.float64).reshape(-1, d)
    pairs, method = ceiling.ceiling_pairs(ka, kb, eps)
    assert pairs == max_matching(eps_edges(a, b, eps), len(b))
    assert method == (ceiling.METHOD_1D if d == 1 else ceiling.METHOD_GRAPH)


@settings(max_examples=100, deadline=None)
@given(small_graph())
def test_bound_over_budget_is_never_below_the_maximum_matching(case):
    a, b, eps = case
    d = len(eps)
    if d == 1 or not a or not b:
        return
    ka, kb = np.array(a, np.float64).reshape(-1, d), np.array(b, np.float64).reshape(-1, d)
    bound = min(ceiling.match_1d(ka[:, j], kb[:, j], eps[j]) for j in range(d))
    assert bound >= max_matching(eps_edges(a, b, eps), len(b))


def test_bound_is_used_and_named_when_the_graph_is_over_budget(monkeypatch):
    monkeypatch.setattr(ceiling, "MIN_EDGES", 10)
    monkeypatch.setattr(ceiling, "EDGE_BUDGET", 0)
    ka = np.array([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0]] * 10)
    kb = ka.copy()
    pairs, method = ceiling.ceiling_pairs(ka, kb, (1.0, 1.0))
    assert method == ceiling.METHOD_BOUND and pairs == 30


def _stream(draw, n, far):
    keys = sorted(draw(st.integers(0, 60)) / 2 for _ in range(n))
    for _ in range(draw(st.integers(0, n // 2 + 1))):
        if n:
            i = draw(st.integers(0, n - 1))
            keys.insert(min(n - 1, max(0, i + draw(st.integers(-far, far)))), keys.pop(i))
    return keys


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_no_run_passes_the_ceiling(data):
    n = data.draw(st.integers(1, 10))
    d = data.draw(st.integers(1, 2))
    na, nb = data.draw(st.integers(0, 80)), data.draw(st.integers(0, 80))
    cols_a = [_stream(data.draw, na, 3 * n) for _ in range(d)]
    cols_b = [_stream(data.draw, nb, 3 * n) for _ in range(d)]
    ka = np.array(cols_a, np.float64).T.reshape(na, d)
    kb = np.array(cols_b, np.float64).T.reshape(nb, d)
    eps = tuple(data.draw(st.sampled_from([0.0, 0.5, 1.5])) for _ in range(d))
    k = data.draw(st.integers(1, n))
    s = _run(ka, kb, tuple(f"k{j}" for j in range(d)), eps, n, k, batch=data.draw(st.integers(1, 9)))
    dd = s.as_dict()
    if not na:
        return
    assert s.matched <= round(dd["kappa_max"] * na)
    assert dd["kappa_greedy"] <= dd["kappa_max"] + 1e-12
    truth = max_matching(eps_edges([tuple(r) for r in ka], [tuple(r) for r in kb], eps), nb)
    assert round(dd["kappa_max"] * na) == truth


def test_greedy_can_be_passed_by_a_window_but_the_ceiling_cannot():
    """Greedy pairs a to the first b it meets: A = [1, 2], B = [0, 1] with eps = 1 pairs (1, 0)
    and leaves 2 alone when the sweep sees 1 first; the maximum matching pairs both."""
    ka = np.array([[1.0], [2.0]])
    kb = np.array([[0.0], [1.0]])
    pairs, _ = ceiling.ceiling_pairs(ka, kb, (1.0,))
    assert pairs == 2


def _gen(records, rand, disp, jitter=0.0, seed_b=2):
    from smerge.datasets.gen import GenParams, generate

    ta = pa.Table.from_batches(list(generate(GenParams(records, 0, 0, seed=1))))
    tb = pa.Table.from_batches(list(generate(GenParams(records, rand, disp, jitter=jitter, seed=seed_b))))
    return ta, tb


def _merge_tables(ta, tb, eps, n, k):
    keys = ("time", "lat", "lon")
    p = CGMParams(keys=MergeKeys(keys, keys), eps=eps, window_size=n, least_increment_a=k, least_increment_b=k)
    s = MergeStats("cgm")
    for _ in cgm_merge(ta.to_batches(), tb.to_batches(), p, schema_a=ta.schema, schema_b=tb.schema, stats=s,
                       compute_kappa_max=True):
        pass
    return s.as_dict()


def test_hint_on_the_jittered_grid_names_a_smaller_increment_that_recovers():
    """docs/cgm.md's jittered grid: 20,000 records, 0.001 degree jitter, eps lat = lon = 0.002,
    N = 5,000, K = 1,000 pairs about 56%; the hint names K = N / 32, and that run is within a
    point of the ceiling."""
    ta, tb = _gen(20_000, 0, 0, jitter=0.001)
    eps = (0.01, 0.002, 0.002)
    d = _merge_tables(ta, tb, eps, 5000, 1000)
    assert d["match_pct"] < 60 and d["kappa_max"] == 1.0 and d["kappa_max_method"] == ceiling.METHOD_GRAPH
    rec = d["recover"]
    assert rec["change"] == "increment" and rec["least_increment"] == 156
    assert "recover with --increment 156" in merge_summary(d)
    again = _merge_tables(ta, tb, eps, 5000, rec["least_increment"])
    assert again["kappa_max"] - again["match_pct"] / 100 <= 0.01
    assert "recover" not in again and "recover with" not in merge_summary(again)


def test_hint_on_station_observations_delivered_late_names_a_window_that_recovers():
    """Station-like observations: 40 stations reporting hourly, B's times 0-10 min off the
    model's, and one station in five delivering its records late (2,000 to 8,000 records behind).
    N = 500 misses those partners; the hint names the window that reaches them, and re-running
    with it comes within a point of the ceiling."""
    rng = np.random.default_rng(5)
    hours, stations = 400, 40
    t = np.repeat(np.arange(hours, dtype=np.float64) * 60.0, stations)
    sid = np.tile(np.arange(stations, dtype=np.float64), hours)
    ka = np.column_stack([t, sid])
    kb = np.column_stack([t + rng.uniform(0, 10, t.size), sid])
    late = np.isin(sid, rng.choice(stations, stations // 5, replace=False))
    pos = np.arange(t.size, dtype=np.float64)
    pos[late] += rng.integers(2000, 8000, int(late.sum()))
    kb = kb[np.argsort(pos, kind="stable")]
    eps = (10.0, 0.0)
    s = _run(ka, kb, ("time", "station"), eps, 500, 15, batch=4096)
    d = s.as_dict()
    rec = d["recover"]
    assert d["kappa_max"] == 1.0 and d["match_pct"] < 99 and rec["change"] == "window"
    assert rec["window_size"] > 500 and f"recover with --window {rec['window_size']}" in merge_summary(d)
    d2 = _run(ka, kb, ("time", "station"), eps, rec["window_size"], rec["least_increment"], batch=4096).as_dict()
    assert d2["kappa_max"] - d2["match_pct"] / 100 <= 0.01 and "recover" not in d2


def test_gen_displacement_hint_window_recovers():
    ta, tb = _gen(60_000, 33, 5000)
    d = _merge_tables(ta, tb, (0.01,) * 3, 1000, 1000)
    rec = d["recover"]
    assert rec["change"] == "window"
    again = _merge_tables(ta, tb, (0.01,) * 3, rec["window_size"], rec["least_increment"])
    assert again["kappa_max"] - again["match_pct"] / 100 <= 0.01


def test_figures_are_in_the_statistics_without_a_hint_when_close():
    s = _run([[1.0], [2.0]], [[1.0], [2.0]], ("k",), (0.0,), 2, 1)
    d = s.as_dict()
    assert d["kappa_max"] == 1.0 and d["kappa_greedy"] == 1.0 and d["kappa_max_method"] == ceiling.METHOD_1D
    assert "recover" not in d
    assert "ceiling: the most any run can pair" in merge_summary(d)
