"""Spark execution of the CGM merge: the driver side.

``run_cgm_spark(prep, master=...)`` runs the same engine as ``smerge.jobs.run_local`` inside
Spark tasks, one task per range of the leading key (see ``smerge.spark.cgm.tasks`` for the
co-partitioning and ownership rule), and returns the same statistics dict.

Flow: (1) planning, only when P > 1: per chunk of the outermost dimension the count and the
range of the leading key k1 -- from the file's metadata for gridded inputs keyed by their
outer coordinate, else from a scan of k1 alone on the executors; (2) the driver picks P - 1
boundaries; (3) the merge job runs one task per range; every task reads only the chunks that
can hold its records, runs the engine (reader threads and a background writer inside the
task) and writes its final pairs and unmatched records as part files (Parquet parts of the
final output when the output is Parquet, else Arrow IPC); seam pairs (with a B record near a
boundary) come back to the driver, which keeps at most one pair per record; (4) the driver
finishes the output atomically: a Parquet dataset folder is the parts renamed into place, a
single Parquet file is the parts joined byte-for-byte (``smerge.spark.parquet``), other
formats are written from the Arrow parts; the staging directory is removed also on failure.
"""

from __future__ import annotations

import json

import os
import threading
import time
from dataclasses import replace

import numpy as np
import pyarrow as pa

from smerge.datasets.writers import DATASET_FORMAT
from smerge.errors import InputError, UsageError, param
from smerge.jobs import PreparedMerge, masked_stats, write_stats
from smerge.merge import MergeStats
from smerge.spark.actions import arrow_batches, run_job, session_conf, spark_action
from smerge.spark.cgm import windows as pwin
from smerge.spark.cgm.assemble import assemble_outputs, finish_parquet, start_join
from smerge.spark.cgm.plan import explicit_bounds, frame_order, plan_frames, plan_slabs, side_spec
from smerge.spark.cgm.seams import raise_partition_errors, report_kappas, resolve_seams
from smerge.spark.cgm.tasks import PART_KINDS, MergePlan, run_partition
from smerge.spark.runner import SparkRun, run_on_spark
from smerge.spark.session import DEFAULT_MASTER


def run_cgm_spark(prep, *, master: str | None = DEFAULT_MASTER, partitions: int | None = None,
                  conf: dict[str, str] | None = None, progress=None, verbose: bool = False, spark=None) -> dict:
    """Run the CGM merge of ``prep`` on Spark; return the statistics dict (docs/cli.md).

    ``prep``: a ``PreparedMerge`` (inputs opened by smerge's readers: slab pairing), or a
    ``CGMJob`` whose inputs are opened in the Spark session -- URLs by Spark's own readers
    (``smerge.spark.frames``; see ``smerge.jobs.needs_spark_readers``).
    ``spark``: an existing SparkSession (batch runs, tests); otherwise one is started for
    ``master`` and stopped at the end. ``partitions``: P, the number of key ranges (default:
    Spark's default parallelism). Settings ``smerge.*`` in ``conf`` are smerge's own (docs/spark.md).
    """
    def body(run: SparkRun) -> dict:
        spark = run.spark
        p = prep if isinstance(prep, PreparedMerge) else prepare_frames(prep, spark)
        if not _frame_sources(p):
            return _run(p, run, partitions)
        # Row ids of inputs read by Spark come from its file splits: keep their layout fixed
        # for the whole run (it depends on the default parallelism, which grows as executors
        # register on a cluster).
        pin = spark.conf.get("spark.sql.files.minPartitionNum", None) or str(max(1, spark.sparkContext.defaultParallelism))
        with session_conf(spark, {"spark.sql.files.minPartitionNum": pin}):
            return _run(p, run, partitions)

    return run_on_spark(body, master=master, partitions=partitions, conf=conf, verbose=verbose, spark=spark,
                        progress=progress)


def prepare_frames(job, spark) -> PreparedMerge:
    """``prepare`` with the inputs opened in ``spark``: URLs (and, beside a URL, local Parquet/CSV)
    by Spark's readers, local netCDF through the ``smerge_netcdf`` data source."""
    from smerge.jobs import prepare
    from smerge.spark.frames import open_frame

    return prepare(job, opener=lambda path, sample=None, **kw: open_frame(spark, path, **kw))


