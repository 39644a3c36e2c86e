"""W-join jobs: open n inputs, validate everything up front, run the join, write atomically.

``WJoinJob`` is the join as given on the command line; ``prepare`` opens the inputs (metadata
only; netCDF CF times decoded to ``timestamp[ns]``), builds and validates ``WJoinParams`` and
the predicate against the schemas, and checks the output path — nothing is written before
that succeeds. ``run_local`` streams the inputs through ``smerge.merge.wjoin.wjoin`` with one
background reader per input and writes the tuples as they form.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

import pyarrow as pa

from smerge.datasets import InputSource, format_for, open_input, open_output
from smerge.datasets.writers import check_output_schema
from smerge.errors import UsageError, param
from smerge.jobs.outputs import check_run_outputs, named_outputs, write_stats
from smerge.merge.values import Duration, parse_duration
from smerge.merge.wjoin import wjoin
from smerge.merge.wjoin_params import WJoinParams
from smerge.merge.wjoin_plan import make_plan
from smerge.merge.wjoin_stats import WJoinStats
from smerge.transport import Prefetcher

if TYPE_CHECKING:
    from smerge.datasets.archive.sampling import Sampling


@dataclass(frozen=True)
class WJoinJob:
    """One W-join: input paths, the time column(s), window bounds, predicate, output."""

    inputs: tuple[str, ...]
    time: tuple[str, ...]
    window: str | None = None
    pair_windows: tuple[str, ...] = ()  # "I,J=DUR" (1-based), DUR may be "none"
    vars: tuple[str, ...] = ()  # "I=V1,V2" (1-based) or "V1,V2" (every stream)
    on: tuple[str, ...] = ()
    where: str | None = None
    aliases: tuple[str, ...] = ()
    with_ids: bool = False
    method: str = "auto"
    output: str | None = None
    format: str | None = None
    overwrite: bool = False
    stats: str | None = None
    # Records per input batch. A W-join holds its buffers plus less than two batches per stream:
    # 8192 instead of 65536 took the peak RSS of the 48k-record benchmark shapes down by 6-12 MB
    # and of a 4-way join of 1M records per stream from ~290 to ~210 MB, for up to ~25% more
    # time on that join (123 chunks instead of 77, each rebuilding its hash chains); 4096 saved
    # 1-6 MB more and cost ~35% more there.
    batch_rows: int = 8192
    command: str = ""
    # The run's sampled archive reads (``smerge.datasets.archive.sampling.Sampling``), set by the
    # pipeline (``execute``); None outside a run: archives read with the environment's fraction, else 1.
    sampling: Sampling | None = field(default=None, compare=False, repr=False)


@dataclass
class PreparedWJoin:
    job: WJoinJob
    sources: list[InputSource]
    params: WJoinParams
    output: str
    output_format: str
    out_schema: pa.Schema
    extra: dict = field(default_factory=dict)
    # Per stream: the (keys, variables) it was opened with (None, None: the defaults), for reopening.
    opened: tuple[tuple[tuple[str, ...] | None, tuple[str, ...] | None], ...] = ()


def parse_pair_window(spec: str, n: int) -> tuple[int, int, Duration | None]:
    """``"1,3=2h"`` -> (0, 2, Duration(2, "h")); ``"1,3=none"`` removes that pair's bound."""
    pair, sep, dur = spec.partition("=")
    parts = [p.strip() for p in pair.split(",")]
    if not sep or len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise UsageError(f"{param.pair_windows} {spec!r} is not I,J=DUR; write e.g. {param.pair_windows} 1,3=2h (streams 1..{n})")
    i, j = int(parts[0]) - 1, int(parts[1]) - 1
    if not (0 <= i < n and 0 <= j < n) or i == j:
        raise UsageError(f"{param.pair_windows} {spec!r}: stream numbers must be two different values in 1..{n}")
    if dur.strip().lower() in ("none", "inf", "off"):
        return i, j, None
    return i, j, parse_duration(dur.strip(), param.pair_windows, shown=spec)


def parse_vars(specs: Sequence[str], n: int) -> tuple[tuple[str, ...] | None, ...]:
    """``("1=T,q", "x")`` -> the variables of each of the ``n`` streams (None: the default). A
    spec ``I=V1,V2`` names stream I's (1-based), a bare ``V1,V2`` every stream not named."""
    every: tuple[str, ...] | None = None
    per: dict[int, tuple[str, ...]] = {}
    for spec in specs:
        head, sep, rest = spec.partition("=")
        if sep and not head.strip().isdigit():
            raise UsageError(f"{param.vars} {spec!r} is not I=V1,V2 or V1,V2; write e.g. {param.vars} 1=T,q (streams 1..{n})")
        names = tuple(x.strip() for x in (rest if sep else spec).split(","))
        if not all(names):
            raise UsageError(f"{param.vars} {spec!r} has an empty name; give names separated by commas")
        dup = sorted({x for x in names if names.count(x) > 1})
        if dup:
            raise UsageError(f"{param.vars} {spec!r}: {', '.join(map(repr, dup))} named twice; name each once")
        if sep:
            i = int(head) - 1
            if not 0 <= i < n:
                raise UsageError(f"{param.vars} {spec!r}: stream number {int(head)} is not in 1..{n}")
            if i in per:
                raise UsageError(f"{param.vars} names stream {i + 1}'s variables twice; give one {param.vars} {i + 1}=V1,V2")
            per[i] = names
        else:
            if every is not None:
                raise UsageError(f"{param.vars} V1,V2 (every stream) is given twice; give it once, and I=V1,V2 for one "
                                 "stream")
            every = names
    return tuple(per.get(i, every) for i in range(n))


