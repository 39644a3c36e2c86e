"""The W-join's hot loops (merge/wjoin_engine.py): C (``merge/_wjoin_ckernel.c``, through ctypes) and numpy.

``purge_walk`` replays the arrivals of one chunk record by record and applies the purge rule
of docs/semantics.md section 6 after each one; ``arrivals`` merges a chunk's streams into
arrival order; ``expand_ranges`` (NLW-join) and ``KeyIndex`` (HW-join and equality probes:
records grouped by key hash) turn per-partial-tuple candidate ranges into flat (parent,
candidate) index arrays for the left-deep expansion. Times are int64 (integers, datetimes as ns) or
float64; ``NEG``/``POS`` stand for "nothing seen yet" and "stream exhausted". Plain C loaded
with ctypes, not a JIT: loading takes about 1 ms, where importing numba costs ~0.5 s and ~65 MB
of memory per process.
"""

from __future__ import annotations

import ctypes

import numpy as np

from smerge.merge._cext import open_extension

INT_NEG = np.iinfo(np.int64).min
INT_POS = np.iinfo(np.int64).max

_p = ctypes.c_void_p
_i64 = ctypes.c_int64


def _load() -> ctypes.CDLL:
    lib = open_extension("smerge.merge._wjoin_ckernel", "W-join kernel")
    for sfx, t in (("i64", _i64), ("f64", ctypes.c_double)):
        f = getattr(lib, f"wj_purge_walk_{sfx}")
        f.argtypes = [_i64, _p, _p, _p, _p, _p, _p, _p, _p, _i64, t, _p, _p, _i64, _p, _i64, t, t]
        f.restype = _i64
        f = getattr(lib, f"wj_arrivals_{sfx}")
        f.argtypes = [_i64, _p, _p, _p, _i64, _p, _p, _p, _p, _p]
        f.restype = _i64
        f = getattr(lib, f"wj_key_probe_{sfx}")
        f.argtypes = [_i64, _p, _p, _p, _p, _i64, _p, _p, _p, _p, _i64, _i64, _i64, _p, _p, _i64, _p, _i64, _i64, _p,
                      _p, ctypes.POINTER(_i64)]
        f.restype = _i64
    lib.wj_key_index.argtypes = [_p, _i64, _p, _p]
    lib.wj_key_index.restype = _i64
    lib.wj_key_table.argtypes = [_p, _p, _p, _i64, _i64, _p]
    lib.wj_key_table.restype = None
    lib.wj_hash_f64.argtypes = [_p, _i64, _p]
    lib.wj_hash_f64.restype = None
    lib.wj_hash_combine.argtypes = [_p, _p, _i64]
    lib.wj_hash_combine.restype = None
    lib.wj_range_probe.argtypes = [_i64, _p, _p, _i64, _p, _p, _i64, _p, _i64, ctypes.POINTER(_p), ctypes.POINTER(_p)]
    lib.wj_range_probe.restype = _i64
    lib.wj_free.argtypes = [_p]
    lib.wj_free.restype = None
    return lib


_LIB = _load()


def _ptr(a: np.ndarray, dtype) -> int:
    """Address of a C-contiguous array of ``dtype`` (checked: a wrong layout would be silent corruption)."""
    if a.dtype != dtype or not a.flags.c_contiguous:
        raise TypeError(f"W-join kernel: expected a C-contiguous {np.dtype(dtype)} array, got {a.dtype}")
    return a.ctypes.data


def _sfx(dtype) -> tuple[str, type]:
    return ("i64", ctypes.c_int64) if np.dtype(dtype) == np.int64 else ("f64", ctypes.c_double)


BAND_OPS = {"<": 0, "<=": 1, ">": 2, ">=": 3}


class Band:
    """Band conjuncts checked inside a probe: pair (p, q) is kept when ``cand[k, q] OP_k
    par[k, p]`` for every k (float64, NULL as NaN; ``ops`` codes from ``BAND_OPS``)."""

    def __init__(self, ops: list[int], cand: list[np.ndarray], par: list[np.ndarray]):
        self.n = len(ops)
        self.ops = np.array(ops, np.int64)
        self.cand = np.ascontiguousarray(np.stack(cand), np.float64) if cand else np.empty((0, 0))
        self.par = np.ascontiguousarray(np.stack(par), np.float64) if par else np.empty((0, 0))

    def args(self, m: int) -> list:
        if self.n == 0:
            return [0, None, None, 0, None]
        assert self.par.shape[1] == m
        return [self.n, _ptr(self.ops, np.int64), _ptr(self.cand, np.float64), self.cand.shape[1],
                _ptr(self.par, np.float64)]


_NO_BAND = Band([], [], [])


