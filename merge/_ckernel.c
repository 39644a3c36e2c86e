/* Compiled kernels of the merge engines (docs/semantics.md sections 1, 3, 4).
 *
 * Plain C over numpy buffers, called through ctypes from merge/_kernel.py (ctypes releases the
 * GIL for the duration of a call). Keys are float64 arrays of shape (n, d) in C order, one row
 * per record, compared lexicographically; row ids are int64; eps has one value per key.
 *
 * Tolerant comparison: at the first key j with x_j < y_j - eps_j the result is BEFORE (-1),
 * with x_j > y_j + eps_j AFTER (+1); if no key decides, MATCH (0).
 *
 * The module also defines an (empty) Python extension module so that setuptools builds and
 * installs it like any other extension and its file can be located by import machinery.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int64_t i64;

/* Forced inlining: the CGM passes are instantiated for d = 1, 2, 3 (see smerge_cgm_passes), so
 * that the key loops and record copies are unrolled for a constant d. */
#define INL static inline __attribute__((always_inline))

INL int tol_cmp(const double *x, const double *y, const double *eps, i64 d) {
    for (i64 c = 0; c < d; c++) {
        if (x[c] < y[c] - eps[c]) return -1;
        if (x[c] > y[c] + eps[c]) return 1;
    }
    return 0;
}

/* Exact (key, row) <=: x sorts before or equal to y. */
INL int lex_le(const double *x, i64 xr, const double *y, i64 yr, i64 d) {
    for (i64 c = 0; c < d; c++) {
        if (x[c] < y[c]) return 1;
        if (x[c] > y[c]) return 0;
    }
    return xr <= yr;
}

/* Exact (key, row, index) <= of records p and q: the total order of a stable sort. */
INL int le_idx(const double *keys, const i64 *rows, i64 d, i64 p, i64 q) {
    const double *x = keys + p * d, *y = keys + q * d;
    for (i64 c = 0; c < d; c++) {
        if (x[c] < y[c]) return 1;
        if (x[c] > y[c]) return 0;
    }
    if (rows[p] != rows[q]) return rows[p] < rows[q];
    return p <= q;
}

/* Sort idx[0..n) by le_idx: insertion-sorted runs of 16, then bottom-up merges (tmp: n).
 * Returns the buffer holding the result (idx or tmp). */
INL i64 *merge_sort(const double *keys, const i64 *rows, i64 d, i64 *idx, i64 *tmp, i64 n) {
    const i64 run = 16;
    for (i64 s = 0; s < n; s += run) {
        i64 e = s + run < n ? s + run : n;
        for (i64 t = s + 1; t < e; t++) {
            i64 v = idx[t], u = t - 1;
            while (u >= s && !le_idx(keys, rows, d, idx[u], v)) { idx[u + 1] = idx[u]; u--; }
            idx[u + 1] = v;
        }
    }
    i64 *src = idx, *dst = tmp;
    for (i64 width = run; width < n; width *= 2) {
        for (i64 s = 0; s < n; s += 2 * width) {
            i64 m = s + width < n ? s + width : n;
            i64 e = s + 2 * width < n ? s + 2 * width : n;
            if (m >= e || le_idx(keys, rows, d, src[m - 1], src[m])) {
                memcpy(dst + s, src + s, (size_t)(e - s) * sizeof(i64));
                continue;
            }
            i64 p = s, q = m, o = s;
            while (p < m && q < e) dst[o++] = le_idx(keys, rows, d, src[p], src[q]) ? src[p++] : src[q++];
            while (p < m) dst[o++] = src[p++];
            while (q < e) dst[o++] = src[q++];
        }
        i64 *t = src; src = dst; dst = t;
    }
    return src;
}

/* Stable order of records by exact key, ties by row id, into idx (n).
 * Adaptive for partially sorted input: one pass splits the records into an ordered
 * subsequence and the misfits (for each adjacent inversion met, both records); the misfits
 * are merge-sorted and merged back. scratch: 3n int64. */
