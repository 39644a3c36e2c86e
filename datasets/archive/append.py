"""Appending a stream to an archive (``smerge archive append``): the parameters (``AppendParams``),
the lock and the sweep of what killed appends left, and ``append``, which cuts the stream into
runs, writes each (its blocks laid out by ``blocks``, its aggregates by ``aggregate``) and commits
it.

Appending is atomic per run: the run's file (and its aggregate files) are written under names
the manifest does not list yet and fsynced once each, their folders fsynced, then the manifest is
replaced atomically (temporary file, fsync, rename, fsync of the folder). A killed append leaves
the archive as it was before the run it was writing; the next append removes what the killed
one left (under the lock).
"""

from __future__ import annotations

import base64
import fcntl
import os
import secrets
import shutil
from contextlib import contextmanager
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import numpy as np
import pyarrow as pa

from smerge.datasets.archive.aggregate import AggregateSpec, _write_aggregates, check_aggregate
from smerge.datasets.archive.blocks import _eager_run, _rts_run, _RunFile, _split_run, parquet_options
from smerge.datasets.archive.manifest import (
    AGG_DIR, ARCHIVE_FORMAT, ARCHIVE_VERSION, DEFAULT_BLOCK_ROWS, DEFAULT_RUN_BLOCKS, EAGER, LAYOUT, LAYOUTS, LOCK,
    MANIFEST, MAX_COPIES, MAX_RUN_RECORDS, RUN_SUFFIX, RUNS_DIR, _RUN_ID, Manifest, _fsync_path, _make_dir,
    _write_manifest, all_blocks, max_time, min_time, read_manifest)
from smerge.datasets.archive.probe import is_archive
from smerge.datasets.metadata import schema_list, short_error
from smerge.datasets.output_space import space_cause
from smerge.datasets.output_staging import remove_stale
from smerge.errors import InputError, OutputError, UsageError, param


def parse_copies(text: str) -> tuple[float, ...]:
    """``--copies 0.2,0.4,0.6,0.8``: reduction levels in (0, 1), distinct (a copy keeps 1 - level)."""
    try:
        levels = [float(x) for x in text.split(",")]
    except ValueError:
        raise UsageError(f"{param.copies} {text!r}: give reduction levels in (0, 1) separated by commas, e.g. "
                         "0.2,0.4,0.6,0.8") from None
    return check_copies(levels, text)


def check_copies(levels: Iterable[float], text: Any = None) -> tuple[float, ...]:
    levels = list(levels)
    shown = text if text is not None else ",".join(map(str, levels))
    if not levels or not all(isinstance(v, (int, float)) and 0 < v < 1 for v in levels):
        raise UsageError(f"{param.copies} {shown}: every reduction level must be in (0, 1) (0.2 keeps 80% of the records; "
                         "the primary copy keeps them all)")
    if len(set(levels)) != len(levels) or len(levels) > MAX_COPIES:
        raise UsageError(f"{param.copies} {shown}: give at most {MAX_COPIES} distinct levels")
    return tuple(sorted((float(v) for v in levels), reverse=True))  # smallest copy first


