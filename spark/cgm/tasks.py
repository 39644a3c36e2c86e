"""The executor side of partitioned CGM: the per-partition merge task (the planning scans are in
``smerge.spark.cgm.plan``).

Nothing here needs a SparkSession; the functions are shipped to executors by reference
(``smerge`` must be installed in the executors' interpreter). Only the fault-injection hook
imports ``pyspark.TaskContext``.

Partitioning (docs/spark.md, "co-partitioning and ownership"):

- The leading key k1 is split into P ranges ``[bound[p-1], bound[p])`` (``bounds`` sorted,
  P - 1 values). The *owner* of a record is the range holding its k1; a record with a NaN or
  missing key is owned by partition 0 and never replicated.
- Every A record is in exactly one partition: its owner's. A B record is *visible* to every
  partition whose range, widened by eps1 on both sides, holds its k1 — to its owner, and also
  to a neighbour when it lies within eps1 of a boundary (it is then *shared*). Every pair A
  can form is therefore visible to the partition that owns its A record.
- Each partition streams its A and B records in arrival order (ascending row id) through the
  unchanged CGM engine, with windows thinned to its share of the arrival order
  (``smerge.spark.cgm.windows``). Pairs whose B record is not shared are final. Pairs whose B record is
  shared are *seam pairs*: the driver keeps, for each shared B record, the pair from its owner
  partition if there is one, else the one from the lowest partition; the A record of a dropped
  seam pair becomes unmatched. So every record is in at most one pair, and the result only
  depends on the inputs, the parameters and the bounds.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from typing import Iterator

import numpy as np
import pyarrow as pa

from smerge.errors import KeyNaNError, SmergeError
from smerge.merge import CGMParams, MergeStats, cgm_merge
from smerge.merge.keys import KeyedBatch, key_matrix, nan_rows
from smerge.spark.cgm.rows import Rows as _Rows
from smerge.spark.cgm.windows import task_params
from smerge.spark.parts import PartWriter


@dataclass(frozen=True)
class SideSpec:
    """How an executor reopens one input (the same resolved keys and payload as the driver)."""

    path: str
    keys: tuple[str, ...]
    variables: tuple[str, ...] | None
    batch_rows: int
    schema: pa.Schema
    step: int  # outer indices per chunk
    inner: int  # records per outer index
    outer: int | None  # outer size (None: unknown until read, CSV)
    # An archive input's (fraction, seed), pinned on the driver (plan.side_spec; () for other
    # inputs): every task then reads the same sample as --local (smerge.spark.archive).
    sample: tuple = ()
    # The driver's source again without its metadata read (``InputSource.reopen``; netCDF): a
    # task's open costs no netCDF open of its own (6-8 ms each, twice per task otherwise).
    reopen: tuple | None = None
    # read in the other input's key order (a transposed grid): only ``reopen`` reads it so
    reordered: bool = False

    @property
    def open_options(self) -> dict:
        from smerge.spark.archive import open_options

        return open_options(self.sample)

    def open(self):
        from smerge.datasets import open_input

        if self.reopen is not None:
            fn, args = self.reopen
            return fn(*args)
        src = open_input(self.path, keys=self.keys, variables=self.variables, batch_rows=self.batch_rows,
                         **self.open_options)
        if src.schema != self.schema:
            raise SmergeError(f"{self.path}: the executor sees schema {src.schema} but the driver saw {self.schema}; "
                              "the file changed during the run, or executors read another copy")
        return src

    def open_keys(self):
        """The input reduced to its key columns when the format allows it, else the whole input."""
        from smerge.datasets import open_input

        if self.reordered:
            return self.open()
        try:
            src = open_input(self.path, keys=self.keys, variables=self.keys[:1], batch_rows=self.batch_rows,
                             **self.open_options)
            if tuple(src.schema.names) == tuple(self.keys) and src.num_rows == (
                    None if self.outer is None else self.outer * self.inner):
                return src
        except Exception:  # noqa: BLE001 - e.g. gridded netCDF keys: fall back to the whole input
            pass
        return self.open()


def key_columns(batch: pa.RecordBatch, keys: tuple[str, ...]) -> np.ndarray:
    return key_matrix(batch, keys)


# The merge task of one partition.


@dataclass(frozen=True)
class MergePlan:
    a: SideSpec
    b: SideSpec
    params: CGMParams  # with_ids=True: the task maps local ids to global row ids
    bounds: tuple[float, ...]
    eps1: float
    runs_a: tuple[tuple[tuple[int, int | None], ...], ...]
    runs_b: tuple[tuple[tuple[int, int | None], ...], ...]
    staging: str
    want_unmatched: bool
    source_a: str
    source_b: str
    # "parquet": tasks write the final Parquet parts (output schema: ids only when asked for);
    # "arrow": tasks write Arrow IPC parts with ids, the driver writes the output (CSV, netCDF, ...)
    part_format: str = "arrow"
    out_schema: pa.Schema | None = None
    una_schema: pa.Schema | None = None
    unb_schema: pa.Schema | None = None
    prefetch: bool = True  # reader threads and a background part writer inside the task
    # (N, K_A, K_B) per partition (smerge.spark.cgm.windows); None: the job's own in every partition
    windows: tuple[tuple[int, int, int], ...] | None = None
    kill_once_partition: int | None = None
    kill_marker: str | None = None

    @property
    def parts(self) -> int:
        return len(self.bounds) + 1


PART_KINDS = ("pairs", "ua", "ub")


def part_path(staging: str, kind: str, p: int, fmt: str = "arrow") -> str:
    """Where partition ``p`` writes its part of ``kind`` (pairs, ua, ub); one folder per kind."""
    return os.path.join(staging, kind, f"part-{p:05d}.{'parquet' if fmt == 'parquet' else 'arrow'}")


def owner(bounds: np.ndarray, k1: np.ndarray) -> np.ndarray:
    own = np.searchsorted(bounds, k1, side="right")
    own[np.isnan(k1)] = 0
    return own


def inside_range(k1: np.ndarray, lo_edge: float, hi_edge: float, pad: float) -> bool:
    """True when every k1 (none NaN) lies in [lo_edge + pad, hi_edge - pad): the ownership rule
    then makes this partition each record's owner, lowest and highest partition (``visibility``
    with eps1 = pad), so the batch needs no per-record rule: two passes over k1 instead of three
    binary searches and a NaN scan (measured: a fifth of the task CPU at P = 8 on 16M gridded)."""
    if k1.size == 0:
        return False
    return bool(k1.min() - pad >= lo_edge and k1.max() + pad < hi_edge)  # a NaN fails both


def visibility(bounds: np.ndarray, k: np.ndarray, eps1: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ownership rule for B records with key matrix ``k``: (owner, lowest and highest
    partition that sees the record). A record with a NaN key is seen by its owner only."""
    k1 = k[:, 0]
    own = owner(bounds, k1)
    with np.errstate(invalid="ignore"):
        lo = np.searchsorted(bounds, k1 - eps1, side="right")
        hi = np.searchsorted(bounds, k1 + eps1, side="right")
    nan = nan_rows(k)  # column by column: isnan(k).any(axis=1) took 2.3 ms per 131,072 x 3 batch, this 0.15 ms
    lo[nan] = own[nan]
    hi[nan] = own[nan]
    return own, lo, hi