def _frame_sources(prep: PreparedMerge) -> dict | None:
    from smerge.spark.frames import FrameSource

    srcs = {"a": prep.src_a, "b": prep.src_b}
    if not any(isinstance(s, FrameSource) for s in srcs.values()):
        return None
    for side, s in srcs.items():
        if not isinstance(s, FrameSource):
            raise UsageError(f"{s.path}: open both inputs with smerge.spark.frames when one of them is a URL")
    return srcs


def _empty_result(p: int) -> dict:
    return {"p": p, "a_records": 0, "b_records": 0, "b_visible": 0, "b_shared_owned": 0, "a_nan_keys": 0,
            "b_nan_keys": 0, "final_pairs": 0, "engine_pairs": 0, "passes": 0, "kappas": [], "windows": [],
            "merge_seconds": 0.0, "write_seconds": 0.0, "read_seconds": 0.0, "task_seconds": 0.0,
            "seam": None, "seam_owned": b"", "seam_ord": b"", "cand_b": None}


def _merge_frames(spark, plan: MergePlan, frames: dict, scans: dict, progress) -> list[dict]:
    """Tag both inputs with row ids and partitions, shuffle them into P groups, merge each group."""
    from smerge.spark.frames import cogroup_merge, results_of, salts, tagged_frame

    P = plan.parts
    salt = salts(spark, P)
    ta = tagged_frame(frames["a"], "a", scans["a"], plan.bounds, plan.eps1, salt)
    tb = tagged_frame(frames["b"], "b", scans["b"], plan.bounds, plan.eps1, salt)
    sc = spark.sparkContext
    act = spark_action(f"{plan.source_a} + {plan.source_b}")
    with session_conf(spark, {"spark.sql.shuffle.partitions": str(P),
                               "spark.sql.adaptive.coalescePartitions.enabled": "false",
                               **arrow_batches(plan.a.batch_rows)}):
        rows = act(lambda: run_job(sc, lambda: cogroup_merge(ta, tb, plan, salt).collect(), P, progress,
                                   "merge partitions"))
    results = {r["p"]: r for r in results_of(rows)}
    return [results.get(p) or _empty_result(p) for p in range(P)]


def _frames_kappa_max(spark, plan: MergePlan, frames: dict, scans: dict) -> dict:
    """The --kappa-max figures of frame inputs (``merge.ceiling.kappa_figures``, as --local), in
    one task that gets both inputs' keys (as ``_kappa_max``)."""
    from smerge.spark.frames import ROW, tagged_frame

    def keyed(side):
        src = frames[side]
        t = tagged_frame(src, side, scans[side], (), plan.eps1, [0], replicate=False)
        return t.select(*[f"`{k}`" for k in src.keys], ROW, "_salt")

    def task(key, left: pa.Table, right: pa.Table) -> pa.Table:
        from smerge.merge.ceiling import kappa_figures
        from smerge.merge.keys import key_matrix

        out = []
        for t, spec in ((left, plan.a), (right, plan.b)):
            k = key_matrix(t, spec.keys)
            r = t.column(ROW).to_numpy()
            good = ~np.isnan(k).any(axis=1)
            out.append((np.ascontiguousarray(k[good]), r[good], t.num_rows))
        (ka, ra, na), (kb, rb, _) = out
        o = np.argsort(ra, kind="stable")
        ka, ra = np.ascontiguousarray(ka[o]), ra[o]
        o = np.argsort(rb, kind="stable")
        kb, rb = np.ascontiguousarray(kb[o]), rb[o]
        return pa.table({"k": pa.array([json.dumps(kappa_figures(ka, ra, kb, rb, plan.params.eps, na))])})

    a, b = keyed("a"), keyed("b")
    with session_conf(spark, {"spark.sql.shuffle.partitions": "1"}):
        rows = spark_action(param.kappa_max)(
            lambda: a.groupBy("_salt").cogroup(b.groupBy("_salt")).applyInArrow(task, "k string").collect())
    return json.loads(rows[0].k)


