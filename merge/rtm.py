"""RTM: the R-tree merge (docs/semantics.md section 5) as a partition-level iterator.

``rtm_merge(a_batches, source, params)`` reads A in windows of N records (arrival order) and,
for each window, asks ``source`` (a ``smerge.merge.range_source.RangeSource``, e.g.
``smerge.transport.flight_client.IndexClient`` or ``smerge.index.LocalSource``) for the B
records in the window's eps-box, N at a time. It yields batches of pairs (layout:
``merge.output``). B is an indexed relation, not consumed: a B record may pair with A records
of several windows; each A record pairs at most once.

Page mode (the default) sweeps each window B against window A until a sweep pairs nothing
(kappa_max's rule: one sweep pairs only one record of a run of MATCHing keys) and refills
window B while a remaining A key plus eps is not before window B's last key. With eps = 0 it
pairs, per A window and key, min(A records of the window, B records) with that key: the most
possible. ``symdiff`` mode is the paper's: one sweep per window B and the paper's cursor rule.

Memory: one A window, the current window B and the pairs of one A window, plus a bitmap of
|B| booleans recording which B records were ever paired (for ``b_unmatched``).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa

from smerge.errors import KeyNaNError
from smerge.merge import _kernel
from smerge.merge.keys import check_key_compat, key_matrix, nan_rows
from smerge.merge.arrays import int64_array
from smerge.merge.output import empty_batch, pair_batch, pair_schema
from smerge.merge.range_source import ROW_ID_COLUMN, Box, RangeSource
from smerge.merge.rtm_params import RTMParams
from smerge.merge.stats import MergeStats, ReportWindows

UnmatchedSink = Callable[[str, pa.RecordBatch], None]
FIRST_FETCH_WINDOWS = 4  # page mode: an A window's first request asks for up to this many windows B
LOOKAHEAD_WINDOWS = 1  # A windows read (and their first range requests announced) ahead of the sweep


class _Fetcher:
    """Window B for one A window: the first N of range(box_A), then refills (spec step 4).

    Windows come with their key matrix (computed once per transferred page, not per window).
    """

    def __init__(self, source: RangeSource, box: Box, params: RTMParams, keys_b: tuple[str, ...], clock: list):
        self.source, self.box, self.params, self.keys_b, self.clock = source, box, params, keys_b, clock
        self.n = params.window_size
        self.buf: pa.Table | None = None
        self.buf_keys: np.ndarray | None = None
        self.pos = 0
        self.token: str | None = None
        self.started = False
        self.fetch_limit = first_fetch_rows(params)
        self.c_lo: np.ndarray | None = None  # bounding box C of every B record fetched so far
        self.c_hi: np.ndarray | None = None
        self.queries = 0
        self.fetched = 0
        self.windows = 0

    def _timed(self, fn):
        t0 = time.perf_counter()
        try:
            return fn()
        finally:
            self.clock[0] += time.perf_counter() - t0
            self.queries += 1

    def _keys(self, table: pa.Table) -> np.ndarray:
        if table.num_rows == 0:
            return np.empty((0, len(self.keys_b)), np.float64)
        return np.ascontiguousarray(key_matrix(table, self.keys_b))

    def _track(self, keys: np.ndarray) -> None:
        if keys.shape[0] == 0:
            return
        lo, hi = keys.min(axis=0), keys.max(axis=0)
        self.c_lo = lo if self.c_lo is None else np.minimum(self.c_lo, lo)
        self.c_hi = hi if self.c_hi is None else np.maximum(self.c_hi, hi)

    def _page_mode_next(self) -> tuple[pa.Table, np.ndarray] | None:
        have = 0 if self.buf is None else self.buf.num_rows - self.pos
        if have < self.n and (not self.started or self.token is not None):
            limit = self.fetch_limit
            table, self.token = self._timed(lambda: self.source.range_query(self.box, limit=limit, token=self.token))
            keys = self._keys(table)
            self.fetched += table.num_rows
            self.started = True
            self.fetch_limit = min(max(self.n, 2 * self.fetch_limit), max(self.n, self.params.fetch_rows))
            if self.buf is not None and have:
                self.buf = pa.concat_tables([self.buf.slice(self.pos), table])
                self.buf_keys = np.concatenate([self.buf_keys[self.pos:], keys])
            else:
                self.buf, self.buf_keys = table, keys
            self.pos = 0
        if self.buf is None:
            return None
        out = self.buf.slice(self.pos, self.n), self.buf_keys[self.pos:self.pos + self.n]
        self.pos += out[0].num_rows
        return out

    def next_window(self) -> tuple[pa.Table, np.ndarray] | None:
        """The next window B (sorted by key, row id) and its keys; an empty or no window when none."""
        if self.params.refill == "page":
            out = self._page_mode_next()
        else:
            if not self.started:
                table, _ = self._timed(lambda: self.source.range_query(self.box, limit=self.n))
                self.started = True
            else:
                c = Box(tuple(self.c_lo.tolist()), tuple(self.c_hi.tolist()))
                table, _ = self._timed(lambda: self.source.symdiff_query(c, self.box, limit=self.n))
            self.fetched += table.num_rows
            out = table, self._keys(table)
            self._track(out[1])
        if out is not None and out[0].num_rows:
            self.windows += 1
        return out


def first_fetch_rows(params: RTMParams) -> int:
    """Records asked for by an A window's first range request (page mode: up to 4N, so that most
    windows need one round trip; symdiff mode: N)."""
    if params.refill != "page":
        return params.window_size
    return max(params.window_size, min(FIRST_FETCH_WINDOWS * params.window_size, params.fetch_rows))


def _box_of(k: np.ndarray, eps: np.ndarray) -> Box | None:
    """box_A: per key [min - eps, max + eps] over the window's non-NaN keys (None: no such key)."""
    ok = ~nan_rows(k)
    if not ok.any():
        return None
    kk = k if ok.all() else k[ok]
    cols = [kk[:, j] for j in range(kk.shape[1])]
    return Box(tuple(float(c.min() - e) for c, e in zip(cols, eps)), tuple(float(c.max() + e) for c, e in zip(cols, eps)))