INL void argsort_impl(const double *keys, const i64 *rows, i64 n, i64 d, i64 *idx, i64 *scratch) {
    for (i64 t = 0; t < n; t++) idx[t] = t;
    if (n < 2) return;
    int ordered = 1;
    for (i64 t = 1; t < n; t++)
        if (!lex_le(keys + (t - 1) * d, rows[t - 1], keys + t * d, rows[t], d)) { ordered = 0; break; }
    if (ordered) return;
    i64 *kept = scratch, *mis = scratch + n, *tmp = scratch + 2 * n;
    i64 nk = 0, nm = 0;
    for (i64 t = 0; t < n; t++) {
        if (nk == 0 || le_idx(keys, rows, d, kept[nk - 1], t)) {
            kept[nk++] = t;
        } else {
            nk--;
            mis[nm++] = kept[nk];
            mis[nm++] = t;
        }
    }
    i64 *ms = merge_sort(keys, rows, d, mis, tmp, nm);
    i64 p = 0, q = 0, o = 0;
    while (p < nk && q < nm) idx[o++] = le_idx(keys, rows, d, kept[p], ms[q]) ? kept[p++] : ms[q++];
    while (p < nk) idx[o++] = kept[p++];
    while (q < nm) idx[o++] = ms[q++];
}

void smerge_argsort(const double *keys, const i64 *rows, i64 n, i64 d, i64 *idx, i64 *scratch) {
    argsort_impl(keys, rows, n, d, idx, scratch);
}

/* First position after i whose key does not MATCH wk[i]. */
INL i64 skip_matching(const double *wk, i64 i, i64 n, i64 d, const double *eps) {
    const double *y = wk + i * d;
    for (i64 t = i + 1; t < n; t++) {
        const double *x = wk + t * d;
        for (i64 c = 0; c < d; c++)
            if (x[c] < y[c] - eps[c] || x[c] > y[c] + eps[c]) return t;
    }
    return n;
}

/* A MATCH at (*i, *j): mark both, log the pair, move both cursors past the records that MATCH
 * the matched ones (docs/semantics.md section 3, step 3). */
INL void match_at(const double *ak, i64 *i, i64 na, const double *bk, i64 *j, i64 nb, i64 d, const double *eps,
                  uint8_t *am, uint8_t *bm, i64 *apos, i64 *bpos, i64 *m) {
    am[*i] = 1; bm[*j] = 1;
    apos[*m] = *i; bpos[*m] = *j; (*m)++;
    *i = skip_matching(ak, *i, na, d, eps);
    *j = skip_matching(bk, *j, nb, d, eps);
}

/* One sweep over sorted windows ak[0..na) and bk[0..nb) (docs/semantics.md section 3, step 3).
 * Marks matched positions (am, bm: cleared by the caller), writes pair positions; returns m
 * and the final cursors in ij[0], ij[1]. */
INL i64 sweep_impl(const double *ak, i64 na, const double *bk, i64 nb, i64 d, const double *eps,
                   uint8_t *am, uint8_t *bm, i64 *apos, i64 *bpos, i64 *ij) {
    i64 i = 0, j = 0, m = 0;
    while (i < na && j < nb) {
        int c = tol_cmp(ak + i * d, bk + j * d, eps, d);
        if (c < 0) i++;
        else if (c > 0) j++;
        else match_at(ak, &i, na, bk, &j, nb, d, eps, am, bm, apos, bpos, &m);
    }
    ij[0] = i; ij[1] = j;
    return m;
}

i64 smerge_sweep(const double *ak, i64 na, const double *bk, i64 nb, i64 d, const double *eps,
                 uint8_t *am, uint8_t *bm, i64 *apos, i64 *bpos, i64 *ij) {
    return sweep_impl(ak, na, bk, nb, d, eps, am, bm, apos, bpos, ij);
}

/* Stable in-place merge of the new records (order: sorted positions into newk) into the
 * sorted window wk[0..n), which has room for them at its end. Merging from the back never
 * overwrites a record not yet moved; records sorting before every new one are not touched:
 * *first is the position the first new record lands on (n when there is none). */
INL i64 merge_back(double *wk, i64 *wr, i64 n, const double *newk, const i64 *newr, const i64 *order,
                      i64 nn, i64 d, i64 *first) {
    i64 p = n - 1, q = nn - 1, o = n + nn - 1;
    while (q >= 0) {
        i64 s = order[q];
        if (p >= 0 && !lex_le(wk + p * d, wr[p], newk + s * d, newr[s], d)) {
            memcpy(wk + o * d, wk + p * d, (size_t)d * sizeof(double));
            wr[o] = wr[p];
            p--;
        } else {
            memcpy(wk + o * d, newk + s * d, (size_t)d * sizeof(double));
            wr[o] = newr[s];
            q--;
        }
        o--;
    }
    *first = nn ? o + 1 : n;
    return n + nn;
}