def _run(prep: PreparedMerge, run: SparkRun, partitions: int | None) -> dict:
    t0 = time.perf_counter()
    spark, sc, own, progress = run.spark, run.sc, run.own, run.progress
    job = prep.job
    specs = {"a": side_spec(prep, "a"), "b": side_spec(prep, "b")}
    eps1 = float(prep.params.eps[0])
    frames = _frame_sources(prep)
    bounds = explicit_bounds(own)

    # (1) planning: none for one partition; metadata or a k1 scan otherwise
    if frames:
        scans, bounds = plan_frames(spark, prep, frames, partitions, bounds, own, progress)
        plan_how = {"a": "spark-scan", "b": "spark-scan"}
        runs_a = runs_b = ((),) * (len(bounds) + 1)
        order = {side: frame_order(scans[side]) for side in ("a", "b")}
    else:
        bounds, plan_how, runs_a, runs_b, order = plan_slabs(prep, sc, specs, partitions, bounds, own, progress)
    P = len(bounds) + 1
    windows, density = pwin.plan_windows(prep.params, bounds, *(order or {"a": [], "b": []}).values(),
                                         pwin.window_mode(own)) if P > 1 else (None, None)
    plan_seconds = time.perf_counter() - t0

    # (2) the merge job: executors write the part files
    task_threads = _task_threads(own, sc, P)  # (a bad setting fails before anything is created)
    part_format = "parquet" if prep.output_format in ("parquet", DATASET_FORMAT) else "arrow"
    kill, _, marker = own.get("smerge.test.kill_once_partition", "").partition(":")
    una_schema = unb_schema = None
    if prep.unmatched_paths:
        una_schema, unb_schema = prep.src_a.schema, prep.src_b.schema
        if prep.params.with_ids:
            una_schema = una_schema.append(pa.field("a_row", pa.int64()))
            unb_schema = unb_schema.append(pa.field("b_row", pa.int64()))
    staging = run.staging(prep.output, "spark", PART_KINDS)  # removed at the end, whatever ends the run
    plan = MergePlan(a=specs["a"], b=specs["b"], params=replace(prep.params, with_ids=True), bounds=bounds,
                     eps1=eps1, runs_a=runs_a, runs_b=runs_b, staging=staging,
                     want_unmatched=prep.unmatched_paths is not None, source_a=job.a, source_b=job.b,
                     part_format=part_format, out_schema=prep.out_schema if part_format == "parquet" else None,
                     una_schema=una_schema, unb_schema=unb_schema,
                     prefetch=task_threads, windows=windows,
                     kill_once_partition=int(kill) if kill else None, kill_marker=marker or None)
    # The pairs an in-process run would find: estimated on the driver while the merge job runs.
    estimate = _Estimate(prep, specs, own, order) if P > 1 and not frames else None
    joiner = start_join(prep, plan)  # a single Parquet file: its parts joined while the job runs
    if joiner is not None:
        run.on_end(joiner.close)
    t1 = time.perf_counter()
    try:
        if frames:
            results = _merge_frames(spark, plan, frames, scans, progress)
        else:
            results = run.collect(lambda: sc.parallelize(range(P), P).map(lambda p: run_partition(plan, p)).collect(),
                                  P, "merge partitions")
    finally:
        if estimate is not None:
            estimate.join()
    job_seconds = time.perf_counter() - t1
    results.sort(key=lambda r: r["p"])
    raise_partition_errors(results)
    if plan.windows:  # report windows of the job's N, as --local's (the tasks closed them at N_p)
        for r in results:
            r["windows"], r["k_windows"] = pwin.regroup_windows(r["windows"], r.get("k_windows", []),
                                                                prep.params.window_size)
    t2 = time.perf_counter()
    seam = resolve_seams(prep, results)
    if part_format == "parquet":
        finish_parquet(prep, plan, results, seam, joiner)
    else:
        assemble_outputs(prep, plan, results, seam)
    assemble_seconds = time.perf_counter() - t2

    stats = MergeStats("cgm")
    stats.params = prep.params.as_dict()
    stats.a_records = sum(r["a_records"] for r in results)
    stats.b_records = sum(r["b_records"] for r in results)
    if frames and (stats.a_records, stats.b_records) != (scans["a"].count, scans["b"].count):
        raise InputError(f"{job.a} + {job.b}: the merge read {stats.a_records:,} + {stats.b_records:,} records but the "
                         f"key scan counted {scans['a'].count:,} + {scans['b'].count:,}; an input changed during the "
                         "run: run it again")
    stats.matched = sum(r["final_pairs"] for r in results) + seam["kept"]
    stats.a_unmatched = stats.a_records - stats.matched
    stats.b_unmatched = stats.b_records - stats.matched
    stats.a_nan_keys = sum(r["a_nan_keys"] for r in results)
    stats.b_nan_keys = sum(r["b_nan_keys"] for r in results)
    stats.passes = sum(r["passes"] for r in results)
    stats.kappas = report_kappas(results, seam["dropped_at"])
    # The K in force per report window, aligned with the kappas (partitions in key-range order;
    # with --adapt each task adapts its own K from the starting K).
    stats.k_windows = [tuple(k) for r in results for k in r.get("k_windows", ())]
    stats.check_accounting()
    if job.kappa_max:
        stats.set_kappa(_frames_kappa_max(spark, plan, frames, scans) if frames else _kappa_max(sc, plan))
    stats.fetch_seconds = plan_seconds + sum(r.get("read_seconds", 0.0) for r in results)
    stats.merge_seconds = sum(r["merge_seconds"] for r in results)
    stats.write_seconds = sum(r["write_seconds"] for r in results) + assemble_seconds
    stats.total_seconds = time.perf_counter() - t0
    stats.extra.update({
        **masked_stats(prep, read_here=False),
        **run.stats(), "partitions": P, "bounds": list(bounds),
        "plan": plan_how, "part_format": part_format, "task_threads": plan.prefetch,
        "plan_seconds": plan_seconds, "spark_job_seconds": job_seconds,
        "fetch_a_seconds": sum(r.get("read_a_seconds", 0.0) for r in results),
        "fetch_b_seconds": sum(r.get("read_b_seconds", 0.0) for r in results),
        "assemble_seconds": assemble_seconds,
        "task_seconds": [r.get("task_seconds", 0.0) for r in results],
        "task_cpu_seconds": [r.get("task_cpu_seconds", 0.0) for r in results],
        "b_shared": sum(r["b_shared_owned"] for r in results),
        "seam_pairs": seam["total"], "seam_pairs_dropped": seam["total"] - seam["kept"],
        "partition_pairs": [r["final_pairs"] for r in results],
        **_archive_io(results),
        **_partition_stats(plan, density, stats.matched, estimate,
                           "inputs read by Spark's readers" if frames else "one partition is the in-process run"),
        "a": job.a, "b": job.b, "output": prep.output,
    })
    result = stats.as_dict()
    result["params"] = dict(result["params"], with_ids=prep.write_ids, output_format=prep.output_format)
    if job.stats:
        write_stats(job.stats, result, overwrite=job.overwrite)
    return result


