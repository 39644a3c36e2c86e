"""Compiled kernels shared by the merge engines (numba, ``nogil``).

Keys are ``float64`` arrays of shape ``(n, d)`` (C order), one row per record, compared
lexicographically. ``eps`` is a ``float64`` array of length ``d``. Row ids are ``int64``.

Tolerant comparison (spec section 1): at the first key j with ``x_j < y_j - eps_j`` the result
is BEFORE (-1); with ``x_j > y_j + eps_j`` AFTER (+1); if no key decides, MATCH (0).

The sweep (spec section 3, step 3) is written once here and used by CGM, RTM and kappa_max.
"""

from __future__ import annotations

import numpy as np
from numba import njit

BEFORE = -1
MATCH = 0
AFTER = 1


@njit(cache=True, nogil=True, inline="always")
def tol_cmp(xk, i, yk, j, eps):
    """Tolerant comparison of xk[i] with yk[j]: -1 BEFORE, 0 MATCH, +1 AFTER."""
    d = xk.shape[1]
    for c in range(d):
        x = xk[i, c]
        y = yk[j, c]
        if x < y - eps[c]:
            return -1
        if x > y + eps[c]:
            return 1
    return 0


@njit(cache=True, nogil=True, inline="always")
def lex_le(xk, i, xr, yk, j, yr):
    """Exact lexicographic ``(key, row) <=``: x sorts before or equal to y."""
    d = xk.shape[1]
    for c in range(d):
        x = xk[i, c]
        y = yk[j, c]
        if x < y:
            return True
        if x > y:
            return False
    return xr[i] <= yr[j]


@njit(cache=True, nogil=True, inline="always")
def _le_idx(keys, rows, p, q):
    """Exact ``(key, row, index) <=`` of records p and q: the total order of a stable sort."""
    d = keys.shape[1]
    for c in range(d):
        x = keys[p, c]
        y = keys[q, c]
        if x < y:
            return True
        if x > y:
            return False
    if rows[p] != rows[q]:
        return rows[p] < rows[q]
    return p <= q


@njit(cache=True, nogil=True)
def _merge_sort(keys, rows, idx):
    """Sort the index array ``idx`` by ``_le_idx`` (insertion-sorted runs of 16, bottom-up merges).

    Returns the sorted array (``idx`` itself or a scratch copy).
    """
    n = idx.shape[0]
    run = 16
    for s in range(0, n, run):
        e = min(s + run, n)
        for t in range(s + 1, e):
            v = idx[t]
            u = t - 1
            while u >= s and not _le_idx(keys, rows, idx[u], v):
                idx[u + 1] = idx[u]
                u -= 1
            idx[u + 1] = v
    tmp = np.empty_like(idx)
    width = run
    src = idx
    dst = tmp
    while width < n:
        for s in range(0, n, 2 * width):
            m = min(s + width, n)
            e = min(s + 2 * width, n)
            if m >= e or _le_idx(keys, rows, src[m - 1], src[m]):
                dst[s:e] = src[s:e]  # runs already in order (common for partially sorted data)
                continue
            p = s
            q = m
            o = s
            while p < m and q < e:
                if _le_idx(keys, rows, src[p], src[q]):
                    dst[o] = src[p]
                    p += 1
                else:
                    dst[o] = src[q]
                    q += 1
                o += 1
            while p < m:
                dst[o] = src[p]
                p += 1
                o += 1
            while q < e:
                dst[o] = src[q]
                q += 1
                o += 1
        src, dst = dst, src
        width *= 2
    return src


@njit(cache=True, nogil=True)
def argsort_keys(keys, rows):
    """Stable order of records by exact key, ties by row id (= arrival order).

    Adaptive for partially sorted input, O(n log n) worst case, O(n) scratch: one pass splits
    the records into an ordered subsequence and the *misfits* (for each adjacent inversion met,
    both records: at most twice the fewest records whose removal leaves the rest sorted); the
    misfits are merge-sorted and merged back. Equal (key, row) keep their input order, so the
    result is exactly that of a stable sort.
    """
    n = keys.shape[0]
    idx = np.arange(n)
    if n < 2:
        return idx
    # Fast path: already sorted (the common case for partially sorted streams' chunks).
    ordered = True
    for t in range(1, n):
        if not lex_le(keys, t - 1, rows, keys, t, rows):
            ordered = False
            break
    if ordered:
        return idx
    kept = np.empty(n, np.int64)
    mis = np.empty(n, np.int64)
    nk = 0
    nm = 0
    for t in range(n):
        if nk == 0 or _le_idx(keys, rows, kept[nk - 1], t):
            kept[nk] = t
            nk += 1
        else:
            nk -= 1
            mis[nm] = kept[nk]
            mis[nm + 1] = t
            nm += 2
    ms = _merge_sort(keys, rows, mis[:nm])
    p = 0
    q = 0
    o = 0
    while p < nk and q < nm:
        if _le_idx(keys, rows, kept[p], ms[q]):
            idx[o] = kept[p]
            p += 1
        else:
            idx[o] = ms[q]
            q += 1
        o += 1
    while p < nk:
        idx[o] = kept[p]
        p += 1
        o += 1
    while q < nm:
        idx[o] = ms[q]
        q += 1
        o += 1
    return idx


