"""Compiled and vectorised hot loops of the W-join (merge/wjoin.py).

``purge_walk`` replays the arrivals of one chunk record by record and applies the purge rule
of docs/semantics.md section 6 after each one; ``expand_ranges`` (NLW-join) and ``BucketIndex`` (HW-join hash chains) turn per-partial-tuple
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
def _chain_probe(hashes, mask, order, h, times, lo, hi, pe, slot_h, slot_head, prv, inserted, limit):
    """HW-join probe, in one compiled pass: probes are taken in order of ``pe`` (``order``); before
    a probe, the stream's records below its ``pe`` are inserted into an open-addressing table
    (hash -> newest position) whose positions link to the previous one of the same hash, so
    each bucket is a newest-first chain of exactly the records that arrived before the probing
    record. The walk stops at the first record before the period start ``lo``. At ``limit`` + 1
    pairs it stops early (the caller refuses or splits the probe; the chains stay valid)."""
    m = h.shape[0]
    ocap = max(16, 2 * m)
    out_parent = np.empty(ocap, np.int64)
    out_cand = np.empty(ocap, np.int64)
    total = 0
    for k in range(m):
        p = order[k]
        e = pe[p]
        while inserted < e:
            hv = hashes[inserted]
            s = np.int64(hv & np.uint64(mask))
            while slot_head[s] != -1 and slot_h[s] != hv:
                s = (s + 1) & mask
            prv[inserted] = slot_head[s]
            slot_h[s] = hv
            slot_head[s] = inserted
            inserted += 1
        hp = h[p]
        s = np.int64(hp & np.uint64(mask))
        while slot_head[s] != -1 and slot_h[s] != hp:
            s = (s + 1) & mask
        q = slot_head[s]
        lp, up = lo[p], hi[p]
        while q >= 0:
            t = times[q]
            if t < lp:
                break
            if t <= up:
                if total > limit:
                    return out_parent[:total], out_cand[:total], inserted
                if total == ocap:
                    ocap *= 2
                    a = np.empty(ocap, np.int64)
                    a[:total] = out_parent[:total]
                    out_parent = a
                    b = np.empty(ocap, np.int64)
                    b[:total] = out_cand[:total]
                    out_cand = b
                out_parent[total] = p
                out_cand[total] = q
                total += 1
            q = prv[q]
    return out_parent[:total], out_cand[:total], inserted


class BucketIndex:
    """Hash buckets of one stream's buffered+chunk records (time-ordered positions).

    ``probe`` builds newest-first chains per 64-bit key hash incrementally while it takes the
    probes in arrival order (``_chain_probe``), so a walk never meets a record that arrived
    after its probing record and stops at the start of the probe's period.
    """

    def __init__(self, hashes: np.ndarray):
        n = hashes.shape[0]
        cap = 16
        while cap < 2 * n:
            cap *= 2
        self.mask = cap - 1
        self.hashes = np.ascontiguousarray(hashes, np.uint64)
        # The chains persist between calls whose probes come later in arrival order (blocks of
        # one arriving stream): records already inserted are not inserted again.
        self._slot_h = np.zeros(cap, np.uint64)
        self._slot_head = np.full(cap, -1, np.int64)
        self._prv = np.empty(n, np.int64)
        self._inserted = 0

    def probe(self, h: np.ndarray, times: np.ndarray, lo: np.ndarray, hi: np.ndarray,
              pe: np.ndarray, limit: int = 2**62) -> tuple[np.ndarray, np.ndarray]:
        """(parent, candidate position) pairs: records in the probe's bucket with lo <= t <= hi
        among the first ``pe`` positions (pairs grouped by probe, in order of ``pe``). Successive
        calls on one index must come in arrival order (every ``pe`` >= the last call's). More than
        ``limit`` pairs: the walk stops after ``limit`` + 1 of them (memory bounded by the limit);
        the caller must not use that result, only its size."""
        if self.hashes.shape[0] == 0 or h.shape[0] == 0:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        pe = np.ascontiguousarray(pe, np.int64)
        if pe.shape[0] > 1 and np.any(pe[1:] < pe[:-1]):
            order = np.argsort(pe, kind="stable").astype(np.int64)
        else:
            order = np.arange(pe.shape[0], dtype=np.int64)
        if pe.shape[0] and int(pe.min()) < self._inserted:
            raise ValueError("BucketIndex.probe: probes must not precede those of an earlier call")
        parent, cand, self._inserted = _chain_probe(
            self.hashes, self.mask, order, np.ascontiguousarray(h, np.uint64), times,
            np.ascontiguousarray(lo, times.dtype), np.ascontiguousarray(hi, times.dtype), pe,
            self._slot_h, self._slot_head, self._prv, self._inserted, int(limit))
        return parent, cand
