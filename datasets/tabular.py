"""Shared parts of the tabular backends (Parquet, CSV, Arrow IPC): column choice, row ranges."""

from __future__ import annotations

from typing import Iterable, Iterator, Sequence

import pyarrow as pa

from smerge.errors import InputError, MissingKeyError, UsageError


def resolve_columns(path: str, schema: pa.Schema, keys: Sequence[str] | None,
                    variables: Sequence[str] | None) -> tuple[pa.Schema, list[str], tuple[str, ...]]:
    """Schema, column list and keys for a tabular file: keys first, then the payload columns."""
    names = schema.names
    missing_keys = [c for c in keys or () if c not in names]
    if missing_keys:
        raise MissingKeyError(path, missing_keys, names)
    for what, cols in (("key", keys or ()), ("column", variables or ())):
        missing = [c for c in cols if c not in names]
        if missing:
            raise UsageError(f"{path}: no {what} {', '.join(map(repr, missing))}; its columns are {', '.join(names)}")
    key_names = tuple(keys or ())
    payload = list(variables) if variables else [c for c in names if c not in key_names]
    columns = list(key_names) + [c for c in payload if c not in key_names]
    if not keys:
        columns = names
    for c in dict.fromkeys(columns):  # a name two columns share: which one is meant is a guess
        at = [i + 1 for i, n in enumerate(names) if n == c]
        if len(at) > 1:
            raise InputError(f"{path}: {len(at)} columns are named {c!r} (columns {', '.join(map(str, at))}); "
                             "rename all but one in the file")
    return pa.schema([schema.field(c) for c in columns]), columns, key_names


def sliced(batches: Iterable[pa.RecordBatch], start: int, stop: int | None, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Rows ``start .. stop`` of a batch stream, cast to ``schema``'s column order."""
    pos = 0
    for b in batches:
        n = b.num_rows
        lo, hi = max(start - pos, 0), n if stop is None else min(stop - pos, n)
        pos += n
        if hi <= lo:
            if stop is not None and pos >= stop:
                return
            continue
        if b.schema.names != schema.names:
            b = pa.RecordBatch.from_arrays([b.column(c) for c in schema.names], schema=schema)
        yield b.slice(lo, hi - lo) if (lo, hi) != (0, n) else b
        if stop is not None and pos >= stop:
            return


def rebatch(batches: Iterable[pa.RecordBatch], batch_rows: int) -> Iterator[pa.RecordBatch]:
    """Split batches larger than ``batch_rows`` (zero-copy slices)."""
    for b in batches:
        for off in range(0, b.num_rows, batch_rows):
            yield b.slice(off, batch_rows)