def _file_batches(spec: SideSpec, runs, io: dict | None = None) -> Iterator[tuple[pa.RecordBatch, int]]:
    """The records of ``runs`` (outer-index ranges) of one input, with their first global row id;
    ``io`` gets the reader's counters (an archive's ``blocks_read``, ``bytes_read``)."""
    src = spec.open()
    if io is not None:
        io.update(counters=src.counters)
    for start, stop in runs:
        row = start * spec.inner
        for batch in src.batches(start, stop):
            n = batch.num_rows
            yield batch, row  # the batch's records are rows row, row + 1, ...
            row += n


def _stream(batches: Iterator[tuple[pa.RecordBatch, np.ndarray | int]], keys: tuple[str, ...], select,
            rows: _Rows | None) -> Iterator[KeyedBatch]:
    """The partition's records of one input in arrival order, with their key matrix; their
    global ids go to ``rows``. Runs in a reader thread (the key matrix is computed there).
    ``batches`` gives each batch's row ids, or the first one when they are consecutive."""
    for batch, g in batches:
        k = key_matrix(batch, keys)
        mask = select(k)
        if mask is None or mask.all():
            if rows is not None:
                if isinstance(g, np.ndarray):
                    rows.extend(g)
                else:
                    rows.extend_run(g, batch.num_rows)
            yield KeyedBatch(batch, k)
        elif mask.any():
            rows.extend(g[mask] if isinstance(g, np.ndarray) else g + np.flatnonzero(mask))
            yield KeyedBatch(batch.filter(pa.array(mask)), np.ascontiguousarray(k[mask]))


