"""The executor side of partitioned CGM: planning scans and the per-partition merge task.

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
  unchanged CGM engine. Pairs whose B record is not shared are final. Pairs whose B record is
  shared are *seam pairs*: the driver keeps, for each shared B record, the pair from its owner
  partition if there is one, else the one from the lowest partition; the A record of a dropped
  seam pair becomes unmatched. So every record is in at most one pair, and the result only
  depends on the inputs, the parameters and the bounds.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from typing import Iterator

import numpy as np
import pyarrow as pa

from smerge.errors import SmergeError
from smerge.merge import CGMParams, MergeStats, cgm_merge
from smerge.merge.keys import key_matrix

SAMPLE_PER_CHUNK = 256


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

    def open(self):
        from smerge.datasets import open_input

        src = open_input(self.path, keys=self.keys, variables=self.variables, batch_rows=self.batch_rows)
        if src.schema != self.schema:
            raise SmergeError(f"{self.path}: the executor sees schema {src.schema} but the driver saw {self.schema}; "
                              "the file changed during the run, or executors read another copy")
        return src

    def open_keys(self):
        """The input reduced to its key columns when the format allows it, else the whole input."""
        from smerge.datasets import open_input

        try:
            src = open_input(self.path, keys=self.keys, variables=self.keys[:1], batch_rows=self.batch_rows)
            if tuple(src.schema.names) == tuple(self.keys) and src.num_rows == (
                    None if self.outer is None else self.outer * self.inner):
                return src
        except Exception:  # noqa: BLE001 - e.g. gridded netCDF keys: fall back to the whole input
            pass
        return self.open()


def key_columns(batch: pa.RecordBatch, keys: tuple[str, ...]) -> np.ndarray:
    return key_matrix(batch, keys)


# ---------------------------------------------------------------------------------------------
# Planning: per chunk (``step`` outer indices) the count, k1 range, NaNs and a sample of k1.


@dataclass
class ChunkStats:
    side: str
    chunk: int
    count: int = 0
    k1_min: float = np.inf
    k1_max: float = -np.inf
    nan_k1: bool = False
    first_nan_row: int = -1
    first_nan_key: str = ""
    sample: np.ndarray = field(default_factory=lambda: np.empty(0))


def scan_chunks(side: str, spec: SideSpec, first_chunk: int, last_chunk: int | None) -> list[ChunkStats]:
    """Read chunks ``first_chunk .. last_chunk`` (None: to the end) of one input; their stats."""
    src = spec.open_keys()
    start = first_chunk * spec.step
    stop = None if last_chunk is None else (last_chunk + 1) * spec.step
    chunk_rows = spec.step * spec.inner
    row = start * spec.inner
    out: dict[int, ChunkStats] = {}
    for batch in src.batches(start, stop):
        k = key_columns(batch, spec.keys)
        n = batch.num_rows
        pos = 0
        while pos < n:
            c = (row + pos) // chunk_rows
            end = min(n, (c + 1) * chunk_rows - row)
            seg = k[pos:end]
            st = out.setdefault(c, ChunkStats(side, c))
            st.count += end - pos
            nan_any = np.isnan(seg).any(axis=1)
            if nan_any.any() and st.first_nan_row < 0:
                i = int(np.argmax(nan_any))
                st.first_nan_row = row + pos + i
                st.first_nan_key = spec.keys[int(np.argmax(np.isnan(seg[i])))]
            k1 = seg[:, 0]
            good = k1[~np.isnan(k1)]
            if good.size < k1.size:
                st.nan_k1 = True
            if good.size:
                st.k1_min = min(st.k1_min, float(good.min()))
                st.k1_max = max(st.k1_max, float(good.max()))
                stride = max(1, good.size // SAMPLE_PER_CHUNK)
                st.sample = np.concatenate([st.sample, good[::stride]])
            pos = end
        row += n
    return [out[c] for c in sorted(out)]


def choose_bounds(sample: np.ndarray, parts: int) -> tuple[float, ...]:
    """P - 1 boundaries at the sample's quantiles, each moved into the gap below its value.

    A boundary half-way between two distinct sampled values lies in a gap of the data, so on
    gridded keys (time steps) no record is within a small eps of it and nothing is shared.
    Fewer boundaries result when the sample has few distinct values.
    """
    if parts <= 1 or sample.size == 0:
        return ()
    vals = np.unique(sample)
    if vals.size < 2:
        return ()
    srt = np.sort(sample)
    bounds = []
    for i in range(1, parts):
        q = srt[min(srt.size - 1, (i * srt.size) // parts)]
        j = int(np.searchsorted(vals, q))
        if j == 0:
            continue
        b = (vals[j - 1] + vals[j]) / 2.0
        if not bounds or b > bounds[-1]:
            bounds.append(float(b))
    return tuple(bounds)


def needed_runs(stats: list[ChunkStats], lo: float, hi: float, closed_hi: bool, with_nan: bool,
                step: int) -> tuple[tuple[int, int], ...]:
    """Outer-index runs of the chunks whose k1 range meets [lo, hi) (or [lo, hi])."""
    chunks = []
    for st in stats:
        if st.count == 0:
            continue
        meets = st.k1_max >= lo and (st.k1_min <= hi if closed_hi else st.k1_min < hi)
        if meets or (with_nan and (st.nan_k1 or st.first_nan_row >= 0)):
            chunks.append(st.chunk)
    runs: list[list[int]] = []
    for c in chunks:
        if runs and runs[-1][1] == c * step:
            runs[-1][1] = (c + 1) * step
        else:
            runs.append([c * step, (c + 1) * step])
    return tuple((a, b) for a, b in runs)


# ---------------------------------------------------------------------------------------------
# The merge task of one partition.


@dataclass(frozen=True)
class MergePlan:
    a: SideSpec
    b: SideSpec
    params: CGMParams  # with_ids=True: the task maps local ids to global row ids
    bounds: tuple[float, ...]
    eps1: float
    runs_a: tuple[tuple[tuple[int, int], ...], ...]
    runs_b: tuple[tuple[tuple[int, int], ...], ...]
    staging: str
    want_unmatched: bool
    source_a: str
    source_b: str
    kill_once_partition: int | None = None
    kill_marker: str | None = None

    @property
    def parts(self) -> int:
        return len(self.bounds) + 1


class _Rows:
    """A growable int64 array (global row ids of a partition's stream, by local position)."""

    def __init__(self, dtype=np.int64):
        self.buf = np.empty(1 << 16, dtype=dtype)
        self.n = 0

    def extend(self, values: np.ndarray) -> None:
        need = self.n + values.size
        if need > self.buf.size:
            new = np.empty(max(need, 2 * self.buf.size), dtype=self.buf.dtype)
            new[: self.n] = self.buf[: self.n]
            self.buf = new
        self.buf[self.n: need] = values
        self.n = need

    def view(self) -> np.ndarray:
        return self.buf[: self.n]


def part_path(staging: str, kind: str, p: int) -> str:
    return os.path.join(staging, f"{kind}-{p:05d}.arrow")


class _PartWriter:
    """An Arrow IPC file written to a temporary name and renamed on close (retries overwrite)."""

    def __init__(self, path: str, schema: pa.Schema):
        self.path, self.tmp = path, f"{path}.tmp-{os.getpid()}-{time.monotonic_ns()}"
        self._sink = pa.OSFile(self.tmp, "wb")
        self._w = pa.ipc.new_file(self._sink, schema)
        self.rows = 0

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows:
            self._w.write_batch(batch)
            self.rows += batch.num_rows

    def close(self) -> None:
        self._w.close()
        self._sink.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        try:
            self._w.close()
            self._sink.close()
        finally:
            if os.path.exists(self.tmp):
                os.unlink(self.tmp)


def _owner(bounds: np.ndarray, k1: np.ndarray) -> np.ndarray:
    own = np.searchsorted(bounds, k1, side="right")
    own[np.isnan(k1)] = 0
    return own


def _stream(spec: SideSpec, runs, select, rows: _Rows, counters: dict) -> Iterator[pa.RecordBatch]:
    """The partition's records of one input, in arrival order; their global ids go to ``rows``."""
    src = spec.open()
    for start, stop in runs:
        row = start * spec.inner
        for batch in src.batches(start, stop):
            n = batch.num_rows
            g = np.arange(row, row + n, dtype=np.int64)
            row += n
            mask = select(batch, g)
            if mask is None:
                continue
            if mask.all():
                rows.extend(g)
                yield batch
            elif mask.any():
                rows.extend(g[mask])
                yield batch.filter(pa.array(mask))


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


def run_partition(plan: MergePlan, p: int) -> dict:
    """Merge partition ``p``: write its final pairs / unmatched records; return stats and seams.

    SmergeErrors are returned (not raised) so that the driver can report them as one line.
    """
    try:
        return _run_partition(plan, p)
    except SmergeError as e:
        return {"p": p, "error": (type(e).__name__, str(e), getattr(e, "column", None), getattr(e, "row", None))}


def _maybe_kill(plan: MergePlan, p: int) -> None:
    if plan.kill_once_partition is None or plan.kill_once_partition != p:
        return
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is not None and ctx.attemptNumber() == 0:
        if plan.kill_marker:
            open(plan.kill_marker, "a").close()
        os._exit(17)  # a killed Python worker: Spark retries the task


def _run_partition(plan: MergePlan, p: int) -> dict:
    t0 = time.perf_counter()
    bounds = np.asarray(plan.bounds, dtype=np.float64)
    eps1 = plan.eps1
    ga, gb = _Rows(), _Rows()
    b_shared, b_owned = _Rows(np.bool_), _Rows(np.bool_)
    counters = {"a": 0, "b_owned": 0, "b_shared_owned": 0, "b_visible": 0}
    keys_a, keys_b = plan.a.keys, plan.b.keys

    def select_a(batch, g):
        k = key_columns(batch, keys_a[:1])[:, 0]
        mask = _owner(bounds, k) == p
        counters["a"] += int(mask.sum())
        return mask

    def select_b(batch, g):
        k = key_columns(batch, keys_b)
        k1 = k[:, 0]
        own = _owner(bounds, k1)
        with np.errstate(invalid="ignore"):
            lo = np.searchsorted(bounds, k1 - eps1, side="right")
            hi = np.searchsorted(bounds, k1 + eps1, side="right")
        nan = np.isnan(k).any(axis=1)
        lo[nan] = own[nan]
        hi[nan] = own[nan]
        vis = (lo <= p) & (p <= hi)
        shared = (lo != hi)[vis]
        owned = (own == p)[vis]
        b_shared.extend(shared)
        b_owned.extend(owned)
        counters["b_owned"] += int(owned.sum())
        counters["b_shared_owned"] += int((owned & shared).sum())
        counters["b_visible"] += int(vis.sum())
        return vis

    a_it = _stream(plan.a, plan.runs_a[p], select_a, ga, counters)
    b_it = _stream(plan.b, plan.runs_b[p], select_b, gb, counters)
    stats = MergeStats("cgm")
    params = plan.params
    from smerge.merge.output import pair_schema

    out_schema = pair_schema(plan.a.schema, plan.b.schema, with_ids=True)
    una_schema = plan.a.schema.append(pa.field("a_row", pa.int64()))
    unb_schema = plan.b.schema.append(pa.field("b_row", pa.int64()))
    writers = {"pairs": _PartWriter(part_path(plan.staging, "pairs", p), out_schema)}
    if plan.want_unmatched:
        writers["ua"] = _PartWriter(part_path(plan.staging, "ua", p), una_schema)
        writers["ub"] = _PartWriter(part_path(plan.staging, "ub", p), unb_schema)
    seam: list[pa.RecordBatch] = []
    seam_owned: list[np.ndarray] = []
    cand_b: list[pa.RecordBatch] = []
    final_pairs = 0
    write_seconds = 0.0

    def remap(batch: pa.RecordBatch, col: str, table: np.ndarray) -> pa.RecordBatch:
        i = batch.schema.get_field_index(col)
        local = batch.column(i).to_numpy()
        return batch.set_column(i, batch.schema.field(i), pa.array(table[local], pa.int64()))

    def sink(side: str, batch: pa.RecordBatch) -> None:
        nonlocal write_seconds
        if not plan.want_unmatched:
            return
        t = time.perf_counter()
        if side == "a":
            writers["ua"].write(remap(batch, "a_row", ga.view()))
        else:
            local = batch.column("b_row").to_numpy()
            sh, ow = b_shared.view()[local], b_owned.view()[local]
            batch = remap(batch, "b_row", gb.view())
            writers["ub"].write(batch.filter(pa.array(~sh)))
            keep = sh & ow
            if keep.any():
                cand_b.append(batch.filter(pa.array(keep)))
        write_seconds += time.perf_counter() - t

    try:
        for batch in cgm_merge(a_it, b_it, params, schema_a=plan.a.schema, schema_b=plan.b.schema, stats=stats,
                               unmatched=sink, source_a=plan.source_a, source_b=plan.source_b):
            t = time.perf_counter()
            lb = batch.column("b_row").to_numpy()
            sh, ow = b_shared.view()[lb], b_owned.view()[lb]
            batch = remap(remap(batch, "a_row", ga.view()), "b_row", gb.view())
            fin = ~sh
            if fin.all():
                writers["pairs"].write(batch)
                final_pairs += batch.num_rows
            else:
                writers["pairs"].write(batch.filter(pa.array(fin)))
                final_pairs += int(fin.sum())
                seam.append(batch.filter(pa.array(sh)))
                seam_owned.append(ow[sh])
            _maybe_kill(plan, p)
            write_seconds += time.perf_counter() - t
        t = time.perf_counter()
        for w in writers.values():
            w.close()
        write_seconds += time.perf_counter() - t
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
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
        "merge_seconds": stats.merge_seconds,
        "write_seconds": write_seconds,
        "task_seconds": time.perf_counter() - t0,
        "seam": _ipc_bytes(seam, out_schema),
        "seam_owned": np.concatenate(seam_owned).tobytes() if seam_owned else b"",
        "cand_b": _ipc_bytes(cand_b, unb_schema),
    }


def with_ids(params: CGMParams) -> CGMParams:
    return replace(params, with_ids=True)