def _may_reach(ak: np.ndarray, eps: np.ndarray, last: np.ndarray) -> bool:
    """Whether some A key may MATCH a B key at or after ``last`` in key order (a later window B
    of the same range): some row's upper corner ``ak + eps`` is not before ``last``."""
    if not ak.shape[0]:
        return False
    lead = ak[-1, 0] + eps[0]  # ak is sorted: its last row has the largest leading key
    if lead != last[0] or ak.shape[1] == 1:
        return bool(lead >= last[0])
    ak = ak[np.searchsorted(ak[:, 0], ak[-1, 0], side="left"):]  # only these rows tie on the leading key
    up = ak + eps
    after, undecided = np.zeros(up.shape[0], np.bool_), np.ones(up.shape[0], np.bool_)
    for j in range(up.shape[1]):
        after |= undecided & (up[:, j] > last[j])
        undecided &= up[:, j] == last[j]
    return bool((after | undecided).any())


def _a_windows(batches: Iterator[pa.RecordBatch], schema: pa.Schema, n: int,
               clock: list) -> Iterator[pa.Table]:
    """A in windows of exactly N records (the last may be shorter), arrival order."""
    held: list[pa.RecordBatch] = []
    count = 0
    while True:
        t0 = time.perf_counter()
        batch = next(batches, None)
        clock[0] += time.perf_counter() - t0
        if batch is None:
            break
        if batch.schema != schema:
            batch = pa.RecordBatch.from_arrays([batch.column(c) for c in schema.names], schema=schema) \
                if batch.schema.names == schema.names else batch.select(schema.names).cast(schema)
        held.append(batch)
        count += batch.num_rows
        while count >= n:
            t = pa.Table.from_batches(held, schema=schema)
            yield t.slice(0, n)
            rest = t.slice(n)
            held = rest.to_batches()
            count = rest.num_rows
    if count:
        yield pa.Table.from_batches(held, schema=schema)


