"""The CGM merge job: open inputs, validate everything up front, run the engine, write atomically.

A ``CGMJob`` describes one merge as the user gave it (paths, key names, parameters). ``prepare``
opens the inputs (metadata only), resolves default keys, validates every parameter and the
output paths, and returns a ``PreparedMerge``; nothing is written before that succeeds.
``run_local`` runs the engine in this process with dual buffering (background readers).
The Spark runner (``smerge.spark.cgm.runner``) takes the same ``PreparedMerge``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Mapping

import pyarrow as pa

from smerge.datasets import InputSource, open_input
from smerge.datasets.writers import check_output_schema
from smerge.jobs.inputs import PreparedMerge, ProgressFactory, check_kappa_memory, masked_stats, open_inputs
from smerge.jobs.outputs import abort_outputs, check_outputs, commit_outputs, default_output, open_outputs, write_stats
from smerge.merge import CGMParams, MergeKeys, MergeStats, cgm_merge, resolve_eps
from smerge.merge.keys import check_key_compat, key_eps, with_keys
from smerge.merge.output import pair_schema
from smerge.merge.params import DEFAULT_DELTA_WINDOWS, DEFAULT_LEAST_INCREMENT, DEFAULT_WINDOW_SIZE
from smerge.transport import BackgroundWriter, Prefetcher

if TYPE_CHECKING:
    from smerge.datasets.archive.sampling import Sampling


@dataclass(frozen=True)
class CGMJob:
    """One CGM merge as given on the command line or in a batch file."""

    a: str
    b: str
    output: str | None = None
    format: str | None = None
    keys_a: tuple[str, ...] | None = None
    keys_b: tuple[str, ...] | None = None
    vars_a: tuple[str, ...] | None = None
    vars_b: tuple[str, ...] | None = None
    eps: float | Mapping[str, float] | tuple[float, ...] = 0.0
    window_size: int = DEFAULT_WINDOW_SIZE
    least_increment_a: int = DEFAULT_LEAST_INCREMENT
    least_increment_b: int = DEFAULT_LEAST_INCREMENT
    with_ids: bool = False
    nan_keys: str = "error"
    delta: float | None = None
    delta_windows: int = DEFAULT_DELTA_WINDOWS
    adapt: bool = False
    unmatched: str | None = None
    stats: str | None = None
    kappa_max: bool = False
    overwrite: bool = False
    batch_rows: int = 131072
    command: str = ""
    # The run's sampled archive reads (``smerge.datasets.archive.sampling.Sampling``), set by the
    # pipeline (``execute``); None outside a run: archives read with the environment's fraction, else 1.
    sampling: Sampling | None = field(default=None, compare=False, repr=False)


def prepare(job: CGMJob, opener: Callable[..., InputSource] = open_input) -> PreparedMerge:
    """Open inputs (metadata only) and validate every parameter and output path.

    ``opener(path, keys=, variables=, batch_rows=)`` opens an input (default: smerge's own
    readers; the Spark runner passes one that reads URLs with Spark's readers).
    """
    src_a, src_b = open_inputs(job, opener)
    if job.kappa_max:
        check_kappa_memory(src_a, src_b)
    keys = MergeKeys(tuple(src_a.keys), tuple(src_b.keys))
    check_key_compat(src_a.schema, keys.a, src_b.schema, keys.b, source_a=job.a, source_b=job.b)
    eps = resolve_eps(key_eps(dict(job.eps) if isinstance(job.eps, Mapping) else job.eps, keys.a, src_a.schema),
                      keys.a)
    params = CGMParams(keys=keys, eps=eps, window_size=job.window_size, least_increment_a=job.least_increment_a,
                       least_increment_b=job.least_increment_b, with_ids=job.with_ids, nan_keys=job.nan_keys,
                       delta=job.delta, delta_windows=job.delta_windows, adapt=job.adapt)
    output = job.output or default_output(job.a, job.b)
    fmt, unmatched = check_outputs(job, output, src_a)
    write_ids = params.with_ids
    if fmt in ("netcdf", "zarr") and not write_ids:
        params = replace(params, with_ids=True)  # the grid writer places pairs by a_row
    out_schema = pair_schema(src_a.schema, src_b.schema, with_ids=params.with_ids)
    check_output_schema(output, fmt, out_schema)  # before the run: CSV holds no nested column
    return PreparedMerge(job=job, src_a=src_a, src_b=src_b, params=params, output=output, output_format=fmt,
                         out_schema=out_schema, write_ids=write_ids, unmatched_paths=unmatched)


def run_local(prep: PreparedMerge, *, progress: ProgressFactory | None = None, prefetch_depth: int = 4) -> dict:
    """Run the CGM merge in this process; return the statistics dict (docs/cli.md)."""
    t0 = time.perf_counter()
    stats = MergeStats("cgm")
    out, un_a, un_b = open_outputs(prep)
    bar = progress(prep.src_a.num_rows, "A records") if progress else None
    write_seconds = 0.0
    drop_ids = prep.params.with_ids and not prep.write_ids and prep.output_format not in ("netcdf", "zarr")
    # key columns, not a key matrix: the engine reads them as they are (no copy, no fresh pages)
    pa_it = Prefetcher(with_keys(prep.src_a.batches(), prep.params.keys.a, columns=True), prefetch_depth,
                       "smerge-read-a", on_item=(lambda kb: bar.update(kb.batch.num_rows)) if bar else None)
    pb_it = Prefetcher(with_keys(prep.src_b.batches(), prep.params.keys.b, columns=True), prefetch_depth,
                       "smerge-read-b")

    # Output batches are encoded and written in a background thread (dual buffering on the
    # output side), in order, while the engine computes the next ones.
    writer = BackgroundWriter(lambda item: item[0].write(item[1]), prefetch_depth, "smerge-write")

    def sink(side: str, batch: pa.RecordBatch) -> None:
        w = un_a if side == "a" else un_b
        if w is not None:
            writer.put((w, batch))

    try:
        for batch in cgm_merge(pa_it, pb_it, prep.params, schema_a=prep.src_a.schema, schema_b=prep.src_b.schema,
                               stats=stats, unmatched=sink if prep.unmatched_paths else None,
                               source_a=prep.job.a, source_b=prep.job.b, compute_kappa_max=prep.job.kappa_max):
            writer.put((out, batch.drop_columns(["a_row", "b_row"]) if drop_ids else batch))
        writer.close()
        write_seconds += commit_outputs((out, un_a, un_b))
    except BaseException:
        writer.cancel()
        abort_outputs((out, un_a, un_b))
        raise
    finally:
        pa_it.close()
        pb_it.close()
        if bar:
            bar.close()
    stats.fetch_seconds = max(pa_it.busy_seconds, pb_it.busy_seconds)
    stats.write_seconds = write_seconds + writer.busy_seconds
    stats.total_seconds = time.perf_counter() - t0
    stats.extra.update({
        "fetch_a_seconds": pa_it.busy_seconds, "fetch_b_seconds": pb_it.busy_seconds,
        "execution": "local", "a": prep.job.a, "b": prep.job.b, "output": prep.output,
        **masked_stats(prep),
    })
    result = stats.as_dict()
    result["params"] = dict(result["params"], with_ids=prep.write_ids, output_format=prep.output_format)
    if prep.job.stats:
        write_stats(prep.job.stats, result, overwrite=prep.job.overwrite)
    return result


__all__ = ["CGMJob", "prepare", "run_local"]
