"""W-join on Spark (issue 5, spec section 7): the in-process engine runs unchanged inside tasks.

``run_wjoin_spark(prep, master=...)`` takes a ``smerge.jobs.wjoin.PreparedWJoin`` and returns the
same statistics dict as ``smerge.jobs.wjoin.run_local``; the output file is exactly the one
``--local`` writes (same rows, same order).

HW-join (equalities link every stream), P partitions:

1. *Split* (executors, one task per chunk of each input): read the chunk in Python
   (``smerge.datasets``: netCDF, Parquet, CSV, Arrow), check the time column (present,
   non-decreasing), hash every record's equality key with the engine's own hash
   (``smerge.merge.wjoin._hash_terms``: SQL-equal values hash equal across streams) and append
   it, with its row id, to the Arrow file of partition ``hash % P``. Every record goes to exactly
   one partition, and every tuple's members (equal keys) to the same one.
2. *Join* (one task per partition): each stream's records of the partition are read back in
   chunk order (= their arrival order: time, then position) and streamed through
   ``smerge.merge.wjoin.wjoin``. Its tuples are exactly the in-process tuples whose key hashes
   to this partition, in the in-process relative order.
3. *Assemble* (driver): the partitions' outputs are merged on the *completion key* of each
   tuple — the arrival (time, stream, row id) of its last member, which is how ``--local``
   orders tuples (all tuples completed by one arrival are in one partition, already in the
   local order: members' row ids, S1 first). The merge is streaming (one batch per partition
   in memory) and the output is written atomically.

NLW-join (any predicate): with P = 1 one task reads the inputs and runs the engine (the
in-process run on an executor). With P > 1, by *time ranges with a halo*: the split stage
writes each chunk once (with row ids) and samples its times; the driver cuts the time axis at
the sample's quantiles into ranges [b_r, b_r+1); task r streams every record with
b_r - D_max <= t < b_r+1 (D_max = the largest shortest-path bound, the halo) through the engine
and keeps the tuples whose *completion time* (their last member's time) lies in [b_r, b_r+1).
Every member of such a tuple has t >= t_max - D_max, so the tuple is formed there, and in no
other range: each tuple is formed in exactly one range. The driver merges as for HW-join.

The driver checks the order of the chunks' time ranges (a decrease at a chunk seam is reported
like ``--local`` does). Staging files live next to the output (a filesystem shared with the
executors, as for CGM) and are removed at the end, also on failure.
"""

from __future__ import annotations

import glob
import os
import shutil
import time
from dataclasses import dataclass, replace
from types import SimpleNamespace

import numpy as np
import pyarrow as pa

from smerge.errors import InputError, OutputError, SmergeError, UsageError
from smerge.datasets.outputs import make_staging
from smerge.jobs import write_stats
from smerge.merge.wjoin import WJoinParams, WJoinStats, _hash_terms, _times, make_plan, wjoin

ROW_COL = "__smerge_row"
SAMPLE_PER_BATCH = 64
ORD_T, ORD_S, ORD_R = "__ord_t", "__ord_s", "__ord_r"
_ERRORS = {c.__name__: c for c in (SmergeError, UsageError, InputError, OutputError)}


@dataclass(frozen=True)
class StreamSpec:
    path: str
    source: str  # the name used in messages (the path as given)
    batch_rows: int
    schema: pa.Schema
    outer: int | None
    inner: int

    def open(self):
        from smerge.datasets import open_input

        src = open_input(self.path, batch_rows=self.batch_rows, decode_times=True)
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


def _raise(err: tuple) -> None:
    name, msg = err
    raise _ERRORS.get(name, SmergeError)(msg)


def _in_path(staging: str, i: int, chunk: int, p: int) -> str:
    return os.path.join(staging, f"in-{i:03d}-{chunk:06d}-{p:05d}.arrow")


def _out_path(staging: str, p: int) -> str:
    return os.path.join(staging, f"out-{p:05d}.arrow")


