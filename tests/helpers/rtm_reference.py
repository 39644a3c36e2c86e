"""A plain-Python RTM (docs/semantics.md section 5) over a brute-force box filter: the test oracle."""

from __future__ import annotations

import numpy as np

from cgm_reference import sweep, tol_cmp  # noqa: F401 - the paper's sweep, shared by both oracles


def in_box(k: np.ndarray, lo, hi) -> np.ndarray:
    return ((k >= np.asarray(lo)) & (k <= np.asarray(hi))).all(axis=1)


def sorted_rows(kb: np.ndarray, rows: np.ndarray) -> list:
    return sorted(rows.tolist(), key=lambda r: (tuple(kb[r]), r))


def rtm_reference(ka: np.ndarray, kb: np.ndarray, eps, n: int, refill: str = "page"):
    """Pairs [(a_row, b_row)] and, per A window, (pairs, fullscan_pairs).

    ``page``: each window B (the next N records of range(box_A)) is swept against window A
    until a sweep pairs nothing (B records paired in one sweep leave the window B for the
    next); window B is refilled while some remaining A key plus eps is not before the last key
    of window B. ``symdiff``: one sweep per window B and the paper's cursor rule (the paper's).
    ``fullscan_pairs``: one sweep of window A over all of range(box_A).
    """
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
            if refill == "page":  # the sweep repeated until dry over this window B, then refill while
                b_left = list(wb)  # some A key plus eps is not before the window's last key
                while a and b_left:
                    pairs, _, _ = sweep(a, b_left, eps)
                    if not pairs:
                        break
                    out += [(a[ia][1], b_left[jb][1]) for ia, jb in pairs]
                    found += len(pairs)
                    hit_a, hit_b = {ia for ia, _ in pairs}, {jb for _, jb in pairs}
                    a = [x for t, x in enumerate(a) if t not in hit_a]
                    b_left = [x for t, x in enumerate(b_left) if t not in hit_b]
                last = wb[-1][0]
                if not any(tuple(x + e for x, e in zip(k, eps)) >= last for k, _ in a):
                    break
                nxt = rng[pos:pos + n]
                pos += n
                wb = [(tuple(kb[r]), r) for r in nxt]
                continue
            pairs, i, _ = sweep(a, wb, eps)
            for ia, jb in pairs:
                out.append((a[ia][1], wb[jb][1]))
            found += len(pairs)
            na = len(a)
            hit = {ia for ia, _ in pairs}
            a = [x for t, x in enumerate(a) if t not in hit]
            if i >= na:
                break
            fk = kb[fetched]
            clo, chi = fk.min(axis=0), fk.max(axis=0)
            sd = np.nonzero(in_box(kb, clo, chi) ^ in_box(kb, lo, hi))[0]
            nxt = sorted_rows(kb, sd)[:n]
            fetched = fetched + nxt
            wb = [(tuple(kb[r]), r) for r in nxt]
        per_window.append((found, len(fullscan)))
    return out, per_window
