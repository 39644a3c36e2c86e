"""RTM engine (docs/semantics.md sections 2, 4, 5): worked example through a real server, oracle
equality with a plain-Python RTM, invariants on random partially sorted data."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rtm_reference import rtm_reference, tol_cmp
from smerge.errors import KeyNaNError, UsageError
from smerge.index import BIndex, LocalSource
from smerge.merge.range_source import Box
from smerge.merge.params import MergeKeys
from smerge.merge.rtm import rtm_merge, rtm_merge_table
from smerge.merge.rtm_params import RTMParams
from smerge.merge.stats import MergeStats


def params(names=("k",), eps=0.0, n=5, refill="page", **kw) -> RTMParams:
    e = tuple(eps) if isinstance(eps, (tuple, list)) else (float(eps),) * len(names)
    return RTMParams(keys=MergeKeys(tuple(names), tuple(names)), eps=e, window_size=n, refill=refill,
                     with_ids=True, **kw)


def tables(ka: np.ndarray, kb: np.ndarray):
    names = [f"k{j}" for j in range(ka.shape[1])]
    ta = pa.table({**{nm: ka[:, j] for j, nm in enumerate(names)}, "va": np.arange(ka.shape[0])})
    tb = pa.table({**{nm: kb[:, j] for j, nm in enumerate(names)}, "vb": np.arange(kb.shape[0]) * 10})
    return names, ta, tb


def run(ta, tb, p, source=None, batch=7):
    idx = BIndex.build(tb, p.keys.b)
    st_ = MergeStats("rtm")
    un = []
    out = list(rtm_merge(ta.to_batches(max_chunksize=batch), source or LocalSource(idx), p, schema_a=ta.schema,
                         schema_b=tb.schema, b_records=tb.num_rows, stats=st_, unmatched=lambda s, b: un.append(b)))
    pairs = sorted((int(x), int(y)) for b in out for x, y in zip(b.column("a_row").to_pylist(),
                                                                b.column("b_row").to_pylist()))
    return pairs, st_, un, out


@pytest.mark.slow
@pytest.mark.parametrize("refill", ["page", "symdiff"])
def test_worked_example_through_a_real_server(refill):
    """Mazzucco et al. (SC2002) section 4.2: N=5, eps=0, A={2,4,6,8,10}, B gives {2..6} then {7..10}."""
    from smerge.transport.flight_client import IndexClient
    from smerge.transport.flight_server import IndexServer

    ta = pa.table({"k": [2.0, 4, 6, 8, 10], "va": [1, 2, 3, 4, 5]})
    tb = pa.table({"k": [2.0, 3, 4, 5, 6, 7, 8, 9, 10], "vb": np.arange(9)})
    server = IndexServer(BIndex.build(tb, ["k"], name="b"), port=0, token="worked-example-token")
    server.start_background()
    try:
        client = IndexClient(server.url, token="worked-example-token")
        first, _ = client.range_query(Box((2.0,), (10.0,)), limit=5)
        assert first.column("k").to_pylist() == [2, 3, 4, 5, 6]
        p = params(n=5, refill=refill)
        st_ = MergeStats("rtm")
        t = rtm_merge_table(ta, client, p, schema_b=tb.schema, b_records=9, stats=st_)
        assert list(zip(t.column("k").to_pylist(), t.column("k_b").to_pylist())) == [(2, 2), (4, 4), (6, 6), (8, 8), (10, 10)]
        assert t.column("vb").to_pylist() == [0, 2, 4, 6, 8]
        assert st_.matched == 5 and st_.a_unmatched == 0 and st_.b_unmatched == 4
        # windows B: first page {2..6}, refill {7..10}; the transport asks for up to 4N at once
        assert st_.extra["b_windows"] == 2 and st_.extra["queries"] == (1 if refill == "page" else 2)
        assert st_.extra["b_fetched"] == 9
        client.close()
    finally:
        server.shutdown()


keys_st = st.integers(0, 9).map(float)


@st.composite
def data(draw, eps_zero=False, max_d=3):
    d = draw(st.integers(1, max_d))
    na = draw(st.integers(1, 40))
    nb = draw(st.integers(0, 40))
    ka = np.array(draw(st.lists(st.lists(keys_st, min_size=d, max_size=d), min_size=na, max_size=na)), float)
    kb = np.array(draw(st.lists(st.lists(keys_st, min_size=d, max_size=d), min_size=nb, max_size=nb)), float)
    kb = kb.reshape(nb, d)
    eps = (0.0,) * d if eps_zero else tuple(draw(st.lists(st.sampled_from([0, 0.5, 1.0, 2.0]), min_size=d, max_size=d)))
    n = draw(st.integers(1, 9))
    return ka, kb, eps, n


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data(), st.sampled_from(["page", "symdiff"]), st.integers(1, 30))
def test_equals_plain_python_reference_and_invariants(case, refill, fetch_rows):
    ka, kb, eps, n = case
    names, ta, tb = tables(ka, kb)
    p = params(names, eps, n, refill, fetch_rows=fetch_rows)
    pairs, st_, un, out = run(ta, tb, p)
    ref, _ = rtm_reference(ka, kb, eps, n, refill)
    assert pairs == sorted(ref)
    # Spec section 2: every pair MATCHes; each A record at most once; exact accounting.
    for a, b in pairs:
        assert tol_cmp(tuple(ka[a]), tuple(kb[b]), eps) == 0
    a_rows = [a for a, _ in pairs]
    assert len(a_rows) == len(set(a_rows))
    assert st_.matched + st_.a_unmatched == st_.a_records == ka.shape[0]
    assert st_.b_unmatched == kb.shape[0] - len({b for _, b in pairs})
    unmatched_a = sorted(r for b in un for r in b.column("a_row").to_pylist())
    assert unmatched_a == sorted(set(range(ka.shape[0])) - set(a_rows))
    # payload travels with the pair
    for b in out:
        assert b.column("vb").to_pylist() == [10 * r for r in b.column("b_row").to_pylist()]
        assert b.column("va").to_pylist() == b.column("a_row").to_pylist()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data(eps_zero=True))
def test_page_mode_finds_every_full_scan_match_and_symdiff_never_more(case):
    """eps = 0: per A window, paging finds >= the pairs of one sweep over all of range(box_A);
    symdiff mode never finds more pairs than page mode (counterexamples with eps > 0: docs/rtm.md)."""
    ka, kb, eps, n = case
    names, ta, tb = tables(ka, kb)
    page, st_p, _, _ = run(ta, tb, params(names, eps, n, "page"))
    sym, _, _, _ = run(ta, tb, params(names, eps, n, "symdiff"))
    _, per_window = rtm_reference(ka, kb, eps, n, "page")
    assert all(found >= full for found, full in per_window)
    want = [(found, min(n, ka.shape[0] - i * n)) for i, (found, _) in enumerate(per_window)]
    if len(want) > 1 and want[-1][1] < n:  # a short last A window joins the report window before it
        want[-2:] = [(want[-2][0] + want[-1][0], want[-2][1] + want[-1][1])]
    assert st_p.kappas == [found / retired for found, retired in want]
    assert len(sym) <= len(page)


@settings(max_examples=80, deadline=None)
@given(data(max_d=1))
def test_page_mode_lossless_in_one_dimension_with_eps(case):
    ka, kb, eps, n = case
    _, per_window = rtm_reference(ka, kb, eps, n, "page")
    assert all(found >= full for found, full in per_window)


def test_partially_sorted_stream_matches_full_when_windows_cover_disorder():
    """Gridded keys with local disorder: page mode finds kappa_max; symdiff loses boundary rows."""
    rng = np.random.default_rng(3)
    t, la, lo = np.meshgrid(np.arange(6.0), np.arange(10.0), np.arange(12.0), indexing="ij")
    kb = np.column_stack([t.ravel(), la.ravel(), lo.ravel()])
    ka = kb.copy()
    idx = rng.choice(len(ka), 50, replace=False)
    for i in idx:  # displace 50 records by up to 30 positions
        j = int(np.clip(i + rng.integers(-30, 31), 0, len(ka) - 1))
        ka[[i, j]] = ka[[j, i]]
    names, ta, tb = tables(ka, kb)
    st_p = MergeStats("rtm")
    tbl = rtm_merge_table(ta, LocalSource(BIndex.build(tb, names)), params(names, 0.0, 100), schema_b=tb.schema,
                          b_records=tb.num_rows, stats=st_p,
                          kappa_max_b=lambda: (kb, np.arange(len(kb), dtype=np.int64)))
    assert st_p.matched == len(ka) and st_p.kappa_max == 1.0
    assert tbl.column("k0").to_pylist() == tbl.column("k0_b").to_pylist()
    st_s = MergeStats("rtm")
    rtm_merge_table(ta, LocalSource(BIndex.build(tb, names)), params(names, 0.0, 100, "symdiff"), schema_b=tb.schema,
                    b_records=tb.num_rows, stats=st_s)
    assert st_s.matched < st_p.matched


def test_nan_keys_error_or_unmatched():
    ta = pa.table({"k": [1.0, float("nan"), 3.0]})
    tb = pa.table({"k": [1.0, 2.0, 3.0]})
    with pytest.raises(KeyNaNError, match="row 1"):
        run(ta, tb, params(n=3))
    pairs, st_, un, _ = run(ta, tb, params(n=3, nan_keys="unmatched"))
    assert pairs == [(0, 0), (2, 2)] and st_.a_unmatched == 1 and st_.a_nan_keys == 1
    assert [r for b in un for r in b.column("a_row").to_pylist()] == [1]


def test_b_paired_across_windows_is_not_consumed():
    """B is an indexed relation: one B record may pair with A records of several windows."""
    ta = pa.table({"k": [5.0, 5.0, 5.0]})
    tb = pa.table({"k": [5.0]})
    pairs, st_, _, _ = run(ta, tb, params(n=1))
    assert pairs == [(0, 0), (1, 0), (2, 0)] and st_.b_unmatched == 0 and st_.kappas == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("kw, msg", [(dict(window_size=0), "^window_size is 0"), (dict(refill="x"), "^refill is 'x'"),
                                     (dict(eps=(-1.0,)), "^eps for key 'k' is -1"), (dict(nan_keys="x"), "^nan_keys is 'x'"),
                                     (dict(delta=2.0), "^delta is 2.0")])
def test_params_are_validated(kw, msg):
    base = dict(keys=MergeKeys(("k",), ("k",)), eps=(0.0,))
    with pytest.raises(UsageError, match=msg):
        RTMParams(**{**base, **kw})


@pytest.mark.slow
@pytest.mark.parametrize("refill", ["page", "symdiff"])
def test_through_a_real_server_with_prefetch_equals_in_process(refill):
    """The client's announced (prefetched) first pages give exactly the in-process result."""
    from smerge.transport.flight_client import IndexClient
    from smerge.transport.flight_server import IndexServer

    rng = np.random.default_rng(11)
    kb = np.column_stack([np.repeat(np.arange(40.0), 25), np.tile(np.arange(25.0), 40)])
    ka = kb[np.clip(np.arange(1000) + rng.integers(-30, 31, 1000), 0, 999)]
    names, ta, tb = tables(ka, kb)
    p = params(names, (0.0, 1.0), 60, refill)
    local, st_l, _, _ = run(ta, tb, p)
    server = IndexServer(BIndex.build(tb, names, name="b"), port=0, token="prefetch-test-token")
    server.start_background()
    try:
        client = IndexClient(server.url, token="prefetch-test-token")
        remote, st_r, _, _ = run(ta, tb, p, source=client)
        assert remote == local and st_r.kappas == st_l.kappas
        assert st_r.extra["queries"] == st_l.extra["queries"] and st_r.extra["b_windows"] == st_l.extra["b_windows"]
        assert client._prefetched == {}  # every announced page was collected
        client.close()
    finally:
        server.shutdown()
