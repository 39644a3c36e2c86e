"""Laying one run of an archive out in blocks: randomize-then-sort (each record in one of the run's R
blocks chosen at random, each block sorted by time) and eager (the run in time order plus one
thinned copy per reduction level); each block stored as its own Parquet bytes at a recorded
offset of the run's file (``_RunFile``), with the writer options of ``parquet_options``.
``time_order`` sorts a time column stably (also used by the sampled reads). The append that
calls these, and commits the run, is in ``append``.
"""

from __future__ import annotations

import hashlib
import os
from typing import BinaryIO, Iterable

import numpy as np
import pyarrow as pa

from smerge.datasets.archive.manifest import RUN_SUFFIX, RUNS_DIR, _json_time


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
        part = ordered.take(pa.array(np.flatnonzero(keep)))  # Table.take: ~5x faster than filter
        copies.append({"level": lv, "fraction": 1.0 - lv, "count": part.num_rows,
                       "blocks": rf.blocks(part, _chunks(part.num_rows, block_rows))})
    return {"blocks": primary, "copies": copies}
