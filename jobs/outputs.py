"""A run's outputs: checked before anything is read (the output rule), opened as atomic writers,
committed or aborted together; the statistics JSON. Shared by the cgm, rtm and wjoin jobs (in
process and on Spark)."""

from __future__ import annotations

import contextlib
import json
import os
import time

import pyarrow as pa

from smerge.datasets import InputSource, format_for, open_output
from smerge.datasets.output_commit import claim_file
from smerge.datasets.output_space import space_errors
from smerge.datasets.output_staging import make_temp_file
from smerge.datasets.outputs import check_distinct, check_target
from smerge.datasets.writers import GRID_FORMATS, is_dataset_path
from smerge.errors import UsageError, param
from smerge.jobs.inputs import PreparedMerge
from smerge.merge.output import b_output_names


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
    if fmt in GRID_FORMATS and src_a.grid is None:
        raise UsageError(f"{'netCDF' if fmt == 'netcdf' else 'Zarr'} output is on A's grid, but A ({job.a}) is not "
                         "gridded (netCDF, Zarr, GRIB); write .parquet, .csv or .arrow")
    outs = named_outputs(job, output)
    check_run_outputs([job.a, job.b], outs, overwrite=job.overwrite)
    return fmt, tuple(path for opt, path, _ in outs if opt == param.unmatched) or None


def named_outputs(job, output: str | None = None) -> list[tuple[str, str, bool]]:
    """-o (``output``, else the job's, else its default), --unmatched's two files and --stats of a
    cgm, rtm or wjoin job, as (option, path, is a folder): the outputs the run checks before it
    starts, and what a further output of the run (the CLI's ``--plot``) must not share a path with."""
    if output is None and getattr(job, "inputs", None):  # a W-join
        from smerge.jobs.wjoin import default_output as wjoin_default

        output = job.output or wjoin_default(job.inputs)
    elif output is None:
        output = job.output or default_output(job.a, job.b or "b")
    try:
        folder = is_dataset_path(output, format_for(output, job.format))
    except UsageError:  # an unknown extension: the run's own check names it
        folder = False
    outs = [("-o", output, folder)]
    if getattr(job, "unmatched", None):
        outs += [(param.unmatched, f"{job.unmatched}.{s}.parquet", False) for s in ("a", "b")]
    if job.stats:
        outs.append((param.stats, job.stats, False))
    return outs


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


def open_outputs(prep: PreparedMerge):
    """The atomic writers of a run: (pairs, unmatched A, unmatched B) — the last two may be None."""
    options = {}
    if prep.output_format in GRID_FORMATS:
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


def commit_outputs(outputs) -> float:
    """Commit every atomic output (put in place); returns the seconds it took. When one fails
    (its name was taken meanwhile, a full disk) the names this run claimed before it are removed
    again: the run leaves nothing written."""
    t = time.perf_counter()
    done = []
    try:
        for w in outputs:
            if w is not None:
                w.commit()
                done.append(w)
    except BaseException:
        for w in done:
            w.retract()
        raise
    return time.perf_counter() - t


def abort_outputs(outputs) -> None:
    """Remove every temporary output after a failure: no half-written file is left."""
    for w in outputs:
        if w is not None:
            w.abort()


@contextlib.contextmanager
def committed(outputs):
    """Commit every atomic writer of ``outputs`` (None entries are skipped) when the block ends,
    or abort them all when it raises (Ctrl-C and SIGTERM included): no half-written output."""
    try:
        yield
        commit_outputs(outputs)
    except BaseException:
        abort_outputs(outputs)
        raise


def write_stats(path: str, stats: dict, *, overwrite: bool = True, opt: str = param.stats) -> None:
    """Write the statistics JSON atomically (owner-tagged temporary file, umask modes); without
    ``overwrite`` its name is claimed atomically (``smerge.datasets.output_commit.claim_file``)."""
    tmp = make_temp_file(path)
    try:
        with space_errors(path, where=tmp, opt=opt):
            with open(tmp, "w") as f:
                json.dump(stats, f, indent=2, sort_keys=False, default=float)
                f.write("\n")
            claim_file(tmp, path, overwrite=overwrite, opt=opt)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


__all__ = ["default_output", "check_outputs", "check_run_outputs", "check_distinct_paths", "open_outputs",
           "commit_outputs", "abort_outputs", "committed", "write_stats"]
