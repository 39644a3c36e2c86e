"""Archived streams (ENGINES.md section 8): a folder holding one stream, appended run by run.

Layout ``randomize-then-sort`` (OSCAR section 4.1.3)::

    ARCHIVE/manifest.json                       format, version, schema, time column, runs, checksums
    ARCHIVE/.lock                               held (flock) by an append while it runs
    ARCHIVE/runs/<run id>/block-00000.parquet   one block: at most B records, sorted by time (stable)

Appended records are cut into runs of R blocks: each record goes to one of the run's R blocks
chosen uniformly at random (seeded); the run is closed when one of its blocks holds B records
(or the source ends), as in the paper, so blocks are not all full. Each block is its own
Parquet file, so it can be read alone. The manifest lists every block with its run, record
count, time range, bytes and SHA-256, and carries its own SHA-256.

Appending is atomic per run: a run's blocks are written in an owner-tagged staging folder
(``outputs.make_staging``), renamed into ``runs/``, then the manifest is replaced atomically
(temporary file, fsync, rename). A killed append leaves the archive as it was before the run
it was writing; the next append removes what the killed one left (under the lock).

Reading lives in ``archive_read``; this module holds the manifest and the writer.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import numpy as np
import pyarrow as pa

from smerge.datasets.outputs import make_staging, remove_stale, temp_name
from smerge.errors import InputError, OutputError, UsageError

ARCHIVE_FORMAT = "smerge-archive"
ARCHIVE_VERSION = 1
MANIFEST = "manifest.json"
LOCK = ".lock"
RUNS_DIR = "runs"
LAYOUT = "randomize-then-sort"
DEFAULT_RUN_BLOCKS = 16  # R: blocks per run (the paper measures 10, 100 and 500)
DEFAULT_BLOCK_ROWS = 65536  # B: records per block at most
MAX_RUN_RECORDS = 1 << 28  # R * B bound: a run is held in memory while it is written
_RUN_ID = re.compile(r"^r\d{6}-[0-9a-f]{8}$")
_BLOCK_FILE = re.compile(r"^block-\d{5}\.parquet$")


# --------------------------------------------------------------------------------------------
# Manifest


def _short(e: BaseException) -> str:
    text = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return text if len(text) <= 160 else text[:157] + "..."


def damaged(directory: str, what: str) -> InputError:
    return InputError(f"{directory}: damaged archive ({what}); restore it from a copy, or append to a new archive")


def _digest(meta: dict) -> str:
    body = {k: v for k, v in meta.items() if k != "manifest_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def schema_list(schema: pa.Schema) -> list[list[str]]:
    return [[f.name, str(f.type)] for f in schema]


def _json_time(column: pa.ChunkedArray | pa.Array, i: int) -> Any:
    """Value ``i`` of a time column as JSON: numbers as they are, timestamps and dates as Arrow's
    text (``2024-01-01 00:00:00.000000001``: fixed width per unit, so text order is time order)."""
    if pa.types.is_integer(column.type) or pa.types.is_floating(column.type):
        return column[i].as_py()
    return column.slice(i, 1).cast(pa.string())[0].as_py()


@dataclass(frozen=True)
class Manifest:
    """The checked manifest of an archive (a dict as stored, plus the decoded schema)."""

    directory: str
    meta: dict
    schema: pa.Schema

    @property
    def time(self) -> str:
        return self.meta["time"]

    @property
    def runs(self) -> list[dict]:
        return self.meta["runs"]

    @property
    def count(self) -> int:
        return self.meta["count"]

    def block_path(self, block: dict) -> str:
        return os.path.join(self.directory, block["file"])


def is_archive(path: str) -> bool:
    """True when ``path`` is a folder with an archive manifest (not checked further)."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, MANIFEST))


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _block_ok(b: Any, run_id: str) -> bool:
    return (isinstance(b, dict) and isinstance(b.get("file"), str) and isinstance(b.get("sha256"), str)
            and all(_int(b.get(k)) for k in ("count", "bytes")) and b["count"] >= 1
            and os.path.dirname(b["file"]) == f"{RUNS_DIR}/{run_id}" and bool(_BLOCK_FILE.match(os.path.basename(b["file"]))))


