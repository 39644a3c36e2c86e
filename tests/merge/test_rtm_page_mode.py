"""RTM page mode on repeated keys and keys out of storage order: what it promises, checked.

Page mode sweeps each window B until a sweep pairs nothing and refills while a remaining A key
(plus eps) is not before the window's last key. With eps = 0 that pairs, in every A window, for
each key, as many A records as the window and B both hold with that key: the most any
matching can (a self-merge pairs every record), so at least as many as cgm and kappa_max.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cgm_reference import cgm_reference, kappa_max_reference
from curvilinear import write_curvilinear
from rtm_reference import rtm_reference, tol_cmp
from smerge.index import BIndex, LocalSource
from smerge.jobs import CGMJob, prepare, run_local
from smerge.jobs.rtm import RTMJob, prepare_rtm, run_rtm
from smerge.merge.params import MergeKeys
from smerge.merge.rtm import rtm_merge
from smerge.merge.rtm_params import RTMParams
from smerge.merge.stats import MergeStats

KEYS = ("time", "lat2d", "lon2d")


def most_pairs(ka: np.ndarray, kb: np.ndarray, n: int) -> int:
    """eps = 0: the most pairs any RTM matching can have (B reusable across A windows, once per
    window): per A window and key, min(A records of the window, B records) with that key."""
    in_b = Counter(map(tuple, kb))
    return sum(min(c, in_b[k]) for s in range(0, len(ka), n) for k, c in Counter(map(tuple, ka[s:s + n])).items())


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    path = tmp_path_factory.mktemp("curv") / "curv.nc"
    keys = write_curvilinear(path)
    return str(path), keys


def _rtm(path, out, **kw) -> dict:
    return run_rtm(prepare_rtm(RTMJob(a=path, b=path, keys_a=KEYS, output=str(out), with_ids=True, overwrite=True,
                                      **kw)))


@pytest.mark.parametrize("eps", [0.0, 0.01])
def test_curvilinear_self_merge_with_repeated_points_pairs_every_record(grid, tmp_path, eps):
    path, keys = grid
    n = 500
    assert len(np.unique(keys, axis=0)) < len(keys) - 500  # many repeated points ...
    assert max(Counter(map(tuple, keys[:n])).values()) > 10  # ... some repeated > 10 times in one window
    assert (np.diff(keys[:2400, 1]) < 0).any() and (np.diff(keys[:2400, 2]) < 0).any()  # not in key order
    s = _rtm(path, tmp_path / "p.parquet", window_size=n, eps=eps, kappa_max=True)
    assert s["matched"] == s["a_records"] == len(keys) == most_pairs(keys, keys, n)
    assert s["kappa_max"] == 1.0 and s["a_unmatched"] == 0
    t = pq.read_table(tmp_path / "p.parquet")
    a, b = t.column("a_row").to_numpy(), t.column("b_row").to_numpy()
    assert len(set(a.tolist())) == len(a)  # each A record once
    assert np.abs(keys[a, 1:] - keys[b, 1:]).max() <= eps and (keys[a, 0] == keys[b, 0]).all()
    # the paper's refill loses the repeated points; cgm's bounded windows lose some too
    sym = _rtm(path, tmp_path / "s.parquet", window_size=n, eps=eps, refill="symdiff")
    cgm = run_local(prepare(CGMJob(a=path, b=path, keys_a=KEYS, output=str(tmp_path / "c.parquet"), eps=eps,
                                   window_size=n, least_increment_a=n // 5, least_increment_b=n // 5, overwrite=True)))
    assert sym["matched"] < s["matched"] and cgm["matched"] < s["matched"]


def _run(ka, kb, eps, n, fetch_rows=7):
    names = [f"k{j}" for j in range(ka.shape[1])]
    ta = pa.table({nm: ka[:, j] for j, nm in enumerate(names)})
    tb = pa.table({nm: kb[:, j] for j, nm in enumerate(names)})
    p = RTMParams(keys=MergeKeys(tuple(names), tuple(names)), eps=tuple(eps), window_size=n, with_ids=True,
                  fetch_rows=fetch_rows)
    st_ = MergeStats("rtm")
    out = list(rtm_merge(ta.to_batches(max_chunksize=5), LocalSource(BIndex.build(tb, names)), p, schema_a=ta.schema,
                         schema_b=tb.schema, b_records=tb.num_rows, stats=st_))
    return sorted((int(x), int(y)) for o in out for x, y in zip(o.column("a_row").to_pylist(),
                                                               o.column("b_row").to_pylist())), st_


@st.composite
def repeated(draw, eps_zero=True):
    """Few distinct keys (many repeats), rows in random order; B sometimes a copy of A."""
    d = draw(st.integers(1, 3))
    pts = draw(st.lists(st.lists(st.integers(0, 3).map(float), min_size=d, max_size=d), min_size=1, max_size=6))
    na = draw(st.integers(1, 40))
    ka = np.array([pts[i] for i in draw(st.lists(st.integers(0, len(pts) - 1), min_size=na, max_size=na))])
    if draw(st.booleans()):
        kb = ka[np.array(draw(st.permutations(range(na))))]
    else:
        nb = draw(st.integers(0, 40))
        kb = np.array([pts[i] for i in draw(st.lists(st.integers(0, len(pts) - 1), min_size=nb, max_size=nb))])
        kb = kb.reshape(nb, d)
    eps = (0.0,) * d if eps_zero else tuple(draw(st.lists(st.sampled_from([0, 0.5, 1.0]), min_size=d, max_size=d)))
    return ka, kb, eps, draw(st.integers(1, 9))


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(repeated(), st.integers(1, 20))
def test_eps_zero_pairs_the_most_possible_and_at_least_cgm(case, fetch_rows):
    ka, kb, eps, n = case
    pairs, st_ = _run(ka, kb, eps, n, fetch_rows)
    assert pairs == sorted(rtm_reference(ka, kb, eps, n)[0])
    assert all((ka[a] == kb[b]).all() for a, b in pairs) and len({a for a, _ in pairs}) == len(pairs)
    for s in range(0, len(ka), n):  # a B record pairs at most once per A window
        in_window = [b for a, b in pairs if s <= a < s + n]
        assert len(in_window) == len(set(in_window))
    assert len(pairs) == most_pairs(ka, kb, n)
    if len(kb) == len(ka) and sorted(map(tuple, kb)) == sorted(map(tuple, ka)):
        assert len(pairs) == len(ka)  # a self-merge (B a permutation of A) pairs every record
    la, lb = [tuple(x) for x in ka], [tuple(x) for x in kb]
    assert len(pairs) >= len(cgm_reference(la, lb, n, n, n, eps)[0])
    assert len(pairs) >= kappa_max_reference(la, lb, eps)
    assert st_.matched == len(pairs) and st_.matched + st_.a_unmatched == len(ka)


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 30), st.integers(1, 9), st.randoms(use_true_random=False))
def test_eps_zero_unique_keys_pairs_every_equal_key_and_contain_cgms(size, n, rnd):
    """Unique keys in A and in B: page mode's pairs are exactly the pairs of equal keys, so
    they contain cgm's pairs and equal them whenever cgm reaches kappa_max."""
    grid_pts = [(float(x), float(y)) for x in range(6) for y in range(6)]
    ka = np.array(rnd.sample(grid_pts, size))
    kb = np.array(rnd.sample(grid_pts, rnd.randint(1, 30)))
    eps = (0.0, 0.0)
    pairs, _ = _run(ka, kb, eps, n)
    where = {tuple(k): r for r, k in enumerate(kb)}
    assert pairs == sorted((a, where[tuple(k)]) for a, k in enumerate(ka) if tuple(k) in where)
    cgm = set(cgm_reference([tuple(x) for x in ka], [tuple(x) for x in kb], n, n, n, eps)[0])
    assert cgm <= set(pairs)
    if len(cgm) == kappa_max_reference([tuple(x) for x in ka], [tuple(x) for x in kb], eps):
        assert cgm == set(pairs)


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(repeated(eps_zero=False), st.integers(1, 20))
def test_eps_positive_equals_reference_and_sweeps_each_window_until_dry(case, fetch_rows):
    ka, kb, eps, n = case
    pairs, _ = _run(ka, kb, eps, n, fetch_rows)
    assert pairs == sorted(rtm_reference(ka, kb, eps, n)[0])
    assert all(tol_cmp(tuple(ka[a]), tuple(kb[b]), eps) == 0 for a, b in pairs)
    assert len({a for a, _ in pairs}) == len(pairs)