@njit(cache=True, nogil=True)
def sweep(ak, na, bk, nb, eps, a_matched, b_matched, a_pos, b_pos):
    """One sweep over sorted windows ``ak[:na]`` and ``bk[:nb]`` (spec section 3, step 3).

    Marks matched positions in ``a_matched``/``b_matched`` (bool, cleared by the caller) and
    writes the pair positions into ``a_pos``/``b_pos``. Returns ``(m, i, j)``: pairs emitted
    and final cursors (``i == na`` means window A is behind, ``j == nb`` window B).
    """
    i = 0
    j = 0
    m = 0
    while i < na and j < nb:
        c = tol_cmp(ak, i, bk, j, eps)
        if c < 0:
            i += 1
        elif c > 0:
            j += 1
        else:
            a_matched[i] = True
            b_matched[j] = True
            a_pos[m] = i
            b_pos[m] = j
            m += 1
            i = _skip_matching(ak, i, na, eps)
            j = _skip_matching(bk, j, nb, eps)
    return m, i, j


@njit(cache=True, nogil=True)
def _skip_matching(wk, i, n, eps):
    """First position after ``i`` whose key does not MATCH ``wk[i]`` (``tol_cmp(wk, t, wk, i) != 0``)."""
    d = wk.shape[1]
    t = i + 1
    while t < n:
        for c in range(d):
            x = wk[t, c]
            y = wk[i, c]
            if x < y - eps[c] or x > y + eps[c]:
                return t
        t += 1
    return t


@njit(cache=True, nogil=True)
def _merge_back(wk, wr, n, newk, newr, order):
    """Stable in-place merge of the new records (sorted by ``order``) into sorted ``wk[:n]``.

    The window has room for them at its end; merging from the back never overwrites a record
    not yet moved, and records of the window that sort before every new record are not
    touched at all (the common case for partially sorted streams). Returns the new size.
    """
    d = wk.shape[1]
    nn = order.shape[0]
    p = n - 1
    q = nn - 1
    o = n + nn - 1
    while q >= 0:
        s = order[q]
        if p >= 0 and not lex_le(wk, p, wr, newk, s, newr):
            for c in range(d):
                wk[o, c] = wk[p, c]
            wr[o] = wr[p]
            p -= 1
        else:
            for c in range(d):
                wk[o, c] = newk[s, c]
            wr[o] = newr[s]
            q -= 1
        o -= 1
    return n + nn


@njit(cache=True, nogil=True)
def _compact(wk, wr, n, matched, evict, ev_out, ev_n):
    """Remove matched records, then evict the first ``evict`` remaining ones into ``ev_out``."""
    o = 0
    evicted = 0
    for t in range(n):
        if matched[t]:
            continue
        if evicted < evict:
            ev_out[ev_n + evicted] = wr[t]
            evicted += 1
            continue
        if o != t:
            for c in range(wk.shape[1]):
                wk[o, c] = wk[t, c]
            wr[o] = wr[t]
        o += 1
    return o, evicted


