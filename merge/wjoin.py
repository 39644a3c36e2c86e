"""W-join: multi-way sliding-window join of time-stamped streams (docs/semantics.md section 6, seed 6.2).

``wjoin(streams, schemas, params)`` consumes n >= 2 iterators of ``pyarrow.RecordBatch`` (each
in non-decreasing time order) and yields record batches of joined n-tuples: every
(x_1..x_n) with the predicate TRUE and |t(x_i) - t(x_j)| <= w_ij for every constrained pair,
exactly once, as formed when its last member arrives. Arrival order interleaves the streams
by timestamp, ties by stream number, then position.

Execution: records are taken from the inputs in *chunks* — everything strictly below the
smallest last-loaded timestamp of the live streams, so no later record can precede them. The
arrivals of a chunk are processed as a left-deep pipeline, vectorised over all arrivals of
one stream at a time: an arrival probes the next stream's buffer (NLW-join: the time period
allowed by the bounds; HW-join: the hash bucket of its equality key inside that period) and
only buffer records that arrived *before* it (so each tuple is formed once), then the
conjuncts of the predicate whose streams are all bound filter the partial tuples. After the
chunk the purge rule is replayed record by record (``_wjoin_kernel.purge_walk``): a buffered
record x of S_i is dropped once, for every other stream j, the latest timestamp seen on S_j
exceeds t(x) + D_ij (D = shortest paths in the graph of window bounds). An exhausted stream
counts as +infinity (no later record of it can join).

Memory: the buffers (records the rule keeps) plus one chunk of input per stream — never the
whole stream. ``WJoinStats.peak_buffered`` reports the buffers per arrival as the rule defines
them; ``peak_held`` the records physically held (buffer + current chunk + read-ahead).

This module is the engine; the parameters are in ``wjoin_params``, the statistics in
``wjoin_stats``, the plan (time kinds, bounds, probe orders, output schema) in ``wjoin_plan``,
the hashing of equality keys in ``wjoin_hashing`` and the compiled loops in ``_wjoin_kernel``.
"""


from __future__ import annotations

import time
from typing import Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from smerge.errors import InputError, UsageError, param
from smerge.merge import expr as X
from smerge.merge import wjoin_numpy as N
from smerge.merge._wjoin_kernel import (BAND_OPS, INT_NEG, INT_POS, Band, KeyIndex, arrivals, expand_ranges, purge_walk,
                                        range_probe)
from smerge.merge.stats import BoundedSeries
from smerge.merge.wjoin_chunks import OutputBatch, cap_takes
from smerge.merge.wjoin_hashing import hash_terms, hash_values
from smerge.merge.wjoin_params import WJoinParams
from smerge.merge.wjoin_plan import Plan, make_plan
from smerge.merge.wjoin_stats import WJoinStats

# Tuples per output batch (a Parquet output's row group): 32,768 held 6-13 MB less peak memory
# than 65,536 on the 48k-record whole-process shapes (the batch, its flush and the writer's
# pages), at the same time; a 4-way --on join of 1M records per stream took the same time.
DEFAULT_OUTPUT_ROWS = 32768
# Partial tuples of one level above which a block of arrivals is cut (2^18: the index arrays,
# the columns a predicate reads and the output block stay a few tens of MB; 2^20 cost ~30 MB
# more peak memory on a 48k + 48k band join and no time; 2^16 saved 14 MB more but cost ~40% on
# a 4-way --on join of 1M records per stream: every cut redoes a level).
SPLIT_TUPLES = 1 << 18
# Arrivals of one stream in one chunk, at most (or twice the records it holds in its buffer,
# whichever is larger: a chunk also rebuilds the buffer's key indexes and replays its purge). The
# chunk's index arrays, hash indexes and the output of its blocks scale with it: 2^14 instead of
# one chunk per 64k-record input batch took the peak RSS of a 48k + 48k band join from 157 to
# 132 MB and of a 4-way join of 1M records per stream from ~365 to ~280 MB, no slower on the
# 48k shapes; the 4-way 1M join took up to ~15% longer (more chunks, each rebuilding 12 hash
# indexes). 2^13 saved 7-10 MB more on the 48k shapes and cost ~30% on that join.
CHUNK_ARRIVALS = 1 << 14
# One arrival's partial tuples at one level. Each is held in about 2n + 4 int64 index arrays
# (members, times, parents) and, at the last level, in every output column before the block is
# written: 4M keeps a 3-way step under ~1 GB (32M reached 5.5 GB and was killed by a 2 GB
# address-space limit with an inequality between two of the streams).
MAX_PARTIAL_TUPLES = 4_000_000