/* Remove matched records, then evict the first `evict` remaining ones into ev_out. */
INL i64 compact(double *wk, i64 *wr, i64 n, i64 d, const uint8_t *matched, i64 evict, i64 *ev_out,
                   i64 *evicted_out) {
    i64 o = 0, evicted = 0;
    for (i64 t = 0; t < n; t++) {
        if (matched[t]) continue;
        if (evicted < evict) { ev_out[evicted++] = wr[t]; continue; }
        if (o != t) {
            memcpy(wk + o * d, wk + t * d, (size_t)d * sizeof(double));
            wr[o] = wr[t];
        }
        o++;
    }
    *evicted_out = evicted;
    return o;
}

INL i64 top_up(double *wk, i64 *wr, i64 n, const double *pk, const i64 *pr, i64 take, i64 d,
                  i64 *order, i64 *scratch, i64 *first) {
    argsort_impl(pk, pr, take, d, order, scratch);
    return merge_back(wk, wr, n, pk, pr, order, take, d, first);
}

/* One window of the CGM passes: records [off, off + n) of buffers holding 2N records (keys k,
 * row ids r). Evicting from the front moves off on instead of moving the records; a top-up that
 * would overrun the buffer first moves the window back to its start. chg: the first position
 * whose record changed (left, or came in) since the last sweep; the positions before it hold
 * the records that sweep saw, at the same places. */
typedef struct { double *k; i64 *r; i64 off, n, chg; } Win;

/* The pending records [start, start + take) of one side join its window. Their keys are read
 * from d columns (key c of record s at pk[c][s * stride]: the columns of a batch, or a C-order
 * (n, d) matrix with stride d) into keys (take x d) first. */
INL void win_top_up(Win *w, const double *const *pk, i64 stride, const i64 *pr, i64 start, i64 take, i64 d,
                    i64 cap, i64 *order, i64 *scratch, double *keys, i64 *memo) {
    for (i64 c = 0; c < d; c++) {
        const double *col = pk[c] + start * stride;
        for (i64 s = 0; s < take; s++) keys[s * d + c] = col[s * stride];
    }
    if (w->off + w->n + take > cap) {
        memmove(w->k, w->k + w->off * d, (size_t)(w->n * d) * sizeof(double));
        memmove(w->r, w->r + w->off, (size_t)w->n * sizeof(i64));
        w->off = 0;
        *memo = 0;  /* every record moved: the last sweep's path no longer applies */
    }
    i64 first;
    w->n = top_up(w->k + w->off * d, w->r + w->off, w->n, keys, pr + start, take, d, order, scratch, &first);
    if (w->off + first < w->chg) w->chg = w->off + first;
}

/* After a sweep: remove the matched records (the first at absolute position first_match,
 * off + n when none), then evict the first `evict` remaining ones into ev_out, as compact does.
 * When those all lie before the first matched record, they are the window's first `evict`
 * records: the front moves on, and only the records from the first matched one on are moved.
 * Returns the number evicted. */
INL i64 win_retire(Win *w, i64 d, const uint8_t *matched, i64 first_match, i64 evict, i64 *ev_out) {
    i64 end = w->off + w->n, ev = 0;
    if (evict > first_match - w->off) {
        w->n = compact(w->k + w->off * d, w->r + w->off, w->n, d, matched + w->off, evict, ev_out, &ev);
        w->chg = w->off;
        return ev;
    }
    memcpy(ev_out, w->r + w->off, (size_t)evict * sizeof(i64));
    w->off += evict;
    w->n = end - w->off;
    if (first_match < end) {
        w->n = first_match - w->off + compact(w->k + first_match * d, w->r + first_match, end - first_match, d,
                                              matched + first_match, 0, NULL, &ev);
        w->chg = first_match;
    }
    return evict;
}