@dataclass(frozen=True)
class AppendParams:
    """Parameters of one append, validated once. ``seed`` None: fresh entropy (recorded per run).
    ``layout`` None: the archive's (randomize-then-sort for a new one, eager when ``copies`` are given).
    ``copies``/``aggregates`` empty on an existing archive: the archive's."""

    time: str
    run_blocks: int = DEFAULT_RUN_BLOCKS
    block_rows: int = DEFAULT_BLOCK_ROWS
    seed: int | None = None
    layout: str | None = None
    copies: tuple[float, ...] = ()
    aggregates: tuple[AggregateSpec, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.time:
            raise UsageError(f"{param.time} names the archive's time column; it cannot be empty")
        if not 1 <= self.run_blocks <= 100_000:
            raise UsageError(f"{param.run_blocks} is {self.run_blocks}; use 1 .. 100000")
        if not 1 <= self.block_rows <= MAX_RUN_RECORDS:
            raise UsageError(f"{param.block_rows} is {self.block_rows}; use 1 .. {MAX_RUN_RECORDS}")
        if self.run_blocks * self.block_rows > MAX_RUN_RECORDS:
            raise UsageError(f"{param.run_blocks} x {param.block_rows} is {self.run_blocks * self.block_rows:,} records held in "
                             f"memory per run; keep it at most {MAX_RUN_RECORDS:,}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise UsageError(f"{param.seed} is {self.seed}; use 0 .. 2^63-1")
        if self.layout is not None and self.layout not in LAYOUTS:
            raise UsageError(f"{param.layout} is {self.layout!r}; use {' or '.join(LAYOUTS)}")
        if self.copies:
            object.__setattr__(self, "copies", check_copies(self.copies))
            if self.layout == LAYOUT:
                raise UsageError(f"{param.copies} are the eager layout's; drop them or use {param.layout} eager")
        elif self.layout == EAGER:
            raise UsageError(f"{param.layout} eager needs {param.copies} (reduction levels in (0, 1), e.g. 0.2,0.4,0.6,0.8)")
        names = [a.name for a in self.aggregates]
        if len(set(names)) != len(names):
            raise UsageError(f"{param.aggregate} given twice for {', '.join(sorted({n for n in names if names.count(n) > 1}))}")

    def resolved_layout(self) -> str:
        return self.layout or (EAGER if self.copies else LAYOUT)


_SORTABLE = (pa.types.is_integer, pa.types.is_floating, pa.types.is_timestamp, pa.types.is_date)


def check_time_column(where: str, schema: pa.Schema, time: str) -> None:
    if time not in schema.names:
        raise UsageError(f"{where}: no time column {time!r}; its columns are {', '.join(schema.names)}")
    t = schema.field(time).type
    if not any(p(t) for p in _SORTABLE):
        raise UsageError(f"{where}: time column {time!r} is {t}; it must be a number, timestamp or date")


@contextmanager
def _locked(directory: str) -> Iterator[None]:
    fd = os.open(os.path.join(directory, LOCK), os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _sweep(directory: str, man: Manifest | None) -> None:
    """Remove what killed appends left: temporary files and staging folders (owner gone), run files
    and folders and aggregate files the manifest does not list. Called under the lock."""
    remove_stale(directory)
    runs = os.path.join(directory, RUNS_DIR)
    remove_stale(runs)
    listed = {r["id"] for r in man.runs} if man else set()
    if os.path.isdir(runs):
        for e in os.scandir(runs):
            rid = e.name[:-len(RUN_SUFFIX)] if e.name.endswith(RUN_SUFFIX) else e.name
            if _RUN_ID.match(rid) and rid not in listed:
                if e.is_dir(follow_symlinks=False):
                    shutil.rmtree(e.path, ignore_errors=True)
                else:
                    os.unlink(e.path)
    aggs = os.path.join(directory, AGG_DIR)
    if os.path.isdir(aggs):
        for d in os.scandir(aggs):
            if d.is_dir(follow_symlinks=False):
                for e in os.scandir(d.path):
                    rid = e.name[:-len(".parquet")] if e.name.endswith(".parquet") else ""
                    if _RUN_ID.match(rid) and rid not in listed:
                        os.unlink(e.path)


def _new_archive_ok(directory: str) -> bool:
    """A folder an append may turn into a new archive: absent, empty, or only what a killed
    first append left (the lock, staging leftovers, runs and aggregates folders)."""
    if not os.path.lexists(directory):
        return True
    if not os.path.isdir(directory):
        return False
    return all(name in (LOCK, RUNS_DIR, AGG_DIR) or ".smerge-" in name for name in os.listdir(directory))


def _commit(directory: str, meta: dict, run: dict) -> None:
    """Make ``run`` part of the archive: fsync its files and their folders, then replace the manifest
    (``meta``, which lists it) atomically. Runs in the append's commit thread, one run at a time, in order."""
    files = {b["file"] for b in all_blocks(run)} | {a["file"] for a in run.get("aggregates", ())}
    for name in sorted(files):
        _fsync_path(os.path.join(directory, name))
    for folder in sorted({os.path.dirname(name) for name in files}):
        _fsync_path(os.path.join(directory, folder))
    _write_manifest(directory, meta)


def _write_run(directory: str, table: pa.Table, meta: dict, params: AppendParams, run_id: str,
               rng: np.random.Generator, ids: np.ndarray | None, opts: dict) -> dict:
    """Write one run's file (and aggregate files) under names the manifest does not list yet (not
    fsynced here: ``_commit`` does it)."""
    runs = os.path.join(directory, RUNS_DIR)
    _make_dir(runs)
    rf = _RunFile(directory, run_id, meta["time"], opts)
    try:
        if meta["layout"] == EAGER:
            entry = _eager_run(rf, table, rng, tuple(meta["copies"]), params.block_rows, meta["time"])
        else:
            entry = _rts_run(rf, table, ids, params.run_blocks, meta["time"])
        rf.f.close()
        if meta.get("aggregates"):
            entry["aggregates"] = _write_aggregates(directory, table, meta["time"], meta["aggregates"], run_id)
    except BaseException:
        if not rf.f.closed:
            rf.f.close()
        for a in [rf.path] + [os.path.join(directory, AGG_DIR, s["name"], f"{run_id}.parquet")
                              for s in meta.get("aggregates", [])]:
            if os.path.exists(a):
                os.unlink(a)
        raise
    return entry


def _check_times(source: str, table: pa.Table, time: str, first_row: int) -> None:
    import pyarrow.compute as pc

    col = table.column(time)
    bad = pc.is_null(col, nan_is_null=True) if pa.types.is_floating(col.type) else pc.is_null(col)
    if pc.any(bad).as_py():
        row = first_row + int(pc.index(bad, True).as_py())
        raise InputError(f"{source}: time column {time!r} is missing or NaN at record {row}; clean the input "
                         "(runs before that record were appended)")


def append(directory: str, source_path: str, batches: Iterable[pa.RecordBatch], schema: pa.Schema,
           params: AppendParams) -> dict:
    """Append a stream (``batches`` of ``schema``) to the archive ``directory`` (created when absent),
    one run at a time; returns a summary. Memory: one run (at most R x B records, plus eager copies)
    at a time.

    The schema must equal the archive's (names, order and types) and hold ``params.time``; the
    layout, copies and aggregates must be the archive's (or not given); otherwise ``UsageError``
    before anything is written.
    """
    created = not os.path.lexists(directory)
    try:
        return _append(directory, source_path, batches, schema, params)
    except BaseException as e:
        if created and not is_archive(directory):  # failed before its first run: leave no folder behind
            shutil.rmtree(directory, ignore_errors=True)
        if not isinstance(e, OSError):
            raise
        # a folder that cannot be written, a full disk: the current run is not appended
        cause = space_cause(e, directory) or e.strerror or short_error(e)
        raise OutputError(f"{directory}: cannot write the archive ({cause}); check the folder's "
                          "permissions and free space (runs appended before this one are kept)") from None


def _new_meta(schema: pa.Schema, params: AppendParams, specs: list[dict]) -> dict:
    layout = params.resolved_layout()
    meta = {"format": ARCHIVE_FORMAT, "version": ARCHIVE_VERSION, "layout": layout, "time": params.time,
            "schema": schema_list(schema),
            "arrow_schema": base64.b64encode(schema.serialize().to_pybytes()).decode("ascii"),
            "count": 0, "runs": []}
    if layout == EAGER:
        meta["copies"] = list(params.copies)
    if specs:
        meta["aggregates"] = specs
    return meta


def _append(directory: str, source_path: str, batches: Iterable[pa.RecordBatch], schema: pa.Schema,
            params: AppendParams) -> dict:
    check_time_column(source_path, schema, params.time)
    specs = [check_aggregate(source_path, schema, params.time, a) for a in params.aggregates]
    existing = is_archive(directory)
    if existing:
        _check_compatible(read_manifest(directory, check_files=False), schema, params, specs, source_path)
    elif not _new_archive_ok(directory):
        raise InputError(f"{directory}: not an smerge archive (no {MANIFEST}) and not empty; name a new folder "
                         "or an archive")
    else:
        parent = os.path.dirname(os.path.abspath(directory))
        if not os.path.isdir(parent):
            raise UsageError(f"{directory}: its folder {parent!r} does not exist; create it first")
        os.makedirs(directory, exist_ok=True)
    with _locked(directory):
        man = read_manifest(directory) if is_archive(directory) else None
        if man is not None:
            _check_compatible(man, schema, params, specs, source_path)
        _sweep(directory, man)
        meta = dict(man.meta) if man else _new_meta(schema, params, specs)
        meta["runs"] = list(meta["runs"])
        eager = meta["layout"] == EAGER
        opts = parquet_options(schema, meta["time"])
        seed_rng = np.random.default_rng(params.seed)
        added_runs = added = 0
        pending: list[pa.RecordBatch] = []
        pending_rows = 0
        run_max = params.run_blocks * params.block_rows if eager else params.run_blocks * (params.block_rows - 1) + 1
        seen = 0
        # Run k's commit (fsyncs, manifest) runs in one background thread while run k + 1 is assigned,
        # encoded and written: the fsyncs wait on the disk, not the CPU. Commits stay in run order and
        # at most one is in flight (each waits for the one before).
        committer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="smerge-archive-commit")
        in_flight: list[Future] = []

        def wait_commit() -> None:
            nonlocal added_runs, added
            while in_flight:
                n_run = in_flight[0].result()
                in_flight.pop(0)
                added_runs += 1
                added += n_run

        def commit(snapshot: dict, run: dict) -> int:
            _commit(directory, snapshot, run)
            return run["count"]

        def flush(final: bool) -> None:
            nonlocal pending, pending_rows
            table = pa.Table.from_batches(pending, schema=schema)
            while table.num_rows and (final or table.num_rows >= run_max):
                seed = int(seed_rng.integers(0, 2**63))
                rng = np.random.default_rng(seed)
                if eager:
                    n, ids = min(table.num_rows, run_max), None
                else:
                    n, ids = _split_run(table.num_rows, params.run_blocks, params.block_rows, rng)
                run_id = f"r{len(meta['runs']) + 1:06d}-{secrets.token_hex(4)}"
                entry = _write_run(directory, table.slice(0, n), meta, params, run_id, rng, ids, opts)
                run = {"id": run_id, "count": n, "seed": seed, "run_blocks": params.run_blocks,
                       "block_rows": params.block_rows, "t_min": min_time(entry["blocks"]),
                       "t_max": max_time(entry["blocks"]), **entry}
                wait_commit()
                meta["runs"].append(run)
                meta["count"] += n
                in_flight.append(committer.submit(commit, dict(meta, runs=list(meta["runs"])), run))
                table = table.slice(n)
            pending = table.combine_chunks().to_batches() if table.num_rows else []
            pending_rows = table.num_rows

        try:
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                if batch.schema != schema:
                    batch = pa.RecordBatch.from_arrays([batch.column(c) for c in schema.names], schema=schema)
                _check_times(source_path, pa.Table.from_batches([batch]), params.time, seen)
                seen += batch.num_rows
                pending.append(batch)
                pending_rows += batch.num_rows
                if pending_rows >= run_max:
                    flush(False)
            flush(True)
            wait_commit()
        finally:
            committer.shutdown(wait=True)  # a run being committed is committed whole (or not at all)
            for f in in_flight:
                if f.done() and f.exception() is None:
                    added_runs, added = added_runs + 1, added + f.result()
        if man is None and not added_runs:
            _write_manifest(directory, meta)  # an empty source: an empty archive, with its schema
    return {"archive": directory, "source": source_path, "layout": meta["layout"], "runs_added": added_runs,
            "records_added": added, "runs": len(meta["runs"]), "count": meta["count"]}


def _check_compatible(man: Manifest, schema: pa.Schema, params: AppendParams, specs: list[dict], source: str) -> None:
    if schema_list(schema) != man.meta["schema"]:
        want = ", ".join(f"{n} {t}" for n, t in man.meta["schema"])
        got = ", ".join(f"{n} {t}" for n, t in schema_list(schema))
        raise UsageError(f"{source}: its schema ({got}) differs from the archive's ({want}); append only streams "
                         "with the archive's columns and types, or start a new archive")
    if params.time != man.time:
        raise UsageError(f"{param.time} is {params.time!r} but the archive's time column is {man.time!r}")
    if params.layout is not None and params.layout != man.layout:
        raise UsageError(f"{param.layout} is {params.layout} but the archive's layout is {man.layout}; drop {param.layout}")
    if params.copies and list(params.copies) != man.meta.get("copies"):
        have = ",".join(f"{v:g}" for v in sorted(man.meta.get("copies") or [])) or "none"
        raise UsageError(f"{param.copies} {','.join(f'{v:g}' for v in sorted(params.copies))} differ from the archive's "
                         f"({have}); drop {param.copies}")
    if specs and specs != man.meta.get("aggregates", []):
        have = ", ".join(s["name"] for s in man.meta.get("aggregates", [])) or "none"
        raise UsageError(f"{param.aggregate} differs from the archive's aggregates ({have}); drop {param.aggregate} (every run "
                         "gets the archive's)")
