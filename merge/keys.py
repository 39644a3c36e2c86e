"""Merge keys: validation against schemas and extraction to ``float64`` key matrices.

Keys are d >= 1 numeric columns compared lexicographically (spec section 1). Integer and
float columns are compared as float64; datetime/duration columns as numbers of their unit
(e.g. seconds for ``timestamp[s]``). Float64 holds integers exactly up to 2**53, so
nanosecond timestamps are compared to about 0.25 microseconds (documented in docs/).
"""

from __future__ import annotations

from typing import Iterable, Iterator, NamedTuple, Sequence

import numpy as np
import pyarrow as pa

from smerge.errors import UsageError


def _key_kind(t: pa.DataType) -> str | None:
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return "number"
    if pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_date(t) or pa.types.is_time(t):
        return f"time[{t}]"
    return None


def check_keys(schema: pa.Schema, keys: Sequence[str], *, side: str, source: str | None = None) -> list[str]:
    """Check that every key exists and is numeric; return the key kinds (for A/B comparison)."""
    where = f" in {source}" if source else ""
    kinds = []
    for k in keys:
        if k not in schema.names:
            raise UsageError(
                f"key {k!r} does not exist{where} ({side}); available columns: {', '.join(schema.names)}"
            )
        kind = _key_kind(schema.field(k).type)
        if kind is None:
            raise UsageError(
                f"key {k!r}{where} ({side}) has type {schema.field(k).type}; keys must be numeric or datetime"
            )
        kinds.append(kind)
    return kinds


def check_key_compat(schema_a: pa.Schema, keys_a: Sequence[str], schema_b: pa.Schema, keys_b: Sequence[str],
                     *, source_a: str | None = None, source_b: str | None = None) -> None:
    """Keys of A and B must agree in number and kind (numbers with numbers, same datetime unit)."""
    ka = check_keys(schema_a, keys_a, side="A", source=source_a)
    kb = check_keys(schema_b, keys_b, side="B", source=source_b)
    if len(ka) != len(kb):
        raise UsageError(f"A has {len(ka)} keys and B has {len(kb)}; pass the same number with --keys/--keys-b")
    for x, y, t, u in zip(keys_a, keys_b, ka, kb):
        if t != u:
            raise UsageError(
                f"key {x!r} of A is {t} but key {y!r} of B is {u}; keys must have the same type "
                "(cast one input, or choose other keys)"
            )


def _column_f64(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    t = col.type
    if pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_time(t) or pa.types.is_date64(t):
        col = col.cast(pa.int64())
    elif pa.types.is_date32(t):
        col = col.cast(pa.int32())
    if col.null_count:
        col = col.cast(pa.float64()).fill_null(float("nan"))
    arr = col.to_numpy(zero_copy_only=False)
    return np.asarray(arr, dtype=np.float64)


def key_matrix(batch: pa.RecordBatch | pa.Table, keys: Sequence[str]) -> np.ndarray:
    """The keys of ``batch`` as a C-ordered ``float64`` array of shape ``(rows, len(keys))``."""
    out = np.empty((batch.num_rows, len(keys)), dtype=np.float64)
    for c, k in enumerate(keys):
        out[:, c] = _column_f64(batch.column(k))
    return out


def nan_rows(keys: np.ndarray) -> np.ndarray:
    """Boolean mask of rows with any NaN (or missing) key."""
    bad = np.isnan(keys[:, 0]) if keys.shape[1] else np.zeros(keys.shape[0], dtype=bool)
    for c in range(1, keys.shape[1]):
        bad |= np.isnan(keys[:, c])
    return bad


class KeyedBatch(NamedTuple):
    """A record batch with its key matrix and NaN-key mask computed ahead (in a reader thread)."""

    batch: pa.RecordBatch
    keys: np.ndarray
    nan: np.ndarray | None = None  # computed by the engine when not given


def with_keys(batches: Iterable[pa.RecordBatch], keys: Sequence[str]) -> Iterator[KeyedBatch]:
    """Attach each batch's key matrix and NaN mask; run it inside a reader thread."""
    for b in batches:
        k = key_matrix(b, keys)
        yield KeyedBatch(b, k, nan_rows(k))
