"""The executor side of the W-join on Spark (``smerge.spark.wjoin`` is the driver's): the split
stage (a chunk of one input hashed, or written once with a sample of its times, into Arrow files
of a staging folder) and the join stage (one partition's records through the unchanged engine,
its tuples written with their completion keys). Functions are shipped to executors by reference.
"""

from __future__ import annotations

import glob
import os
import time
from dataclasses import dataclass, replace
from types import SimpleNamespace

import numpy as np
import pyarrow as pa

from smerge.errors import InputError, SmergeError
from smerge.merge.wjoin import wjoin
from smerge.merge.wjoin_numpy import times as _times
from smerge.merge.wjoin_hashing import hash_terms
from smerge.merge.wjoin_params import WJoinParams
from smerge.merge.wjoin_plan import make_plan
from smerge.merge.wjoin_stats import WJoinStats
from smerge.spark.parts import PartWriter, read_part

ROW_COL = "__smerge_row"
SAMPLE_PER_BATCH = 64
ORD_T, ORD_S, ORD_R = "__ord_t", "__ord_s", "__ord_r"


@dataclass(frozen=True)
class StreamSpec:
    path: str
    source: str  # the name used in messages (the path as given)
    batch_rows: int
    schema: pa.Schema
    outer: int | None
    inner: int
    sample: tuple = ()  # an archive input's (fraction, seed), pinned on the driver (smerge.spark.archive)
    keys: tuple[str, ...] | None = None  # as the driver opened the input (smerge.jobs.wjoin.prepare)
    variables: tuple[str, ...] | None = None

    def open(self):
        from smerge.datasets import open_input
        from smerge.spark.archive import open_options

        src = open_input(self.path, keys=self.keys, variables=self.variables, batch_rows=self.batch_rows,
                         decode_times=True, **open_options(self.sample))
        if src.schema != self.schema:
            raise SmergeError(f"{self.source}: the executor sees schema {src.schema} but the driver saw "
                              f"{self.schema}; the file changed during the run, or executors read another copy")
        return src


@dataclass(frozen=True)
class WSparkPlan:
    streams: tuple[StreamSpec, ...]
    params: WJoinParams
    partitions: int
    staging: str
    mode: str  # "hash" (HW-join by key), "ranges" (NLW-join by time ranges + halo), "single" (one task)
    bounds: tuple = ()  # "ranges": P - 1 range boundaries, in the time representation
    halo: float = 0.0  # "ranges": the largest shortest-path bound (D_max)
    chunk_times: tuple = ()  # "ranges": per stream, ((chunk, first_t, last_t), ...) of the non-empty chunks

    @property
    def hashed(self) -> bool:
        return self.mode == "hash"

    @property
    def split(self) -> bool:
        return self.mode in ("hash", "ranges")


def _err(e: SmergeError) -> dict:
    return {"error": (type(e).__name__, str(e))}


def _in_path(staging: str, i: int, chunk: int, p: int) -> str:
    return os.path.join(staging, f"in-{i:03d}-{chunk:06d}-{p:05d}.arrow")


def out_path(staging: str, p: int) -> str:
    return os.path.join(staging, f"out-{p:05d}.arrow")


def split_chunk(plan: WSparkPlan, item: tuple[int, int, int, int | None]) -> dict:
    """Stage 1: hash-partition chunk ``item = (stream, chunk, start, stop)`` into per-partition files."""
    try:
        return _split_chunk(plan, item)
    except SmergeError as e:
        return _err(e)
    except Exception as e:  # a full disk while writing parts: one line on the driver
        from smerge.spark.runner import task_write_error

        err = task_write_error(e, plan.staging)
        if err is None:
            raise
        return _err(err)