def _open_stream(path: str, variables: tuple[str, ...] | None, keep: tuple[str, ...], batch_rows: int,
                 sampling: Sampling | None = None):
    """``path`` opened with ``variables`` (the default choice when None) and the run's ``sampling``
    (an archive's fraction); returns (source, keys, variables) as opened. netCDF picks its keys itself (the coordinates of the variables'
    dimensions, as for cgm); a table keeps ``keep`` (its time and --on columns) before them."""
    from smerge.datasets.base import guess_backend
    from smerge.errors import MissingKeyError

    if variables is None or guess_backend(path).name == "netcdf":
        return open_input(path, variables=variables, batch_rows=batch_rows, decode_times=True,
                          sample=sampling), None, variables
    keys = tuple(dict.fromkeys(keep))
    try:
        return open_input(path, keys=keys, variables=variables, batch_rows=batch_rows, decode_times=True,
                          sample=sampling), keys, variables
    except MissingKeyError as e:
        raise UsageError(f"{path}: no column {', '.join(map(repr, e.missing))} ({param.vars} keeps the time column and the "
                         f"{param.on} columns); {str(e).partition('; ')[2]} (use {param.time})") from None


def default_output(inputs: Sequence[str]) -> str:
    stem = lambda p: os.path.splitext(os.path.basename(p.rstrip("/")))[0]  # noqa: E731
    return "+".join(stem(p) for p in inputs) + ".parquet"


def prepare(job: WJoinJob) -> PreparedWJoin:
    """Open inputs (metadata only) and validate every parameter, the predicate and the output."""
    n = len(job.inputs)
    if n < 2:
        raise UsageError(f"wjoin needs at least 2 inputs, got {n}")
    pairs = tuple(parse_pair_window(s, n) for s in job.pair_windows)
    params = WJoinParams(n_streams=n, time=tuple(job.time), window=job.window, pair_windows=pairs, on=tuple(job.on),
                         where=job.where, aliases=tuple(job.aliases), with_ids=job.with_ids, method=job.method)
    opened = [_open_stream(p, v, (params.time[i], *params.on), job.batch_rows, job.sampling)
              for i, (p, v) in enumerate(zip(job.inputs, parse_vars(job.vars, n)))]
    sources = [o[0] for o in opened]
    plan = make_plan([s.schema for s in sources], params, sources=job.inputs)  # columns, time kinds, predicate
    output = job.output or default_output(job.inputs)
    fmt = format_for(output, job.format)
    if fmt in ("netcdf", "zarr"):
        raise UsageError("W-join tuples are not on a grid; write .parquet, .csv or .arrow")
    check_run_outputs(job.inputs, named_outputs(job, output), overwrite=job.overwrite)
    check_output_schema(output, fmt, plan.out_schema)  # before the run: CSV holds no nested column
    return PreparedWJoin(job=job, sources=sources, params=params, output=output, output_format=fmt,
                         out_schema=plan.out_schema, opened=tuple(o[1:] for o in opened))


# Inputs of at most this many records in all are read in the join's thread: one reader thread per
# input costs ~1 MB of memory arena each and brought no measurable time at 48,000-record inputs
# (3 x 48,000: 0.33 s either way, 2.7 MB less peak memory); at 1M records per input the reader
# threads overlap decoding with the join.
INLINE_RECORDS = 1 << 20


def run_local(prep: PreparedWJoin, *, progress: Callable | None = None, prefetch_depth: int = 2) -> dict:
    """Run the W-join in this process; return the statistics dict."""
    t0 = time.perf_counter()
    stats = WJoinStats()
    out = open_output(prep.output, prep.out_schema, fmt=prep.output_format, overwrite=prep.job.overwrite)
    total = sum(s.num_rows or 0 for s in prep.sources) or None
    bar = progress(total, "input records") if progress else None
    if total is not None and total <= INLINE_RECORDS:
        prefetch_depth = 0  # read in this thread: see INLINE_RECORDS
    readers = [Prefetcher(s.batches(), prefetch_depth, f"smerge-read-{i + 1}",
                          on_item=(lambda b: bar.update(b.num_rows)) if bar else None)
               for i, s in enumerate(prep.sources)]
    write_seconds = 0.0
    try:
        for batch in wjoin(readers, [s.schema for s in prep.sources], prep.params, stats=stats,
                           sources=list(prep.job.inputs)):
            t = time.perf_counter()
            out.write(batch)
            write_seconds += time.perf_counter() - t
        t = time.perf_counter()
        out.commit()
        write_seconds += time.perf_counter() - t
    except BaseException:
        out.abort()
        raise
    finally:
        for r in readers:
            r.close()
        if bar:
            bar.close()
    total_seconds = time.perf_counter() - t0
    fetch = max(r.busy_seconds for r in readers)
    result = stats.as_dict()
    p = prep.params
    result.update({
        "inputs": list(prep.job.inputs), "output": prep.output, "execution": "local",
        "fetch_seconds": fetch, "join_seconds": max(stats.join_seconds - write_seconds, 0.0),
        "write_seconds": write_seconds, "total_seconds": total_seconds,
        "params": {
            "time": list(p.time), "window": None if p.window is None else str(p.window),
            "pair_windows": [[i + 1, j + 1, None if d is None else str(d)] for i, j, d in p.pair_windows],
            "on": list(p.on), "vars": list(prep.job.vars), "where": p.where, "aliases": list(p.aliases),
            "with_ids": p.with_ids,
            "method": stats.method, "output_format": prep.output_format, "batch_rows": prep.job.batch_rows,
        },
    })
    if prep.job.stats:
        write_stats(prep.job.stats, result, overwrite=prep.job.overwrite)
    return result


__all__ = ["WJoinJob", "PreparedWJoin", "prepare", "run_local", "parse_pair_window", "parse_vars", "default_output"]