/* The sweep of a CGM pass over windows ak[a0..a1) and bk[b0..b1) (absolute positions in their
 * buffers), the same steps as sweep_impl, resumed where the last pass's sweep left the records
 * unchanged.
 *
 * A sweep is a path through states (i, j); a state's step depends only on the records at i and
 * j (and after a MATCH on the records it skips). jat[c] is the j at which the last sweep's path
 * entered column c (absolute positions), jat[iend + 1] its final j. Before its first MATCH the
 * path moves one step at a time, and the records it matched left the windows, so every state
 * of that path with i < ca and j < cb (ca, cb: first changed positions) is a step, not a MATCH,
 * over records that are still there, at the same positions. R is the first state of that path
 * outside this region. This sweep, from its own start (the front may have moved on by
 * evictions), takes its usual steps until it reaches a state of the last path before R: from
 * there the two paths are the same up to R, so it goes on from R. A sweep that never meets the
 * last path (or memo == 0) takes every step itself. The pairs, marks and final cursors are those
 * of sweep_impl over the same windows. */
INL i64 sweep_resume(const double *ak, i64 a0, i64 a1, const double *bk, i64 b0, i64 b1, i64 d,
                     const double *eps, uint8_t *am, uint8_t *bm, i64 *apos, i64 *bpos, i64 *ij,
                     i64 *jat, int memo, i64 ca, i64 cb, i64 iend) {
    i64 i = a0, j = b0, m = 0, ri = -1, rj = -1;
    if (memo) {
        if (ca <= iend && jat[ca] < cb) {
            ri = ca; rj = jat[ca];
        } else {
            /* the column where the last path reached row cb: the first c with jat[c + 1] >= cb */
            i64 lo = a0, hi = (ca - 1 < iend ? ca - 1 : iend);
            if (hi >= lo && jat[hi + 1] >= cb) {
                while (lo < hi) {
                    i64 mid = lo + (hi - lo) / 2;
                    if (jat[mid + 1] >= cb) hi = mid; else lo = mid + 1;
                }
                if (jat[lo] <= cb) { ri = lo; rj = cb; }
            }
        }
        if (ri < a0 || rj < b0) ri = -1;
    }
    i64 pj = ri >= 0 ? jat[a0] : 0;  /* the row at which the last path entered column i */
    jat[a0] = b0;
    if (ri >= 0) {
        while (i < a1 && j < b1) {
            if (i > ri || j > rj) break;
            if (pj <= j && j <= (i < ri ? jat[i + 1] : rj)) { i = ri; j = rj; break; }
            const double *x = ak + i * d, *y = bk + j * d;
            int c = tol_cmp(x, y, eps, d);
            if (c < 0) { i++; pj = jat[i]; jat[i] = j; }
            else if (c > 0) j++;
            else {
                match_at(ak, &i, a1, bk, &j, b1, d, eps, am, bm, apos, bpos, &m);
                pj = jat[i]; jat[i] = j;
            }
        }
    }
    while (i < a1 && j < b1) {
        int c = tol_cmp(ak + i * d, bk + j * d, eps, d);
        if (c < 0) { i++; jat[i] = j; }
        else if (c > 0) j++;
        else {
            match_at(ak, &i, a1, bk, &j, b1, d, eps, am, bm, apos, bpos, &m);
            jat[i] = j;
        }
    }
    jat[i + 1] = j;
    ij[0] = i; ij[1] = j;
    return m;
}

/* Run CGM passes (docs/semantics.md section 3) until input runs short, output fills, or the merge ends.
 * st (16): [0] |window A|, [1] |window B|, [2] next pending A, [3] next pending B, [4] done,
 * [5] passes, [6] A records retired since st[7] was set, [7] report-window stop (0: none),
 * [8] first position of window A in its buffers, [9] of window B, [10]..[13] the last sweep's
 * path (valid flag, first changed positions in A and B, its last column; all 0 at the start).
 * counts: pairs, evicted A, evicted B, passes logged. Windows stay sorted between calls.
 * Returns 0 needs more A, 1 needs more B (the pending records of that side have joined its
 * window: st[2] or st[3] is then at the end of the pending ones), 2 output buffers full, 3 merge
 * ended, 4 the report window closed (st[6] reached st[7] > 0).
 * The pending keys of A: key c of pending record s at pak[c][s * pa_stride] (d columns, or a
 * C-order (n, d) matrix: pak[c] = matrix + c, stride d); likewise B's.
 * The window buffers (wak, war, wbk, wbr) and the marks (ma, mb) hold 2N records; window A is
 * wak[st[8] .. st[8] + st[0]). work: (6 + d)N + 2 int64 (sort order, scratch, the last sweep's
 * path, the keys of the records joining a window). */
