/* Compiled hot loops of the W-join (merge/wjoin_engine.py), called through ctypes from
 * merge/_wjoin_kernel.py (ctypes releases the GIL for the duration of a call).
 *
 * Times are int64 (integers, datetimes as ticks) or float64: every function exists in both
 * flavours (suffix _i64 / _f64). NEG / POS stand for "nothing seen yet" and "stream exhausted".
 * Plain C rather than a JIT: a JIT's import costs about 0.5 s and 65 MB per process, more than
 * the whole join of 48,000 + 48,000 records.
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
typedef uint64_t u64;

/* a - b saturating at the int64 range (wrapping would turn a cut far below every time into one
 * above them: a purge of records still in the window) */
static inline i64 sub_i64(i64 a, i64 b) {
    i64 r;
    if (__builtin_sub_overflow(a, b, &r)) return b > 0 ? INT64_MIN : INT64_MAX;
    return r;
}
static inline double sub_f64(double a, double b) { return a - b; }

/* Replay one chunk's arrivals; advance each stream's purge pointer after every arrival.
 *
 * times_flat[offsets[j]:offsets[j+1]] are stream j's buffered+chunk times (sorted); base[j] of
 * them were buffered before the chunk, ptr[j] of those already purged. A record y of stream j
 * is dropped once latest[k] - dist[j, k] > t(y) + slack for every k != j. final_rank[k] is the
 * arrival index of stream k's last record when it falls in this chunk (-1 otherwise); after
 * it, latest[k] = pos. Updates ptr, latest, peak (per stream) in place; returns the new peak of
 * the total. drop_at[offsets[j] + p] receives the arrival index after which record p of stream
 * j was dropped (when ndrop > 0). Returns -1 when memory runs out. */
#define PURGE_WALK(T, SFX)                                                                          \
    static inline T purge_term_##SFX(const T *latest, const T *dist, i64 n, i64 j, i64 k, T neg, T pos) { \
        T lk = latest[k];                                                                            \
        return lk == neg ? neg : lk == pos ? pos : sub_##SFX(lk, dist[j * n + k]);                   \
    }                                                                                                \
    /* cut[j] = min over k != j of the terms, am[j] = a k giving it (-1: every term is pos) */      \
    static inline void purge_cut_##SFX(const T *latest, const T *dist, i64 n, i64 j, T *cut, i64 *am, \
                                       T neg, T pos) {                                               \
        T c = pos;                                                                                   \
        i64 arg = -1;                                                                                \
        for (i64 k = 0; k < n; k++) {                                                                \
            if (k == j) continue;                                                                    \
            T t = purge_term_##SFX(latest, dist, n, j, k, neg, pos);                                 \
            if (t < c) {                                                                             \
                c = t;                                                                               \
                arg = k;                                                                             \
            }                                                                                        \
        }                                                                                            \
        cut[j] = c;                                                                                  \
        am[j] = arg;                                                                                 \
    }                                                                                                \
    i64 wj_purge_walk_##SFX(i64 na, const i64 *arr_stream, const T *arr_t, const T *times_flat,      \
                            const i64 *offsets, const i64 *base, i64 *ptr, T *latest, const T *dist, \
                            i64 n, T slack, const i64 *final_rank, i64 *drop_at, i64 ndrop,          \
                            i64 *peak, i64 peak_total, T neg, T pos) {                               \
        if (n <= 0) return peak_total;                                                               \
        i64 *arrived = (i64 *)malloc(sizeof(i64) * (size_t)n), *am = (i64 *)malloc(sizeof(i64) * (size_t)n); \
        T *cut = (T *)malloc(sizeof(T) * (size_t)n);                                                 \
        if (!arrived || !am || !cut) {                                                               \
            free(arrived);                                                                           \
            free(am);                                                                                \
            free(cut);                                                                               \
            return -1;                                                                               \
        }                                                                                            \
        i64 pt = peak_total, tot = 0;                                                                \
        for (i64 j = 0; j < n; j++) {                                                                \
            arrived[j] = base[j];                                                                    \
            tot += base[j] - ptr[j];                                                                 \
        }                                                                                            \
        /* After the first arrival every stream's pointer stands where its cut puts it. Then only  \
         * stream i's latest time changes at an arrival of i: the cut of j != i moves only through \
         * its term for i (kept as a running minimum), and only stream i gains a record. */        \
        for (i64 a = 0; a < na; a++) {                                                               \
            i64 i = arr_stream[a];                                                                   \
            arrived[i] += 1;                                                                         \
            tot += 1;                                                                                \
            latest[i] = final_rank[i] != a ? arr_t[a] : pos;                                         \
            if (a == 0)                                                                              \
                for (i64 j = 0; j < n; j++) purge_cut_##SFX(latest, dist, n, j, cut, am, neg, pos);  \
            for (i64 j = 0; j < n; j++) {                                                            \
                if (j != i && a > 0) {                                                               \
                    T c = purge_term_##SFX(latest, dist, n, j, i, neg, pos);                         \
                    if (c < cut[j]) {                                                                \
                        cut[j] = c;                                                                  \
                        am[j] = i;                                                                   \
                    } else if (am[j] == i) {                                                         \
                        purge_cut_##SFX(latest, dist, n, j, cut, am, neg, pos);                      \
                    } else {                                                                         \
                        continue; /* cut and records of j unchanged: its pointer stays */            \
                    }                                                                                \
                }                                                                                    \
                T cj = cut[j];                                                                       \
                if (cj == neg) continue;                                                             \
                i64 p = ptr[j], hi = arrived[j], o = offsets[j];                                     \
                if (cj == pos) p = hi;                                                               \
                else                                                                                 \
                    while (p < hi && times_flat[o + p] + slack < cj) p++;                            \
                if (ndrop > 0)                                                                       \
                    for (i64 q = ptr[j]; q < p; q++) drop_at[o + q] = a;                             \
                tot -= p - ptr[j];                                                                   \
                ptr[j] = p;                                                                          \
            }                                                                                        \
            /* only stream i's buffer grows (at the first arrival, every stream is checked) */      \
            for (i64 j = a == 0 ? 0 : i; j < (a == 0 ? n : i + 1); j++)                              \
                if (arrived[j] - ptr[j] > peak[j]) peak[j] = arrived[j] - ptr[j];                    \
            if (tot > pt) pt = tot;                                                                  \
        }                                                                                            \
        free(arrived);                                                                               \
        free(am);                                                                                    \
        free(cut);                                                                                   \
        return pt;                                                                                   \
    }