def read_manifest(directory: str, *, check_files: bool = True) -> Manifest:
    """The archive's manifest, checked: its own SHA-256, every field, counts adding up and (with
    ``check_files``) every block file present with its recorded size. Damage is an InputError."""
    path = os.path.join(directory, MANIFEST)
    if not os.path.isdir(directory) or not os.path.isfile(path):
        raise InputError(f"{directory}: not an smerge archive (no {MANIFEST}); create one with `smerge archive append`")
    try:
        with open(path, "rb") as f:
            meta = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise damaged(directory, f"{MANIFEST} cannot be read ({_short(e)})") from None
    if not isinstance(meta, dict):
        raise damaged(directory, f"{MANIFEST} is not a JSON object")
    if meta.get("format") != ARCHIVE_FORMAT or meta.get("version") != ARCHIVE_VERSION:
        fmt, ver = str(meta.get("format"))[:40], str(meta.get("version"))[:40]
        raise InputError(f"{directory}: archive format {fmt}/{ver} is not supported (this smerge reads "
                         f"{ARCHIVE_FORMAT}/{ARCHIVE_VERSION})")
    if meta.get("manifest_sha256") != _digest(meta):
        raise damaged(directory, f"{MANIFEST} does not match its checksum")
    runs = meta.get("runs")
    ok = (meta.get("layout") == LAYOUT and isinstance(meta.get("time"), str) and _int(meta.get("count"))
          and isinstance(meta.get("schema"), list) and isinstance(meta.get("arrow_schema"), str)
          and isinstance(runs, list)
          and all(isinstance(r, dict) and isinstance(r.get("id"), str) and _RUN_ID.match(r["id"])
                  and _int(r.get("count")) and _int(r.get("seed")) and _int(r.get("run_blocks"))
                  and _int(r.get("block_rows")) and isinstance(r.get("blocks"), list) and r["blocks"]
                  and all(_block_ok(b, r["id"]) for b in r["blocks"])
                  and sum(b["count"] for b in r["blocks"]) == r["count"] for r in runs)
          and sum(r["count"] for r in runs) == meta["count"])
    if not ok:
        raise damaged(directory, f"{MANIFEST} has missing or malformed fields")
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(meta["arrow_schema"], validate=True)))
    except (ValueError, pa.ArrowException) as e:
        raise damaged(directory, f"its schema cannot be decoded ({_short(e)})") from None
    if schema_list(schema) != meta["schema"] or meta["time"] not in schema.names:
        raise damaged(directory, f"{MANIFEST}'s schema fields disagree")
    man = Manifest(directory, meta, schema)
    if check_files:
        for r in runs:
            for b in r["blocks"]:
                try:
                    size = os.path.getsize(man.block_path(b))
                except OSError:
                    raise damaged(directory, f"block {b['file']} is missing") from None
                if size != b["bytes"]:
                    raise damaged(directory, f"block {b['file']} has {size} bytes, {b['bytes']} were written")
    return man


def read_block(man: Manifest, block: dict, columns: list[str] | None = None) -> pa.Table:
    """One block's records (the file read once: checked against its size and SHA-256, then parsed)."""
    import pyarrow.parquet as pq

    path = man.block_path(block)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise damaged(man.directory, f"block {block['file']} cannot be read ({e.strerror or _short(e)})") from None
    if len(data) != block["bytes"] or hashlib.sha256(data).hexdigest() != block["sha256"]:
        raise damaged(man.directory, f"block {block['file']} does not match its SHA-256")
    try:
        table = pq.read_table(pa.BufferReader(data), columns=columns)
    except (OSError, pa.ArrowException) as e:
        raise damaged(man.directory, f"block {block['file']} cannot be parsed ({_short(e)})") from None
    if table.num_rows != block["count"]:
        raise damaged(man.directory, f"block {block['file']} has {table.num_rows} records, the manifest says "
                                     f"{block['count']}")
    return table


