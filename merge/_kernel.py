"""The compiled kernels of the merge engines (C, ``merge/_ckernel.c``), called through ctypes.

Keys are ``float64`` arrays of shape ``(n, d)`` (C order), one row per record, compared
lexicographically. ``eps`` is a ``float64`` array of length ``d``. Row ids are ``int64``.

Tolerant comparison (docs/semantics.md section 1): at the first key j with ``x_j < y_j - eps_j`` the result
is BEFORE (-1); with ``x_j > y_j + eps_j`` AFTER (+1); if no key decides, MATCH (0).

The sweep (docs/semantics.md section 3, step 3) is written once, in C, and used by CGM, RTM and kappa_max.
Plain C loaded with ctypes rather than a JIT: no compiler at run time, about 1 ms to load
(a JIT's import and cache load cost ~0.4 s per process, more than a 750,000-record merge), and
ctypes releases the GIL during every call, so reader and writer threads keep working.
"""

from __future__ import annotations

import ctypes

import numpy as np

from smerge.merge._cext import open_extension

BEFORE = -1
MATCH = 0
AFTER = 1

_i64p = ctypes.POINTER(ctypes.c_int64)
_f64p = ctypes.POINTER(ctypes.c_double)
_u8p = ctypes.POINTER(ctypes.c_uint8)
_i64 = ctypes.c_int64


def _load() -> ctypes.CDLL:
    lib = open_extension("smerge.merge._ckernel", "C kernel")
    lib.smerge_argsort.argtypes = [_f64p, _i64p, _i64, _i64, _i64p, _i64p]
    lib.smerge_argsort.restype = None
    lib.smerge_sweep.argtypes = [_f64p, _i64, _f64p, _i64, _i64, _f64p, _u8p, _u8p, _i64p, _i64p, _i64p]
    lib.smerge_sweep.restype = _i64
    lib.smerge_cgm_passes.argtypes = (
        [_i64p, _f64p, _i64p, _f64p, _i64p, _i64p, _i64, _i64p, _i64, ctypes.c_int, _i64p, _i64, _i64p, _i64,
         ctypes.c_int, _i64, _f64p, _i64, _i64, _i64, _i64p, _i64p, _i64, _i64p, _i64p, _i64, _i64p, _i64p, _i64p,
         _i64, _u8p, _u8p, _i64p, _i64p, _i64p])
    lib.smerge_cgm_passes.restype = ctypes.c_int
    lib.smerge_sweep_until_dry.argtypes = [_f64p, _i64p, _i64, _f64p, _i64p, _i64, _i64, _f64p, _i64p, _i64p,
                                           _u8p, _u8p, _i64p, _i64p]
    lib.smerge_sweep_until_dry.restype = _i64
    lib.smerge_gather_segments.argtypes = [_i64, _i64p, _i64p, _i64, _i64p, _i64, ctypes.c_void_p]
    lib.smerge_gather_segments.restype = None
    return lib


_lib = _load()


def _ptr(a: np.ndarray, kind):
    """ctypes pointer to a C-contiguous array (checked: a wrong layout would be silent corruption)."""
    if not a.flags["C_CONTIGUOUS"]:
        raise ValueError("kernel arrays must be C-contiguous")
    return a.ctypes.data_as(kind)


def _keys(a: np.ndarray) -> np.ndarray:
    if a.dtype != np.float64 or a.ndim != 2 or not a.flags["C_CONTIGUOUS"]:
        a = np.ascontiguousarray(a, dtype=np.float64).reshape(a.shape[0], -1)
    return a


def _rows(a: np.ndarray) -> np.ndarray:
    return a if a.dtype == np.int64 and a.flags["C_CONTIGUOUS"] else np.ascontiguousarray(a, dtype=np.int64)


def _eps(eps) -> np.ndarray:
    return np.ascontiguousarray(eps, dtype=np.float64)