PURGE_WALK(i64, i64)
PURGE_WALK(double, f64)

/* A chunk's arrival order: the n streams' chunk times (each sorted; stream j's are
 * t[off[j]:off[j+1]]) merged by time, ties by stream number, then position (a stable n-way
 * merge: what a lexsort of (time, stream, position) gives, in one pass). For arrival a:
 * arr_s[a] its stream, arr_pos[a] its position in that stream's buffer+chunk (base[s] + its
 * place in the chunk), arr_t[a] its time, pe[j * na + a] the records of stream j that arrived
 * before it (base[j] + its chunk records before a; not written when pe is NULL); rank[off[j] + q]
 * receives the arrival index of stream j's chunk record q (the inverse permutation). Returns 0,
 * -1 when memory runs out. */
#define ARRIVALS(T, SFX)                                                                            \
    i64 wj_arrivals_##SFX(i64 n, const T *t, const i64 *off, const i64 *base, i64 na, i64 *arr_s,   \
                          i64 *arr_pos, T *arr_t, i64 *pe, i64 *rank) {                             \
        i64 *cur = (i64 *)malloc(sizeof(i64) * (size_t)(n > 0 ? n : 1));                           \
        if (!cur) return -1;                                                                         \
        for (i64 j = 0; j < n; j++) cur[j] = off[j];                                                 \
        for (i64 a = 0; a < na; a++) {                                                               \
            i64 best = -1;                                                                           \
            T bt = 0;                                                                                \
            for (i64 j = 0; j < n; j++) {                                                            \
                if (pe) pe[j * na + a] = base[j] + (cur[j] - off[j]);                                \
                if (cur[j] < off[j + 1] && (best < 0 || t[cur[j]] < bt)) {                           \
                    best = j;                                                                        \
                    bt = t[cur[j]];                                                                  \
                }                                                                                    \
            }                                                                                        \
            arr_s[a] = best;                                                                         \
            arr_pos[a] = base[best] + (cur[best] - off[best]);                                       \
            arr_t[a] = bt;                                                                           \
            rank[cur[best]++] = a;                                                                   \
        }                                                                                            \
        free(cur);                                                                                   \
        return 0;                                                                                    \
    }

ARRIVALS(i64, i64)
ARRIVALS(double, f64)

/* Band conjuncts checked inside a probe, before a pair is formed: for each k < nb, candidate q's
 * value cv[k * ncand + q] OP_k the partial tuple p's value pv[k * m + p] (OP: 0 <, 1 <=, 2 >,
 * 3 >=). Values are float64 with NULL as NaN: a comparison with NaN is false, as a NULL drops
 * the row, so the pairs kept are exactly those the conjuncts keep. */
static inline int band_ok(i64 nb, const i64 *ops, const double *cv, i64 ncand, i64 q, const double *pv, i64 m,
                          i64 p) {
    for (i64 k = 0; k < nb; k++) {
        double a = cv[k * ncand + q], b = pv[k * m + p];
        int ok;
        switch (ops[k]) {
            case 0: ok = a < b; break;
            case 1: ok = a <= b; break;
            case 2: ok = a > b; break;
            default: ok = a >= b; break;
        }
        if (!ok) return 0;
    }
    return 1;
}