class _Stream:
    """One input: its reader, read-ahead (pending) and W-join buffer."""

    def __init__(self, it: Iterable[pa.RecordBatch], schema: pa.Schema, time_col: str, name: str, dtype: type):
        self.it = iter(it)
        self.schema = schema
        self.time_col = time_col
        self.name = name
        self.done = False
        self.rows_read = 0
        self.batch_rows = 0  # the largest input batch so far: the read-ahead kept past a chunk
        self.last_t = None
        empty_t = np.empty(0, dtype)
        self.pend = pa.Table.from_batches([], schema=schema)  # schema.empty_table() imports pandas
        self.pend_t, self.pend_h, self.pend_row = empty_t, np.empty(0, np.uint64), np.empty(0, np.int64)
        self.buf = self.pend
        self.buf_t, self.buf_h, self.buf_row = empty_t, np.empty(0, np.uint64), np.empty(0, np.int64)


def wjoin(streams: Sequence[Iterable[pa.RecordBatch]], schemas: Sequence[pa.Schema], params: WJoinParams, *,
          stats: WJoinStats | None = None, sources: Sequence[str] | None = None,
          output_rows: int = DEFAULT_OUTPUT_ROWS, trace: list | None = None) -> Iterator[pa.RecordBatch]:
    """Join n time-ordered streams of record batches; yield batches of ``plan.out_schema``.

    Lazy: input batches are pulled as the join advances; memory holds the W-join buffers plus
    about one input batch per stream. ``trace`` (diagnostics, tests): a list that receives, per
    chunk, ``(arrival streams, arrival row ids, [(row ids dropped, arrival index) per stream])``.
    """
    plan = make_plan(schemas, params, sources=sources)
    return _run(plan, streams, schemas, params, stats if stats is not None else WJoinStats(), sources, output_rows,
                trace)