class _Writer:
    """An Arrow IPC file written under a temporary name and renamed on close (task retries overwrite)."""

    def __init__(self, path: str, schema: pa.Schema):
        self.path, self.tmp = path, f"{path}.tmp-{os.getpid()}-{time.monotonic_ns()}"
        self._sink = pa.OSFile(self.tmp, "wb")
        self._w = pa.ipc.new_file(self._sink, schema)
        self.rows = 0

    def write(self, b) -> None:
        self._w.write(b)
        self.rows += b.num_rows

    def close(self) -> None:
        self._w.close()
        self._sink.close()
        os.replace(self.tmp, self.path)


def _read_ipc(path: str):
    with pa.memory_map(path) as src:
        r = pa.ipc.open_file(src)
        for k in range(r.num_record_batches):
            yield r.get_batch(k)


# ---- executor side ---------------------------------------------------------------------------

def split_chunk(plan: WSparkPlan, item: tuple[int, int, int, int | None]) -> dict:
    """Stage 1: hash-partition chunk ``item = (stream, chunk, start, stop)`` into per-partition files."""
    try:
        return _split_chunk(plan, item)
    except SmergeError as e:
        return _err(e)


def _split_chunk(plan: WSparkPlan, item) -> dict:
    i, chunk, start, stop = item
    spec = plan.streams[i]
    eplan = make_plan([s.schema for s in plan.streams], plan.params)
    tcol = plan.params.time[i]
    src = spec.open()
    row0 = start * spec.inner
    row = row0
    first_t = last_t = None
    writers: dict[int, _Writer] = {}
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
                pid = (_hash_terms(tab, eplan.hash_terms[i]) % np.uint64(P)).astype(np.int64)
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
                    w = writers[int(p)] = _Writer(_in_path(plan.staging, i, chunk, int(p)), schema)
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
        yield from _read_ipc(f)


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
        for b in _read_ipc(_in_path(plan.staging, i, chunk, 0)):
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
    w = _Writer(_out_path(plan.staging, p), schema)
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


# ---- driver side -----------------------------------------------------------------------------

class _Part:
    """One partition's output, read one batch ahead (``more``: batches remain after ``buf``)."""

    def __init__(self, path: str):
        self.it = _read_ipc(path)
        self.buf = None
        self.nxt = next(self.it, None)

    def refill(self) -> None:
        while (self.buf is None or self.buf.num_rows == 0) and self.nxt is not None:
            self.buf, self.nxt = self.nxt, next(self.it, None)

    @property
    def more(self) -> bool:
        return self.nxt is not None

    def last_key(self):
        k = self.buf.num_rows - 1
        return tuple(self.buf.column(c)[k].as_py() for c in (ORD_T, ORD_S, ORD_R))


def _le(b, key) -> np.ndarray:
    t, s, r = (b.column(c).to_numpy() for c in (ORD_T, ORD_S, ORD_R))
    kt, ks, kr = key
    return (t < kt) | ((t == kt) & ((s < ks) | ((s == ks) & (r <= kr))))


def merge_parts(paths: list[str]):
    """Yield the rows of the sorted part files in completion-key order (streaming k-way merge)."""
    parts = [_Part(p) for p in paths]
    while True:
        for q in parts:
            q.refill()
        live = [q for q in parts if q.buf is not None and q.buf.num_rows]
        if not live:
            return
        bounded = [q.last_key() for q in live if q.more]
        bound = min(bounded) if bounded else None
        take = []
        for q in live:
            if bound is None:
                take.append(q.buf)
                q.buf = None
                continue
            m = _le(q.buf, bound)
            k = int(m.sum())  # rows of a part are sorted, so the taken rows are a prefix
            if k:
                take.append(q.buf.slice(0, k))
                q.buf = q.buf.slice(k)
        if not take:
            continue
        tab = pa.Table.from_batches(take).combine_chunks() if len(take) > 1 else pa.Table.from_batches(take)
        if len(take) > 1:
            o = np.lexsort(tuple(tab.column(c).to_numpy() for c in (ORD_R, ORD_S, ORD_T)))
            tab = tab.take(pa.array(o))
        yield from tab.to_batches()


def _chunk_items(spec: StreamSpec, i: int, groups: int) -> list[tuple[int, int, int, int | None]]:
    if spec.outer is None or spec.outer == 0:
        return [(i, 0, 0, None)]
    g = max(1, min(groups, spec.outer))
    edges = [round(k * spec.outer / g) for k in range(g + 1)]
    return [(i, c, a, b) for c, (a, b) in enumerate(zip(edges[:-1], edges[1:])) if b > a]


