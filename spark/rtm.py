"""RTM on Spark (issue 4): each partition of A queries B's index server; the engine runs unchanged.

``run_rtm_spark(prep, master=...)`` takes a ``smerge.jobs.rtm.prepare_rtm`` result and returns the
same statistics dict as ``smerge.jobs.rtm.run_rtm``; the output files are exactly the ones
``--local`` writes (same rows, same order).

- *Server*: the one of ``--server`` (token from ``--token-file``, certificates from
  ``--tls-root-cert``), or an embedded one the driver starts on 127.0.0.1 (free port, random
  token) for the run. The embedded server is reachable by executors on the driver's host only
  (``local[*]``, a standalone cluster on one host); on a real cluster run ``smerge serve`` where
  the workers can reach it and pass ``--server``. The token travels to the tasks in the task
  closure.
- *Split*: A is cut into P contiguous row ranges whose boundaries are multiples of
  U = lcm(N, inner) records (N the window size, inner the records of one outer slab of a
  gridded input; 1 for tabular inputs). Every boundary is then a multiple of N, so every A
  window of a partition is exactly an in-process window, and the partition's pairs and
  unmatched A records are exactly the in-process ones of those windows; it is also a whole
  number of outer slabs, which ``InputSource.batches(start, stop)`` needs. P is at most
  ceil(R / U) (R = A's records): one partition when a slab and N do not divide well enough,
  or when A's record count is unknown (CSV, Arrow IPC).
- *Tasks*: each reads its row range of A, runs ``smerge.merge.rtm.rtm_merge`` against the
  server with global row ids, writes its pairs and unmatched A records as Arrow IPC part files
  in a staging directory next to the output, and returns its statistics and the bitmap
  (``np.packbits``) of the B records it paired.
- *Driver*: concatenates the parts in partition order through the same atomic writers as
  ``--local`` (no half-written output), ORs the bitmaps (B's unmatched = never paired in any
  partition), streams B's unmatched records from the server, and combines the statistics
  (report windows close at N records of A, so the partitions' kappas concatenated are the
  in-process kappas). ``--kappa-max`` is computed on the driver as ``--local`` does.
  The staging directory is removed at the end, also on failure, Ctrl-C or SIGTERM (``smerge.spark.runner``).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from smerge.errors import SmergeError
from smerge.jobs.outputs import committed, open_outputs
from smerge.merge.rtm_params import RTMParams
from smerge.merge.stats import MergeStats
from smerge.spark.actions import raise_task_error
from smerge.spark.parts import PartWriter, read_part
from smerge.spark.archive import pinned_sample
from smerge.spark.runner import SparkRun, run_on_spark

@dataclass(frozen=True)
class RTMSparkPlan:
    a_path: str
    source_a: str  # A as named on the command line (messages)
    keys_a: tuple[str, ...]
    vars_a: tuple[str, ...] | None
    batch_rows: int
    schema_a: pa.Schema
    schema_b: pa.Schema
    b_records: int
    params: RTMParams
    url: str
    token: str | None
    tls_root_certs: bytes | None
    ranges: tuple[tuple[int, int | None, int], ...]  # (start, stop) outer indices, first global row id
    staging: str
    unmatched_a: bool
    sample_a: tuple = ()  # A's (fraction, seed) when it is an archive, pinned on the driver (smerge.spark.archive)


def plan_ranges(num_rows: int | None, inner: int, window: int, partitions: int) -> list[tuple[int, int | None, int]]:
    """P contiguous ranges of A: (start, stop) in outer indices (stop None: to the end), first row id.

    Boundaries are multiples of U = lcm(window, inner) records; at most ceil(R / U) ranges.
    """
    inner = max(int(inner or 1), 1)
    if not num_rows or partitions <= 1:
        return [(0, None, 0)]
    unit = math.lcm(window, inner)
    units = -(-num_rows // unit)
    p = min(partitions, units)
    if p <= 1:
        return [(0, None, 0)]
    edges = [round(k * units / p) * unit for k in range(p + 1)]
    out = []
    for k in range(p):
        lo, hi = edges[k], edges[k + 1]
        out.append((lo // inner, None if k == p - 1 else hi // inner, lo))
    return out


def _fewer_partitions(src_a, window: int, asked: int, got: int) -> str:
    """Why an RTM run has fewer partitions than asked: A splits at multiples of lcm(N, records per
    outer index), so each partition starts a window on a slab boundary (``plan_ranges``)."""
    if not src_a.num_rows:
        return f"{got} partition: A's size is not known before it is read, so it is read in one range"
    unit = math.lcm(window, max(int(src_a.inner_size or 1), 1))
    return (f"{got} of the {asked} partitions asked: A ({src_a.num_rows:,} records) splits only at multiples of "
            f"{unit:,} records (the window N = {window:,} and A's records per outer index), so that each "
            "partition's windows are those of the in-process run; a smaller window N allows more partitions")


def _part(staging: str, kind: str, p: int) -> str:
    return os.path.join(staging, f"{kind}-{p:05d}.arrow")


# ---- executor side ---------------------------------------------------------------------------

def rtm_partition(plan: RTMSparkPlan, p: int) -> dict:
    """Run RTM on partition ``p`` of A against the server; write its part files; return its stats."""
    try:
        return _rtm_partition(plan, p)
    except SmergeError as e:
        return {"p": p, "error": (type(e).__name__, str(e))}
    except Exception as e:  # a full disk while writing parts: one line on the driver
        from smerge.spark.runner import task_write_error

        err = task_write_error(e, plan.staging)
        if err is None:
            raise
        return {"p": p, "error": (type(err).__name__, str(err))}


def _rtm_partition(plan: RTMSparkPlan, p: int) -> dict:
    from smerge.datasets import open_input
    from smerge.merge.output import pair_schema
    from smerge.spark.archive import open_options
    from smerge.merge.rtm import rtm_merge
    from smerge.transport import Prefetcher
    from smerge.transport.flight_client import IndexClient

    t0 = time.perf_counter()
    start, stop, first_row = plan.ranges[p]
    src = open_input(plan.a_path, keys=plan.keys_a, variables=plan.vars_a, batch_rows=plan.batch_rows,
                     **open_options(plan.sample_a))
    if src.schema != plan.schema_a:
        raise SmergeError(f"{plan.source_a}: the executor sees schema {src.schema} but the driver saw "
                          f"{plan.schema_a}; the file changed during the run, or executors read another copy")
    client = IndexClient(plan.url, token=plan.token, tls_root_certs=plan.tls_root_certs)
    params = plan.params
    stats = MergeStats("rtm")
    b_paired = np.zeros(plan.b_records, dtype=np.bool_)
    out = PartWriter(_part(plan.staging, "pairs", p), pair_schema(plan.schema_a, plan.schema_b,
                                                                  with_ids=params.with_ids))
    un_schema = plan.schema_a.append(pa.field("a_row", pa.int64())) if params.with_ids else plan.schema_a
    un = PartWriter(_part(plan.staging, "una", p), un_schema) if plan.unmatched_a else None
    a_it = Prefetcher(src.batches(start, stop), 4, "smerge-read-a")
    write_seconds = 0.0
    try:
        def sink(side: str, batch: pa.RecordBatch) -> None:
            if un is not None:
                un.write(batch)

        for batch in rtm_merge(a_it, client, params, schema_a=plan.schema_a, schema_b=plan.schema_b,
                               b_records=plan.b_records, stats=stats, unmatched=sink if un is not None else None,
                               a_first_row=first_row, source_a=plan.source_a, b_paired=b_paired):
            tw = time.perf_counter()
            out.write(batch)
            write_seconds += time.perf_counter() - tw
        tw = time.perf_counter()
        out.close()
        if un is not None:
            un.close()
        write_seconds += time.perf_counter() - tw
    except BaseException:
        out.abort()
        if un is not None:
            un.abort()
        raise
    finally:
        a_it.close()
        client.close()
    return {"p": p, "a_records": stats.a_records, "matched": stats.matched, "a_unmatched": stats.a_unmatched,
            "a_nan_keys": stats.a_nan_keys, "kappas": list(stats.kappas), "passes": stats.passes,
            "extra": {k: stats.extra.get(k, 0) for k in ("a_windows", "b_windows", "queries", "b_fetched")},
            "fetch_a_seconds": a_it.busy_seconds, "fetch_b_seconds": stats.extra.get("fetch_b_seconds", 0.0),
            "merge_seconds": stats.merge_seconds, "write_seconds": write_seconds, "retries": client.retried,
            "paired": np.packbits(b_paired).tobytes(), "seconds": time.perf_counter() - t0}


# ---- driver side -----------------------------------------------------------------------------

def _kappa_max(prep, client) -> dict:
    """kappa_max exactly as ``--local`` computes it: all of A's valid keys against all of B's."""
    from smerge.merge.ceiling import kappa_figures
    from smerge.merge.keys import key_matrix, nan_rows
    from smerge.jobs.rtm import b_keys

    keys = prep.params.keys.a
    ks, n = [], 0
    for batch in prep.src_a.batches():
        k = key_matrix(batch, keys)
        n += batch.num_rows
        ks.append(k[~nan_rows(k)])
    ka = np.concatenate(ks) if ks else np.empty((0, len(keys)))
    kb, rb = b_keys(client, prep.params.keys.b)
    return kappa_figures(ka, np.arange(ka.shape[0], dtype=np.int64), kb, rb, prep.params.eps, n)


def run_rtm_spark(prep, *, master: str | None = None, partitions: int | None = None,
                  conf: dict[str, str] | None = None, progress=None, verbose: bool = False, spark=None) -> dict:
    """Run the RTM merge of ``prep`` on Spark; return its statistics (the dict ``run_rtm`` returns).

    ``spark``: an existing SparkSession (tests); otherwise one is started for ``master``
    (``local[*]`` by default, or the one spark-submit configured) and stopped at the end.
    ``partitions``: P (default: Spark's default parallelism), reduced by the boundary rule.
    """
    return run_on_spark(lambda run: _run(prep, run, partitions), master=master, partitions=partitions, conf=conf,
                        verbose=verbose, spark=spark, progress=progress, app_name="smerge rtm")


def _run(prep, run: SparkRun, partitions: int | None) -> dict:
    from smerge.transport.flight_client import IndexClient
    from smerge.transport.tokens import read_token_file

    job = prep.job
    params: RTMParams = prep.params
    client = prep.extra.get("client")
    server = None
    build_seconds = 0.0
    try:
        if client is None:
            from smerge.index import BIndex
            from smerge.transport.flight_server import IndexServer
            from smerge.transport.tokens import new_token

            tb = time.perf_counter()
            idx = BIndex.from_source(prep.src_b, nan_keys=params.nan_keys)
            build_seconds = time.perf_counter() - tb
            token = new_token()
            server = IndexServer(idx, host="127.0.0.1", port=0, token=token)
            server.start_background()
            url, certs = server.url, None
            client = IndexClient(url, token=token)
        else:
            url = job.server
            token = read_token_file(job.token_file) if job.token_file else None
            certs = None
            if job.tls_root_cert:
                with open(job.tls_root_cert, "rb") as f:
                    certs = f.read()
        return _run_with_server(prep, run, partitions, client, url, token, certs, server, build_seconds)
    finally:
        if client is not None:
            client.close()
        if server is not None:
            server.shutdown()


def _run_with_server(prep, run: SparkRun, partitions, client, url, token, certs, server, build_seconds) -> dict:
    from smerge.jobs.rtm import rtm_result, unmatched_b

    sc = run.sc
    job = prep.job
    params: RTMParams = prep.params
    src_a = prep.src_a
    info = client.info()
    b_records = int(info["count"])
    P = partitions or max(1, sc.defaultParallelism)
    ranges = plan_ranges(src_a.num_rows, src_a.inner_size, params.window_size, P)
    a_path = src_a.path if "://" in src_a.path else os.path.abspath(src_a.path)
    staging = run.staging(prep.output, "rtm")
    plan = RTMSparkPlan(a_path=a_path, source_a=job.a, keys_a=tuple(src_a.keys),
                        vars_a=tuple(job.vars_a) if job.vars_a else None, batch_rows=job.batch_rows,
                        schema_a=src_a.schema, schema_b=prep.src_b.schema, b_records=b_records, params=params,
                        url=url, token=token, tls_root_certs=certs, ranges=tuple(ranges), staging=staging,
                        unmatched_a=bool(prep.unmatched_paths), sample_a=pinned_sample(a_path, job.sampling))
    t1 = time.perf_counter()
    results = run.collect(lambda: sc.parallelize(range(len(ranges)), len(ranges))
                          .map(lambda p: rtm_partition(plan, p)).collect(), len(ranges), "A partitions")
    job_seconds = time.perf_counter() - t1
    results.sort(key=lambda r: r["p"])
    for r in results:
        if "error" in r:
            raise_task_error(r["error"])
    paired = np.zeros(b_records, dtype=np.bool_)
    for r in results:
        paired |= np.unpackbits(np.frombuffer(r["paired"], np.uint8), count=b_records).astype(np.bool_)
    kappa_max = _kappa_max(prep, client) if job.kappa_max else None
    t2 = time.perf_counter()
    drop_ids = params.with_ids and not prep.write_ids and prep.output_format not in ("netcdf", "zarr")
    out, un_a, un_b = open_outputs(prep)
    with committed((out, un_a, un_b)):
        for r in results:
            for b in read_part(_part(staging, "pairs", r["p"])):
                out.write(b.drop_columns(["a_row", "b_row"]) if drop_ids else b)
            if un_a is not None:
                for b in read_part(_part(staging, "una", r["p"])):
                    un_a.write(b)
        if un_b is not None:
            for sel in unmatched_b(client, prep.src_b.schema.names, paired, with_ids=params.with_ids):
                un_b.write(sel)
    assemble_seconds = time.perf_counter() - t2

    stats = MergeStats("rtm")
    stats.params = params.as_dict()
    stats.a_records = sum(r["a_records"] for r in results)
    stats.b_records = b_records
    stats.b_nan_keys = int(info.get("nan_keys") or 0)  # left out of B's index (--nan-keys unmatched)
    stats.matched = sum(r["matched"] for r in results)
    stats.a_unmatched = sum(r["a_unmatched"] for r in results)
    stats.a_nan_keys = sum(r["a_nan_keys"] for r in results)
    stats.kappas = [k for r in results for k in r["kappas"]]
    stats.passes = sum(r["passes"] for r in results)
    n_paired = int(np.count_nonzero(paired))
    stats.b_unmatched = b_records - n_paired
    if kappa_max is not None:
        stats.set_kappa(kappa_max)
    stats.check_accounting()
    fetch_a = sum(r["fetch_a_seconds"] for r in results)
    fetch_b = sum(r["fetch_b_seconds"] for r in results)
    stats.fetch_seconds = fetch_a + fetch_b
    stats.merge_seconds = sum(r["merge_seconds"] for r in results)
    stats.write_seconds = sum(r["write_seconds"] for r in results) + assemble_seconds
    stats.total_seconds = time.perf_counter() - run.t0
    for k in ("a_windows", "b_windows", "queries", "b_fetched"):
        stats.extra[k] = sum(r["extra"][k] for r in results)
    stats.extra.update({
        "b_paired": n_paired, "fetch_b_seconds": fetch_b, "fetch_a_seconds": fetch_a,
        "index_build_seconds": build_seconds, "client_retries": client.retried + sum(r["retries"] for r in results),
        **run.stats(), "partitions": len(ranges), "partitions_asked": P,
        **({"partitions_note": _fewer_partitions(src_a, params.window_size, P, len(ranges))}
           if len(ranges) < P else {}),
        "partition_rows": [r["a_records"] for r in results],
        "spark_job_seconds": job_seconds,
        "assemble_seconds": assemble_seconds,
    })
    return rtm_result(prep, stats, embedded=server is not None, read_here=False)


__all__ = ["run_rtm_spark", "rtm_partition", "plan_ranges", "RTMSparkPlan"]