@njit(cache=True, nogil=True)
def cgm_passes(
    st,  # int64[8]: na, nb, a_pos(pending), b_pos(pending), done, passes, pairs_n, ev_a_n / ev_b_n in st2
    wak, war, wbk, wbr,  # windows (capacity N): keys (N, d) float64, rows (N,) int64
    pak, par, a_exhausted,  # pending A records (arrival order) and whether A has no more
    pbk, pbr, b_exhausted,
    eps, window_size, inc_a, inc_b,
    pairs_a, pairs_b,  # output pair row ids (capacity >= 2N)
    ev_a, ev_b,  # output evicted row ids (capacity >= 2N)
    counts,  # int64[4]: pairs_n, ev_a_n, ev_b_n, passes_logged
    pass_m, pass_ret_a,  # per-pass log: pairs, A records retired
    scratch_ma, scratch_mb, scratch_pa, scratch_pb,
):
    """Run CGM passes (spec section 3) until input runs short, output fills, or the merge ends.

    State ``st``: [0] |window A|, [1] |window B|, [2] next pending A, [3] next pending B,
    [4] done flag (1 when the merge has ended). Windows are kept sorted between calls.
    Returns a status: 0 needs more A input, 1 needs more B input, 2 output buffers full,
    3 merge ended.
    """
    n_cap = window_size
    while True:
        na = st[0]
        nb = st[1]
        # Step 5 / step 1: top up both windows to N records (new records in arrival order).
        need_a = n_cap - na
        avail_a = pak.shape[0] - st[2]
        if need_a > 0 and avail_a < need_a and not a_exhausted:
            return 0
        need_b = n_cap - nb
        avail_b = pbk.shape[0] - st[3]
        if need_b > 0 and avail_b < need_b and not b_exhausted:
            return 1
        # Room for one more pass in every output buffer.
        if (counts[0] + n_cap > pairs_a.shape[0] or counts[1] + n_cap > ev_a.shape[0]
                or counts[2] + n_cap > ev_b.shape[0] or counts[3] >= pass_m.shape[0]):
            return 2
        take_a = min(need_a, avail_a)
        if take_a > 0:
            s0 = st[2]
            nk = pak[s0:s0 + take_a]
            nr = par[s0:s0 + take_a]
            order = argsort_keys(nk, nr)
            na = _merge_back(wak, war, na, nk, nr, order)
            st[2] = s0 + take_a
        take_b = min(need_b, avail_b)
        if take_b > 0:
            s0 = st[3]
            nk = pbk[s0:s0 + take_b]
            nr = pbr[s0:s0 + take_b]
            order = argsort_keys(nk, nr)
            nb = _merge_back(wbk, wbr, nb, nk, nr, order)
            st[3] = s0 + take_b
        st[0] = na
        st[1] = nb
        # Step 6: stop when a window is empty (its stream is then exhausted).
        if na == 0 or nb == 0:
            st[4] = 1
            return 3
        # Step 3: sweep.
        scratch_ma[:na] = False
        scratch_mb[:nb] = False
        m, i, j = sweep(wak, na, wbk, nb, eps, scratch_ma, scratch_mb, scratch_pa, scratch_pb)
        base = counts[0]
        for t in range(m):
            pairs_a[base + t] = war[scratch_pa[t]]
            pairs_b[base + t] = wbr[scratch_pb[t]]
        counts[0] = base + m
        # Step 4: remove matched records; evict max(0, K_W - m) from each behind window.
        evict_a = max(0, inc_a - m) if i >= na else 0
        evict_b = max(0, inc_b - m) if j >= nb else 0
        na2, ea = _compact(wak, war, na, scratch_ma, evict_a, ev_a, counts[1])
        nb2, eb = _compact(wbk, wbr, nb, scratch_mb, evict_b, ev_b, counts[2])
        counts[1] += ea
        counts[2] += eb
        st[0] = na2
        st[1] = nb2
        st[5] += 1
        pass_m[counts[3]] = m
        pass_ret_a[counts[3]] = m + ea
        counts[3] += 1


@njit(cache=True, nogil=True)
def sweep_until_dry(keys_a, rows_a, keys_b, rows_b, eps, pairs_a, pairs_b):
    """kappa_max (spec section 4): repeat the sweep over whole sorted streams until dry.

    Inputs must be sorted by exact key (ties by row). Returns the number of pairs written.
    """
    na = keys_a.shape[0]
    nb = keys_b.shape[0]
    ak = keys_a.copy()
    ar = rows_a.copy()
    bk = keys_b.copy()
    br = rows_b.copy()
    ma = np.zeros(na, dtype=np.bool_)
    mb = np.zeros(nb, dtype=np.bool_)
    pa = np.empty(min(na, nb) + 1, dtype=np.int64)
    pb = np.empty(min(na, nb) + 1, dtype=np.int64)
    total = 0
    while na > 0 and nb > 0:
        ma[:na] = False
        mb[:nb] = False
        m, i, j = sweep(ak, na, bk, nb, eps, ma, mb, pa, pb)
        if m == 0:
            break
        for t in range(m):
            pairs_a[total + t] = ar[pa[t]]
            pairs_b[total + t] = br[pb[t]]
        total += m
        o = 0
        for t in range(na):
            if not ma[t]:
                ak[o, :] = ak[t, :]
                ar[o] = ar[t]
                o += 1
        na = o
        o = 0
        for t in range(nb):
            if not mb[t]:
                bk[o, :] = bk[t, :]
                br[o] = br[t]
                o += 1
        nb = o
    return total