def _run(plan: Plan, streams, schemas, params: WJoinParams, stats: WJoinStats, sources, output_rows: int, trace):
    n = plan.n
    sources = list(sources) if sources else list(params.aliases)
    st = [_Stream(it, sch, params.time[i], sources[i], plan.dtype) for i, (it, sch) in enumerate(zip(streams, schemas))]
    stats.aliases = params.aliases
    stats.method = "hash" if plan.hash_terms is not None else "nested-loop"
    stats.records_read = [0] * n
    stats.peak_buffered = [0] * n
    stats.peak_held = [0] * n
    stats.timeline = BoundedSeries(("records_read", "tuples") + tuple(f"buffered_{a}" for a in params.aliases))
    neg, pos = (INT_NEG, INT_POS) if plan.dtype is np.int64 else (-np.inf, np.inf)
    latest = np.full(n, neg, dtype=plan.dtype)
    block: list = [None]  # arrivals per block, as the last split chose (see _chunk)
    t_start = time.perf_counter()

    def load(s: _Stream, i: int) -> None:
        for batch in s.it:
            if batch.num_rows == 0:
                continue
            tab = pa.Table.from_batches([batch])
            if tab.schema.names != s.schema.names:
                tab = tab.select(s.schema.names)
            if not tab.schema.equals(s.schema):
                tab = tab.cast(s.schema)
            t = N.times(tab.column(s.time_col), plan.kind, s)
            prev = s.last_t
            if (prev is not None and t[0] < prev) or (t.shape[0] > 1 and np.any(t[1:] < t[:-1])):
                d = np.flatnonzero(np.diff(np.concatenate([[prev if prev is not None else t[0]], t])) < 0)[0]
                raise InputError(f"{s.name}: time column {s.time_col!r} decreases at row {s.rows_read + d}; "
                                 "W-join needs every stream in non-decreasing time order (sort it first)")
            s.last_t = t[-1]
            for c in plan.float_cols[i]:
                N.refuse_nan(tab.column(c), c, s)
            h = hash_terms(tab, plan.hash_terms[i]) if plan.hash_terms is not None else np.empty(0, np.uint64)
            rows = np.arange(s.rows_read, s.rows_read + tab.num_rows, dtype=np.int64)
            s.rows_read += tab.num_rows
            s.batch_rows = max(s.batch_rows, tab.num_rows)
            s.pend = pa.concat_tables([s.pend, tab]) if s.pend.num_rows else tab
            s.pend_t = np.concatenate([s.pend_t, t]) if s.pend_t.shape[0] else t
            s.pend_h = np.concatenate([s.pend_h, h])
            s.pend_row = np.concatenate([s.pend_row, rows])
            return
        s.done = True

    def top_up(s: _Stream, i: int, frontier) -> None:
        """Read ``s`` until it holds records past ``frontier`` and at least one input batch that
        no chunk has taken: every stream then brings about one batch to the next chunk. Loading
        only the streams at the frontier gave chunks of about a batch divided among the streams
        (8192-row batches: 4x the chunks of 65536-row ones, twice the time of a 4-way join of 1M
        records per stream, each chunk rebuilding its hash chains over the buffers). Held: the
        buffer plus less than two batches."""
        while not s.done and (s.pend_t.shape[0] == 0 or s.pend_t.shape[0] < s.batch_rows
                              or (frontier is not None and s.pend_t[-1] <= frontier)):
            load(s, i)

    sink = OutputBatch(plan.out_schema, output_rows)  # the output batch being filled
    for i, s in enumerate(st):  # prime every stream
        top_up(s, i, None)
    while True:
        for i, s in enumerate(st):
            if s.done and s.pend_t.shape[0] == 0:
                latest[i] = pos  # exhausted: no later record of it can join
        live = [s for s in st if not s.done]
        if live:
            frontier = min(s.pend_t[-1] for s in live)
            takes = [int(np.searchsorted(s.pend_t, frontier, "left")) for s in st]
        else:
            takes = [s.pend_t.shape[0] for s in st]
        capped = cap_takes(st, takes, CHUNK_ARRIVALS)
        if capped is not None:
            takes = capped
        for i, s in enumerate(st):
            held = s.buf_t.shape[0] + s.pend_t.shape[0]
            stats.peak_held[i] = max(stats.peak_held[i], held)
        if sum(takes):
            for k in _chunk(plan, st, takes, latest, neg, pos, stats, sink, trace, block):
                stats.tuples += k  # a piece never straddles a multiple of output_rows tuples
                if sink.n == output_rows:
                    yield sink.flush()
            stats.timeline.append([sum(s.rows_read for s in st), stats.tuples] + [s.buf_t.shape[0] for s in st])
        if capped is not None:
            continue  # the rest of the arrivals up to the frontier first
        if not live:
            break
        for i, s in enumerate(st):
            top_up(s, i, frontier)
    if sink.n:
        yield sink.flush()
    for i, s in enumerate(st):
        stats.records_read[i] = s.rows_read
    stats.join_seconds += time.perf_counter() - t_start


