"""A plain-Python RTM (spec section 5) over a brute-force box filter: the test oracle."""

from __future__ import annotations

import numpy as np

from cgm_reference import sweep, tol_cmp  # noqa: F401 - the spec's sweep, shared by both oracles


def in_box(k: np.ndarray, lo, hi) -> np.ndarray:
    return ((k >= np.asarray(lo)) & (k <= np.asarray(hi))).all(axis=1)


def sorted_rows(kb: np.ndarray, rows: np.ndarray) -> list:
    return sorted(rows.tolist(), key=lambda r: (tuple(kb[r]), r))


def rtm_reference(ka: np.ndarray, kb: np.ndarray, eps, n: int, refill: str = "page"):
    """Pairs [(a_row, b_row)] and, per A window, (pairs, fullscan_pairs)."""
    eps = tuple(float(e) for e in eps)
    out = []
    per_window = []
    for s in range(0, ka.shape[0], n):
        rows = list(range(s, min(s + n, ka.shape[0])))
        a = sorted(((tuple(ka[r]), r) for r in rows), key=lambda t: (t[0], t[1]))
        lo = ka[rows].min(axis=0) - np.asarray(eps)
        hi = ka[rows].max(axis=0) + np.asarray(eps)
        rng = sorted_rows(kb, np.nonzero(in_box(kb, lo, hi))[0])
        full = [(tuple(kb[r]), r) for r in rng]
        fullscan, _, _ = sweep(a, full, eps)
        fetched = rng[:n]
        pos = n
        wb = [(tuple(kb[r]), r) for r in fetched]
        found = 0
        while wb and a:
            pairs, i, _ = sweep(a, wb, eps)
            for ia, jb in pairs:
                out.append((a[ia][1], wb[jb][1]))
            found += len(pairs)
            na = len(a)
            hit = {ia for ia, _ in pairs}
            a = [x for t, x in enumerate(a) if t not in hit]
            if i >= na:
                break
            if refill == "page":
                nxt = rng[pos:pos + n]
                pos += n
            else:
                fk = kb[fetched]
                clo, chi = fk.min(axis=0), fk.max(axis=0)
                sd = np.nonzero(in_box(kb, clo, chi) ^ in_box(kb, lo, hi))[0]
                nxt = sorted_rows(kb, sd)[:n]
                fetched = fetched + nxt
            wb = [(tuple(kb[r]), r) for r in nxt]
        per_window.append((found, len(fullscan)))
    return out, per_window