/* append (p, q) to the growing pair arrays; 0 when memory runs out */
static inline int push_pair(i64 **op, i64 **oc, i64 *cap, i64 total, i64 p, i64 q) {
    if (total == *cap) {
        i64 c2 = *cap * 2;
        i64 *a = (i64 *)realloc(*op, sizeof(i64) * (size_t)c2);
        if (!a) return 0;
        *op = a;
        a = (i64 *)realloc(*oc, sizeof(i64) * (size_t)c2);
        if (!a) return 0;
        *oc = a;
        *cap = c2;
    }
    (*op)[total] = p;
    (*oc)[total] = q;
    return 1;
}

/* NLW-join probe with band conjuncts: the candidates of partial tuple p are positions
 * [starts[p], ends[p]); pairs passing band_ok are written to malloc'd *out_parent / *out_cand
 * (free with wj_free). Stops after limit + 1 pairs. Returns their number, -1 when out of memory. */
i64 wj_range_probe(i64 m, const i64 *starts, const i64 *ends, i64 nb, const i64 *ops, const double *cv, i64 ncand,
                   const double *pv, i64 limit, i64 **out_parent, i64 **out_cand) {
    i64 cap = 2 * m > 16 ? 2 * m : 16, total = 0;
    i64 *op = (i64 *)malloc(sizeof(i64) * (size_t)cap), *oc = (i64 *)malloc(sizeof(i64) * (size_t)cap);
    if (!op || !oc) goto oom;
    for (i64 p = 0; p < m; p++) {
        for (i64 q = starts[p]; q < ends[p]; q++) {
            if (!band_ok(nb, ops, cv, ncand, q, pv, m, p)) continue;
            if (total > limit) goto done;
            if (!push_pair(&op, &oc, &cap, total, p, q)) goto oom;
            total++;
        }
    }
done:
    *out_parent = op;
    *out_cand = oc;
    return total;
oom:
    free(op);
    free(oc);
    *out_parent = *out_cand = NULL;
    return -1;
}

/* An equality index of one stream's buffered+chunk records, built once per chunk and shared by
 * every probe into that stream: the positions 0..nrec-1 grouped by their 64-bit key hash
 * (groups in order of first position; positions ascending within a group): gstart[g] ..
 * gstart[g+1] is group g's range of pos (gstart needs nrec + 1 entries). Returns the number of
 * groups, -1 when memory runs out. Then wj_key_table puts the groups in an open-addressing
 * table (hash -> group + 1, 0: empty slot) sized by the groups, not the records (a probe's
 * first, random, access: 16 bytes a slot, in one cache line). */
typedef struct {
    u64 h;
    i64 g1;
} key_slot;

static inline i64 key_find(const key_slot *t, i64 mask, u64 hv) {
    i64 s = (i64)(hv & (u64)mask);
    while (t[s].g1 != 0 && t[s].h != hv) s = (s + 1) & mask;
    return s;
}

i64 wj_key_index(const u64 *hashes, i64 nrec, i64 *gstart, i64 *pos) {
    i64 cap = 16;
    while (cap < 2 * nrec) cap *= 2;
    key_slot *t = (key_slot *)calloc((size_t)cap, sizeof(key_slot)); /* zero pages: touched as used */
    i64 *gid = (i64 *)malloc(sizeof(i64) * (size_t)(nrec > 0 ? nrec : 1));
    if (!t || !gid) {
        free(t);
        free(gid);
        return -1;
    }
    i64 ng = 0;
    for (i64 r = 0; r < nrec; r++) {
        i64 s = key_find(t, cap - 1, hashes[r]);
        if (t[s].g1 == 0) {
            t[s].h = hashes[r];
            t[s].g1 = ++ng;
            gstart[ng - 1] = 0;
        }
        gid[r] = t[s].g1 - 1;
        gstart[gid[r]]++;
    }
    for (i64 g = 0, acc = 0; g < ng; g++) gstart[g] = acc += gstart[g]; /* group ends */
    for (i64 r = nrec - 1; r >= 0; r--) pos[--gstart[gid[r]]] = r;     /* now group starts */
    gstart[ng] = nrec;
    free(t);
    free(gid);
    return ng;
}

/* slots: mask + 1 zeroed key_slot entries (mask + 1 >= 2 ng) */
void wj_key_table(const u64 *hashes, const i64 *pos, const i64 *gstart, i64 ng, i64 mask, key_slot *slots) {
    for (i64 g = 0; g < ng; g++) {
        u64 hv = hashes[pos[gstart[g]]];
        i64 s = key_find(slots, mask, hv);
        slots[s].h = hv;
        slots[s].g1 = g + 1;
    }
}