class _Estimate:
    """``windows.estimate_local_pairs`` in a driver thread (the driver waits for the merge job
    meanwhile). ``smerge.partition.estimate=false`` turns it off."""

    def __init__(self, prep: PreparedMerge, specs: dict, own: dict, order: dict | None):
        self.result: dict | None = None
        self.reason = ""
        self.seconds = 0.0
        if str(own.get("smerge.partition.estimate", "true")).lower() in ("false", "0", "no", "off"):
            self.reason, self._thread = "smerge.partition.estimate=false", None
            return
        # record counts: the readers', else the planning's (CSV)
        n_a, n_b = (src.num_rows if src.num_rows is not None else
                    (round(sum(per * smp.size for per, smp in order[side])) if order else None)
                    for side, src in (("a", prep.src_a), ("b", prep.src_b)))
        self._thread = threading.Thread(target=self._run, args=(specs, prep.params, n_a, n_b),
                                        name="smerge-estimate", daemon=True)
        self._thread.start()

    def _run(self, specs, params, n_a, n_b) -> None:
        t = time.perf_counter()
        try:
            if n_a is None or n_b is None:
                self.reason = "input sizes unknown before the run"
                return
            self.result = pwin.estimate_local_pairs(specs["a"], specs["b"], params, n_a, n_b)
        except Exception as e:  # noqa: BLE001 - the estimate only informs; the merge reports input errors
            self.reason = f"the estimate failed ({type(e).__name__}: {e})"
        finally:
            self.seconds = time.perf_counter() - t

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()