def _pairs(total: int, out_p: ctypes.c_void_p, out_c: ctypes.c_void_p, what: str) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's malloc'd (parent, candidate) arrays as numpy copies; frees them."""
    try:
        if total < 0:
            raise MemoryError(f"W-join {what}: out of memory")
        return tuple(np.ctypeslib.as_array(ctypes.cast(x, ctypes.POINTER(_i64)), (total,)).copy()
                     if total else np.empty(0, np.int64) for x in (out_p, out_c))
    finally:
        _LIB.wj_free(out_p)
        _LIB.wj_free(out_c)


def range_probe(starts: np.ndarray, ends: np.ndarray, band: Band, limit: int = 2**62) -> tuple[np.ndarray, np.ndarray]:
    """``expand_ranges`` keeping only the pairs that pass ``band`` (stops after ``limit`` + 1 pairs)."""
    starts, ends = np.ascontiguousarray(starts, np.int64), np.ascontiguousarray(ends, np.int64)
    m = starts.shape[0]
    out_p, out_c = _p(), _p()
    nb, ops, cv, ncand, pv = band.args(m)
    total = _LIB.wj_range_probe(m, _ptr(starts, np.int64), _ptr(ends, np.int64), nb, ops, cv, ncand, pv, int(limit),
                                ctypes.byref(out_p), ctypes.byref(out_c))
    return _pairs(total, out_p, out_c, "range probe")


def purge_walk(arr_stream, arr_t, times_flat, offsets, base, ptr, latest, dist, slack, final_rank, drop_at,
               peak, peak_total, neg, pos) -> int:
    """Replay one chunk's arrivals; advance each stream's purge pointer after every arrival.

    ``times_flat[offsets[j]:offsets[j+1]]`` are stream j's buffered+chunk times (sorted);
    ``base[j]`` of them were buffered before the chunk, ``ptr[j]`` of those already purged.
    A record y of stream j is dropped once latest[k] - dist[j, k] > t(y) + slack for every
    k != j (the latest timestamp seen on S_k exceeds t(y) + D_jk). ``final_rank[k]`` is the
    arrival index of stream k's last record when it falls in this chunk (-1 otherwise); after
    it, latest[k] = pos. Updates ptr, latest, peak (per stream) in place; returns the new peak
    of the total. ``drop_at[offsets[j] + p]`` receives the arrival index after which record p of
    stream j was dropped (when ``drop_at`` is non-empty).
    """
    dt = latest.dtype
    sfx, ct = _sfx(dt)
    i8 = np.int64
    arr_stream, final_rank = np.ascontiguousarray(arr_stream, i8), np.ascontiguousarray(final_rank, i8)
    arr_t, times_flat = np.ascontiguousarray(arr_t, dt), np.ascontiguousarray(times_flat, dt)
    dist = np.ascontiguousarray(dist, dt)
    r = getattr(_LIB, f"wj_purge_walk_{sfx}")(
        arr_stream.shape[0], _ptr(arr_stream, i8), _ptr(arr_t, dt), _ptr(times_flat, dt), _ptr(offsets, i8),
        _ptr(base, i8), _ptr(ptr, i8), _ptr(latest, dt), _ptr(dist, dt), ptr.shape[0], ct(slack),
        _ptr(final_rank, i8), _ptr(drop_at, i8), drop_at.shape[0], _ptr(peak, i8), int(peak_total), ct(neg), ct(pos))
    if r < 0:
        raise MemoryError("W-join purge: out of memory")
    return r


def arrivals(times: list[np.ndarray], base: np.ndarray, with_pe: bool = True) -> tuple[np.ndarray, ...]:
    """A chunk's arrival order from each stream's chunk times (sorted; ``base[j]`` records of
    stream j buffered before them): by time, ties by stream number, then position, merged in
    one compiled pass. Returns (stream, position in the stream's buffer+chunk, time) per
    arrival; ``pe`` (n x arrivals): ``pe[j, a]`` = records of stream j that arrived before
    arrival a (buffered ones included; None unless ``with_pe``); ``rank``: the arrival index of
    every chunk record, stream after stream (``rank[off[j] + q]`` for stream j's record q, where
    ``off`` are the cumulative chunk lengths): each stream's arrivals in order."""
    n = len(times)
    dt = np.dtype(times[0].dtype) if n else np.dtype(np.int64)
    sfx, _ = _sfx(dt)
    i8 = np.int64
    t = np.ascontiguousarray(np.concatenate(times) if n else np.empty(0, dt), dt)
    off = np.zeros(n + 1, i8)
    off[1:] = np.cumsum([x.shape[0] for x in times])
    base = np.ascontiguousarray(base, i8)
    na = t.shape[0]
    arr_s, arr_pos, arr_t, rank = np.empty(na, i8), np.empty(na, i8), np.empty(na, dt), np.empty(na, i8)
    pe = np.empty((n, na), i8) if with_pe else None
    if getattr(_LIB, f"wj_arrivals_{sfx}")(n, _ptr(t, dt), _ptr(off, i8), _ptr(base, i8), na, _ptr(arr_s, i8),
                                            _ptr(arr_pos, i8), _ptr(arr_t, dt), None if pe is None else _ptr(pe, i8),
                                            _ptr(rank, i8)) < 0:
        raise MemoryError("W-join arrival order: out of memory")
    return arr_s, arr_pos, arr_t, pe, rank


def hash_f64(v: np.ndarray) -> np.ndarray:
    """``mix64`` of the float64 values' bits, NaN as 0.0 and -0.0 as 0.0, in one compiled pass."""
    v = np.ascontiguousarray(v, np.float64)
    out = np.empty(v.shape[0], np.uint64)
    _LIB.wj_hash_f64(_ptr(v, np.float64), v.shape[0], _ptr(out, np.uint64))
    return out


def hash_combine(h: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``h = mix64(h * 31 + x)`` (uint64, wrapping) in place, in one compiled pass; returns ``h``."""
    x = np.ascontiguousarray(x, np.uint64)
    if h.shape != x.shape:
        raise ValueError("hash_combine: h and x differ in length")
    _LIB.wj_hash_combine(_ptr(h, np.uint64), _ptr(x, np.uint64), h.shape[0])
    return h


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


class KeyIndex:
    """One stream's buffered+chunk records (time-ordered positions) grouped by a 64-bit key hash
    (``wj_key_index`` in C), built once per chunk and shared by every probe into the stream:
    each group holds its positions in time order, so a probe finds by binary search the newest
    record that arrived before its arriving record and walks back to the start of its period.
    Probes need no order."""

    def __init__(self, hashes: np.ndarray, times: np.ndarray):
        n = hashes.shape[0]
        hashes = np.ascontiguousarray(hashes, np.uint64)
        gstart = np.empty(n + 1, np.int64)
        self._pos = np.empty(n, np.int64)
        ng = _LIB.wj_key_index(_ptr(hashes, np.uint64), n, _ptr(gstart, np.int64), _ptr(self._pos, np.int64))
        if ng < 0:
            raise MemoryError("W-join key index: out of memory")
        self._gstart = gstart[:ng + 1].copy()
        cap = 16
        while cap < 2 * ng:
            cap *= 2
        self.mask = cap - 1
        self._slots = np.zeros((cap, 2), np.uint64)  # (hash, group + 1) per slot, 0: empty
        _LIB.wj_key_table(_ptr(hashes, np.uint64), _ptr(self._pos, np.int64), _ptr(self._gstart, np.int64), ng,
                          self.mask, _ptr(self._slots, np.uint64))
        self._gt = np.ascontiguousarray(times[self._pos])

    def probe(self, h: np.ndarray, lo: np.ndarray, hi: np.ndarray, ta: np.ndarray, strict: bool,
              limit: int = 2**62, band: Band | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(parent, candidate position) pairs: the records in probe p's group (hash ``h[p]``)
        with lo <= t <= hi that arrived before probe p's arriving record, whose time is ``ta[p]``:
        t < ta[p], or t == ta[p] unless ``strict`` (the probed stream comes after the arriving
        one in arrival order's ties). Grouped by probe in order, newest first. More than
        ``limit`` pairs: the walk stops after ``limit`` + 1 of them (memory bounded by the
        limit); the caller must not use that result, only its size. ``band``: conjuncts a pair
        must pass."""
        m = h.shape[0]
        if self._pos.shape[0] == 0 or m == 0:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        dt = self._gt.dtype
        f = getattr(_LIB, f"wj_key_probe_{_sfx(dt)[0]}")
        h = np.ascontiguousarray(h, np.uint64)
        lo, hi, ta = np.ascontiguousarray(lo, dt), np.ascontiguousarray(hi, dt), np.ascontiguousarray(ta, dt)
        fixed = (self.mask, _ptr(self._slots, np.uint64), _ptr(self._gstart, np.int64), _ptr(self._pos, np.int64),
                 _ptr(self._gt, dt), m, _ptr(h, np.uint64), _ptr(lo, dt), _ptr(hi, dt), _ptr(ta, dt), int(strict),
                 int(limit), *(band or _NO_BAND).args(m))
        cap = 2 * m + 16
        out_p, out_c = np.empty(cap, np.int64), np.empty(cap, np.int64)
        total, p = _i64(0), 0
        while True:
            p = f(*fixed, p, cap, _ptr(out_p, np.int64), _ptr(out_c, np.int64), ctypes.byref(total))
            if p >= m:
                break
            cap *= 2  # probe p's pairs did not fit: grow, go on from it
            out_p, out_c = np.resize(out_p, cap), np.resize(out_c, cap)
        k = total.value
        if 2 * k < cap:  # not held at twice the size
            return out_p[:k].copy(), out_c[:k].copy()
        return out_p[:k], out_c[:k]
