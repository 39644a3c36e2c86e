"""W-join on Spark (issue 5, docs/semantics.md section 7): the in-process engine runs unchanged inside tasks.

``run_wjoin_spark(prep, master=...)`` takes a ``smerge.jobs.wjoin.PreparedWJoin`` and returns the
same statistics dict as ``smerge.jobs.wjoin.run_local``; the output file is exactly the one
``--local`` writes (same rows, same order).

HW-join (equalities link every stream), P partitions:

1. *Split* (executors, one task per chunk of each input): read the chunk in Python
   (``smerge.datasets``: netCDF, Parquet, CSV, Arrow), check the time column (present,
   non-decreasing), hash every record's equality key with the engine's own hash
   (``smerge.merge.wjoin_hashing.hash_terms``: SQL-equal values hash equal across streams) and append
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

import os
import time
from dataclasses import replace

import numpy as np
import pyarrow as pa

from smerge.errors import InputError
from smerge.jobs.outputs import committed, write_stats
from smerge.merge.wjoin_params import WJoinParams
from smerge.merge.wjoin_plan import make_plan
from smerge.merge.wjoin_stats import WJoinStats
from smerge.spark.actions import raise_task_error
from smerge.spark.archive import pinned_sample
from smerge.spark.parts import read_part
from smerge.spark.runner import SparkRun, run_on_spark
from smerge.spark.wjoin_tasks import (ORD_R, ORD_S, ORD_T, StreamSpec, WSparkPlan, join_partition, out_path,
                                      split_chunk)


class _Part:
    """One partition's output, read one batch ahead (``more``: batches remain after ``buf``)."""

    def __init__(self, path: str):
        self.it = read_part(path)
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
    return run_on_spark(lambda run: _run(prep, run, partitions), master=master, partitions=partitions, conf=conf,
                        verbose=verbose, spark=spark, progress=progress, app_name="smerge wjoin")


def _run(prep, run: SparkRun, partitions: int | None) -> dict:
    from smerge.datasets import open_output

    sc = run.sc
    params: WJoinParams = prep.params
    job = prep.job
    n = params.n_streams
    specs = tuple(StreamSpec(path=os.path.abspath(s.path), source=job.inputs[i], batch_rows=job.batch_rows,
                             schema=s.schema, outer=s.outer_size, inner=max(int(s.inner_size or 1), 1),
                             sample=pinned_sample(s.path, job.sampling), keys=keys, variables=variables)
                  for i, (s, (keys, variables)) in enumerate(zip(prep.sources, prep.opened or [(None, None)] * n)))
    eplan = make_plan([s.schema for s in specs], params)
    hashed = eplan.hash_terms is not None
    P = partitions or max(1, sc.defaultParallelism)
    mode = "hash" if hashed else ("ranges" if P > 1 else "single")
    staging = run.staging(prep.output, "wjoin")
    plan = WSparkPlan(streams=specs, params=params, partitions=P, staging=staging, mode=mode)
    split_seconds = 0.0
    if plan.split:
        t1 = time.perf_counter()
        groups = int(run.own.get("smerge.wjoin.split_groups", max(1, sc.defaultParallelism)))
        items = [it for i, s in enumerate(specs) for it in _chunk_items(s, i, groups)]
        res = run.collect(lambda: sc.parallelize(items, len(items)).map(lambda it: split_chunk(plan, it)).collect(),
                          len(items), "split inputs", bar=len(items) > 4)
        for r in res:
            if "error" in r:
                raise_task_error(r["error"])
        _check_seams(plan, res)
        if mode == "ranges":
            plan = _range_plan(plan, res, eplan)
            P = plan.partitions
        split_seconds = time.perf_counter() - t1
    t2 = time.perf_counter()
    results = run.collect(lambda: sc.parallelize(range(P), P).map(lambda p: join_partition(plan, p)).collect(),
                          P, "join partitions")
    job_seconds = time.perf_counter() - t2
    results.sort(key=lambda r: r.get("p", -1))
    for r in results:
        if "error" in r:
            raise_task_error(r["error"])
    t3 = time.perf_counter()
    out = open_output(prep.output, prep.out_schema, fmt=prep.output_format, overwrite=job.overwrite)
    with committed([out]):
        for b in merge_parts([out_path(staging, r["p"]) for r in results]):
            out.write(pa.RecordBatch.from_arrays([b.column(f.name) for f in prep.out_schema], schema=prep.out_schema))
    assemble_seconds = time.perf_counter() - t3

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
        "inputs": list(job.inputs), "output": prep.output, **run.stats(),
        "partitions": P, "partitioning": {"hash": "equality key hash", "ranges": "time ranges + halo",
                                          "single": "one partition"}[mode],
        "partition_tuples": [r["tuples"] for r in results],
        "fetch_seconds": split_seconds, "join_seconds": sum(r["join_seconds"] for r in results),
        "write_seconds": sum(r["write_seconds"] for r in results) + assemble_seconds,
        "spark_job_seconds": job_seconds,
        # the tuples-and-buffers timeline is a single stream's (in-process); partitions have none
        "timeline": None,
        "assemble_seconds": assemble_seconds, "total_seconds": time.perf_counter() - run.t0,
        "params": {
            "time": list(p.time), "window": None if p.window is None else str(p.window),
            "pair_windows": [[i + 1, j + 1, None if d is None else str(d)] for i, j, d in p.pair_windows],
            "on": list(p.on), "vars": list(job.vars), "where": p.where, "aliases": list(p.aliases),
            "with_ids": p.with_ids,
            "method": st.method, "output_format": prep.output_format, "batch_rows": job.batch_rows,
        },
    })
    if job.stats:
        write_stats(job.stats, result, overwrite=job.overwrite)
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