def _collect(sc, rdd_fn, total: int, progress, label: str) -> list:
    from smerge.spark.actions import run_job  # job group + progress bar, shared by the Spark adapters

    return run_job(sc, rdd_fn, total, progress, label)


def run_wjoin_spark(prep, *, master: str | None = None, partitions: int | None = None,
                    conf: dict[str, str] | None = None, progress=None, verbose: bool = False, spark=None) -> dict:
    """Run the W-join of ``prep`` (``smerge.jobs.wjoin.prepare``) on Spark; return its statistics.

    ``spark``: an existing SparkSession (tests, batch); otherwise one is started for ``master``
    (``local[*]`` by default, or the one spark-submit configured) and stopped at the end.
    ``partitions``: P (default: Spark's default parallelism): hash partitions for HW-join, time
    ranges for NLW-join (one partition when P = 1; fewer ranges when the times have fewer
    distinct quantiles).
    Settings ``smerge.*`` in ``conf`` are smerge's own: ``smerge.wjoin.split_groups`` (chunks per
    input in the split stage, default: default parallelism).
    """
    from smerge.spark.runner import run_in_session

    return run_in_session(lambda spark, own, session_seconds, t0: _run(prep, spark, partitions, own, progress,
                                                                     session_seconds, t0),
                          master=master, partitions=partitions, conf=conf, verbose=verbose, spark=spark,
                          app_name="smerge wjoin")


def _run(prep, spark, partitions, own: dict, progress, session_seconds: float, t_start: float) -> dict:
    from smerge.datasets import open_output

    sc = spark.sparkContext
    params: WJoinParams = prep.params
    job = prep.job
    n = params.n_streams
    specs = tuple(StreamSpec(path=os.path.abspath(s.path), source=job.inputs[i], batch_rows=job.batch_rows,
                             schema=s.schema, outer=s.outer_size, inner=max(int(s.inner_size or 1), 1))
                  for i, s in enumerate(prep.sources))
    eplan = make_plan([s.schema for s in specs], params)
    hashed = eplan.hash_terms is not None
    P = partitions or max(1, sc.defaultParallelism)
    mode = "hash" if hashed else ("ranges" if P > 1 else "single")
    staging = make_staging(prep.output, "wjoin")  # owner-tagged (leftovers of killed runs are swept), umask modes
    plan = WSparkPlan(streams=specs, params=params, partitions=P, staging=staging, mode=mode)
    split_seconds = 0.0
    try:
        if plan.split:
            t1 = time.perf_counter()
            groups = int(own.get("smerge.wjoin.split_groups", max(1, sc.defaultParallelism)))
            items = [it for i, s in enumerate(specs) for it in _chunk_items(s, i, groups)]
            res = _collect(sc, lambda: sc.parallelize(items, len(items)).map(lambda it: split_chunk(plan, it))
                           .collect(), len(items), progress if len(items) > 4 else None, "split inputs")
            for r in res:
                if "error" in r:
                    _raise(r["error"])
            _check_seams(plan, res)
            if mode == "ranges":
                plan = _range_plan(plan, res, eplan)
                P = plan.partitions
            split_seconds = time.perf_counter() - t1
        t2 = time.perf_counter()
        results = _collect(sc, lambda: sc.parallelize(range(P), P).map(lambda p: join_partition(plan, p)).collect(),
                           P, progress, "join partitions")
        job_seconds = time.perf_counter() - t2
        results.sort(key=lambda r: r.get("p", -1))
        for r in results:
            if "error" in r:
                _raise(r["error"])
        t3 = time.perf_counter()
        out = open_output(prep.output, prep.out_schema, fmt=prep.output_format, overwrite=job.overwrite)
        try:
            for b in merge_parts([_out_path(staging, r["p"]) for r in results]):
                out.write(pa.RecordBatch.from_arrays([b.column(f.name) for f in prep.out_schema],
                                                     schema=prep.out_schema))
            out.commit()
        except BaseException:
            out.abort()
            raise
        assemble_seconds = time.perf_counter() - t3
    finally:
        shutil.rmtree(staging, ignore_errors=True)

    st = WJoinStats(aliases=params.aliases, method="hash" if hashed else "nested-loop")
    st.tuples = sum(r["tuples"] for r in results)
    st.records_read = [sum(r["records_read"][i] for r in results) for i in range(n)]
    st.peak_buffered = [max(r["peak_buffered"][i] for r in results) for i in range(n)]
    st.peak_held = [max(r["peak_held"][i] for r in results) for i in range(n)]
    st.peak_buffered_total = max(r["peak_buffered_total"] for r in results)
    st.chunks = sum(r["chunks"] for r in results)
    result = st.as_dict()
    p = params
    result.update({
        "inputs": list(job.inputs), "output": prep.output, "execution": "spark", "master": sc.master,
        "partitions": P, "partitioning": {"hash": "equality key hash", "ranges": "time ranges + halo",
                                          "single": "one partition"}[mode],
        "partition_tuples": [r["tuples"] for r in results],
        "fetch_seconds": split_seconds, "join_seconds": sum(r["join_seconds"] for r in results),
        "write_seconds": sum(r["write_seconds"] for r in results) + assemble_seconds,
        "session_start_seconds": session_seconds, "spark_job_seconds": job_seconds,
        "assemble_seconds": assemble_seconds, "total_seconds": time.perf_counter() - t_start,
        "params": {
            "time": list(p.time), "window": None if p.window is None else str(p.window),
            "pair_windows": [[i + 1, j + 1, None if d is None else str(d)] for i, j, d in p.pair_windows],
            "on": list(p.on), "where": p.where, "aliases": list(p.aliases), "with_ids": p.with_ids,
            "method": st.method, "output_format": prep.output_format, "batch_rows": job.batch_rows,
        },
    })
    if job.stats:
        write_stats(job.stats, result)
    return result