/* HW-join probe through a key index (wj_key_index, wj_key_table; gt[k] = the time of record
 * pos[k]): for each partial tuple p from p0 on, the records of its hash group that arrived
 * before its arriving record (time ta[p]: a record of the probed stream arrived before it when
 * its time is below ta[p], or equal and the probed stream's number is lower: strict = 0, else
 * 1 — the arrival order) with lo[p] <= time <= hi[p] (and the band conjuncts, see band_ok),
 * newest first: a binary search in the group for the last such record, then a walk back to the
 * first record older than lo[p]. Pairs (p, position) are written at *total_io onwards into
 * out_parent / out_cand (cap entries). Returns m when done (*total_io = the number of pairs; it
 * stops after limit + 1 of them), or the p whose pairs did not fit (*total_io = the pairs before
 * it): grow the arrays, call again from there. Probes are independent: any order, any number of
 * calls. The table slot of the probe KEY_AHEAD places on is prefetched (the keys are random). */
#define KEY_AHEAD 8
#define KEY_PROBE(T, SFX)                                                                              \
    i64 wj_key_probe_##SFX(i64 mask, const key_slot *slots, const i64 *gstart, const i64 *pos,         \
                           const T *gt, i64 m, const u64 *h, const T *lo, const T *hi, const T *ta,    \
                           i64 strict, i64 limit, i64 nb, const i64 *ops, const double *cv, i64 ncand, \
                           const double *pv, i64 p0, i64 cap, i64 *out_parent, i64 *out_cand,          \
                           i64 *total_io) {                                                            \
        i64 total = *total_io;                                                                         \
        for (i64 p = p0; p < m; p++) {                                                                 \
            if (p + KEY_AHEAD < m) __builtin_prefetch(&slots[h[p + KEY_AHEAD] & (u64)mask]);           \
            i64 g = slots[key_find(slots, mask, h[p])].g1 - 1;                                         \
            if (g < 0) continue;                                                                       \
            i64 g0 = gstart[g], a = g0, b = gstart[g + 1], t0 = total;                                 \
            T lp = lo[p], up = hi[p], tp = ta[p];                                                      \
            while (a < b) { /* the first record of the group past hi[p] or not before ta[p] */        \
                i64 mid = a + (b - a) / 2;                                                             \
                T t = gt[mid];                                                                         \
                if (t <= up && (t < tp || (!strict && t == tp))) a = mid + 1;                          \
                else b = mid;                                                                          \
            }                                                                                          \
            for (i64 k = a - 1; k >= g0; k--) {                                                        \
                if (gt[k] < lp) break;                                                                 \
                if (nb == 0 || band_ok(nb, ops, cv, ncand, pos[k], pv, m, p)) {                        \
                    if (total > limit) {                                                               \
                        *total_io = total;                                                             \
                        return m;                                                                      \
                    }                                                                                  \
                    if (total == cap) {                                                                \
                        *total_io = t0;                                                                \
                        return p;                                                                      \
                    }                                                                                  \
                    out_parent[total] = p;                                                             \
                    out_cand[total] = pos[k];                                                          \
                    total++;                                                                           \
                }                                                                                      \
            }                                                                                          \
        }                                                                                              \
        *total_io = total;                                                                             \
        return m;                                                                                      \
    }

KEY_PROBE(i64, i64)
KEY_PROBE(double, f64)

/* The equality hashes' arithmetic (merge/wjoin_hashing.py; merge/hashing.py's mix64 in numpy is
 * the reference): splitmix64's finaliser, in one pass instead of numpy's temporary per step. */
static inline u64 mix64(u64 x) {
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

/* out[r] = mix64 of the bits of v[r] with NaN as 0.0 and -0.0 as 0.0 (a numeric key's hash) */
void wj_hash_f64(const double *v, i64 n, u64 *out) {
    for (i64 r = 0; r < n; r++) {
        double d = v[r];
        if (d != d) d = 0.0;
        d = d + 0.0; /* -0.0 -> 0.0 */
        u64 b;
        memcpy(&b, &d, sizeof b);
        out[r] = mix64(b);
    }
}

/* h[r] = mix64(h[r] * 31 + x[r]): one more column of a key, in place */
void wj_hash_combine(u64 *h, const u64 *x, i64 n) {
    for (i64 r = 0; r < n; r++) h[r] = mix64(h[r] * 31u + x[r]);
}

void wj_free(void *p) { free(p); }

static struct PyModuleDef wjoin_ckernel_module = {PyModuleDef_HEAD_INIT, "_wjoin_ckernel",
                                                  "W-join kernels (called through ctypes)", -1, NULL};

PyMODINIT_FUNC PyInit__wjoin_ckernel(void) { return PyModule_Create(&wjoin_ckernel_module); }