def _write_manifest(directory: str, meta: dict) -> None:
    """Replace the manifest atomically (temporary file, fsync, rename, fsync of the folder)."""
    meta = dict(meta)
    meta["manifest_sha256"] = _digest(meta)
    target = os.path.join(directory, MANIFEST)
    tmp = temp_name(target, "tmp")
    try:
        with open(tmp, "w") as f:
            json.dump(meta, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------
# Appending


@dataclass(frozen=True)
class AppendParams:
    """Parameters of one append, validated once. ``seed`` None: fresh entropy (recorded per run)."""

    time: str
    run_blocks: int = DEFAULT_RUN_BLOCKS
    block_rows: int = DEFAULT_BLOCK_ROWS
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.time:
            raise UsageError("--time names the archive's time column; it cannot be empty")
        if not 1 <= self.run_blocks <= 100_000:
            raise UsageError(f"--run-blocks is {self.run_blocks}; use 1 .. 100000")
        if not 1 <= self.block_rows <= MAX_RUN_RECORDS:
            raise UsageError(f"--block-rows is {self.block_rows}; use 1 .. {MAX_RUN_RECORDS}")
        if self.run_blocks * self.block_rows > MAX_RUN_RECORDS:
            raise UsageError(f"--run-blocks x --block-rows is {self.run_blocks * self.block_rows:,} records held in "
                             f"memory per run; keep it at most {MAX_RUN_RECORDS:,}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise UsageError(f"--seed is {self.seed}; use 0 .. 2^63-1")


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
    """Remove what killed appends left: staging folders (owner gone) and run folders the manifest
    does not list. Called under the lock, so no append is running."""
    remove_stale(directory)
    runs = os.path.join(directory, RUNS_DIR)
    remove_stale(runs)
    listed = {r["id"] for r in man.runs} if man else set()
    if os.path.isdir(runs):
        for e in os.scandir(runs):
            if _RUN_ID.match(e.name) and e.name not in listed:
                shutil.rmtree(e.path, ignore_errors=True)


def _new_archive_ok(directory: str) -> bool:
    """A folder an append may turn into a new archive: absent, empty, or only what a killed
    first append left (the lock, staging leftovers, an empty-ish runs folder)."""
    if not os.path.lexists(directory):
        return True
    if not os.path.isdir(directory):
        return False
    return all(name in (LOCK, RUNS_DIR) or ".smerge-" in name for name in os.listdir(directory))


def time_order(column: pa.ChunkedArray) -> pa.Array:
    """Indices that sort a time column (no nulls) stably. numpy's stable sort is a timsort that
    merges presorted stretches, so on concatenated sorted blocks it is a k-way merge."""
    return pa.array(np.argsort(column.to_numpy(), kind="stable"))


def _block_ids(rng: np.random.Generator, run_blocks: int, m: int) -> np.ndarray:
    """The block of each of ``m`` records, uniform; 16-bit when it fits (numpy's stable argsort is a radix sort then)."""
    return rng.integers(0, run_blocks, size=m, dtype=np.uint16 if run_blocks <= 1 << 16 else np.int64)


def _split_run(n: int, run_blocks: int, block_rows: int, rng: np.random.Generator) -> tuple[int, np.ndarray]:
    """Assign the next records uniformly at random to ``run_blocks`` blocks until one holds
    ``block_rows``: returns (records in this run, block of each of them)."""
    m = min(n, run_blocks * (block_rows - 1) + 1)  # a block is full by then (pigeonhole)
    ids = _block_ids(rng, run_blocks, m)
    if m < run_blocks * (block_rows - 1) + 1 and np.bincount(ids, minlength=run_blocks).max() < block_rows:
        return m, ids  # the source ended before any block filled
    order = np.argsort(ids, kind="stable")
    counts = np.bincount(ids, minlength=run_blocks)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    full = counts >= block_rows
    end = int(order[starts[full] + block_rows - 1].min()) + 1  # the record that fills the first full block
    return end, ids[:end]


def _write_run(directory: str, table: pa.Table, ids: np.ndarray, run_blocks: int, time: str,
               run_id: str) -> list[dict]:
    """Write one run's blocks in a staging folder, then rename it to runs/<run_id>."""
    import pyarrow.parquet as pq

    runs = os.path.join(directory, RUNS_DIR)
    os.makedirs(runs, exist_ok=True)
    final = os.path.join(runs, run_id)
    staging = make_staging(final)
    blocks = []
    try:
        order = np.argsort(ids, kind="stable")
        counts = np.bincount(ids, minlength=run_blocks)
        pos = 0
        for b in range(run_blocks):
            rows = order[pos:pos + counts[b]]
            pos += counts[b]
            if rows.size == 0:
                continue
            block = table.take(pa.array(rows))
            block = block.take(time_order(block.column(time)))
            sink = pa.BufferOutputStream()
            pq.write_table(block, sink)
            data = sink.getvalue().to_pybytes()
            name = f"block-{len(blocks):05d}.parquet"
            _write_file(os.path.join(staging, name), data)
            tcol = block.column(time)
            blocks.append({"file": f"{RUNS_DIR}/{run_id}/{name}", "count": block.num_rows,
                           "t_min": _json_time(tcol, 0), "t_max": _json_time(tcol, len(tcol) - 1),
                           "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
        _fsync_dir(staging)
        os.rename(staging, final)
        _fsync_dir(runs)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return blocks


def _write_file(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


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
    one run at a time; returns a summary. Memory: one run (at most R x B records) at a time.

    The schema must equal the archive's (names, order and types) and hold ``params.time``;
    otherwise ``UsageError`` before anything is written.
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
        raise OutputError(f"{directory}: cannot write the archive ({e.strerror or _short(e)}); check the folder's "
                          "permissions and free space (runs appended before this one are kept)") from None


def _append(directory: str, source_path: str, batches: Iterable[pa.RecordBatch], schema: pa.Schema,
            params: AppendParams) -> dict:
    check_time_column(source_path, schema, params.time)
    existing = is_archive(directory)
    if existing:
        _check_compatible(read_manifest(directory, check_files=False), schema, params, source_path)
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
            _check_compatible(man, schema, params, source_path)
        _sweep(directory, man)
        meta = dict(man.meta) if man else {
            "format": ARCHIVE_FORMAT, "version": ARCHIVE_VERSION, "layout": LAYOUT, "time": params.time,
            "schema": schema_list(schema),
            "arrow_schema": base64.b64encode(schema.serialize().to_pybytes()).decode("ascii"),
            "count": 0, "runs": []}
        meta["runs"] = list(meta["runs"])
        seed_rng = np.random.default_rng(params.seed)
        added_runs = added = 0
        pending: list[pa.RecordBatch] = []
        pending_rows = 0
        run_max = params.run_blocks * (params.block_rows - 1) + 1
        seen = 0

        def flush(final: bool) -> None:
            nonlocal pending, pending_rows, added_runs, added
            table = pa.Table.from_batches(pending, schema=schema)
            while table.num_rows and (final or table.num_rows >= run_max):
                seed = int(seed_rng.integers(0, 2**63))
                n, ids = _split_run(table.num_rows, params.run_blocks, params.block_rows, np.random.default_rng(seed))
                run_id = f"r{len(meta['runs']) + 1:06d}-{secrets.token_hex(4)}"
                blocks = _write_run(directory, table.slice(0, n), ids, params.run_blocks, params.time, run_id)
                meta["runs"].append({"id": run_id, "count": n, "seed": seed, "run_blocks": params.run_blocks,
                                     "block_rows": params.block_rows, "t_min": min_time(blocks),
                                     "t_max": max_time(blocks), "blocks": blocks})
                meta["count"] += n
                _write_manifest(directory, meta)
                added_runs += 1
                added += n
                table = table.slice(n)
            pending = table.combine_chunks().to_batches() if table.num_rows else []
            pending_rows = table.num_rows

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
        if man is None and not added_runs:
            _write_manifest(directory, meta)  # an empty source: an empty archive, with its schema
    return {"archive": directory, "source": source_path, "runs_added": added_runs, "records_added": added,
            "runs": len(meta["runs"]), "count": meta["count"]}


def min_time(blocks: list[dict]) -> Any:
    return _json_time_extreme([b["t_min"] for b in blocks], min)


def max_time(blocks: list[dict]) -> Any:
    return _json_time_extreme([b["t_max"] for b in blocks], max)


def _json_time_extreme(values: list, pick) -> Any:
    # ISO texts of one type order like their times; numbers order as numbers.
    return pick(values) if values else None


def _check_compatible(man: Manifest, schema: pa.Schema, params: AppendParams, source: str) -> None:
    if schema_list(schema) != man.meta["schema"]:
        want = ", ".join(f"{n} {t}" for n, t in man.meta["schema"])
        got = ", ".join(f"{n} {t}" for n, t in schema_list(schema))
        raise UsageError(f"{source}: its schema ({got}) differs from the archive's ({want}); append only streams "
                         "with the archive's columns and types, or start a new archive")
    if params.time != man.time:
        raise UsageError(f"--time is {params.time!r} but the archive's time column is {man.time!r}")


def info(directory: str, *, verify: bool = False) -> dict:
    """What ``smerge archive info`` prints: runs, blocks, records, bytes, time range. The manifest
    and block sizes are always checked; ``verify`` also reads every block once (SHA-256, parse, count)."""
    man = read_manifest(directory)
    blocks = [b for r in man.runs for b in r["blocks"]]
    if verify:
        for b in blocks:
            read_block(man, b, [man.time])
    return {"archive": directory, "format": f"{ARCHIVE_FORMAT}/{ARCHIVE_VERSION}", "layout": LAYOUT,
            "time": man.time, "schema": man.meta["schema"], "count": man.count, "runs": len(man.runs),
            "blocks": len(blocks), "bytes": sum(b["bytes"] for b in blocks),
            "t_min": min_time(blocks) if blocks else None,
            "t_max": max_time(blocks) if blocks else None,
            "run_list": [{"id": r["id"], "count": r["count"], "blocks": len(r["blocks"]), "t_min": r["t_min"],
                          "t_max": r["t_max"], "bytes": sum(b["bytes"] for b in r["blocks"])} for r in man.runs]}