#define CGM_PASSES_PARAMS                                                                          \
    i64 *st, double *wak, i64 *war, double *wbk, i64 *wbr,                                         \
    const double *const *pak, i64 pa_stride, const i64 *par, i64 pa_n, int a_exhausted,           \
    const double *const *pbk, i64 pb_stride, const i64 *pbr, i64 pb_n, int b_exhausted,           \
    i64 d, const double *eps, i64 window_size, i64 inc_a, i64 inc_b,                               \
    i64 *pairs_a, i64 *pairs_b, i64 pairs_cap, i64 *ev_a, i64 *ev_b, i64 ev_cap,                  \
    i64 *counts, i64 *pass_m, i64 *pass_ret_a, i64 pass_cap,                                       \
    uint8_t *ma, uint8_t *mb, i64 *spa, i64 *spb, i64 *work
#define CGM_PASSES_ARGS(D)                                                                         \
    st, wak, war, wbk, wbr, pak, pa_stride, par, pa_n, a_exhausted, pbk, pb_stride, pbr, pb_n,     \
    b_exhausted, D, eps,                                                                           \
    window_size, inc_a, inc_b, pairs_a, pairs_b, pairs_cap, ev_a, ev_b, ev_cap, counts, pass_m,    \
    pass_ret_a, pass_cap, ma, mb, spa, spb, work
INL int cgm_passes_impl(CGM_PASSES_PARAMS) {
    const i64 ncap = window_size, cap = 2 * window_size;
    i64 *order = work, *scratch = work + ncap, *jat = work + 4 * ncap;
    double *keys = (double *)(work + 6 * ncap + 2);
    Win A = {wak, war, st[8], st[0], st[11]}, B = {wbk, wbr, st[9], st[1], st[12]};
#define SAVE_STATE() (st[0] = A.n, st[1] = B.n, st[8] = A.off, st[9] = B.off, st[11] = A.chg, st[12] = B.chg)
    for (;;) {
        /* Input short: the records available join the window now (the window's order is the
         * total order of (key, row id), so topping up in two steps gives the same window), so
         * that the caller's next batch need not be appended to left-over records. */
        i64 need_a = ncap - A.n, avail_a = pa_n - st[2];
        if (need_a > 0 && avail_a < need_a && !a_exhausted) {
            if (avail_a > 0) {
                win_top_up(&A, pak, pa_stride, par, st[2], avail_a, d, cap, order, scratch, keys, &st[10]);
                st[2] += avail_a;
            }
            SAVE_STATE();
            return 0;
        }
        i64 need_b = ncap - B.n, avail_b = pb_n - st[3];
        if (need_b > 0 && avail_b < need_b && !b_exhausted) {
            if (avail_b > 0) {
                win_top_up(&B, pbk, pb_stride, pbr, st[3], avail_b, d, cap, order, scratch, keys, &st[10]);
                st[3] += avail_b;
            }
            SAVE_STATE();
            return 1;
        }
        if (counts[0] + ncap > pairs_cap || counts[1] + ncap > ev_cap || counts[2] + ncap > ev_cap ||
            counts[3] >= pass_cap) {
            SAVE_STATE();
            return 2;
        }
        i64 take_a = need_a < avail_a ? need_a : avail_a;
        if (take_a > 0) {
            win_top_up(&A, pak, pa_stride, par, st[2], take_a, d, cap, order, scratch, keys, &st[10]);
            st[2] += take_a;
        }
        i64 take_b = need_b < avail_b ? need_b : avail_b;
        if (take_b > 0) {
            win_top_up(&B, pbk, pb_stride, pbr, st[3], take_b, d, cap, order, scratch, keys, &st[10]);
            st[3] += take_b;
        }
        i64 na = A.n, nb = B.n;
        if (na == 0 || nb == 0) { SAVE_STATE(); st[4] = 1; return 3; }
        memset(ma + A.off, 0, (size_t)na);
        memset(mb + B.off, 0, (size_t)nb);
        i64 ij[2];
        i64 m = sweep_resume(wak, A.off, A.off + na, wbk, B.off, B.off + nb, d, eps, ma, mb, spa, spb, ij, jat,
                             (int)st[10], A.chg, B.chg, st[13]);
        st[10] = 1; st[13] = ij[0];
        A.chg = B.chg = cap + 1;
        i64 base = counts[0];
        for (i64 t = 0; t < m; t++) {
            pairs_a[base + t] = war[spa[t]];
            pairs_b[base + t] = wbr[spb[t]];
        }
        counts[0] = base + m;
        i64 evict_a = (ij[0] >= A.off + na && inc_a > m) ? inc_a - m : 0;
        i64 evict_b = (ij[1] >= B.off + nb && inc_b > m) ? inc_b - m : 0;
        i64 ea = win_retire(&A, d, ma, m ? spa[0] : A.off + na, evict_a, ev_a + counts[1]);
        i64 eb = win_retire(&B, d, mb, m ? spb[0] : B.off + nb, evict_b, ev_b + counts[2]);
        counts[1] += ea;
        counts[2] += eb;
        st[5] += 1;
        pass_m[counts[3]] = m;
        pass_ret_a[counts[3]] = m + ea;
        counts[3] += 1;
        /* Report-window stop (adaptive K): st[7] > 0 is the number of A records still to retire
         * before the open report window closes; st[6] counts them. Return 4 after the pass that
         * closes it, so that the caller may change K before the next pass. */
        if (st[7] > 0) {
            st[6] += m + ea;
            if (st[6] >= st[7]) { SAVE_STATE(); return 4; }
        }
    }
#undef SAVE_STATE
}