class _Inline:
    """An iterator with the Prefetcher's interface, read in the caller's thread."""

    def __init__(self, it):
        self._it, self.busy_seconds = iter(it), 0.0

    def __iter__(self):
        return self

    def __next__(self):
        t = time.perf_counter()
        try:
            return next(self._it)
        finally:
            self.busy_seconds += time.perf_counter() - t

    def close(self) -> None:
        close = getattr(self._it, "close", None)
        if close is not None:
            close()


class _InlineWriter:
    """A BackgroundWriter's interface, writing in the caller's thread."""

    def __init__(self, write):
        self._write, self.busy_seconds = write, 0.0

    def put(self, item) -> None:
        t = time.perf_counter()
        self._write(item)
        self.busy_seconds += time.perf_counter() - t

    def close(self) -> None:
        pass

    def cancel(self) -> None:
        pass


def _ipc_bytes(batches: list[pa.RecordBatch], schema: pa.Schema) -> bytes | None:
    if not batches:
        return None
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as w:
        for b in batches:
            w.write_batch(b)
    return sink.getvalue().to_pybytes()


def read_ipc_bytes(data: bytes | None) -> pa.Table | None:
    if data is None:
        return None
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def run_partition(plan: MergePlan, p: int, tables: tuple[pa.Table, pa.Table] | None = None) -> dict:
    """Merge partition ``p``: write its final pairs / unmatched records; return stats and seams.

    The task reads its chunks of A and B itself (slab pairing), or is given them: ``tables``
    are the partition's records of A and B with a ``_row`` column (``smerge.spark.frames``).
    SmergeErrors are returned (not raised) so that the driver can report them as one line.
    """
    from smerge.spark.session import freeze_worker_heap

    freeze_worker_heap()  # once per worker: no full collection between its tasks
    try:
        return _run_partition(plan, p, tables)
    except KeyNaNError as e:
        side = "a" if e.source == plan.source_a else "b"
        return {"p": p, "error": (type(e).__name__, str(e), e.column, e.row, side)}
    except SmergeError as e:
        return {"p": p, "error": (type(e).__name__, str(e), getattr(e, "column", None), getattr(e, "row", None))}
    except Exception as e:  # a full disk while writing parts: one line on the driver, not a failed job
        from smerge.spark.runner import task_write_error

        err = task_write_error(e, plan.staging)
        if err is None:
            raise
        return {"p": p, "error": (type(err).__name__, str(err), None, None)}


def _maybe_kill(plan: MergePlan, p: int) -> None:
    if plan.kill_once_partition is None or plan.kill_once_partition != p:
        return
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is not None and ctx.attemptNumber() == 0:
        if plan.kill_marker:
            open(plan.kill_marker, "a").close()
        os._exit(17)  # a killed Python worker: Spark retries the task