def _range_plan(plan: WSparkPlan, res: list[dict], eplan) -> WSparkPlan:
    """Boundaries at the quantiles of the sampled times; the halo is the largest shortest-path bound.

    A tuple is formed in the range that holds its completion time t_max (its last member's
    time); every member has t >= t_max - D_max, so the range's records plus those within the
    halo below it hold every member of the tuples completed in it.
    """
    sample = np.sort(np.concatenate([r["sample"] for r in res if r["rows"]] or [np.empty(0)]))
    P = plan.partitions
    bounds: list = []
    if sample.shape[0]:
        qs = sample[np.minimum((np.arange(1, P) * sample.shape[0]) // P, sample.shape[0] - 1)]
        bounds = [x.item() for x in np.unique(qs) if x > sample[0]]
    dist = eplan.dist
    if eplan.dtype is np.float64:
        halo = float(np.max(dist)) * (1 + 1e-9) + 1e-300
        scale = float(np.max(np.abs(sample))) if sample.shape[0] else 0.0
        halo += 1e-12 * max(scale, 1.0)  # float rounding of t_max - t: a wider halo only adds records
    else:
        halo = int(np.max(dist))
    chunk_times = tuple(tuple((r["chunk"], r["first_t"], r["last_t"])
                              for r in sorted((r for r in res if r["i"] == i and r["rows"]), key=lambda r: r["chunk"]))
                        for i in range(plan.params.n_streams))
    return replace(plan, bounds=tuple(bounds), halo=halo, chunk_times=chunk_times, partitions=len(bounds) + 1)


def _check_seams(plan: WSparkPlan, res: list[dict]) -> None:
    """Each stream's time must not decrease from one chunk to the next (checked inside chunks by the tasks)."""
    for i, spec in enumerate(plan.streams):
        chunks = sorted((r for r in res if r["i"] == i and r["rows"]), key=lambda r: r["chunk"])
        for a, b in zip(chunks[:-1], chunks[1:]):
            if b["first_t"] < a["last_t"]:
                tcol = plan.params.time[i]
                raise InputError(f"{spec.source}: time column {tcol!r} decreases at row {b['first_row']}; W-join "
                                 "needs every stream in non-decreasing time order (sort it first)")


__all__ = ["run_wjoin_spark", "split_chunk", "join_partition", "merge_parts", "WSparkPlan", "StreamSpec"]
