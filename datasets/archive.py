"""Archived streams (ENGINES.md section 8): a folder holding one stream, appended run by run.

::

    ARCHIVE/manifest.json                 format, version, layout, schema, time column, runs, checksums
    ARCHIVE/.lock                         held (flock) by an append while it runs
    ARCHIVE/runs/<run id>.blocks          one run: its blocks back to back, each a standalone Parquet file
    ARCHIVE/aggregates/<name>/<run id>.parquet   optional tumbling-window aggregates of that run

Layout ``randomize-then-sort`` (OSCAR section 4.1.3): appended records are cut into runs of R
blocks; each record goes to one of the run's R blocks chosen uniformly at random (seeded); the
run is closed when one of its blocks holds B records (or the source ends), as in the paper, so
blocks are not all full. Each block is sorted by time (stable) and stored as its own Parquet
bytes at a recorded offset of the run's file, so it can be read alone with I/O of its own size.

Layout ``eager`` (OnWriteReplicate, 4.1.1): runs of R x B records in time order (the primary
copy, cut into blocks of B) plus, per reduction level L of ``copies``, a copy keeping each
record independently with probability 1 - L (time order, blocks of B). A read at fraction f
reads the smallest copy keeping at least f (``blocks_for_fraction``).

The manifest lists every block with its run, offset, record count, time range, bytes and
SHA-256, and carries its own SHA-256.

Appending is atomic per run: the run's file (and its aggregate files) are written under names
the manifest does not list yet and fsynced once each, their folders fsynced, then the manifest is
replaced atomically (temporary file, fsync, rename, fsync of the folder). A killed append leaves
the archive as it was before the run it was writing; the next append removes what the killed
one left (under the lock).

Reading lives in ``archive_read``; this module holds the manifest, the writer, the choice of
blocks for a fraction and the aggregates' reader.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import math
import os
import re
import secrets
import shutil
from contextlib import contextmanager
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Iterable, Iterator

import numpy as np
import pyarrow as pa

from smerge.datasets.archive_probe import MANIFEST, is_archive  # noqa: F401 - public here too
from smerge.datasets.outputs import remove_stale, temp_name
from smerge.errors import InputError, OutputError, UsageError

ARCHIVE_FORMAT = "smerge-archive"
ARCHIVE_VERSION = 1
LOCK = ".lock"
RUNS_DIR = "runs"
AGG_DIR = "aggregates"
RUN_SUFFIX = ".blocks"
LAYOUT = "randomize-then-sort"  # the default layout
EAGER = "eager"
LAYOUTS = (LAYOUT, EAGER)
DEFAULT_RUN_BLOCKS = 16  # R: blocks per run (the paper measures 10, 100 and 500)
DEFAULT_BLOCK_ROWS = 65536  # B: records per block at most
MAX_RUN_RECORDS = 1 << 28  # R * B bound: a run is held in memory while it is written
MAX_COPIES = 32
AGG_FUNCS = ("count", "mean", "min", "max")
_RUN_ID = re.compile(r"^r\d{6}-[0-9a-f]{8}$")
_BLOCK_FILE = re.compile(r"^block-\d{5}\.parquet$")  # version-1 archives written before run files
_AGG_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,120}$")


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

    @property
    def layout(self) -> str:
        return self.meta["layout"]

    def block_path(self, block: dict) -> str:
        """The file holding ``block`` (a run file shared by the run's blocks: read it with ``read_block``)."""
        return os.path.join(self.directory, block["file"])


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _block_ok(b: Any, run_id: str) -> bool:
    if not (isinstance(b, dict) and isinstance(b.get("file"), str) and isinstance(b.get("sha256"), str)
            and all(_int(b.get(k)) for k in ("count", "bytes")) and b["count"] >= 1):
        return False
    if "offset" in b:  # a byte range of the run's file
        return _int(b["offset"]) and b["file"] == f"{RUNS_DIR}/{run_id}{RUN_SUFFIX}"
    return os.path.dirname(b["file"]) == f"{RUNS_DIR}/{run_id}" and bool(_BLOCK_FILE.match(os.path.basename(b["file"])))


def _blocks_ok(blocks: Any, run_id: str, count: Any) -> bool:
    return (isinstance(blocks, list) and bool(blocks) and all(_block_ok(b, run_id) for b in blocks)
            and sum(b["count"] for b in blocks) == count)


def _copies_ok(run: dict, levels: list) -> bool:
    copies = run.get("copies")
    return (isinstance(copies, list) and len(copies) == len(levels)
            and all(isinstance(c, dict) and c.get("level") == lv and _int(c.get("count"))
                    and isinstance(c.get("fraction"), float) and abs(c["fraction"] - (1 - lv)) < 1e-9
                    and isinstance(c.get("blocks"), list)
                    and (c["blocks"] == [] if c["count"] == 0 else _blocks_ok(c["blocks"], run["id"], c["count"]))
                    for c, lv in zip(copies, levels)))


def _aggs_ok(run: dict, specs: list) -> bool:
    aggs = run.get("aggregates", [])
    return (isinstance(aggs, list) and len(aggs) == len(specs)
            and all(isinstance(a, dict) and a.get("name") == s["name"] and isinstance(a.get("sha256"), str)
                    and _int(a.get("bytes")) and _int(a.get("count"))
                    and a.get("file") == f"{AGG_DIR}/{s['name']}/{run['id']}.parquet" for a, s in zip(aggs, specs)))


def _specs_ok(meta: dict) -> bool:
    specs = meta.get("aggregates", [])
    return (isinstance(specs, list) and len({s.get("name") for s in specs if isinstance(s, dict)}) == len(specs)
            and all(isinstance(s, dict) and isinstance(s.get("name"), str) and _AGG_NAME.match(s["name"])
                    and isinstance(s.get("every"), str) and isinstance(s.get("funcs"), list)
                    and isinstance(s.get("by"), list) and isinstance(s.get("values"), list) for s in specs))


def _levels_ok(meta: dict) -> bool:
    levels = meta.get("copies")
    if meta.get("layout") != EAGER:
        return levels is None
    return (isinstance(levels, list) and 1 <= len(levels) <= MAX_COPIES
            and all(isinstance(v, float) and 0 < v < 1 for v in levels) and levels == sorted(set(levels), reverse=True))


def all_blocks(run: dict) -> list[dict]:
    """Every block of a run: the primary copy's, then the eager copies'."""
    return list(run["blocks"]) + [b for c in run.get("copies", ()) for b in c["blocks"]]


def read_manifest(directory: str, *, check_files: bool = True) -> Manifest:
    """The archive's manifest, checked: its own SHA-256, every field, counts adding up and (with
    ``check_files``) every run and aggregate file present with its recorded size. Damage is an InputError."""
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
    ok = (meta.get("layout") in LAYOUTS and _levels_ok(meta) and _specs_ok(meta)
          and isinstance(meta.get("time"), str) and _int(meta.get("count"))
          and isinstance(meta.get("schema"), list) and isinstance(meta.get("arrow_schema"), str)
          and isinstance(runs, list)
          and all(isinstance(r, dict) and isinstance(r.get("id"), str) and _RUN_ID.match(r["id"])
                  and _int(r.get("count")) and _int(r.get("seed")) and _int(r.get("run_blocks"))
                  and _int(r.get("block_rows")) and _blocks_ok(r.get("blocks"), r["id"], r["count"])
                  and (meta["layout"] != EAGER or _copies_ok(r, meta["copies"]))
                  and _aggs_ok(r, meta.get("aggregates", [])) for r in runs)
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
        sizes: dict[str, int] = {}  # file -> its size: the end of its last block
        for r in runs:
            for b in all_blocks(r):
                end = b.get("offset", 0) + b["bytes"]
                sizes[b["file"]] = max(sizes.get(b["file"], 0), end)
            for a in r.get("aggregates", ()):
                sizes[a["file"]] = a["bytes"]
        for name, want in sizes.items():
            try:
                size = os.path.getsize(os.path.join(directory, name))
            except OSError:
                raise damaged(directory, f"{name} is missing") from None
            if size != want:
                raise damaged(directory, f"{name} has {size} bytes, {want} were written")
    return man


def _read_range(man: Manifest, name: str, offset: int, size: int) -> bytes:
    path = os.path.join(man.directory, name)
    try:
        with open(path, "rb") as f:
            if offset:
                f.seek(offset)
            return f.read(size)
    except OSError as e:
        raise damaged(man.directory, f"{name} cannot be read ({e.strerror or _short(e)})") from None


def read_block(man: Manifest, block: dict, columns: list[str] | None = None) -> pa.Table:
    """One block's records, time-sorted: only its bytes are read (its range of the run's file), checked
    against its size and SHA-256, then parsed."""
    import pyarrow.parquet as pq

    data = _read_range(man, block["file"], block.get("offset", 0), block["bytes"])
    what = f"block {block['file']}" + (f" at {block['offset']}" if "offset" in block else "")
    if len(data) != block["bytes"] or hashlib.sha256(data).hexdigest() != block["sha256"]:
        raise damaged(man.directory, f"{what} does not match its SHA-256")
    try:
        # ParquetFile.read, not pq.read_table: the latter imports pyarrow.dataset (and pandas) at the first
        # block of a process, about a second.
        table = pq.ParquetFile(pa.BufferReader(data)).read(columns=columns)
    except (OSError, pa.ArrowException) as e:
        raise damaged(man.directory, f"{what} cannot be parsed ({_short(e)})") from None
    if table.num_rows != block["count"]:
        raise damaged(man.directory, f"{what} has {table.num_rows} records, the manifest says {block['count']}")
    return table


def eager_fractions(man: Manifest) -> list[float]:
    """The fractions a run can be read at without dropping records: the copies' (1 - level) and the
    primary's 1.0, ascending. Randomize-then-sort: [1.0] (it reads any k/R)."""
    return sorted({1.0 - lv for lv in man.meta.get("copies") or ()} | {1.0})


def blocks_for_fraction(man: Manifest, run_index: int, fraction: float,
                        rng: np.random.Generator | None = None) -> tuple[list[dict], float]:
    """The blocks to read for run ``run_index`` at sampling fraction ``fraction`` in (0, 1], and the
    fraction of the run's records they represent (``represented >= fraction``): a reader keeps each
    record it reads with probability ``fraction / represented``, so each record is in the sample with
    probability ``fraction``.

    randomize-then-sort: ``k = ceil(R f)`` of the run's R blocks chosen with ``rng`` (drawn as
    ``rng.choice(R, k, replace=False)``, sorted; no draw at f = 1), representing k / R.
    eager: the blocks of the smallest copy keeping at least f (the primary copy keeps 1); no draw.
    """
    run = man.runs[run_index]
    if fraction >= 1.0:
        return list(run["blocks"]), 1.0
    if man.layout == EAGER:
        for c in sorted(run["copies"], key=lambda c: c["fraction"]):
            if c["fraction"] >= fraction - 1e-12:
                return list(c["blocks"]), c["fraction"]
        return list(run["blocks"]), 1.0
    blocks = run["blocks"]
    r = len(blocks)
    k = max(1, math.ceil(r * fraction - 1e-9))
    if rng is None:
        rng = np.random.default_rng()
    chosen = sorted(rng.choice(r, size=k, replace=False).tolist())
    return [blocks[i] for i in chosen], k / r


def _write_manifest(directory: str, meta: dict) -> None:
    """Replace the manifest atomically (temporary file, fsync, rename, fsync of the folder)."""
    meta = dict(meta)
    meta["manifest_sha256"] = _digest(meta)
    target = os.path.join(directory, MANIFEST)
    tmp = temp_name(target, "tmp")
    try:
        with open(tmp, "w") as f:
            f.write(json.dumps(meta))  # json.dumps without indent: the C encoder (json.dump is pure Python)
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


def _make_dir(path: str) -> None:
    """Create ``path`` (and parents) when absent, durably: each new folder's parent is fsynced."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path)
    _make_dir(parent)
    os.makedirs(path, exist_ok=True)
    _fsync_dir(parent)


# --------------------------------------------------------------------------------------------
# Appending: parameters


_DUR = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-z]*)\s*$")
_UNIT_NS = {"ns": 1, "us": 10**3, "ms": 10**6, "s": 10**9, "min": 60 * 10**9, "h": 3600 * 10**9,
            "d": 86400 * 10**9, "w": 7 * 86400 * 10**9}


@dataclass(frozen=True)
class AggregateSpec:
    """``--aggregate EVERY:FUNCS[:BY]``: tumbling windows of EVERY (a duration such as 1h, or a plain
    number in the time column's unit), FUNCS of count, mean, min, max, grouped by the BY columns."""

    every: str
    funcs: tuple[str, ...]
    by: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return "_".join((self.every,) + self.by)


def parse_aggregate(text: str) -> AggregateSpec:
    what = f"--aggregate {text!r}"
    parts = text.split(":")
    if not 2 <= len(parts) <= 3:
        raise UsageError(f"{what}: write EVERY:FUNCS[:BY], e.g. 1h:count,mean,min,max:station")
    every = parts[0].strip()
    m = _DUR.match(every)
    if not m or (m.group(2) and m.group(2) not in _UNIT_NS) or float(m.group(1)) <= 0:
        raise UsageError(f"{what}: EVERY {every!r} is not a positive duration (units ns us ms s min h d w, or a "
                         "plain number in the time column's unit)")
    funcs = tuple(f.strip() for f in parts[1].split(","))
    bad = [f for f in funcs if f not in AGG_FUNCS]
    if bad or not funcs or len(set(funcs)) != len(funcs):
        raise UsageError(f"{what}: FUNCS must be distinct names among {', '.join(AGG_FUNCS)}"
                         + (f" (not {', '.join(map(repr, bad))})" if bad else ""))
    by = tuple(c.strip() for c in parts[2].split(",")) if len(parts) == 3 else ()
    if any(not c for c in by) or len(set(by)) != len(by):
        raise UsageError(f"{what}: BY must be distinct column names separated by commas")
    spec = AggregateSpec(every.replace(" ", ""), funcs, by)
    if not _AGG_NAME.match(spec.name):
        raise UsageError(f"{what}: its name {spec.name!r} must be letters, digits, _ . - (BY columns with other "
                         "characters cannot be used)")
    return spec


def parse_copies(text: str) -> tuple[float, ...]:
    """``--copies 0.2,0.4,0.6,0.8``: reduction levels in (0, 1), distinct (a copy keeps 1 - level)."""
    try:
        levels = [float(x) for x in text.split(",")]
    except ValueError:
        raise UsageError(f"--copies {text!r}: give reduction levels in (0, 1) separated by commas, e.g. "
                         "0.2,0.4,0.6,0.8") from None
    return check_copies(levels, text)


def check_copies(levels: Iterable[float], text: Any = None) -> tuple[float, ...]:
    levels = list(levels)
    shown = text if text is not None else ",".join(map(str, levels))
    if not levels or not all(isinstance(v, (int, float)) and 0 < v < 1 for v in levels):
        raise UsageError(f"--copies {shown}: every reduction level must be in (0, 1) (0.2 keeps 80% of the records; "
                         "the primary copy keeps them all)")
    if len(set(levels)) != len(levels) or len(levels) > MAX_COPIES:
        raise UsageError(f"--copies {shown}: give at most {MAX_COPIES} distinct levels")
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
        if self.layout is not None and self.layout not in LAYOUTS:
            raise UsageError(f"--layout is {self.layout!r}; use {' or '.join(LAYOUTS)}")
        if self.copies:
            object.__setattr__(self, "copies", check_copies(self.copies))
            if self.layout == LAYOUT:
                raise UsageError("--copies are the eager layout's; drop them or use --layout eager")
        elif self.layout == EAGER:
            raise UsageError("--layout eager needs --copies (reduction levels in (0, 1), e.g. 0.2,0.4,0.6,0.8)")
        names = [a.name for a in self.aggregates]
        if len(set(names)) != len(names):
            raise UsageError(f"--aggregate given twice for {', '.join(sorted({n for n in names if names.count(n) > 1}))}")

    def resolved_layout(self) -> str:
        return self.layout or (EAGER if self.copies else LAYOUT)


_SORTABLE = (pa.types.is_integer, pa.types.is_floating, pa.types.is_timestamp, pa.types.is_date)


def check_time_column(where: str, schema: pa.Schema, time: str) -> None:
    if time not in schema.names:
        raise UsageError(f"{where}: no time column {time!r}; its columns are {', '.join(schema.names)}")
    t = schema.field(time).type
    if not any(p(t) for p in _SORTABLE):
        raise UsageError(f"{where}: time column {time!r} is {t}; it must be a number, timestamp or date")


def _ticks_per_window(spec: AggregateSpec, ttype: pa.DataType) -> int | float:
    """EVERY in the time column's own ticks (its unit; days for date32, ms for date64)."""
    m = _DUR.match(spec.every)
    value, unit = float(m.group(1)), m.group(2)
    what = f"--aggregate {spec.every}:..."
    if pa.types.is_timestamp(ttype) or pa.types.is_date(ttype):
        tick_ns = ({"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}[ttype.unit] if pa.types.is_timestamp(ttype)
                   else 86400 * 10**9 if pa.types.is_date32(ttype) else 10**6)
        if not unit:
            ticks = value
        else:
            ticks = value * _UNIT_NS[unit] / tick_ns
        if ticks < 1 or abs(ticks - round(ticks)) > 1e-9 * max(1.0, ticks):
            raise UsageError(f"{what}: EVERY must be a whole number of the time column's ticks ({ttype})")
        return int(round(ticks))
    if unit:
        raise UsageError(f"{what}: the time column is a plain number ({ttype}); give EVERY as a number in its unit")
    if pa.types.is_integer(ttype):
        if value != int(value):
            raise UsageError(f"{what}: the time column is an integer; EVERY must be a whole number")
        return int(value)
    return value


def _value_columns(schema: pa.Schema, time: str, spec: AggregateSpec) -> list[str]:
    if not {"mean", "min", "max"} & set(spec.funcs):
        return []
    numeric = (pa.types.is_integer, pa.types.is_floating)
    return [f.name for f in schema if f.name != time and f.name not in spec.by and any(p(f.type) for p in numeric)]


def check_aggregate(where: str, schema: pa.Schema, time: str, spec: AggregateSpec) -> dict:
    """The manifest's entry for ``spec`` on this schema (UsageError when it does not apply)."""
    for c in spec.by:
        if c not in schema.names:
            raise UsageError(f"{where}: --aggregate BY column {c!r} is not a column ({', '.join(schema.names)})")
        if c == time:
            raise UsageError(f"{where}: --aggregate groups by windows of the time column already; drop {c!r} from BY")
    _ticks_per_window(spec, schema.field(time).type)
    values = _value_columns(schema, time, spec)
    if {"mean", "min", "max"} & set(spec.funcs) and not values:
        raise UsageError(f"{where}: --aggregate {spec.every}: mean/min/max need a numeric column besides the time "
                         "and BY columns; there is none")
    return {"name": spec.name, "every": spec.every, "funcs": list(spec.funcs), "by": list(spec.by), "values": values}


# --------------------------------------------------------------------------------------------
# Appending: the writer


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


def time_order(column: pa.ChunkedArray) -> pa.Array:
    """Indices that sort a time column (no nulls) stably. numpy's stable sort is a timsort that
    merges presorted stretches, so on concatenated sorted blocks it is a k-way merge."""
    return pa.array(np.argsort(column.to_numpy(), kind="stable"))


def _time_sorted_order(t: np.ndarray) -> np.ndarray | None:
    """None when ``t`` is already in (non-decreasing) time order, else the stable order that sorts it."""
    if t.size < 2 or bool(np.all(t[1:] >= t[:-1])):
        return None
    return np.argsort(t, kind="stable")


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


def parquet_options(schema: pa.Schema, time: str) -> dict:
    """Writer options of blocks: dictionaries only where they pay (not for floating-point columns, nor
    the time column), the time column delta-encoded when it is an integer, timestamp or date (sorted
    within a block: small deltas), no compression of floating-point columns (random mantissas do
    not compress), snappy elsewhere. About 3x faster to write than Parquet's defaults, and smaller."""
    floats = {f.name for f in schema if pa.types.is_floating(f.type)}
    dicts = [f.name for f in schema if f.name != time and f.name not in floats]
    tt = schema.field(time).type
    opts: dict = {"use_dictionary": dicts or False,
                  "compression": {f.name: ("none" if f.name in floats else "snappy") for f in schema}}
    if pa.types.is_integer(tt) or pa.types.is_timestamp(tt) or pa.types.is_date(tt):
        opts["column_encoding"] = {time: "DELTA_BINARY_PACKED"}
    return opts


def _encode(table: pa.Table, opts: dict) -> pa.Buffer:
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=max(1, table.num_rows), **opts)
    return sink.getvalue()


def _write_blob(f: BinaryIO, data: pa.Buffer) -> None:
    f.write(data)


class _RunFile:
    """The run's file, written block by block (each a standalone Parquet file's bytes) at recorded offsets."""

    def __init__(self, directory: str, run_id: str, time: str, opts: dict):
        self.name = f"{RUNS_DIR}/{run_id}{RUN_SUFFIX}"
        self.path = os.path.join(directory, self.name)
        self.f: BinaryIO = open(self.path, "xb")
        self.offset = 0
        self.time = time
        self.opts = opts

    def block(self, table: pa.Table) -> dict:
        data = _encode(table, self.opts)
        _write_blob(self.f, data)
        tcol = table.column(self.time)
        entry = {"file": self.name, "offset": self.offset, "count": table.num_rows,
                 "t_min": _json_time(tcol, 0), "t_max": _json_time(tcol, len(tcol) - 1),
                 "bytes": data.size, "sha256": hashlib.sha256(data).hexdigest()}
        self.offset += data.size
        return entry

    def blocks(self, table: pa.Table, sizes: Iterable[int]) -> list[dict]:
        out, pos = [], 0
        for c in sizes:
            if c:
                out.append(self.block(table.slice(pos, c)))
            pos += c
        return out


def _rts_run(rf: _RunFile, table: pa.Table, ids: np.ndarray, run_blocks: int, time: str) -> dict:
    """randomize-then-sort: one take puts the run in block order, each block in time order (stable)."""
    pre = _time_sorted_order(table.column(time).to_numpy())
    if pre is None:
        order = np.argsort(ids, kind="stable")
    else:
        order = pre[np.argsort(ids[pre], kind="stable")]
    ordered = table.take(pa.array(order))
    return {"blocks": rf.blocks(ordered, np.bincount(ids, minlength=run_blocks).tolist())}


def _chunks(n: int, size: int) -> list[int]:
    return [min(size, n - i) for i in range(0, n, size)]


def _eager_run(rf: _RunFile, table: pa.Table, rng: np.random.Generator, levels: tuple[float, ...],
               block_rows: int, time: str) -> dict:
    """eager: the run in time order (the primary copy) and one copy per level, each record kept in it
    independently with probability 1 - level; each cut into blocks of at most B records."""
    pre = _time_sorted_order(table.column(time).to_numpy())
    ordered = table if pre is None else table.take(pa.array(pre))
    primary = rf.blocks(ordered, _chunks(ordered.num_rows, block_rows))
    copies = []
    for lv in levels:  # smallest copy first
        keep = rng.random(ordered.num_rows) < 1.0 - lv
        part = ordered.filter(pa.array(keep))
        copies.append({"level": lv, "fraction": 1.0 - lv, "count": part.num_rows,
                       "blocks": rf.blocks(part, _chunks(part.num_rows, block_rows))})
    return {"blocks": primary, "copies": copies}


def window_starts(column: pa.ChunkedArray | pa.Array, every: int | float) -> pa.Array:
    """The start of each record's tumbling window (multiples of ``every`` ticks from 0), of the time type."""
    ttype = column.type
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_floating(ttype):
        return pa.array(np.floor(column.to_numpy() / every) * every, ttype)
    width = pa.int32() if ttype.bit_width == 32 else pa.int64()
    raw = column.view(width).to_numpy().astype(np.int64) if not pa.types.is_integer(ttype) else \
        column.to_numpy().astype(np.int64)
    starts = (raw // every) * every
    if pa.types.is_integer(ttype):
        return pa.array(starts).cast(ttype)
    return pa.array(starts.astype(np.int32 if width == pa.int32() else np.int64), width).view(ttype)


def aggregate_table(table: pa.Table, time: str, spec: dict) -> pa.Table:
    """One run's partial aggregate for ``spec`` (a manifest entry): per window and group, ``count``
    (records) and per value column v: ``v_count`` (non-null values, with mean), ``v_mean``, ``v_min``,
    ``v_max``; sorted by window then group."""
    ttype = table.schema.field(time).type
    every = _ticks_per_window(AggregateSpec(spec["every"], tuple(spec["funcs"]), tuple(spec["by"])), ttype)
    keys = ["window"] + spec["by"]
    t = pa.table([window_starts(table.column(time), every)] + [table.column(c) for c in spec["by"]], names=keys)
    aggs: list[tuple] = [([], "count_all")]
    cols = []
    for v in spec["values"]:
        t = t.append_column(f"__{v}", table.column(v))
        if "mean" in spec["funcs"]:
            aggs += [(f"__{v}", "count"), (f"__{v}", "mean")]
            cols += [f"{v}_count", f"{v}_mean"]
        for fn in ("min", "max"):
            if fn in spec["funcs"]:
                aggs.append((f"__{v}", fn))
                cols.append(f"{v}_{fn}")
    g = t.group_by(keys, use_threads=False).aggregate(aggs)
    out = g.select(keys + ["count_all"] + [n for n in g.column_names if n.startswith("__")])
    out = out.rename_columns(keys + ["count"] + cols)
    return out.sort_by([(k, "ascending") for k in keys])


def read_aggregate(directory: str, name: str) -> pa.Table:
    """The aggregate ``name`` over the whole archive: each run's partial aggregate (its Parquet file,
    checked against its SHA-256) combined per window and group (counts added, min of mins, max of
    maxes, means weighted by their non-null counts), sorted by window then group."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    man = read_manifest(directory)
    specs = {s["name"]: s for s in man.meta.get("aggregates", [])}
    if name not in specs:
        raise UsageError(f"{directory}: no aggregate {name!r}; it has {', '.join(specs) or 'none'}")
    spec = specs[name]
    parts = []
    for r in man.runs:
        a = next(x for x in r["aggregates"] if x["name"] == name)
        data = _read_range(man, a["file"], 0, a["bytes"])
        if hashlib.sha256(data).hexdigest() != a["sha256"]:
            raise damaged(directory, f"{a['file']} does not match its SHA-256")
        parts.append(pq.read_table(pa.BufferReader(data)))
    keys = ["window"] + spec["by"]
    if not parts:
        return _empty_aggregate(man, spec)
    t = pa.concat_tables(parts)
    aggs: list[tuple] = [("count", "sum")]
    for v in spec["values"]:
        if "mean" in spec["funcs"]:
            w = pc.multiply(pc.cast(t.column(f"{v}_mean"), pa.float64()), pc.cast(t.column(f"{v}_count"), pa.float64()))
            w = pc.if_else(pc.equal(t.column(f"{v}_count"), 0), 0.0, w)
            t = t.append_column(f"__{v}_wsum", w)
            aggs += [(f"{v}_count", "sum"), (f"__{v}_wsum", "sum")]
        for fn in ("min", "max"):
            if fn in spec["funcs"]:
                aggs.append((f"{v}_{fn}", fn))
    g = t.group_by(keys, use_threads=False).aggregate(aggs)
    cols = {"window": g.column("window")}
    for k in spec["by"]:
        cols[k] = g.column(k)
    cols["count"] = g.column("count_sum")
    for v in spec["values"]:
        if "mean" in spec["funcs"]:
            n = g.column(f"{v}_count_sum")
            cols[f"{v}_count"] = n
            cols[f"{v}_mean"] = pc.if_else(pc.equal(n, 0), pa.scalar(None, pa.float64()),
                                           pc.divide(g.column(f"__{v}_wsum_sum"), pc.cast(n, pa.float64())))
        for fn in ("min", "max"):
            if fn in spec["funcs"]:
                cols[f"{v}_{fn}"] = g.column(f"{v}_{fn}_{fn}")
    return pa.table(cols).sort_by([(k, "ascending") for k in keys])


def _empty_aggregate(man: Manifest, spec: dict) -> pa.Table:
    empty = man.schema.empty_table()
    return aggregate_table(empty, man.time, spec)


def _write_aggregates(directory: str, table: pa.Table, time: str, specs: list[dict], run_id: str) -> list[dict]:
    import pyarrow.parquet as pq

    out = []
    for s in specs:
        folder = os.path.join(directory, AGG_DIR, s["name"])
        _make_dir(folder)
        sink = pa.BufferOutputStream()
        agg = aggregate_table(table, time, s)
        pq.write_table(agg, sink)
        data = sink.getvalue()
        name = f"{AGG_DIR}/{s['name']}/{run_id}.parquet"
        with open(os.path.join(directory, name), "xb") as f:
            f.write(data)
        out.append({"name": s["name"], "file": name, "count": agg.num_rows, "bytes": data.size,
                    "sha256": hashlib.sha256(data).hexdigest()})
    return out


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _commit(directory: str, meta: dict, run: dict) -> None:
    """Make ``run`` part of the archive: fsync its files and their folders, then replace the manifest
    (``meta``, which lists it) atomically. Runs in the append's commit thread, one run at a time, in order."""
    files = {b["file"] for b in all_blocks(run)} | {a["file"] for a in run.get("aggregates", ())}
    for name in sorted(files):
        _fsync_file(os.path.join(directory, name))
    for folder in sorted({os.path.dirname(name) for name in files}):
        _fsync_dir(os.path.join(directory, folder))
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
        raise OutputError(f"{directory}: cannot write the archive ({e.strerror or _short(e)}); check the folder's "
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


def min_time(blocks: list[dict]) -> Any:
    return _json_time_extreme([b["t_min"] for b in blocks], min)


def max_time(blocks: list[dict]) -> Any:
    return _json_time_extreme([b["t_max"] for b in blocks], max)


def _json_time_extreme(values: list, pick) -> Any:
    # ISO texts of one type order like their times; numbers order as numbers.
    return pick(values) if values else None


def _check_compatible(man: Manifest, schema: pa.Schema, params: AppendParams, specs: list[dict], source: str) -> None:
    if schema_list(schema) != man.meta["schema"]:
        want = ", ".join(f"{n} {t}" for n, t in man.meta["schema"])
        got = ", ".join(f"{n} {t}" for n, t in schema_list(schema))
        raise UsageError(f"{source}: its schema ({got}) differs from the archive's ({want}); append only streams "
                         "with the archive's columns and types, or start a new archive")
    if params.time != man.time:
        raise UsageError(f"--time is {params.time!r} but the archive's time column is {man.time!r}")
    if params.layout is not None and params.layout != man.layout:
        raise UsageError(f"--layout is {params.layout} but the archive's layout is {man.layout}; drop --layout")
    if params.copies and list(params.copies) != man.meta.get("copies"):
        have = ",".join(f"{v:g}" for v in sorted(man.meta.get("copies") or [])) or "none"
        raise UsageError(f"--copies {','.join(f'{v:g}' for v in sorted(params.copies))} differ from the archive's "
                         f"({have}); drop --copies")
    if specs and specs != man.meta.get("aggregates", []):
        have = ", ".join(s["name"] for s in man.meta.get("aggregates", [])) or "none"
        raise UsageError(f"--aggregate differs from the archive's aggregates ({have}); drop --aggregate (every run "
                         "gets the archive's)")


def info(directory: str, *, verify: bool = False) -> dict:
    """What ``smerge archive info`` prints: layout, runs, blocks, records, bytes, time range, eager
    copies and aggregates. The manifest and file sizes are always checked; ``verify`` also reads every
    block once (SHA-256, parse, count)."""
    man = read_manifest(directory)
    blocks = [b for r in man.runs for b in r["blocks"]]
    if verify:
        for r in man.runs:
            for b in all_blocks(r):
                read_block(man, b, [man.time])
    out = {"archive": directory, "format": f"{ARCHIVE_FORMAT}/{ARCHIVE_VERSION}", "layout": man.layout,
           "time": man.time, "schema": man.meta["schema"], "count": man.count, "runs": len(man.runs),
           "blocks": len(blocks), "bytes": sum(b["bytes"] for b in blocks),
           "t_min": min_time(blocks) if blocks else None,
           "t_max": max_time(blocks) if blocks else None}
    if man.layout == EAGER:
        out["copies"] = [{"level": lv, "fraction": 1.0 - lv,
                          "count": sum(c["count"] for r in man.runs for c in r["copies"] if c["level"] == lv),
                          "blocks": sum(len(c["blocks"]) for r in man.runs for c in r["copies"] if c["level"] == lv),
                          "bytes": sum(b["bytes"] for r in man.runs for c in r["copies"] if c["level"] == lv
                                       for b in c["blocks"])}
                         for lv in sorted(man.meta["copies"])]
    out["aggregates"] = [{**s, "path": os.path.join(directory, AGG_DIR, s["name"]),
                          "rows": sum(a["count"] for r in man.runs for a in r["aggregates"] if a["name"] == s["name"]),
                          "bytes": sum(a["bytes"] for r in man.runs for a in r["aggregates"] if a["name"] == s["name"])}
                         for s in man.meta.get("aggregates", [])]
    out["run_list"] = [{"id": r["id"], "count": r["count"], "blocks": len(r["blocks"]), "t_min": r["t_min"],
                        "t_max": r["t_max"], "bytes": sum(b["bytes"] for b in r["blocks"])} for r in man.runs]
    return out
