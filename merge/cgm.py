"""CGM: the continuously generated data merge (docs/semantics.md section 3), as a partition-level iterator.

``cgm_merge(a_batches, b_batches, params)`` takes two iterators of ``pyarrow.RecordBatch``
(A and B in arrival order) and yields output batches of pairs (layout: ``merge.output``).
Memory is O(N + batch size) whatever the stream length: only the two windows, the records
read but not yet in a window, and the pairs not yet yielded are held. The passes run in the
compiled kernel (``merge._kernel.CGMPasses``, bound once to the windows and buffers); Python runs
once per input batch or output flush, and with adaptive K once per report window.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa

from smerge.errors import KeyNaNError
from smerge.merge import _kernel
from smerge.merge.adapt import DeltaController
from smerge.merge.ceiling import kappa_figures
from smerge.merge.keys import KeyedBatch, check_key_compat, key_columns, nan_rows
from smerge.merge.arrays import int64_array
from smerge.merge.output import RowStore, empty_batch, pair_batch, pair_schema
from smerge.merge.params import CGMParams
from smerge.merge.stats import MergeStats, ReportWindows

UnmatchedSink = Callable[[str, pa.RecordBatch], None]

_NEED_A, _NEED_B, _FULL, _ENDED, _WINDOW = 0, 1, 2, 3, 4
PASS_LOG = 4096


def _peek(it: Iterator[pa.RecordBatch]) -> tuple[pa.RecordBatch | None, Iterator[pa.RecordBatch]]:
    for first in it:
        def chain(first=first):
            yield first
            yield from it
        return first, chain()
    return None, iter(())


class _Gather:
    """The payload of one flush's pairs, gathered by the run's gather thread (``_Gatherer``)
    while the engine runs the next passes; ``result()`` waits for it and re-raises."""

    def __init__(self, fn: Callable[[], pa.RecordBatch]):
        self._fn, self._out, self._err = fn, None, None
        self._done = threading.Event()

    def run(self) -> None:
        try:
            self._out = self._fn()
        except BaseException as e:  # re-raised by result(), in the engine's thread
            self._err = e
        finally:
            self._done.set()

    def result(self) -> pa.RecordBatch:
        self._done.wait()
        if self._err is not None:
            raise self._err
        return self._out


class _Gatherer:
    """One thread that runs the flushes' gathers in turn (Arrow's take and numpy's release the
    GIL). One thread for the whole run, not one per flush: Arrow's allocator keeps a heap per
    thread, and a thread of its own reuses the pages of the output batches the writer has freed,
    where a new thread per flush faulted fresh ones in (about 15,000 page faults in a 1M-pair run)."""

    def __init__(self):
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, fn: Callable[[], pa.RecordBatch]) -> _Gather:
        job = _Gather(fn)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="smerge-gather", daemon=True)
            self._thread.start()
        self._q.put(job)
        return job

    def _run(self) -> None:
        while (job := self._q.get()) is not None:
            job.run()

    def close(self) -> None:
        if self._thread is not None:
            self._q.put(None)


# Pending keys are a key matrix (n, d) or a tuple of d columns (``merge.keys.key_columns``, read
# by the kernel as they are: no copy into a matrix).
def _klen(k) -> int:
    return k[0].shape[0] if isinstance(k, tuple) else k.shape[0]


def _kslice(k, lo: int, hi: int | None = None):
    return tuple(c[lo:hi] for c in k) if isinstance(k, tuple) else k[lo:hi]


def _kcol(k, j: int) -> np.ndarray:
    return k[j] if isinstance(k, tuple) else k[:, j]


def _ktake(k, mask: np.ndarray):
    return tuple(c[mask] for c in k) if isinstance(k, tuple) else k[mask]


class _Side:
    """One input stream: its iterator, records read but not yet in the window, its row store."""

    def __init__(self, name: str, batches: Iterator[pa.RecordBatch], schema: pa.Schema, keys: tuple[str, ...],
                 first_row: int, params: CGMParams, source: str | None, collect_keys: bool):
        self.name, self.batches, self.schema, self.keys = name, batches, schema, keys
        self.next_row = first_row
        self.params, self.source = params, source
        d = len(keys)
        self.pend_k = np.empty((0, d), dtype=np.float64)
        self.pend_r = np.empty(0, dtype=np.int64)
        self.exhausted = False
        self.store = RowStore(schema)
        self.records = 0
        self.nan_keys = 0
        self.nan_rows: list[np.ndarray] = []
        self.wait_seconds = 0.0
        self.all_keys: list[np.ndarray] | None = [] if collect_keys else None
        self.all_rows: list[np.ndarray] | None = [] if collect_keys else None
        self._bufs = [(np.empty((0, d), np.float64), np.empty(0, np.int64)) for _ in range(2)]
        self._turn = 0
        self._ids = [np.empty(0, np.int64) for _ in range(2)]  # row ids of a batch, in turn
        self._ids_turn = 0
        self._iota = np.empty(0, np.int64)  # 0, 1, 2, ...

    def pull(self, consumed: int) -> int:
        """Read one more batch into the pending records; returns the new pending offset (0)."""
        t0 = time.perf_counter()
        item = next(self.batches, None)
        self.wait_seconds += time.perf_counter() - t0
        batch, k, bad = item if isinstance(item, KeyedBatch) else (item, None, None)
        keep_k, keep_r = _kslice(self.pend_k, consumed), self.pend_r[consumed:]
        if batch is None:
            self.exhausted = True
            self.pend_k, self.pend_r = keep_k, keep_r
            return 0
        if batch.schema != self.schema:
            batch = pa.RecordBatch.from_arrays(list(batch.columns), schema=self.schema) \
                if batch.schema.names == self.schema.names else batch.cast(self.schema)
        n = batch.num_rows
        if k is None:
            k = key_columns(batch, self.keys)
        if bad is None:
            bad = nan_rows(k)
        r = self._row_ids(n)
        if bad.any():
            first_bad = int(np.argmax(bad))
            if self.params.nan_keys == "error":
                col = next(c for j, c in enumerate(self.keys) if np.isnan(_kcol(k, j)[first_bad]))
                raise KeyNaNError(col, int(r[first_bad]), self.source)
            self.nan_keys += int(bad.sum())
            self.nan_rows.append(r[bad])
            k, r = _ktake(k, ~bad), r[~bad]
        self.store.append(batch, self.next_row)
        self.next_row += n
        self.records += n
        if self.all_keys is not None:
            self.all_keys.append(np.column_stack(k) if isinstance(k, tuple) else k)
            self.all_rows.append(r)
        if _klen(keep_k):
            self.pend_k, self.pend_r = self._joined(keep_k, keep_r, k, r)
        else:
            self.pend_k, self.pend_r = k, r
        return 0

    def _row_ids(self, n: int) -> np.ndarray:
        """The row ids of the next ``n`` records, in one of two buffers used in turn: the
        pending records left over lie in the other one (or in a joined buffer), and a fresh array
        per batch would cost page faults on every megabyte. Fresh when every key is collected."""
        if self.all_rows is not None:
            return np.arange(self.next_row, self.next_row + n, dtype=np.int64)
        self._ids_turn ^= 1
        buf = self._ids[self._ids_turn]
        if buf.size < n:
            buf = self._ids[self._ids_turn] = np.empty(max(n, 2 * buf.size), np.int64)
        if self._iota.size < n:
            self._iota = np.arange(buf.size, dtype=np.int64)
        return np.add(self._iota[:n], self.next_row, out=buf[:n])

    def _joined(self, keep_k, keep_r: np.ndarray, k, r: np.ndarray):
        """The records left over followed by the batch's (keys: matrices or columns), as a key
        matrix in one of two buffers used in turn (not the one ``keep_k`` may lie in): a fresh
        array per batch costs page faults on every megabyte, reused ones do not."""
        d = len(self.keys)
        n0, n = _klen(keep_k), _klen(keep_k) + _klen(k)
        self._turn ^= 1
        bk, br = self._bufs[self._turn]
        if bk.shape[0] < n:
            bk = np.empty((max(n, 2 * bk.shape[0]), d), np.float64)
            br = np.empty(bk.shape[0], np.int64)
            self._bufs[self._turn] = (bk, br)
        for c in range(d):
            bk[:n0, c], bk[n0:n, c] = _kcol(keep_k, c), _kcol(k, c)
        br[:n0], br[n0:n] = keep_r, r
        return bk[:n], br[:n]

    def first_unconsumed_row(self, consumed: int) -> int:
        return int(self.pend_r[consumed]) if consumed < self.pend_r.shape[0] else self.next_row


def kappa_max_pairs(keys_a: np.ndarray, rows_a: np.ndarray, keys_b: np.ndarray, rows_b: np.ndarray,
                    eps: tuple[float, ...], return_pairs: bool = False):
    """Pairs of the unbounded-window merge (docs/semantics.md section 4): the sweep of the whole sorted streams
    repeated until dry. Greedy: a windowed run can pair more (``merge.ceiling`` gives the true
    ceiling); reported as ``kappa_greedy``. Holds all keys in memory. With ``return_pairs``:
    (count, A row ids, B row ids)."""
    oa = _kernel.argsort_keys(keys_a, rows_a)
    ob = _kernel.argsort_keys(keys_b, rows_b)
    cap = min(len(rows_a), len(rows_b)) + 1
    pa_, pb_ = np.empty(cap, np.int64), np.empty(cap, np.int64)
    n = int(_kernel.sweep_until_dry(np.ascontiguousarray(keys_a[oa]), np.asarray(rows_a)[oa],
                                    np.ascontiguousarray(keys_b[ob]), np.asarray(rows_b)[ob],
                                    np.asarray(eps, np.float64), pa_, pb_))
    return (n, pa_[:n], pb_[:n]) if return_pairs else n


def cgm_merge(
    a_batches: Iterable[pa.RecordBatch],
    b_batches: Iterable[pa.RecordBatch],
    params: CGMParams,
    *,
    schema_a: pa.Schema | None = None,
    schema_b: pa.Schema | None = None,
    stats: MergeStats | None = None,
    unmatched: UnmatchedSink | None = None,
    a_first_row: int = 0,
    b_first_row: int = 0,
    source_a: str | None = None,
    source_b: str | None = None,
    compute_kappa_max: bool = False,
) -> Iterator[pa.RecordBatch]:
    """Merge A and B with CGM; yield batches of pairs (docs/semantics.md sections 2-3).

    The inputs yield ``pyarrow.RecordBatch`` (or ``merge.keys.KeyedBatch`` when the key
    matrix or the key columns were computed ahead, e.g. by ``with_keys`` in a reader thread).

    ``unmatched(side, batch)`` receives the unmatched records of ``"a"`` and ``"b"`` (with
    ``a_row``/``b_row`` when ``params.with_ids``). ``stats`` is filled in as the merge runs
    and complete when the iterator is exhausted. ``compute_kappa_max`` keeps every key in
    memory (O(stream length)) to compute kappa_max at the end.

    With ``params.adapt`` the kernel stops after the pass that closes each report window and
    ``merge.adapt.DeltaController`` sets K_A, K_B for the next one (docs/semantics.md section 10); every
    pass is section 3 with the K in force, and ``stats.k_windows`` records it per window.
    """
    t_start = time.perf_counter()
    stats = stats if stats is not None else MergeStats("cgm")
    stats.algorithm = "cgm"
    stats.params = params.as_dict()
    a_it, b_it = iter(a_batches), iter(b_batches)
    if schema_a is None:
        first, a_it = _peek(a_it)
        schema_a = first.schema if first is not None else pa.schema([(k, pa.float64()) for k in params.keys.a])
    if schema_b is None:
        first, b_it = _peek(b_it)
        schema_b = first.schema if first is not None else pa.schema([(k, pa.float64()) for k in params.keys.b])
    check_key_compat(schema_a, params.keys.a, schema_b, params.keys.b, source_a=source_a, source_b=source_b)
    out_schema = pair_schema(schema_a, schema_b, with_ids=params.with_ids)

    A = _Side("a", a_it, schema_a, params.keys.a, a_first_row, params, source_a, compute_kappa_max)
    B = _Side("b", b_it, schema_b, params.keys.b, b_first_row, params, source_b, compute_kappa_max)
    n, d = params.window_size, len(params.keys.a)
    eps = np.asarray(params.eps, dtype=np.float64)
    # window buffers of 2N records: window A is wak[st[8] : st[8] + st[0]] (its front moves on
    # as records are evicted; the kernel moves it back when a top-up would overrun the end)
    wak, wbk = np.empty((2 * n, d), np.float64), np.empty((2 * n, d), np.float64)
    war, wbr = np.empty(2 * n, np.int64), np.empty(2 * n, np.int64)
    cap = max(params.out_batch_rows, 1) + 2 * n
    pairs_a, pairs_b, ev_a, ev_b = (np.empty(cap, np.int64) for _ in range(4))
    counts = np.zeros(4, np.int64)
    pass_m, pass_ret = np.empty(PASS_LOG, np.int64), np.empty(PASS_LOG, np.int64)
    sma, smb = np.empty(2 * n, np.bool_), np.empty(2 * n, np.bool_)
    spa, spb = np.empty(n, np.int64), np.empty(n, np.int64)
    st = np.zeros(16, np.int64)
    work = np.empty((6 + d) * n + 2, np.int64)
    report = ReportWindows(n)
    yield_seconds = 0.0
    control = DeltaController(params) if params.adapt else None
    ks = control.ks if control is not None else (params.least_increment_a, params.least_increment_b)
    k_windows = stats.k_windows = []

    def log_passes() -> None:
        """Group the logged passes into report windows; record the K of each window closed;
        with adaptation, set the K of the next window and the kernel's report-window stop."""
        nonlocal ks
        npass = int(counts[3])
        report.add_many(pass_m[:npass], pass_ret[:npass])
        stats.passes += npass
        counts[3] = 0
        while len(k_windows) < len(report.kappas):
            k_windows.append(ks)
            if control is not None:
                ks = control.update(report.kappas[len(k_windows) - 1])
        if control is not None:
            st[6], st[7] = 0, n - report.open_retired

    def emit_unmatched(side: _Side, rows: np.ndarray) -> None:
        if unmatched is not None and rows.size:
            batch = side.store.take(rows)
            if params.with_ids:
                # a copy: ``rows`` may be a view of a buffer the next passes overwrite, and
                # the Arrow array does not copy it (the batch may be written later, in a thread)
                batch = batch.append_column(f"{side.name}_row", int64_array(np.array(rows, dtype=np.int64)))
            unmatched(side.name, batch)

    pair_bufs = [(np.empty(0, np.int64), np.empty(0, np.int64)) for _ in range(2)]
    pair_turn = 0

    def pair_rows(npairs: int) -> tuple[np.ndarray, np.ndarray]:
        """A copy of the pairs' row ids for the gather thread: in one of two buffer pairs used in
        turn (the gather of the flush before the last one has ended by now: its result was
        collected), fresh with ids (they become output columns, written later)."""
        nonlocal pair_turn
        if params.with_ids:
            return pairs_a[:npairs].copy(), pairs_b[:npairs].copy()
        pair_turn ^= 1
        ba, bb = pair_bufs[pair_turn]
        if ba.size < npairs:
            ba, bb = pair_bufs[pair_turn] = (np.empty(cap, np.int64), np.empty(cap, np.int64))
        np.copyto(ba[:npairs], pairs_a[:npairs])
        np.copyto(bb[:npairs], pairs_b[:npairs])
        return ba[:npairs], bb[:npairs]

    def flush() -> _Gather | None:
        """Gather pairs (in a thread: the result is collected at the next flush) and unmatched
        records found so far; release rows no longer needed."""
        log_passes()
        npairs, nea, neb = (int(x) for x in counts[:3])
        stats.matched += npairs
        stats.a_unmatched += nea
        stats.b_unmatched += neb
        out = None
        if npairs:
            ra, rb = pair_rows(npairs)
            va, vb = A.store.frozen(), B.store.frozen()
            out = gatherer.submit(lambda: pair_batch(out_schema, va.take(ra), vb.take(rb),
                                                     ra if params.with_ids else None, rb if params.with_ids else None))
        emit_unmatched(A, ev_a[:nea])
        emit_unmatched(B, ev_b[:neb])
        for side in (A, B):
            if side.nan_rows:
                rows = np.concatenate(side.nan_rows)
                side.nan_rows.clear()
                emit_unmatched(side, rows)
        counts[:] = 0
        A.store.release(war[st[8]: st[8] + st[0]], A.first_unconsumed_row(int(st[2])))
        B.store.release(wbr[st[9]: st[9] + st[1]], B.first_unconsumed_row(int(st[3])))
        return out

    if control is not None:
        st[6], st[7] = 0, n
    gathering: _Gather | None = None
    gatherer = _Gatherer()
    passes = _kernel.CGMPasses(st, wak, war, wbk, wbr, eps, n, pairs_a, pairs_b, ev_a, ev_b, counts, pass_m,
                               pass_ret, sma, smb, spa, spb, work)
    try:
        while True:
            status = passes(A.pend_k, A.pend_r, A.exhausted, B.pend_k, B.pend_r, B.exhausted, ks[0], ks[1])
            if status == _NEED_A:
                st[2] = A.pull(int(st[2]))
            elif status == _NEED_B:
                st[3] = B.pull(int(st[3]))
            elif status == _WINDOW:
                log_passes()
            else:
                # The previous flush's pairs are yielded now, once this one's gather has started.
                gathering, out = flush(), gathering
                if out is not None:
                    out = out.result()
                    t0 = time.perf_counter()
                    yield out
                    yield_seconds += time.perf_counter() - t0
                if status == _ENDED:
                    break
        if gathering is not None:
            out = gathering.result()
            t0 = time.perf_counter()
            yield out
            yield_seconds += time.perf_counter() - t0
    finally:
        gatherer.close()

    # Step 6: everything left in either window, the pending records and the rest of the
    # streams is unmatched. The rest is read batch by batch (keys still checked, memory bounded).
    def retire(side: _Side, rows: np.ndarray) -> None:
        if side is A:
            stats.a_unmatched += rows.size
            report.add_unmatched(rows.size)
        else:
            stats.b_unmatched += rows.size
        emit_unmatched(side, rows)
        if side.nan_rows:
            nan = np.concatenate(side.nan_rows)
            side.nan_rows.clear()
            emit_unmatched(side, nan)
        side.pend_k, side.pend_r = _kslice(side.pend_k, 0, 0), side.pend_r[:0]
        side.store.release(rows[:0], side.next_row)

    retire(A, np.concatenate([war[st[8]: st[8] + st[0]], A.pend_r[int(st[2]):]]))
    retire(B, np.concatenate([wbr[st[9]: st[9] + st[1]], B.pend_r[int(st[3]):]]))
    for side in (A, B):
        while not side.exhausted:
            side.pull(0)
            retire(side, side.pend_r)
    # NaN-keyed records were never in a window: they count as unmatched (and retired A records).
    stats.a_unmatched += A.nan_keys
    stats.b_unmatched += B.nan_keys
    report.add_unmatched(A.nan_keys)
    report.finish()
    k_windows.extend([ks] * (len(report.kappas) - len(k_windows)))  # windows of the end: the last K
    stats.kappas = report.kappas
    stats.report_counts = report.counts
    stats.a_records, stats.b_records = A.records, B.records
    stats.a_nan_keys, stats.b_nan_keys = A.nan_keys, B.nan_keys
    if compute_kappa_max:
        ka = np.concatenate(A.all_keys) if A.all_keys else np.empty((0, d))
        ra = np.concatenate(A.all_rows) if A.all_rows else np.empty(0, np.int64)
        kb = np.concatenate(B.all_keys) if B.all_keys else np.empty((0, d))
        rb = np.concatenate(B.all_rows) if B.all_rows else np.empty(0, np.int64)
        stats.set_kappa(kappa_figures(ka, ra, kb, rb, params.eps, A.records))
    stats.check_accounting()
    stats.merge_seconds = time.perf_counter() - t_start - A.wait_seconds - B.wait_seconds - yield_seconds


def cgm_merge_table(a: pa.Table, b: pa.Table, params: CGMParams, **kw) -> pa.Table:
    """Convenience: merge two in-memory tables; returns all pairs as one table (loads it all)."""
    schema_a, schema_b = a.schema, b.schema
    with_ids = params.with_ids
    batches = list(cgm_merge(a.to_batches(), b.to_batches(), params, schema_a=schema_a, schema_b=schema_b, **kw))
    schema = pair_schema(schema_a, schema_b, with_ids=with_ids)
    return pa.Table.from_batches(batches or [empty_batch(schema)], schema=schema)