int smerge_cgm_passes(CGM_PASSES_PARAMS) {
    /* The same passes with d a constant for the usual key counts (identical arithmetic). */
    switch (d) {
    case 1: return cgm_passes_impl(CGM_PASSES_ARGS(1));
    case 2: return cgm_passes_impl(CGM_PASSES_ARGS(2));
    case 3: return cgm_passes_impl(CGM_PASSES_ARGS(3));
    default: return cgm_passes_impl(CGM_PASSES_ARGS(d));
    }
}

/* Fixed-width values gathered from several arrays (the record batches of a row store) without
 * concatenating them: out[i] is element pos[i] - starts[s] of array s (at address bases[s]),
 * where starts[s] <= pos[i] < starts[s + 1]; starts: nseg + 1 cumulative lengths, every pos in
 * [0, starts[nseg]) (checked by the caller). itemsize: 1, 2, 4 or 8 bytes. */
#define GATHER_SEGMENTS(T)                                                                         \
    for (i64 i = 0, s = 0; i < n; i++) {                                                           \
        i64 p = pos[i];                                                                            \
        if (p < starts[s] || p >= starts[s + 1]) {                                                 \
            i64 lo = 0, hi = nseg - 1;                                                             \
            while (lo < hi) { i64 mid = (lo + hi + 1) / 2; if (starts[mid] <= p) lo = mid; else hi = mid - 1; } \
            s = lo;                                                                                \
        }                                                                                          \
        ((T *)out)[i] = ((const T *)(intptr_t)bases[s])[p - starts[s]];                            \
    }
void smerge_gather_segments(i64 nseg, const i64 *bases, const i64 *starts, i64 itemsize, const i64 *pos, i64 n,
                            void *out) {
    switch (itemsize) {
    case 1: GATHER_SEGMENTS(uint8_t) break;
    case 2: GATHER_SEGMENTS(uint16_t) break;
    case 4: GATHER_SEGMENTS(uint32_t) break;
    default: GATHER_SEGMENTS(uint64_t) break;
    }
}

/* kappa_max (docs/semantics.md section 4): repeat the sweep over whole sorted streams until dry.
 * ak/ar and bk/br are sorted copies the function may modify; am/bm: na/nb bytes;
 * spa/spb: min(na, nb) + 1. Returns the number of pairs written to pairs_a/pairs_b. */
i64 smerge_sweep_until_dry(double *ak, i64 *ar, i64 na, double *bk, i64 *br, i64 nb, i64 d,
                           const double *eps, i64 *pairs_a, i64 *pairs_b, uint8_t *am, uint8_t *bm,
                           i64 *spa, i64 *spb) {
    i64 total = 0, ev;
    while (na > 0 && nb > 0) {
        memset(am, 0, (size_t)na);
        memset(bm, 0, (size_t)nb);
        i64 ij[2];
        i64 m = smerge_sweep(ak, na, bk, nb, d, eps, am, bm, spa, spb, ij);
        if (m == 0) break;
        for (i64 t = 0; t < m; t++) {
            pairs_a[total + t] = ar[spa[t]];
            pairs_b[total + t] = br[spb[t]];
        }
        total += m;
        na = compact(ak, ar, na, d, am, 0, NULL, &ev);
        nb = compact(bk, br, nb, d, bm, 0, NULL, &ev);
    }
    return total;
}

