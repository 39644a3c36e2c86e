"""The ceiling of kappa: the most A records any merge could pair (``--kappa-max``).

A merge pairs an A record with a B record when they are within eps on every key (the tolerant
comparison MATCHes), each record at most once. The pairs any run can find, whatever its window,
increments or engine, are a matching of the *eps-graph* (A and B records, an edge between every
MATCHing A and B record), so the size of a maximum matching of that graph, over A's records, is
a ceiling no run can pass. ``kappa_max`` in the statistics is that figure:

- one key: exact, by a sweep (``_ckernel.smerge_match_1d``: in key order every A interval
  [x - eps, x + eps] takes the smallest free B key inside it; optimal for intervals of one
  length), O(n) memory past the sort;
- several keys: exact, by Hopcroft-Karp on the eps-graph. Its edges are found through a grid of
  cells of side eps_j on each key (two records within eps are in the same or adjacent cells), in
  memory bounded by ``EDGE_BUDGET`` edges per record; a graph with more edges than that
  (e.g. eps as wide as the data) falls back to a proven upper bound: the smallest of the one-key
  maximum matchings (a matching of the eps-graph is a matching of each key's own graph).

``kappa_max_method`` says which: ``"matching, 1 key"``, ``"matching, eps-graph"`` (both exact)
or ``"bound, min over keys"`` (an upper bound). ``kappa_greedy`` is the unbounded-window merge of
earlier versions (the sweep of whole sorted streams repeated until dry, ``cgm.kappa_max_pairs``):
greedy, so a windowed run can exceed it; it is reported beside the ceiling, never as one.
"""

from __future__ import annotations

import ctypes

import numpy as np

from smerge.merge import _kernel

EDGE_BUDGET = 16  # eps-graph edges (and cell candidates) per record before the bound is used instead
MIN_EDGES = 1 << 20

METHOD_1D = "matching, 1 key"
METHOD_GRAPH = "matching, eps-graph"
METHOD_BOUND = "bound, min over keys"

_lib = _kernel._lib
_i64p, _f64p, _i64 = _kernel._i64p, _kernel._f64p, _kernel._i64
_lib.smerge_match_1d.argtypes = [_f64p, _i64, _f64p, _i64, ctypes.c_double]
_lib.smerge_match_1d.restype = _i64
_lib.smerge_hopcroft_karp.argtypes = [_i64, _i64, _i64p, _i64p, _i64p, _i64p, _i64p, _i64p, _i64p, _i64p]
_lib.smerge_hopcroft_karp.restype = _i64


def match_1d(a: np.ndarray, b: np.ndarray, eps: float) -> int:
    """Size of a maximum matching of values ``a`` to ``b`` with |x - y| <= eps (exact)."""
    a = np.ascontiguousarray(np.sort(np.asarray(a, np.float64)))
    b = np.ascontiguousarray(np.sort(np.asarray(b, np.float64)))
    return int(_lib.smerge_match_1d(_kernel._ptr(a, _f64p), a.size, _kernel._ptr(b, _f64p), b.size, float(eps)))


def max_matching(start: np.ndarray, adj: np.ndarray, nb: int) -> int:
    """Size of a maximum matching of a bipartite graph in CSR form (A vertex v: B neighbours
    ``adj[start[v]:start[v + 1]]``), by Hopcroft-Karp."""
    start = np.ascontiguousarray(start, np.int64)
    adj = np.ascontiguousarray(adj, np.int64)
    na = start.size - 1
    bufs = [np.empty(max(na, 1), np.int64) for _ in range(5)]
    mb = np.empty(max(nb, 1), np.int64)
    p = _kernel._ptr
    return int(_lib.smerge_hopcroft_karp(na, nb, p(start, _i64p), p(adj, _i64p), p(bufs[0], _i64p), p(mb, _i64p),
                                         *(p(x, _i64p) for x in bufs[1:])))


def _cells(keys: np.ndarray, eps: np.ndarray) -> np.ndarray:
    """Integer cell of every record on every key: floor(x / eps_j), or the exact value's bits
    when eps_j = 0 (records within eps_j have cells at most 1 apart; with eps_j = 0, equal)."""
    c = np.empty(keys.shape, np.int64)
    for j, e in enumerate(eps):
        col = np.ascontiguousarray(keys[:, j]) + 0.0  # -0.0 -> 0.0: equal keys, equal bits
        c[:, j] = np.floor(col / e).astype(np.int64) if e > 0 else col.view(np.int64)
    return c


_MIX = np.array([0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93,
                 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53, 0x94D049BB133111EB, 0xBF58476D1CE4E5B9],
                dtype=np.uint64)


def _hash(c: np.ndarray) -> np.ndarray:
    """One int64 per cell tuple (collisions only add candidates, which the eps check removes)."""
    h = np.zeros(c.shape[0], np.uint64)
    with np.errstate(over="ignore"):
        for j in range(c.shape[1]):
            h = (h ^ (c[:, j].view(np.uint64) * _MIX[j % len(_MIX)])) * np.uint64(0x100000001B3)
    return h.view(np.int64)