def argsort_keys(keys: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Stable order of records by exact key, ties by row id (= arrival order).

    Adaptive for partially sorted input (the ordered subsequence is kept, only the misfits are
    sorted and merged back), O(n log n) worst case, O(n) scratch.
    """
    keys, rows = _keys(keys), _rows(rows)
    n = keys.shape[0]
    idx = np.empty(n, np.int64)
    scratch = np.empty(3 * max(n, 1), np.int64)
    _lib.smerge_argsort(_ptr(keys, _f64p), _ptr(rows, _i64p), n, keys.shape[1], _ptr(idx, _i64p),
                        _ptr(scratch, _i64p))
    return idx


def sweep(ak, na, bk, nb, eps, a_matched, b_matched, a_pos, b_pos) -> tuple[int, int, int]:
    """One sweep over sorted windows ``ak[:na]`` and ``bk[:nb]`` (docs/semantics.md section 3, step 3).

    Marks matched positions in ``a_matched``/``b_matched`` (bool, cleared by the caller) and
    writes the pair positions into ``a_pos``/``b_pos``. Returns ``(m, i, j)``: pairs emitted
    and final cursors (``i == na`` means window A is behind, ``j == nb`` window B).
    """
    ak, bk = _keys(ak), _keys(bk)
    ij = np.zeros(2, np.int64)
    m = _lib.smerge_sweep(_ptr(ak, _f64p), int(na), _ptr(bk, _f64p), int(nb), ak.shape[1], _ptr(_eps(eps), _f64p),
                          _ptr(a_matched.view(np.uint8), _u8p), _ptr(b_matched.view(np.uint8), _u8p),
                          _ptr(a_pos, _i64p), _ptr(b_pos, _i64p), _ptr(ij, _i64p))
    return int(m), int(ij[0]), int(ij[1])


def cgm_passes(st, wak, war, wbk, wbr, pak, par, a_exhausted, pbk, pbr, b_exhausted, eps, window_size,
               inc_a, inc_b, pairs_a, pairs_b, ev_a, ev_b, counts, pass_m, pass_ret_a,
               scratch_ma, scratch_mb, scratch_pa, scratch_pb, work=None) -> int:
    """Run CGM passes (docs/semantics.md section 3) until input runs short, output fills, or the merge ends.

    State ``st`` (16 int64, zeros at the start): [0] |window A|, [1] |window B|, [2] next
    pending A, [3] next pending B, [4] done flag, [5] passes, [6] A records retired since [7] was
    set, [7] report-window stop: when > 0, the A records still to retire before the open report
    window closes (0: no stop), [8] first position of window A in ``wak``/``war``, [9] of window
    B, [10]-[13] the kernel's record of the last sweep (it resumes the next one where the
    windows did not change; kept in ``work``), [14] the address of the ``work`` it is kept in. The window buffers and the marks hold 2N records: window A is
    ``war[st[8] : st[8] + st[0]]``. ``counts``: pairs, evicted A, evicted B, passes logged.
    Windows are kept sorted between calls. Returns 0 needs more A input, 1 needs more B input
    (that side's pending records have then joined its window: none is left over), 2 output
    buffers full, 3 merge ended, 4 report window closed (``st[6] >= st[7] > 0``, after the pass
    that closed it). ``work``: (6 + d)N + 2 int64, kept between calls (allocated when not given).
    The pending keys ``pak``, ``pbk``: an (n, d) array or d columns of n (``pending_keys``).
    """
    d = wak.shape[1]
    (ca, sa, na, pak), (cb, sb, nb, pbk) = pending_keys(pak, d), pending_keys(pbk, d)
    par, pbr = _rows(par), _rows(pbr)
    fresh = work is None
    if fresh:
        work = np.empty((6 + d) * window_size + 2, np.int64)
    # no path to resume in a buffer allocated here (it may lie where the last call's was freed)
    # or in another call's buffer
    if fresh or st[14] != work.ctypes.data:
        st[10], st[14] = 0, work.ctypes.data
    _check_buffers(st, wak, wbk, scratch_ma, scratch_mb, work, window_size)
    return _lib.smerge_cgm_passes(
        _ptr(st, _i64p), _ptr(wak, _f64p), _ptr(war, _i64p), _ptr(wbk, _f64p), _ptr(wbr, _i64p),
        _ptr(ca, _i64p), sa, _ptr(par, _i64p), na, int(bool(a_exhausted)),
        _ptr(cb, _i64p), sb, _ptr(pbr, _i64p), nb, int(bool(b_exhausted)),
        wak.shape[1], _ptr(_eps(eps), _f64p), int(window_size), int(inc_a), int(inc_b),
        _ptr(pairs_a, _i64p), _ptr(pairs_b, _i64p), min(pairs_a.shape[0], pairs_b.shape[0]),
        _ptr(ev_a, _i64p), _ptr(ev_b, _i64p), min(ev_a.shape[0], ev_b.shape[0]),
        _ptr(counts, _i64p), _ptr(pass_m, _i64p), _ptr(pass_ret_a, _i64p), min(pass_m.shape[0], pass_ret_a.shape[0]),
        _ptr(scratch_ma.view(np.uint8), _u8p), _ptr(scratch_mb.view(np.uint8), _u8p),
        _ptr(scratch_pa, _i64p), _ptr(scratch_pb, _i64p), _ptr(work, _i64p))


_vp, _int = ctypes.c_void_p, ctypes.c_int
_cgm_passes_addr = _lib["smerge_cgm_passes"]  # a second handle on the same function, taking addresses
_cgm_passes_addr.argtypes = ([_vp] * 5 + [_vp, _i64, _vp, _i64, _int, _vp, _i64, _vp, _i64, _int, _i64, _vp, _i64,
                              _i64, _i64, _vp, _vp, _i64, _vp, _vp, _i64, _vp, _vp, _vp, _i64, _vp, _vp, _vp, _vp,
                              _vp])
_cgm_passes_addr.restype = _int


def _addr(a: np.ndarray) -> int:
    if not a.flags["C_CONTIGUOUS"]:
        raise ValueError("kernel arrays must be C-contiguous")
    return a.ctypes.data


def pending_keys(keys, d: int) -> tuple[np.ndarray, int, int, object]:
    """Pending keys as the kernel reads them: (the addresses of the d columns' first values,
    the step between records in values, the number of records, the arrays read, to be kept
    alive during the call). ``keys``: an (n, d) array, or a sequence of d float64 columns of n
    with one step (``merge.keys.key_columns``: no copy)."""
    if isinstance(keys, np.ndarray):
        keys = _keys(keys)
        if keys.shape[1] != d:
            raise ValueError("pending keys must have d columns")
        base = keys.ctypes.data
        return np.array([base + 8 * c for c in range(d)], np.int64), d, keys.shape[0], keys
    cols = list(keys)
    if len(cols) != d:
        raise ValueError("pending keys must have d columns")
    n = cols[0].shape[0]
    step = cols[0].strides[0] if n > 1 else 8
    if any(c.dtype != np.float64 or c.ndim != 1 or c.shape[0] != n or (n > 1 and c.strides[0] != step)
           for c in cols) or step % 8 or step <= 0:
        return pending_keys(np.column_stack(cols), d)  # columns of other steps: as a matrix
    return np.array([c.ctypes.data for c in cols], np.int64), step // 8, n, cols


def _check_buffers(st, wak, wbk, ma, mb, work, window_size) -> None:
    """The sizes ``cgm_passes`` needs (a smaller buffer would be written past its end)."""
    if st.shape[0] < 16 or work.shape[0] < (6 + wak.shape[1]) * window_size + 2:
        raise ValueError("st must hold 16 int64 and work (6 + d)N + 2")
    if min(wak.shape[0], wbk.shape[0], ma.shape[0], mb.shape[0]) < 2 * window_size:
        raise ValueError("window buffers and marks must hold 2N records")


class CGMPasses:
    """``cgm_passes`` bound to the engine's fixed buffers (windows, state, output, scratch).

    Their addresses are taken once (the caller keeps the arrays alive and never reallocates
    them); a call passes only the pending records and the K's: ~10 us instead of ~150 us of
    argument conversion, which matters when the caller returns to Python after every report
    window (adaptive K). Same semantics and return values as ``cgm_passes``.
    """

    def __init__(self, st, wak, war, wbk, wbr, eps, window_size, pairs_a, pairs_b, ev_a, ev_b, counts, pass_m,
                 pass_ret_a, scratch_ma, scratch_mb, scratch_pa, scratch_pb, work) -> None:
        eps = _eps(eps)
        self._keep = (st, wak, war, wbk, wbr, eps, pairs_a, pairs_b, ev_a, ev_b, counts, pass_m, pass_ret_a,
                      scratch_ma, scratch_mb, scratch_pa, scratch_pb, work)
        for a in (wak, wbk):
            if a.dtype != np.float64 or a.ndim != 2:
                raise ValueError("window keys must be float64 of shape (N, d)")
        _check_buffers(st, wak, wbk, scratch_ma, scratch_mb, work, window_size)
        self.d = wak.shape[1]
        self._head = tuple(_addr(a) for a in (st, wak, war, wbk, wbr))
        self._mid = (self.d, _addr(eps), int(window_size))
        self._tail = (_addr(pairs_a), _addr(pairs_b), min(pairs_a.shape[0], pairs_b.shape[0]),
                      _addr(ev_a), _addr(ev_b), min(ev_a.shape[0], ev_b.shape[0]),
                      _addr(counts), _addr(pass_m), _addr(pass_ret_a), min(pass_m.shape[0], pass_ret_a.shape[0]),
                      _addr(scratch_ma.view(np.uint8)), _addr(scratch_mb.view(np.uint8)), _addr(scratch_pa),
                      _addr(scratch_pb), _addr(work))

    def __call__(self, pak, par, a_exhausted, pbk, pbr, b_exhausted, inc_a: int, inc_b: int) -> int:
        """``pak``, ``pbk``: an (n, d) array or d columns (``pending_keys``); they and the row
        ids stay alive and unchanged during the call."""
        (ca, sa, na, pak), (cb, sb, nb, pbk) = pending_keys(pak, self.d), pending_keys(pbk, self.d)
        par, pbr = _rows(par), _rows(pbr)
        return _cgm_passes_addr(*self._head, ca.ctypes.data, sa, _addr(par), na, int(bool(a_exhausted)),
                                cb.ctypes.data, sb, _addr(pbr), nb, int(bool(b_exhausted)), *self._mid,
                                int(inc_a), int(inc_b), *self._tail)


def sweep_until_dry(keys_a, rows_a, keys_b, rows_b, eps, pairs_a, pairs_b) -> int:
    """kappa_max (docs/semantics.md section 4): repeat the sweep over whole sorted streams until dry.

    Inputs must be sorted by exact key (ties by row); they are not modified. Returns the number
    of pairs written to ``pairs_a``/``pairs_b``.
    """
    ak, bk = _keys(keys_a).copy(), _keys(keys_b).copy()
    ar, br = _rows(rows_a).copy(), _rows(rows_b).copy()
    na, nb = ak.shape[0], bk.shape[0]
    am, bm = np.empty(max(na, 1), np.uint8), np.empty(max(nb, 1), np.uint8)
    cap = min(na, nb) + 1
    spa, spb = np.empty(cap, np.int64), np.empty(cap, np.int64)
    return int(_lib.smerge_sweep_until_dry(
        _ptr(ak, _f64p), _ptr(ar, _i64p), na, _ptr(bk, _f64p), _ptr(br, _i64p), nb, ak.shape[1],
        _ptr(_eps(eps), _f64p), _ptr(pairs_a, _i64p), _ptr(pairs_b, _i64p), _ptr(am, _u8p), _ptr(bm, _u8p),
        _ptr(spa, _i64p), _ptr(spb, _i64p)))


def gather_segments(arrays: list[np.ndarray], pos: np.ndarray, out: np.ndarray) -> None:
    """``out[i] = concatenate(arrays)[pos[i]]`` without concatenating: one-dimensional arrays
    of one fixed-width dtype (1, 2, 4 or 8 bytes) that stay alive during the call; every
    position must lie inside (the caller checks)."""
    itemsize = out.dtype.itemsize
    if itemsize not in (1, 2, 4, 8) or any(a.dtype.itemsize != itemsize or a.ndim != 1 for a in arrays):
        raise ValueError("gather_segments takes arrays of one 1-, 2-, 4- or 8-byte dtype")
    arrays = [np.ascontiguousarray(a) for a in arrays]
    bases = np.array([a.ctypes.data for a in arrays], np.int64)
    starts = np.zeros(len(arrays) + 1, np.int64)
    np.cumsum([a.shape[0] for a in arrays], out=starts[1:])
    pos = _rows(pos)
    if not out.flags["C_CONTIGUOUS"] or out.shape[0] < pos.shape[0]:
        raise ValueError("out must be contiguous and hold every position")
    _lib.smerge_gather_segments(len(arrays), _ptr(bases, _i64p), _ptr(starts, _i64p), itemsize, _ptr(pos, _i64p),
                                pos.shape[0], out.ctypes.data)