def rtm_merge(
    a_batches: Iterable[pa.RecordBatch],
    source: RangeSource,
    params: RTMParams,
    *,
    schema_a: pa.Schema,
    schema_b: pa.Schema,
    b_records: int,
    stats: MergeStats | None = None,
    unmatched: UnmatchedSink | None = None,
    a_first_row: int = 0,
    source_a: str | None = None,
    b_paired: np.ndarray | None = None,
    kappa_max_b: Callable[[], tuple[np.ndarray, np.ndarray]] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Merge A against the indexed B with RTM; yield batches of pairs (docs/semantics.md sections 2 and 5).

    ``schema_b`` is B's schema (without the row id column); ``b_records`` its record count.
    ``unmatched("a", batch)`` receives A's unmatched records (B's unmatched records are those
    never paired: ``b_paired`` is the caller's bitmap, marked in place). ``kappa_max_b`` returns
    all of B's (keys, row ids) to compute kappa_max at the end (holds all keys in memory).
    ``stats`` is complete when the iterator is exhausted.
    """
    t_start = time.perf_counter()
    stats = stats if stats is not None else MergeStats("rtm")
    stats.algorithm = "rtm"
    stats.params = params.as_dict()
    check_key_compat(schema_a, params.keys.a, schema_b, params.keys.b, source_a=source_a)
    out_schema = pair_schema(schema_a, schema_b, with_ids=params.with_ids)
    b_names = schema_b.names
    n, d = params.window_size, len(params.keys.a)
    eps = np.asarray(params.eps, dtype=np.float64)
    if b_paired is None:
        b_paired = np.zeros(b_records, dtype=np.bool_)
    report = ReportWindows(n)
    a_wait, b_wait = [0.0], [0.0]
    yield_seconds = 0.0
    next_row = a_first_row
    a_keys_all: list[np.ndarray] = []
    queries = fetched = windows = 0
    ma, mb = np.empty(n, np.bool_), np.empty(n, np.bool_)
    idx = np.arange(n, dtype=np.int64)  # positions in a window: the "row ids" given to sweep_until_dry
    page_mode = params.refill == "page"
    pa_, pb_ = np.empty(n, np.int64), np.empty(n, np.int64)

    def emit_a(window: pa.Table, pos: np.ndarray, rows: np.ndarray) -> None:
        if unmatched is not None and pos.size:
            batch = window.take(int64_array(pos)).combine_chunks().to_batches()
            batch = batch[0] if batch else empty_batch(schema_a)
            if params.with_ids:
                batch = batch.append_column("a_row", int64_array(rows))
            unmatched("a", batch)

    prefetch = getattr(source, "prefetch", None)
    first_limit = first_fetch_rows(params)
    windows_b = 0
    it = _a_windows(iter(a_batches), schema_a, n, a_wait)
    ahead: deque[tuple[pa.Table, np.ndarray, Box | None]] = deque()

    def read_ahead() -> None:
        """Read A windows ahead (their first queries overlap the sweeps before them)."""
        while len(ahead) <= LOOKAHEAD_WINDOWS:
            nxt = next(it, None)
            if nxt is None:
                return
            nk = key_matrix(nxt, params.keys.a)
            nbox = _box_of(nk, eps)
            if prefetch is not None and nbox is not None and ahead:  # the first window is asked at once
                prefetch(nbox, limit=first_limit)
            ahead.append((nxt, nk, nbox))

    read_ahead()
    while ahead:
        window, k, box = ahead.popleft()
        read_ahead()
        windows += 1
        w = window.num_rows
        rows = np.arange(next_row, next_row + w, dtype=np.int64)
        next_row += w
        bad = nan_rows(k)
        pos = np.arange(w, dtype=np.int64)
        if bad.any():
            first_bad = int(np.argmax(bad))
            if params.nan_keys == "error":
                col = next(c for j, c in enumerate(params.keys.a) if np.isnan(k[first_bad, j]))
                raise KeyNaNError(col, int(rows[first_bad]), source_a)
            stats.a_nan_keys += int(bad.sum())
            emit_a(window, pos[bad], rows[bad])
            k, pos = k[~bad], pos[~bad]
        if kappa_max_b is not None:
            a_keys_all.append(k)
        order = _kernel.argsort_keys(np.ascontiguousarray(k), rows[pos])
        ak = np.ascontiguousarray(k[order])
        apos = pos[order]
        na = ak.shape[0]
        matched_a: list[np.ndarray] = []
        b_parts: list[pa.Table] = []
        if na:
            # ``box`` (computed over the window's non-NaN keys) is the box announced to ``prefetch``
            fetcher = _Fetcher(source, box, params, params.keys.b, b_wait)
            got = fetcher.next_window()
            while got is not None and got[0].num_rows and na:
                wb, bk = got
                nb = bk.shape[0]
                ma[:na] = False
                if page_mode:  # the sweep repeated until dry (it pairs one record of a run of MATCHing keys at a time)
                    m = _kernel.sweep_until_dry(ak, idx[:na], bk, idx[:nb], eps, pa_, pb_)
                    ma[pa_[:m]] = True
                else:
                    mb[:nb] = False
                    m, i, _j = _kernel.sweep(ak, na, bk, nb, eps, ma, mb, pa_, pb_)
                if m:
                    matched_a.append(apos[pa_[:m]].copy())
                    b_parts.append(wb.take(pa.array(pb_[:m].copy())))
                    keep = ~ma[:na]
                    ak, apos = np.ascontiguousarray(ak[keep]), apos[keep]
                if page_mode:  # refill while a remaining A record may MATCH a B record after this window B
                    if not _may_reach(ak, eps, bk[-1]):
                        break
                elif i >= na:  # cursor a reached the end of window A first: next A window
                    break
                na = ak.shape[0]
                got = fetcher.next_window()  # cursor b reached the end of window B: refill
            queries += fetcher.queries
            fetched += fetcher.fetched
            windows_b += fetcher.windows
        left = apos
        m_total = sum(x.size for x in matched_a)
        if m_total:
            a_pos_all = np.concatenate(matched_a)
            b_tab = pa.concat_tables(b_parts) if len(b_parts) > 1 else b_parts[0]
            b_rows = b_tab.column(ROW_ID_COLUMN).to_numpy().astype(np.int64)
            b_paired[b_rows] = True
            a_part = window.take(int64_array(a_pos_all)).combine_chunks().to_batches()[0]
            b_part = b_tab.select(b_names).combine_chunks()
            if b_part.schema != schema_b:
                b_part = b_part.cast(schema_b)
            b_batch = b_part.to_batches()[0]
            out = pair_batch(out_schema, a_part, b_batch, rows[a_pos_all] if params.with_ids else None,
                             b_rows if params.with_ids else None)
            stats.matched += m_total
            t0 = time.perf_counter()
            yield out
            yield_seconds += time.perf_counter() - t0
        stats.a_unmatched += left.size
        emit_a(window, np.sort(left), rows[np.sort(left)])
        report.add(m_total, w)
    stats.a_unmatched += stats.a_nan_keys
    report.finish()
    stats.kappas = report.kappas
    stats.passes = windows
    stats.a_records = next_row - a_first_row
    stats.b_records = b_records
    paired = int(np.count_nonzero(b_paired))
    stats.b_unmatched = b_records - paired
    stats.extra.update({"a_windows": windows, "b_windows": windows_b, "queries": queries, "b_fetched": fetched,
                        "b_paired": paired})
    if kappa_max_b is not None:
        from smerge.merge.ceiling import kappa_figures

        ka = np.concatenate(a_keys_all) if a_keys_all else np.empty((0, d))
        ra = np.arange(ka.shape[0], dtype=np.int64)
        kb, rb = kappa_max_b()
        stats.set_kappa(kappa_figures(ka, ra, kb, rb, params.eps, stats.a_records))
    stats.check_accounting()
    stats.fetch_seconds = a_wait[0] + b_wait[0]
    stats.extra["fetch_b_seconds"] = b_wait[0]
    stats.merge_seconds = time.perf_counter() - t_start - a_wait[0] - b_wait[0] - yield_seconds


def rtm_merge_table(a: pa.Table, source: RangeSource, params: RTMParams, *, schema_b: pa.Schema, b_records: int,
                    **kw) -> pa.Table:
    """Convenience: merge an in-memory A; returns all pairs as one table (loads it all)."""
    batches = list(rtm_merge(a.to_batches(), source, params, schema_a=a.schema, schema_b=schema_b,
                             b_records=b_records, **kw))
    schema = pair_schema(a.schema, schema_b, with_ids=params.with_ids)
    return pa.Table.from_batches(batches or [empty_batch(schema)], schema=schema)