def _split_chunk(plan: WSparkPlan, item) -> dict:
    i, chunk, start, stop = item
    spec = plan.streams[i]
    eplan = make_plan([s.schema for s in plan.streams], plan.params)
    tcol = plan.params.time[i]
    src = spec.open()
    row0 = start * spec.inner
    row = row0
    first_t = last_t = None
    writers: dict[int, PartWriter] = {}
    schema = spec.schema.append(pa.field(ROW_COL, pa.int64()))
    P = plan.partitions if plan.hashed else 1
    samples = []
    try:
        for batch in src.batches(start, stop):
            n = batch.num_rows
            if n == 0:
                continue
            tab = pa.Table.from_batches([batch])
            t = _times(tab.column(tcol), eplan.kind, SimpleNamespace(rows_read=row, name=spec.source, time_col=tcol))
            prev = last_t
            d = np.diff(np.concatenate([[t[0] if prev is None else prev], t]))
            if np.any(d < 0):
                bad = row + int(np.flatnonzero(d < 0)[0])
                raise InputError(f"{spec.source}: time column {tcol!r} decreases at row {bad}; W-join needs every "
                                 "stream in non-decreasing time order (sort it first)")
            if first_t is None:
                first_t = t[0].item()
            last_t = t[-1].item()
            tab = tab.append_column(ROW_COL, pa.array(np.arange(row, row + n, dtype=np.int64)))
            if plan.hashed:
                pid = (hash_terms(tab, eplan.hash_terms[i]) % np.uint64(P)).astype(np.int64)
            else:  # time ranges: one file per chunk; a sample of the times for the boundaries
                pid = np.zeros(n, np.int64)
                samples.append(t[::max(1, n // SAMPLE_PER_BATCH)])
            order = np.argsort(pid, kind="stable")
            counts = np.bincount(pid, minlength=P)
            tab = tab.take(pa.array(order))
            off = 0
            for p in np.flatnonzero(counts):
                c = int(counts[p])
                w = writers.get(int(p))
                if w is None:
                    w = writers[int(p)] = PartWriter(_in_path(plan.staging, i, chunk, int(p)), schema)
                w.write(tab.slice(off, c))
                off += c
            row += n
    finally:
        for w in writers.values():
            w.close()
    sample = np.concatenate(samples) if samples else np.empty(0)
    return {"i": i, "chunk": chunk, "first_row": row0, "rows": row - row0, "first_t": first_t, "last_t": last_t,
            "sample": sample}


def _partition_input(plan: WSparkPlan, i: int, p: int):
    for f in sorted(glob.glob(os.path.join(plan.staging, f"in-{i:03d}-*-{p:05d}.arrow"))):
        yield from read_part(f)


def _range_edges(plan: WSparkPlan, r: int):
    """Range r = [lo, hi) of completion times (None: unbounded)."""
    b = plan.bounds
    return (b[r - 1] if r > 0 else None), (b[r] if r < len(b) else None)


def _range_input(plan: WSparkPlan, i: int, r: int, kind: str):
    """Stream i's records with lo - halo <= t < hi, from the chunks that can hold them, in order."""
    lo, hi = _range_edges(plan, r)
    low = None if lo is None else lo - plan.halo
    tcol = plan.params.time[i]
    for chunk, first_t, last_t in plan.chunk_times[i]:
        if (low is not None and last_t < low) or (hi is not None and first_t >= hi):
            continue
        for b in read_part(_in_path(plan.staging, i, chunk, 0)):
            t = _times(b.column(tcol), kind, SimpleNamespace(rows_read=0, name="", time_col=tcol))
            m = np.ones(b.num_rows, bool)
            if low is not None:
                m &= t >= low
            if hi is not None:
                m &= t < hi
            if m.all():
                yield b
            elif m.any():
                yield b.filter(pa.array(m))


def join_partition(plan: WSparkPlan, p: int) -> dict:
    """Stage 2: run the in-process engine on partition ``p``; write its tuples with completion keys."""
    try:
        return _join_partition(plan, p)
    except SmergeError as e:
        return _err(e)
    except Exception as e:  # a full disk while writing parts: one line on the driver
        from smerge.spark.runner import task_write_error

        err = task_write_error(e, plan.staging)
        if err is None:
            raise
        return _err(err)


def _join_partition(plan: WSparkPlan, p: int) -> dict:
    params = plan.params
    n = params.n_streams
    base_schemas = [s.schema for s in plan.streams]
    final_schema = make_plan(base_schemas, params).out_schema
    stats = WJoinStats()
    t0 = time.perf_counter()
    kind = make_plan(base_schemas, params).kind
    if plan.split:
        # every stream carries its row ids as a payload column; the engine's own ids are not used
        schemas = [s.append(pa.field(ROW_COL, pa.int64())) for s in base_schemas]
        eparams = replace(params, with_ids=False)
        if plan.hashed:
            streams = [_partition_input(plan, i, p) for i in range(n)]
        else:
            streams = [_range_input(plan, i, p, kind) for i in range(n)]
    else:
        schemas = base_schemas
        eparams = replace(params, with_ids=True)
        srcs = [s.open() for s in plan.streams]
        streams = [s.batches() for s in srcs]
    eplan = make_plan(schemas, eparams)
    id_names = make_plan(base_schemas, replace(params, with_ids=True)).id_names
    row_cols = ([f"{a}_{ROW_COL}" for a in params.aliases] if plan.split else id_names)
    r_lo, r_hi = _range_edges(plan, p) if plan.mode == "ranges" else (None, None)
    formed = 0
    time_cols = [f"{a}_{c}" for a, c in zip(params.aliases, params.time)]
    ord_type = pa.float64() if eplan.dtype is np.float64 else pa.int64()
    schema = final_schema.append(pa.field(ORD_T, ord_type)).append(pa.field(ORD_S, pa.int64())) \
        .append(pa.field(ORD_R, pa.int64()))
    w = PartWriter(out_path(plan.staging, p), schema)
    write_seconds = 0.0
    try:
        for b in wjoin(streams, schemas, eparams, stats=stats, sources=[s.source for s in plan.streams]):
            tw = time.perf_counter()
            rows = [b.column(c).to_numpy() for c in row_cols]
            ts = [_times(b.column(c), eplan.kind, SimpleNamespace(rows_read=0, name="", time_col=c))
                  for c in time_cols]
            bt, bs, br = ts[0], np.zeros(b.num_rows, np.int64), rows[0]
            for j in range(1, n):  # the last member in arrival order: max (time, stream); later stream wins ties
                m = ts[j] >= bt
                bt, bs, br = np.where(m, ts[j], bt), np.where(m, j, bs), np.where(m, rows[j], br)
            if r_lo is not None or r_hi is not None:  # keep the tuples completed inside this time range
                keep = np.ones(b.num_rows, bool)
                if r_lo is not None:
                    keep &= bt >= r_lo
                if r_hi is not None:
                    keep &= bt < r_hi
                if not keep.all():
                    b = b.filter(pa.array(keep))
                    rows = [x[keep] for x in rows]
                    bt, bs, br = bt[keep], bs[keep], br[keep]
                if b.num_rows == 0:
                    continue
            formed += b.num_rows
            cols = []
            for f in final_schema:
                if f.name in id_names:
                    cols.append(pa.array(rows[id_names.index(f.name)], pa.int64()))
                else:
                    cols.append(b.column(f.name))
            cols += [pa.array(bt, ord_type), pa.array(bs, pa.int64()), pa.array(br, pa.int64())]
            w.write(pa.RecordBatch.from_arrays(cols, schema=schema))
            write_seconds += time.perf_counter() - tw
    finally:
        w.close()
    return {"p": p, "tuples": formed, "records_read": stats.records_read, "peak_buffered": stats.peak_buffered,
            "peak_buffered_total": stats.peak_buffered_total, "peak_held": stats.peak_held, "chunks": stats.chunks,
            "join_seconds": time.perf_counter() - t0 - write_seconds, "write_seconds": write_seconds}


__all__ = ["split_chunk", "join_partition", "WSparkPlan", "StreamSpec", "ROW_COL", "ORD_T", "ORD_S", "ORD_R",
           "out_path"]
