"""An archive's manifest (docs/archive.md, "Manifest"): its fields and checks, the SHA-256 of the
manifest and of every block, reading one block alone, the choice of blocks for a fraction, the
atomic replacement of the manifest, and ``info`` (``smerge archive info``). The writer is in
``append``, the aggregates in ``aggregate``, sampled reads in ``read``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from smerge.datasets.archive.probe import MANIFEST
from smerge.datasets.metadata import json_digest, read_json_object, schema_list, short_error
from smerge.datasets.output_staging import temp_name
from smerge.errors import InputError

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


def damaged(directory: str, what: str) -> InputError:
    return InputError(f"{directory}: damaged archive ({what}); restore it from a copy, or append to a new archive")


def _digest(meta: dict) -> str:
    return json_digest(meta, "manifest_sha256")


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
    meta = read_json_object(directory, MANIFEST, damaged)
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
        raise damaged(directory, f"its schema cannot be decoded ({short_error(e)})") from None
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
        raise damaged(man.directory, f"{name} cannot be read ({e.strerror or short_error(e)})") from None


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
        raise damaged(man.directory, f"{what} cannot be parsed ({short_error(e)})") from None
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
    _fsync_path(directory)


def _fsync_path(path: str) -> None:
    """fsync a file or a folder by its path (a folder: its entries are durable)."""
    fd = os.open(path, os.O_RDONLY)
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
    _fsync_path(parent)


def min_time(blocks: list[dict]) -> Any:
    return _json_time_extreme([b["t_min"] for b in blocks], min)


def max_time(blocks: list[dict]) -> Any:
    return _json_time_extreme([b["t_max"] for b in blocks], max)


def _json_time_extreme(values: list, pick) -> Any:
    # ISO texts of one type order like their times; numbers order as numbers.
    return pick(values) if values else None


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