def _partition_stats(plan: MergePlan, density, matched: int, estimate: _Estimate | None, why_not: str) -> dict:
    """The partitions' windows and densities, and expected vs found pairs (spark.cgm.windows)."""
    if plan.parts == 1:
        return {}
    out = {"partition_windows": [list(w) for w in plan.windows] if plan.windows else None,
           "arrival_density": {k: [round(float(x), 4) for x in v] for k, v in density.items()} if density else None}
    if estimate is None:
        out.update(pwin.check(matched, None, why_not))
    else:
        out.update(pwin.check(matched, estimate.result, estimate.reason))
        out["estimate_seconds"] = round(estimate.seconds, 3)
    return out


def _archive_io(results: list[dict]) -> dict:
    """Blocks and bytes the merge tasks read of archive inputs (``a_archive_blocks_read``,
    ``a_archive_bytes_read``, ``b_...``): f of the archive's blocks, plus the runs at the edges of
    the tasks' ranges (docs/archive.md, "On Spark"). The planning's key scan is not counted."""
    out = {}
    for side in ("a", "b"):
        ios = [r["archive_io"][side] for r in results if side in r.get("archive_io", {})]
        if ios:
            out[f"{side}_archive_blocks_read"] = sum(x["blocks_read"] for x in ios)
            out[f"{side}_archive_bytes_read"] = sum(x["bytes_read"] for x in ios)
    return out


def _task_threads(own: dict, sc, parts: int) -> bool:
    """Reader/writer threads inside the merge tasks: ``smerge.task.prefetch`` true/false, or
    ``auto`` (default): on when the tasks leave cores free (P below the cores of the machine
    for local masters, below Spark's default parallelism otherwise), off when every core
    already runs a task (measured: threads then only add contention)."""
    v = str(own.get("smerge.task.prefetch", "auto")).lower()
    if v in ("true", "1", "yes", "on"):
        return True
    if v in ("false", "0", "no", "off"):
        return False
    if v != "auto":
        raise UsageError(f"{param.conf} smerge.task.prefetch={v!r}: use true, false or auto")
    slots = (os.cpu_count() or 1) if str(sc.master).startswith("local") else sc.defaultParallelism
    return parts < max(1, slots)


def _kappa_max(sc, plan: MergePlan) -> dict:
    """The --kappa-max figures (``merge.ceiling.kappa_figures``, as --local) computed in one task
    that reads both inputs' keys."""

    def task(_):
        from smerge.merge.ceiling import kappa_figures
        from smerge.spark.cgm.tasks import key_columns

        out = []
        for spec in (plan.a, plan.b):
            src = spec.open()
            ks, rs, row = [], [], 0
            for b in src.batches():
                k = key_columns(b, spec.keys)
                r = np.arange(row, row + b.num_rows, dtype=np.int64)
                row += b.num_rows
                good = ~np.isnan(k).any(axis=1)
                ks.append(k[good])
                rs.append(r[good])
            out.append((np.ascontiguousarray(np.concatenate(ks)) if ks else np.empty((0, len(spec.keys))),
                        np.concatenate(rs) if rs else np.empty(0, np.int64), row))
        (ka, ra, na), (kb, rb, _) = out
        return [kappa_figures(ka, ra, kb, rb, plan.params.eps, na)]

    return sc.parallelize([0], 1).flatMap(task).collect()[0]


__all__ = ["run_cgm_spark", "prepare_frames"]