/* Maximum matching of one key (the ceiling of kappa, docs/semantics.md section 4, for d = 1): a[0..na) and
 * b[0..nb) sorted ascending; A record x may pair with B record y when |x - y| <= eps. Every A
 * interval [x - eps, x + eps] has the same length, so in A's order the intervals are also in
 * order of their right ends, and giving each the smallest free B point inside it is optimal
 * (the earliest-deadline greedy for points and intervals); a B point left of an interval is left
 * of every later one. O(na + nb). */
i64 smerge_match_1d(const double *a, i64 na, const double *b, i64 nb, double eps) {
    i64 j = 0, m = 0;
    for (i64 i = 0; i < na && j < nb; i++) {
        while (j < nb && b[j] < a[i] - eps) j++;
        if (j < nb && b[j] <= a[i] + eps) { m++; j++; }
    }
    return m;
}

/* Maximum matching of a bipartite graph (Hopcroft-Karp): A vertices 0..na, B vertices 0..nb,
 * the B neighbours of A vertex v are adj[start[v] .. start[v+1]). match_a (na), match_b (nb)
 * are filled (-1: free); dist, it, stack: na each; queue: na. Returns the matching's size. */
i64 smerge_hopcroft_karp(i64 na, i64 nb, const i64 *start, const i64 *adj, i64 *match_a, i64 *match_b,
                         i64 *dist, i64 *it, i64 *stack, i64 *queue) {
    const i64 INF = INT64_MAX;
    i64 size = 0;
    for (i64 v = 0; v < na; v++) match_a[v] = -1;
    for (i64 w = 0; w < nb; w++) match_b[w] = -1;
    for (i64 v = 0; v < na; v++)  /* greedy start */
        for (i64 e = start[v]; e < start[v + 1]; e++)
            if (match_b[adj[e]] < 0) { match_b[adj[e]] = v; match_a[v] = adj[e]; size++; break; }
    for (;;) {
        i64 head = 0, tail = 0;
        for (i64 v = 0; v < na; v++) {
            if (match_a[v] < 0 && start[v + 1] > start[v]) { dist[v] = 0; queue[tail++] = v; }
            else dist[v] = INF;
        }
        int found = 0;
        while (head < tail) {
            i64 v = queue[head++];
            for (i64 e = start[v]; e < start[v + 1]; e++) {
                i64 u = match_b[adj[e]];
                if (u < 0) found = 1;
                else if (dist[u] == INF) { dist[u] = dist[v] + 1; queue[tail++] = u; }
            }
        }
        if (!found) break;
        for (i64 v = 0; v < na; v++) it[v] = start[v];
        for (i64 v0 = 0; v0 < na; v0++) {
            if (match_a[v0] >= 0 || dist[v0] != 0) continue;
            i64 top = 0;
            stack[top++] = v0;
            while (top > 0) {
                i64 v = stack[top - 1];
                if (it[v] >= start[v + 1]) { dist[v] = INF; top--; if (top) it[stack[top - 1]]++; continue; }
                i64 w = adj[it[v]], u = match_b[w];
                if (u < 0) {  /* augment along the stack */
                    for (i64 t = top - 1; t >= 0; t--) {
                        i64 av = stack[t], bw = adj[it[av]];
                        match_a[av] = bw; match_b[bw] = av;
                    }
                    size++;
                    break;
                }
                if (dist[u] != INF && dist[u] == dist[v] + 1) stack[top++] = u;
                else it[v]++;
            }
        }
    }
    return size;
}

static struct PyModuleDef ckernel_module = {
    PyModuleDef_HEAD_INIT, "_ckernel",
    "C kernels of smerge's merge engines; called through ctypes (see merge/_kernel.py).", -1, NULL,
};

PyMODINIT_FUNC PyInit__ckernel(void) { return PyModule_Create(&ckernel_module); }