def eps_graph(ka: np.ndarray, kb: np.ndarray, eps, budget: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The eps-graph in CSR form (A -> B indices), or None when it would take more than
    ``budget`` candidates or edges."""
    eps = np.asarray(eps, np.float64)
    na, d = ka.shape
    ca, cb = _cells(ka, eps), _cells(kb, eps)
    hb = _hash(cb)
    ob = np.argsort(hb, kind="stable")
    hb_sorted = hb[ob]
    offsets = np.array(np.meshgrid(*[[-1, 0, 1] if e > 0 else [0] for e in eps], indexing="ij")).reshape(d, -1).T
    src, dst, total = [], [], 0
    for off in offsets:
        h = _hash(ca + off) if off.any() else _hash(ca)
        lo = np.searchsorted(hb_sorted, h, "left")
        cnt = np.searchsorted(hb_sorted, h, "right") - lo
        ncand = int(cnt.sum())
        if ncand == 0:
            continue
        if total + ncand > budget:
            return None
        ai = np.repeat(np.arange(na, dtype=np.int64), cnt)
        pos = np.arange(ncand, dtype=np.int64) - np.repeat(np.cumsum(cnt) - cnt, cnt) + np.repeat(lo, cnt)
        bi = ob[pos]
        ok = np.all(np.abs(ka[ai] - kb[bi]) <= eps, axis=1)
        ai, bi = ai[ok], bi[ok]
        total += ai.size
        src.append(ai)
        dst.append(bi)
    if not src:
        return np.zeros(na + 1, np.int64), np.empty(0, np.int64)
    ai, bi = np.concatenate(src), np.concatenate(dst)
    o = np.lexsort((bi, ai))
    ai, bi = ai[o], bi[o]
    keep = np.ones(ai.size, bool)  # a hash collision may find one pair under two offsets
    keep[1:] = (ai[1:] != ai[:-1]) | (bi[1:] != bi[:-1])
    ai, bi = ai[keep], bi[keep]
    start = np.zeros(na + 1, np.int64)
    np.cumsum(np.bincount(ai, minlength=na), out=start[1:])
    return start, bi


def ceiling_pairs(ka: np.ndarray, kb: np.ndarray, eps) -> tuple[int, str]:
    """(pairs, method): the size of a maximum matching of the eps-graph of A's and B's keys
    (NaN-free), exact, or the smallest one-key maximum matching (an upper bound) when the graph
    exceeds the memory budget; see the module's docstring."""
    eps = tuple(float(e) for e in eps)
    ka = np.asarray(ka, np.float64).reshape(len(ka), len(eps))
    kb = np.asarray(kb, np.float64).reshape(len(kb), len(eps))
    if ka.shape[0] == 0 or kb.shape[0] == 0:
        return 0, METHOD_1D if len(eps) == 1 else METHOD_GRAPH
    if len(eps) == 1:
        return match_1d(ka[:, 0], kb[:, 0], eps[0]), METHOD_1D
    budget = max(MIN_EDGES, EDGE_BUDGET * max(ka.shape[0], kb.shape[0]))
    g = eps_graph(ka, kb, eps, budget)
    if g is not None:
        return max_matching(g[0], g[1], kb.shape[0]), METHOD_GRAPH
    return min(match_1d(ka[:, j], kb[:, j], eps[j]) for j in range(len(eps))), METHOD_BOUND


RECOVER_POINT = 0.01  # a hint is given when the match rate is more than one point (of A) under the ceiling


def kappa_figures(ka: np.ndarray, ra: np.ndarray, kb: np.ndarray, rb: np.ndarray, eps, a_records: int) -> dict:
    """The statistics of ``--kappa-max`` from all of A's and B's valid keys and row ids:
    ``kappa_max`` (the ceiling), ``kappa_max_method``, ``kappa_greedy`` (the unbounded-window
    merge) and ``window_needed``: the least window N under which all but one point of A's
    greedy pairs arrive (the stream distance |a_row - b_row| of a pair is how long the earlier
    record must wait in its window for the later one)."""
    from smerge.merge.cgm import kappa_max_pairs

    d = len(tuple(eps))
    ka = np.ascontiguousarray(ka, np.float64).reshape(len(ka), d)
    kb = np.ascontiguousarray(kb, np.float64).reshape(len(kb), d)
    greedy, pa_, pb_ = kappa_max_pairs(ka, ra, kb, rb, eps, return_pairs=True)
    ceiling, method = ceiling_pairs(ka, kb, eps)
    ceiling = max(ceiling, greedy)  # equal or larger by construction; a guard against float edge cases
    lag = np.sort(np.abs(pa_ - pb_))
    allow = int(RECOVER_POINT * a_records)  # pairs that may stay out of reach
    need = int(lag[lag.size - 1 - allow]) + 1 if lag.size > allow else 1
    rate = (lambda p: p / a_records if a_records else 1.0)
    return {"kappa_max": rate(ceiling), "kappa_max_method": method, "kappa_greedy": rate(greedy),
            "window_needed": need}