def _chunk(plan: Plan, st: list[_Stream], takes: list[int], latest: np.ndarray, neg, pos, stats: WJoinStats,
           sink: OutputBatch, trace: list | None = None, block: list | None = None) -> Iterator[int]:
    """The output of one chunk of arrivals, block by block, gathered into ``sink`` piece by
    piece (yields each piece's tuples; the caller flushes a full ``sink`` before the next); the
    buffers and the purge pointers are updated when the generator is exhausted (the caller
    drains it before the next chunk)."""
    n = plan.n
    stats.chunks += 1
    comb_tab, comb_t, comb_h, comb_row, base = [], [], [], [], np.zeros(n, np.int64)
    final_rank = np.full(n, -1, np.int64)
    for i, s in enumerate(st):
        k = takes[i]
        base[i] = s.buf_t.shape[0]
        comb_t.append(np.concatenate([s.buf_t, s.pend_t[:k]]).astype(plan.dtype, copy=False))
        comb_h.append(np.concatenate([s.buf_h, s.pend_h[:k]]))
        comb_row.append(np.concatenate([s.buf_row, s.pend_row[:k]]))
        comb_tab.append(pa.concat_tables([s.buf, s.pend.slice(0, k)]).combine_chunks())
    # arrival order: by time, then stream number, then position; pe[j][a] = records of stream j
    # that arrived before arrival a (buffer end for a), for the NLW-join's time ranges (a hash probe
    # bounds its walk by the arrival's time and the streams' order instead); ranks[i]: stream i's
    # arrival indices in order (its chunk records')
    arr_s, arr_pos, arr_t, pe, rank = arrivals([comb_t[i][base[i]:] for i in range(n)], base,
                                               with_pe=plan.hash_terms is None)
    ranks = np.split(rank, np.cumsum(takes[:-1]))
    for j in range(n):
        if st[j].done and takes[j] == st[j].pend_t.shape[0] and takes[j] > 0:
            final_rank[j] = ranks[j][-1]
    slack = 0.0
    if plan.dtype is np.float64:
        scale = max(float(np.max(np.abs(arr_t))) if arr_t.shape[0] else 0.0, float(np.max(plan.dist)))
        slack = 1e-12 * max(scale, 1.0)
    buckets: dict = {}
    pair_buckets: dict = {}
    # Arrivals in blocks, in arrival order: partial tuples of different arrivals never meet, so
    # a block bounds the intermediate results and the output held at once by what its arrivals
    # form. A chunk is one block unless a level of it would exceed SPLIT_TUPLES partial tuples:
    # then the block is halved, down to single arrivals.
    # ``block[0]``: the block size (arrivals) the last split chose, kept for the next chunks so
    # that a chunk of similar data is not formed once in full only to be cut again.
    block = block if block is not None else [None]
    size = block[0] or max(arr_s.shape[0], 1)
    todo = [(b, min(b + size, arr_s.shape[0])) for b in reversed(range(0, arr_s.shape[0], size))]
    while todo:
        a0, a1 = todo.pop()
        groups = []
        try:
            for i in range(n):
                # the block's arrivals of stream i: consecutive chunk records q0..q1-1 of it
                q0, q1 = (0, takes[i]) if a1 - a0 == arr_s.shape[0] else np.searchsorted(ranks[i], (a0, a1))
                if q1 > q0:
                    res = _expand(plan, i, ranks[i][q0:q1], base[i] + q0, comb_t, comb_h, comb_tab, pe, buckets, slack,
                                  pair_buckets, can_split=a1 - a0 > 1)
                    if res is not None:
                        groups.append(res)
                if not todo:  # the chunk's last block: the key indexes of the streams no later one probes
                    done = {j for j in range(n) if max(k for k in range(n) if k != j) == i}
                    for d in (buckets, pair_buckets):
                        for key in [k for k in d if k[0] == "index" and k[1] in done]:
                            del d[key]
        except _Split as e:
            # Blocks sized from what this one would have formed (the key indexes hold for the
            # whole chunk: probes need no order)
            size = max(1, min((a1 - a0) // 2, int((a1 - a0) * SPLIT_TUPLES / (2 * max(e.args[0], 1)))))
            block[0] = size
            todo += [(b, min(b + size, a1)) for b in reversed(range(a0, a1, size))]
            stats.block_splits += 1
            continue
        if not groups:
            continue
        a_idx = np.concatenate([g[0] for g in groups])
        members = [np.concatenate([g[1][j] for g in groups]) for j in range(n)]
        del groups
        if not a_idx.shape[0]:
            continue
        o = np.lexsort(tuple(members[j] for j in reversed(range(n))) + (a_idx,))
        del a_idx
        for j in range(n):
            members[j] = members[j][o]
        del o
        # Gathered one piece at a time (the block's tuples are held as row numbers only), cut
        # where the output batch is full.
        r0, total = 0, members[0].shape[0]
        while r0 < total:
            r1 = min(total, r0 + sink.rows - sink.n)
            c = 0
            for j in range(n):
                for name, _ in plan.out_names[j]:
                    sink.put(c, comb_tab[j].column(name), members[j][r0:r1])
                    c += 1
            for j in range(len(plan.id_names)):
                sink.put(c, comb_row[j], members[j][r0:r1])
                c += 1
            sink.advance(r1 - r0)
            yield r1 - r0
            r0 = r1
    # purge rule, replayed arrival by arrival
    offsets = np.zeros(n + 1, np.int64)
    offsets[1:] = np.cumsum([c.shape[0] for c in comb_t])
    ptr = np.zeros(n, np.int64)
    peak = np.array(stats.peak_buffered, np.int64)
    drop_at = np.full(int(offsets[-1]) if trace is not None else 0, -1, np.int64)
    stats.peak_buffered_total = int(purge_walk(
        arr_s, arr_t.astype(plan.dtype), np.concatenate(comb_t), offsets, base, ptr, latest,
        plan.dist, plan.dtype(slack), final_rank, drop_at, peak, stats.peak_buffered_total,
        plan.dtype(neg), plan.dtype(pos)))
    if trace is not None:
        rows = np.array([comb_row[s_][p_] for s_, p_ in zip(arr_s, arr_pos)], np.int64)
        dropped = []
        for j in range(n):
            d = drop_at[offsets[j]:offsets[j + 1]]
            dropped.append((comb_row[j][d >= 0], d[d >= 0]))
        trace.append((arr_s.copy(), rows, dropped))
    stats.peak_buffered = [int(x) for x in peak]
    for i, s in enumerate(st):
        k, p = takes[i], int(ptr[i])
        s.buf = comb_tab[i].slice(p)
        s.buf_t, s.buf_h, s.buf_row = comb_t[i][p:], comb_h[i][p:], comb_row[i][p:]
        s.pend = s.pend.slice(k)
        s.pend_t, s.pend_h, s.pend_row = s.pend_t[k:], s.pend_h[k:], s.pend_row[k:]


def _pair_probe(plan: Plan, j: int, bound: list[int], conjs: Sequence[X.Node]) -> list[tuple[X.Col, X.Col]]:
    """Equality conjuncts ``Sj.x == Sb.y`` (b already bound) usable as hash probes into stream
    j, as (column of j, column of b) pairs in a fixed order."""
    out = []
    for c in conjs:
        eq = X.equality_terms(c)
        if not eq:
            continue
        l, r = eq
        if l.stream == j and r.stream in bound:
            out.append((l, r))
        elif r.stream == j and l.stream in bound:
            out.append((r, l))
    return sorted(out, key=lambda p: (p[0].name, p[1].stream, p[1].name))


def _too_large(plan: Plan, i: int, j: int, bound: list[int], total: int, probed: bool = False) -> UsageError:
    windows = ", ".join(f"{plan.aliases[b]},{plan.aliases[j]} <= {plan.wmat[b, j]:g}" for b in bound
                        if np.isfinite(plan.wmat[b, j])) or "none direct (a chain of windows)"
    if probed:
        return UsageError(
            f"wjoin: stream {plan.aliases[j]} would give more than {MAX_PARTIAL_TUPLES:,} partial tuples (the "
            f"limit) for one {plan.aliases[i]} arrival; within its window bounds ({windows}) too many records share "
            f"the equality values that link it to {', '.join(plan.aliases[b] for b in bound)}: narrow the window "
            f"or add a more selective equality to {param.where}")
    return UsageError(
        f"wjoin: stream {plan.aliases[j]} would give {total:,} partial tuples for one {plan.aliases[i]} "
        f"arrival (limit {MAX_PARTIAL_TUPLES:,}); its window bounds ({windows}) hold too many records and no "
        f"equality links it to {', '.join(plan.aliases[b] for b in bound)}: narrow the window or add an "
        f"equality such as {plan.aliases[j]}.col = {plan.aliases[bound[0]]}.col to {param.where}")


def _band(terms, comb_tab, mem, cache: dict) -> Band:
    """The values a level's band conjuncts compare: per candidate record of the probed stream
    (computed once per chunk, kept in ``cache``) and per partial tuple of the bound one."""
    def values(s, col, adj):
        key = ("band", s, col, adj)
        if key not in cache:
            c = comb_tab[s].column(col)
            v = X.to_numpy(c)
            if adj is not None:
                v = v + adj[1] if adj[0] == "+" else v - adj[1]
            if c.null_count:
                v = np.where(X.to_numpy(X.call("is_null", c)), np.nan, v)
            cache[key] = v
        return cache[key]

    return Band([BAND_OPS[t.op] for t in terms], [values(*t.cand) for t in terms],
                [values(*t.par)[mem[t.par[0]]] for t in terms])


def _int_period(t: np.ndarray, d) -> tuple[np.ndarray, np.ndarray]:
    """[t - d, t + d] for int64 times, in int64 (float64 would round times beyond 2**53, such as
    nanoseconds since 1970, by up to 128 ns), saturating at the int64 range: no bound there."""
    lo, hi = t - d, t + d  # wraps on overflow (arrays do not warn)
    if d > 0:
        np.copyto(lo, INT_NEG, where=lo > t)
        np.copyto(hi, INT_POS, where=hi < t)
    return lo, hi


class _Split(Exception):
    """A block of arrivals would form too many partial tuples at once: halve it."""


def _expand(plan: Plan, i: int, sel: np.ndarray, first: int, comb_t, comb_h, comb_tab, pe, buckets, slack,
            pair_buckets: dict | None = None, can_split: bool = False):
    """Left-deep expansion of the arrivals ``sel`` of stream ``i``, its records ``first``,
    ``first + 1``, ... of the buffer+chunk: (arrival ids, members per stream).

    Each level binds one more stream j: the HW-join probes stream j's key index (the full
    equality class's hash); otherwise an equality conjunct between j and a bound stream becomes a hash probe
    (``_pair_probe``), and only without one are the time ranges enumerated. Every conjunct is
    applied as soon as the streams it names are bound."""
    n = plan.n
    a_idx = sel
    last = first + sel.shape[0]
    mem: dict[int, np.ndarray] = {i: np.arange(first, last, dtype=np.int64)}
    tim: dict[int, np.ndarray] = {i: comb_t[i][first:last]}
    hashed = plan.hash_terms is not None
    h = comb_h[i][first:last] if hashed else None
    bound = [i]

    def apply(conjs):
        nonlocal a_idx, h
        if not conjs or a_idx.shape[0] == 0:
            return
        node = X.conjoin(conjs)
        m = N.mask_numpy(node, numpy_column, a_idx.shape[0])
        if m is None:
            m = X.mask(node, lambda s, c: N.take(comb_tab[s].column(c), mem[s]), a_idx.shape[0])
        keep(m)

    def numpy_column(s, c):
        key = ("values", s, c)  # per chunk (``buckets`` is the chunk's cache)
        if key not in buckets:
            buckets[key] = N.values(comb_tab[s].column(c))
        v = buckets[key]
        return None if v is None else v[mem[s]]

    def keep(m):
        nonlocal a_idx, h
        a_idx = a_idx[m]
        for k in mem:
            mem[k] = mem[k][m]
            tim[k] = tim[k][m]
        if h is not None:
            h = h[m]

    apply(plan.level_conj[i][0])
    for lvl, j in enumerate(plan.orders[i], start=1):
        if a_idx.shape[0] == 0:
            return None
        lo = hi = None
        for b in bound:
            d = plan.dist[b, j]
            l_, h_ = (tim[b] - d - slack, tim[b] + d + slack) if plan.dtype is np.float64 else _int_period(tim[b], d)
            lo = l_ if lo is None else np.maximum(lo, l_)
            hi = h_ if hi is None else np.minimum(hi, h_)
        probes = [] if hashed or pair_buckets is None else _pair_probe(plan, j, bound, plan.level_conj[i][lvl])
        limit = SPLIT_TUPLES if can_split else MAX_PARTIAL_TUPLES  # a probe stops past it (then split or refuse)
        band = _band(plan.level_band[i][lvl], comb_tab, mem, buckets) if plan.level_band[i][lvl] else None
        if hashed:
            if ("index", j) not in buckets:  # one per probed stream and chunk, shared by its probes
                buckets[("index", j)] = KeyIndex(comb_h[j], comb_t[j])
            parent, cand = buckets[("index", j)].probe(h, lo, hi, tim[i], j > i, limit, band)
        elif probes:
            key = ("index", j, tuple(p[0].name for p in probes))
            if key not in pair_buckets:
                pair_buckets[key] = KeyIndex(hash_terms(comb_tab[j], [p[0] for p in probes]), comb_t[j])
            hp = hash_values([(N.take(comb_tab[cb.stream].column(cb.name), mem[cb.stream]), cj.kind) for cj, cb in probes],
                             a_idx.shape[0])
            parent, cand = pair_buckets[key].probe(hp, lo, hi, tim[i], j > i, limit, band)
        else:
            start = np.searchsorted(comb_t[j], lo, "left").astype(np.int64)
            end = np.minimum(np.searchsorted(comb_t[j], hi, "right"), pe[j][a_idx]).astype(np.int64)
            total = int(np.maximum(end - start, 0).sum())
            if band is not None:  # the band conjuncts filter the ranges before any pair is held
                parent, cand = range_probe(start, end, band, limit)
                if parent.shape[0] > limit and not can_split:
                    raise _too_large(plan, i, j, bound, total)
                total = 0
            if total > SPLIT_TUPLES and can_split:
                raise _Split(total)
            if total > MAX_PARTIAL_TUPLES:
                raise _too_large(plan, i, j, bound, total)
            if band is None:
                parent, cand = expand_ranges(start, end)
        if parent.shape[0] > SPLIT_TUPLES and can_split:
            raise _Split(parent.shape[0])
        if parent.shape[0] > MAX_PARTIAL_TUPLES:  # a probe that stopped at the limit
            raise _too_large(plan, i, j, bound, MAX_PARTIAL_TUPLES, probed=True)
        a_idx = a_idx[parent]
        for kk in mem:
            mem[kk] = mem[kk][parent]
            tim[kk] = tim[kk][parent]
        if h is not None:
            h = h[parent]
        mem[j] = cand
        tim[j] = comb_t[j][cand]
        if plan.dtype is np.float64:  # exact direct bounds, in the arithmetic SQL uses
            m = np.ones(a_idx.shape[0], bool)
            for b in bound:
                if np.isfinite(plan.wmat[b, j]):
                    m &= np.abs(tim[j] - tim[b]) <= plan.wmat[b, j]
            if not m.all():
                keep(m)
        bound.append(j)
        apply(plan.level_conj[i][lvl])
    if a_idx.shape[0] == 0:
        return None
    return a_idx, [mem[j] for j in range(n)]


__all__ = ["wjoin", "DEFAULT_OUTPUT_ROWS", "SPLIT_TUPLES", "MAX_PARTIAL_TUPLES"]
