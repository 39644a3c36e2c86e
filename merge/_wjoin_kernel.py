"""Compiled and vectorised hot loops of the W-join (merge/wjoin.py).

``purge_walk`` replays the arrivals of one chunk record by record and applies the purge rule
of spec section 6 after each one; ``expand_ranges`` / ``bucket_ranges`` turn per-partial-tuple
candidate ranges into flat (parent, candidate) index arrays for the left-deep expansion.
Times are int64 (integers, datetimes as ns) or float64; ``NEG``/``POS`` stand for "nothing seen
yet" and "stream exhausted".
"""

from __future__ import annotations

import numba as nb
import numpy as np

INT_NEG = np.iinfo(np.int64).min
INT_POS = np.iinfo(np.int64).max


@nb.njit(cache=True)
def purge_walk(arr_stream, arr_t, times_flat, offsets, base, ptr, latest, dist, slack, final_rank, drop_at,
               peak, peak_total, neg, pos):
    """Replay one chunk's arrivals; advance each stream's purge pointer after every arrival.

    ``times_flat[offsets[j]:offsets[j+1]]`` are stream j's buffered+chunk times (sorted);
    ``base[j]`` of them were buffered before the chunk, ``ptr[j]`` of those already purged.
    A record y of stream j is dropped once latest[k] - dist[j, k] > t(y) + slack for every
    k != j (spec: the latest timestamp seen on S_k exceeds t(y) + D_jk). ``final_rank[k]`` is
    the arrival index of stream k's last record when it falls in this chunk (-1 otherwise);
    after it, latest[k] = pos. Updates ptr, latest, peak (per stream) in place; returns the
    new peak of the total. ``drop_at[offsets[j] + p]`` receives the arrival index after which
    record p of stream j was dropped (when ``drop_at`` is non-empty).
    """
    n = ptr.shape[0]
    arrived = base.copy()
    pt = peak_total
    for a in range(arr_stream.shape[0]):
        i = arr_stream[a]
        arrived[i] += 1
        latest[i] = arr_t[a] if final_rank[i] != a else pos
        for j in range(n):
            # cutoff_j = min_k!=j (latest_k - D_jk); drop the buffered prefix below it
            cut = pos
            for k in range(n):
                if k == j:
                    continue
                lk = latest[k]
                if lk == neg:
                    c = neg
                elif lk == pos:
                    c = pos
                else:
                    c = lk - dist[j, k]
                if c < cut:
                    cut = c
            if cut == neg:
                continue
            p = ptr[j]
            hi = arrived[j]
            o = offsets[j]
            if cut == pos:
                p = hi
            else:
                while p < hi and times_flat[o + p] + slack < cut:
                    p += 1
            if drop_at.shape[0] > 0:
                for q in range(ptr[j], p):
                    drop_at[o + q] = a
            ptr[j] = p
        tot = 0
        for j in range(n):
            b = arrived[j] - ptr[j]
            tot += b
            if b > peak[j]:
                peak[j] = b
        if tot > pt:
            pt = tot
    return pt


def expand_ranges(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Flatten ranges [starts[p], ends[p]) into (parent p, candidate index) pairs, vectorised."""
    counts = np.maximum(ends - starts, 0)
    total = int(counts.sum())
    if total == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    parent = np.repeat(np.arange(starts.shape[0], dtype=np.int64), counts)
    first = np.cumsum(counts) - counts
    cand = starts[parent] + (np.arange(total, dtype=np.int64) - first[parent])
    return parent, cand


@nb.njit(cache=True)
def _bucket_walk(order, gstart, gend, codes, times, lo, hi, pe, out_parent, out_cand, fill):
    """Walk each probe's bucket from its newest record back to the period start (HW-join probe)."""
    total = 0
    for p in range(codes.shape[0]):
        c = codes[p]
        if c < 0:
            continue
        q = gend[c] - 1
        g0 = gstart[c]
        while q >= g0:
            pos = order[q]
            q -= 1
            if pos >= pe[p]:
                continue  # arrived after the probing record
            t = times[pos]
            if t < lo[p]:
                break
            if t <= hi[p]:
                if fill:
                    out_parent[total] = p
                    out_cand[total] = pos
                total += 1
    return total


class BucketIndex:
    """Hash buckets of one stream's buffered+chunk records: position ranges per hash value.

    Records are grouped by hash (stable, so positions stay time-ordered inside a bucket);
    ``probe`` walks a bucket from its newest record back to the start of the probe's period.
    """

    def __init__(self, hashes: np.ndarray):
        n = hashes.shape[0]
        self.order = np.argsort(hashes, kind="stable").astype(np.int64)
        sh = hashes[self.order]
        self.uniq, first = np.unique(sh, return_index=True)
        self.gstart = first.astype(np.int64)
        self.gend = np.append(first[1:], n).astype(np.int64)

    def probe(self, h: np.ndarray, times: np.ndarray, lo: np.ndarray, hi: np.ndarray,
              pe: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(parent, candidate position) pairs: records in the probe's bucket with lo <= t <= hi
        among the first ``pe`` positions, walking each bucket from its newest record back."""
        if self.uniq.shape[0] == 0 or h.shape[0] == 0:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        idx = np.minimum(np.searchsorted(self.uniq, h), self.uniq.shape[0] - 1)
        codes = np.where(self.uniq[idx] == h, idx, -1).astype(np.int64)
        args = (self.order, self.gstart, self.gend, codes, times, lo.astype(times.dtype, copy=False),
                hi.astype(times.dtype, copy=False), pe.astype(np.int64, copy=False))
        e = np.empty(0, np.int64)
        total = _bucket_walk(*args, e, e, False)
        parent, cand = np.empty(total, np.int64), np.empty(total, np.int64)
        _bucket_walk(*args, parent, cand, True)
        return parent, cand