def _run_partition(plan: MergePlan, p: int, tables: tuple[pa.Table, pa.Table] | None) -> dict:
    from smerge.merge.output import pair_schema
    from smerge.transport import BackgroundWriter, Prefetcher

    t0, c0 = time.perf_counter(), time.process_time()
    bounds = np.asarray(plan.bounds, dtype=np.float64)
    eps1 = plan.eps1
    single = bounds.size == 0  # one partition: every record, nothing shared
    ga, gb = _Rows(), _Rows()
    b_shared, b_owned = _Rows(np.bool_), _Rows(np.bool_)
    counters = {"a": 0, "b_owned": 0, "b_shared_owned": 0, "b_visible": 0}
    # The local positions [first, last + 1) of B's shared records so far (none: empty): a batch
    # of pairs or unmatched B records outside it has no shared record, no flag to look up.
    shared_span = [np.iinfo(np.int64).max, -1]

    def any_shared(local: np.ndarray) -> bool:
        lo, hi = shared_span
        return lo < hi and local.size > 0 and int(local.max()) >= lo and int(local.min()) < hi

    lo_edge = bounds[p - 1] if p > 0 else -np.inf
    hi_edge = bounds[p] if p < bounds.size else np.inf

    def select_a(k):
        if single or inside_range(k[:, 0], lo_edge, hi_edge, 0.0):
            counters["a"] += k.shape[0]
            return None
        mask = owner(bounds, k[:, 0]) == p
        counters["a"] += int(mask.sum())
        return mask

    def select_b(k):
        n = k.shape[0]
        if single:
            counters["b_owned"] += n
            counters["b_visible"] += n
            return None
        if inside_range(k[:, 0], lo_edge, hi_edge, eps1):  # owned here, seen by no other partition
            b_shared.extend_run(0, n, 0)
            b_owned.extend_run(1, n, 0)
            counters["b_owned"] += n
            counters["b_visible"] += n
            return None
        own, lo, hi = visibility(bounds, k, eps1)
        vis = (lo <= p) & (p <= hi)
        shared = (lo != hi)[vis]
        owned = (own == p)[vis]
        if shared.any():
            at = b_shared.n + np.flatnonzero(shared)
            shared_span[0] = min(shared_span[0], int(at[0]))
            shared_span[1] = max(shared_span[1], int(at[-1]) + 1)
        b_shared.extend(shared)
        b_owned.extend(owned)
        counters["b_owned"] += int(owned.sum())
        counters["b_shared_owned"] += int((owned & shared).sum())
        counters["b_visible"] += int(vis.sum())
        return vis

    # One partition reads every record in order: local ids are the global row ids already.
    io_a: dict = {}
    io_b: dict = {}
    if tables is None:
        src_a, src_b = _file_batches(plan.a, plan.runs_a[p], io_a), _file_batches(plan.b, plan.runs_b[p], io_b)
    else:
        from smerge.spark.frames import table_batches

        src_a = table_batches(tables[0], plan.a.schema, plan.a.batch_rows)
        src_b = table_batches(tables[1], plan.b.schema, plan.b.batch_rows)
    a_it = _Inline(_stream(src_a, plan.a.keys, select_a, None if single else ga))
    b_it = _Inline(_stream(src_b, plan.b.keys, select_b, None if single else gb))
    if plan.prefetch:
        a_it, b_it = Prefetcher(a_it, 4, "smerge-read-a"), Prefetcher(b_it, 4, "smerge-read-b")
    stats = MergeStats("cgm")
    fmt = plan.part_format
    params = plan.params if single else task_params(plan.params, plan.windows, p)
    if single and fmt == "parquet":  # no id columns unless the output has them (as --local)
        params = replace(params, with_ids="a_row" in plan.out_schema.names)
    ids_schema = pair_schema(plan.a.schema, plan.b.schema, with_ids=True)
    una_ids = plan.a.schema.append(pa.field("a_row", pa.int64()))
    unb_ids = plan.b.schema.append(pa.field("b_row", pa.int64()))
    if fmt == "parquet":
        schemas = {"pairs": plan.out_schema, "ua": plan.una_schema, "ub": plan.unb_schema}
    else:
        schemas = {"pairs": ids_schema, "ua": una_ids, "ub": unb_ids}
    kinds = PART_KINDS if plan.want_unmatched else PART_KINDS[:1]
    writers = {k: PartWriter(part_path(plan.staging, k, p, fmt), schemas[k], fmt) for k in kinds}
    write = lambda item: writers[item[0]].write(item[1])  # noqa: E731
    bg = BackgroundWriter(write, 4, "smerge-part-write") if plan.prefetch else _InlineWriter(write)
    seam: list[pa.RecordBatch] = []
    seam_owned: list[np.ndarray] = []
    seam_ord: list[np.ndarray] = []  # each seam pair's position among the engine's pairs
    cand_b: list[pa.RecordBatch] = []
    final_pairs = engine_seen = 0

    # Local ids (positions in this task's streams) become global row ids. With one partition
    # they already are; pairs written without ids need no mapping except seam pairs.
    ids_out = fmt != "parquet" or "a_row" in plan.out_schema.names

    def remap(batch: pa.RecordBatch, col: str, rows: _Rows) -> pa.RecordBatch:
        if single:
            return batch
        i = batch.schema.get_field_index(col)
        local = batch.column(i).to_numpy()
        return batch.set_column(i, batch.schema.field(i), pa.array(rows.take(local), pa.int64()))

    def sink(side: str, batch: pa.RecordBatch) -> None:
        if not plan.want_unmatched:
            return
        if side == "a":
            bg.put(("ua", remap(batch, "a_row", ga)))
            return
        if single:
            bg.put(("ub", batch))
            return
        local = batch.column("b_row").to_numpy()
        batch = remap(batch, "b_row", gb)
        if not any_shared(local):
            bg.put(("ub", batch))
            return
        sh, ow = b_shared.take(local), b_owned.take(local)
        bg.put(("ub", batch.filter(pa.array(~sh))))
        keep = sh & ow
        if keep.any():
            cand_b.append(batch.filter(pa.array(keep)))

    try:
        try:
            for batch in cgm_merge(a_it, b_it, params, schema_a=plan.a.schema, schema_b=plan.b.schema, stats=stats,
                                   unmatched=sink, source_a=plan.source_a, source_b=plan.source_b):
                base, engine_seen = engine_seen, engine_seen + batch.num_rows
                if single:
                    bg.put(("pairs", batch))
                    final_pairs += batch.num_rows
                    _maybe_kill(plan, p)
                    continue
                lb = batch.column("b_row").to_numpy()
                sh = b_shared.take(lb) if any_shared(lb) else None
                if sh is None or not sh.any():
                    bg.put(("pairs", remap(remap(batch, "a_row", ga), "b_row", gb) if ids_out else batch))
                    final_pairs += batch.num_rows
                else:
                    ow = b_owned.take(lb)
                    fin = ~sh
                    mapped = remap(remap(batch, "a_row", ga), "b_row", gb)
                    bg.put(("pairs", mapped.filter(pa.array(fin))))
                    final_pairs += int(fin.sum())
                    seam.append(mapped.filter(pa.array(sh)))
                    seam_owned.append(ow[sh])
                    seam_ord.append(base + np.flatnonzero(sh))
                _maybe_kill(plan, p)
        except KeyNaNError as e:  # the engine saw a local row id: report the global one
            if single:
                raise
            g = ga if e.source == plan.source_a else gb
            raise KeyNaNError(e.column, int(g.take(np.array([e.row]))[0]) if 0 <= e.row < g.n else e.row,
                              e.source) from None
        bg.close()
        for w in writers.values():
            w.close()
    except BaseException:
        bg.cancel()
        for w in writers.values():
            w.abort()
        raise
    finally:
        a_it.close()
        b_it.close()
    _maybe_kill(plan, p)
    return {
        "p": p,
        "a_records": counters["a"],
        "b_records": counters["b_owned"],
        "b_visible": counters["b_visible"],
        "b_shared_owned": counters["b_shared_owned"],
        "a_nan_keys": stats.a_nan_keys,
        "b_nan_keys": stats.b_nan_keys,
        "final_pairs": final_pairs,
        "engine_pairs": stats.matched,
        "passes": stats.passes,
        "kappas": list(stats.kappas),
        "windows": list(stats.report_counts),
        "k_windows": [list(k) for k in stats.k_windows],  # K per report window (each task adapts its own)
        "merge_seconds": stats.merge_seconds,
        "write_seconds": bg.busy_seconds,
        "read_seconds": max(a_it.busy_seconds, b_it.busy_seconds),
        "read_a_seconds": a_it.busy_seconds, "read_b_seconds": b_it.busy_seconds,
        "task_seconds": time.perf_counter() - t0,
        "task_cpu_seconds": time.process_time() - c0,  # this Python worker's CPU, its threads included
        "seam": _ipc_bytes(seam, ids_schema),
        "seam_owned": np.concatenate(seam_owned).tobytes() if seam_owned else b"",
        "seam_ord": np.concatenate(seam_ord).astype(np.int64).tobytes() if seam_ord else b"",
        "cand_b": _ipc_bytes(cand_b, unb_ids),
        "archive_io": {side: {k: io["counters"].get(k, 0) for k in ("blocks_read", "bytes_read")}
                       for side, io in (("a", io_a), ("b", io_b)) if io.get("counters", {}).get("blocks_read")},
    }
