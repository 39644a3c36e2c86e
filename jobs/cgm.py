"""Merge jobs: open inputs, validate everything up front, run an engine, write atomically.

A ``CGMJob`` describes one merge as the user gave it (paths, key names, parameters). ``prepare``
opens the inputs (metadata only), resolves default keys, validates every parameter and the
output paths, and returns a ``PreparedMerge``; nothing is written before that succeeds.
``run_local`` runs the engine in this process with dual buffering (background readers).
The Spark runner (``smerge.spark``) takes the same ``PreparedMerge``.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping

import pyarrow as pa

from smerge.datasets import InputSource, format_for, open_input, open_output
from smerge.datasets.outputs import check_distinct, check_target, make_temp_file
from smerge.datasets.writers import DATASET_FORMAT
from smerge.errors import MissingKeyError, SmergeError, UsageError
from smerge.merge import CGMParams, MergeKeys, MergeStats, cgm_merge, resolve_eps
from smerge.merge.keys import check_key_compat, key_eps, with_keys
from smerge.merge.output import b_output_names, pair_schema
from smerge.transport import BackgroundWriter, Prefetcher

ProgressFactory = Callable[[int | None, str], "Progress"]


class Progress:
    """What the runner needs of a progress bar (the CLI passes a tqdm-backed one)."""

    def update(self, n: int) -> None: ...

    def close(self) -> None: ...


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
    window_size: int = 5000
    least_increment_a: int = 1000
    least_increment_b: int = 1000
    with_ids: bool = False
    nan_keys: str = "error"
    delta: float | None = None
    delta_windows: int = 10
    adapt: bool = False
    unmatched: str | None = None
    stats: str | None = None
    kappa_max: bool = False
    overwrite: bool = False
    batch_rows: int = 131072
    command: str = ""


@dataclass
class PreparedMerge:
    job: CGMJob
    src_a: InputSource
    src_b: InputSource
    params: CGMParams
    output: str
    output_format: str
    out_schema: pa.Schema
    write_ids: bool
    unmatched_paths: tuple[str, str] | None
    extra: dict = field(default_factory=dict)


def default_output(a: str, b: str) -> str:
    stem = lambda p: os.path.splitext(os.path.basename(p.rstrip("/")))[0]  # noqa: E731
    return f"{stem(a)}+{stem(b)}.parquet"


def check_outputs(job, output: str, src_a: InputSource) -> tuple[str, tuple[str, str] | None]:
    """Validate a run's outputs before anything is read: format, and the output rule of
    ``smerge.datasets.outputs`` for each of -o, --unmatched and --stats (see ``check_run_outputs``).
    Returns the output format and the unmatched paths (or None).

    ``job`` needs ``a``, ``b``, ``format``, ``overwrite``, ``unmatched`` and ``stats``.
    """
    fmt = format_for(output, job.format)
    if fmt == "netcdf" and src_a.grid is None:
        raise UsageError(f"netCDF output is on A's grid, but A ({job.a}) is not netCDF; write .parquet, .csv or .arrow")
    unmatched = None
    if job.unmatched:
        unmatched = (f"{job.unmatched}.a.parquet", f"{job.unmatched}.b.parquet")
    outs = [("-o", output, fmt == DATASET_FORMAT)] + [("--unmatched", u, False) for u in (unmatched or ())] + (
        [("--stats", job.stats, False)] if job.stats else [])
    check_run_outputs([job.a, job.b], outs, overwrite=job.overwrite)
    return fmt, unmatched


def check_run_outputs(inputs, outputs: list[tuple[str, str, bool]], *, overwrite: bool) -> None:
    """The output rule for every output of one run, before anything is written (exit 2):
    distinct real paths, none an input or inside a folder output (``check_distinct_paths``),
    then for each one ``smerge.datasets.outputs.check_target`` (exists without ``overwrite``;
    with it only a file or a folder smerge wrote, never one holding an input).
    ``outputs``: (option, path, is a folder)."""
    check_distinct_paths(inputs, outputs)
    for opt, path, folder in outputs:
        check_target(path, overwrite=overwrite, folder=folder, inputs=inputs, opt=opt)


def check_distinct_paths(inputs, outputs) -> None:
    """Exit 2 when an output path is an input or another output of the run (nothing would be
    left of the input, or one output would replace another), compared by real path.
    ``outputs``: (option, path) or (option, path, is a folder)."""
    check_distinct(inputs, [(o[0], o[1], bool(o[2]) if len(o) > 2 else False) for o in outputs])


def open_inputs(job, opener: Callable[..., InputSource] = open_input) -> tuple[InputSource, InputSource]:
    """Open A and B (metadata only) with their keys matched **by name** (DATA.md section 1).

    B's keys are ``--keys-b`` when given, else A's key names (given, or A's defaults: the
    coordinate variables of A's dimensions in A's order), whatever B's own dimension order.
    ``job`` needs ``a``, ``b``, ``keys_a``, ``keys_b``, ``vars_a``, ``vars_b``, ``batch_rows``.
    """
    src_a = opener(job.a, keys=job.keys_a, variables=job.vars_a, batch_rows=job.batch_rows)
    if not src_a.keys:
        raise UsageError(f"{job.a}: no merge keys; pass --keys K1,K2 (tabular inputs have no default keys)")
    keys_b = job.keys_b or tuple(src_a.keys)
    try:
        src_b = opener(job.b, keys=keys_b, variables=job.vars_b, batch_rows=job.batch_rows)
    except MissingKeyError as e:
        if job.keys_b:
            raise
        raise UsageError(f"{job.b}: B has no {', '.join(map(repr, e.missing))}, a key of A ({','.join(src_a.keys)}); "
                         "keys are matched by name: name B's keys in A's order with --keys-b") from None
    if not src_b.keys:
        raise UsageError(f"{job.b}: no merge keys; pass --keys (or --keys-b for B)")
    return src_a, src_b


def prepare(job: CGMJob, opener: Callable[..., InputSource] = open_input) -> PreparedMerge:
    """Open inputs (metadata only) and validate every parameter and output path.

    ``opener(path, keys=, variables=, batch_rows=)`` opens an input (default: smerge's own
    readers; the Spark runner passes one that reads URLs with Spark's readers).
    """
    src_a, src_b = open_inputs(job, opener)
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
    if fmt == "netcdf" and not write_ids:
        params = replace(params, with_ids=True)  # the grid writer places pairs by a_row
    out_schema = pair_schema(src_a.schema, src_b.schema, with_ids=params.with_ids)
    return PreparedMerge(job=job, src_a=src_a, src_b=src_b, params=params, output=output, output_format=fmt,
                         out_schema=out_schema, write_ids=write_ids, unmatched_paths=unmatched)


def open_outputs(prep: PreparedMerge):
    """The atomic writers of a run: (pairs, unmatched A, unmatched B) — the last two may be None."""
    options = {}
    if prep.output_format == "netcdf":
        names_b = b_output_names(prep.src_a.schema.names, prep.src_b.schema.names)
        b_payload = [(n, o) for n, o in zip(prep.src_b.schema.names, names_b) if n not in prep.src_b.keys]
        options = dict(template=prep.src_a, template_b=prep.src_b, b_columns=[o for _, o in b_payload],
                       b_sources=[n for n, _ in b_payload], history=prep.job.command or "smerge cgm")
    outs = []
    try:
        outs.append(open_output(prep.output, prep.out_schema, fmt=prep.output_format, overwrite=prep.job.overwrite,
                                **options))
        if prep.unmatched_paths:
            for side, path, src in (("a", prep.unmatched_paths[0], prep.src_a), ("b", prep.unmatched_paths[1], prep.src_b)):
                schema = src.schema
                if prep.params.with_ids:
                    schema = schema.append(pa.field(f"{side}_row", pa.int64()))
                outs.append(open_output(path, schema, fmt="parquet", overwrite=prep.job.overwrite))
        else:
            outs += [None, None]
    except BaseException:
        for o in outs:
            if o is not None:
                o.abort()
        raise
    return outs


def masked_stats(prep: PreparedMerge, *, read_here: bool = True) -> dict:
    """``a_masked``/``b_masked``: values made missing by valid_min/valid_max/valid_range in each
    input (DATA.md section 3); ``None`` for a B behind a running server (not read here).
    ``read_here``: the whole inputs were streamed in this process (else they are counted by a
    read of the variables that have such attributes)."""
    from smerge.datasets.netcdf import masked_values

    b = None if prep.src_b.format == "flight" else masked_values(prep.src_b, read_here=read_here)
    return {"a_masked": masked_values(prep.src_a, read_here=read_here), "b_masked": b}


def commit_outputs(outputs) -> float:
    """Commit every atomic output (rename into place); returns the seconds it took."""
    t = time.perf_counter()
    for w in outputs:
        if w is not None:
            w.commit()
    return time.perf_counter() - t


def abort_outputs(outputs) -> None:
    """Remove every temporary output after a failure: no half-written file is left."""
    for w in outputs:
        if w is not None:
            w.abort()


def write_stats(path: str, stats: dict) -> None:
    """Write the statistics JSON atomically (owner-tagged temporary file, umask modes)."""
    tmp = make_temp_file(path)
    try:
        with open(tmp, "w") as f:
            json.dump(stats, f, indent=2, sort_keys=False, default=float)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


JOB_PATH_FIELDS = ("a", "b", "output", "unmatched", "stats", "token_file", "tls_root_cert")


def absolute_path(path: str | None) -> str | None:
    """``path`` absolute from this process's working folder, as executors must be given it
    (they resolve relative paths from their own); a trailing ``/`` (a folder output) is kept.
    URLs (``hdfs://``, ``s3a://``, ``grpc://``, ``file://`` ...) and None are returned as they are."""
    if not path or "://" in path:
        return path
    trailing = path.endswith(("/", os.sep)) and len(path) > 1
    out = os.path.abspath(os.path.expanduser(path))
    return out + os.sep if trailing and not out.endswith(os.sep) else out


def with_absolute_paths(job):
    """A job (``CGMJob``, ``RTMJob``, ``WJoinJob``) with every local path absolute
    (``absolute_path``): inputs, output, unmatched prefix, stats, token and certificate files.
    Done on the driver before a run crosses into Spark. A missing output stays None (the
    default output, in the working folder, is made absolute by ``absolute_output``)."""
    changes = {f: absolute_path(getattr(job, f)) for f in JOB_PATH_FIELDS if hasattr(job, f)}
    if hasattr(job, "inputs"):
        changes["inputs"] = tuple(absolute_path(p) for p in job.inputs)
    return replace(job, **changes)


def absolute_output(prep):
    """A prepared run (``PreparedMerge``, ``PreparedWJoin``) whose output -- the default one
    included -- is an absolute path (``absolute_path``); the same object, changed in place."""
    prep.output = absolute_path(prep.output)
    return prep


def needs_spark_readers(job, conf: Mapping[str, str] | None = None) -> bool:
    """True when an input is a URL for Spark's readers (hdfs://, s3a://, file://, ...) or the
    run asks for them (``--conf smerge.reader=spark``): the inputs are then opened in Spark."""
    from smerge.datasets import is_spark_url

    reader = str((conf or {}).get("smerge.reader", "auto")).lower()
    if reader not in ("auto", "spark", "smerge"):
        raise UsageError(f"--conf smerge.reader={reader!r}: use auto, spark or smerge")
    if reader == "smerge":
        return False
    return reader == "spark" or any(is_spark_url(p) for p in (job.a, job.b) if p)


def run_local(prep: PreparedMerge, *, progress: ProgressFactory | None = None, prefetch_depth: int = 4) -> dict:
    """Run the CGM merge in this process; return the statistics dict (spec/CLI.md)."""
    t0 = time.perf_counter()
    stats = MergeStats("cgm")
    out, un_a, un_b = open_outputs(prep)
    bar = progress(prep.src_a.num_rows, "A records") if progress else None
    write_seconds = 0.0
    drop_ids = prep.params.with_ids and not prep.write_ids and prep.output_format != "netcdf"
    pa_it = Prefetcher(with_keys(prep.src_a.batches(), prep.params.keys.a), prefetch_depth, "smerge-read-a",
                       on_item=(lambda kb: bar.update(kb.batch.num_rows)) if bar else None)
    pb_it = Prefetcher(with_keys(prep.src_b.batches(), prep.params.keys.b), prefetch_depth, "smerge-read-b")

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
        write_stats(prep.job.stats, result)
    return result


__all__ = ["CGMJob", "PreparedMerge", "prepare", "absolute_path", "with_absolute_paths", "absolute_output", "open_inputs", "needs_spark_readers", "check_outputs", "check_distinct_paths", "check_run_outputs", "run_local", "masked_stats", "open_outputs", "commit_outputs", "abort_outputs",
           "write_stats", "default_output",
           "SmergeError", "Progress"]
