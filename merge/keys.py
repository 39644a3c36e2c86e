"""Merge keys: validation against schemas and extraction to ``float64`` key matrices.

Keys are d >= 1 numeric columns compared lexicographically (spec section 1). Integer and
float columns are compared as float64; datetime/duration columns as numbers of their unit
(e.g. seconds for ``timestamp[s]``). Float64 holds integers exactly up to 2**53, so
nanosecond timestamps are compared to about 0.25 microseconds (documented in docs/).
"""

from __future__ import annotations

import re
from typing import Iterable, Iterator, NamedTuple, Sequence

import numpy as np
import pyarrow as pa

from smerge.errors import UsageError


def _key_kind(field: pa.Field) -> str | None:
    t = field.type
    md = field.metadata or {}
    if b"smerge.cf_units" in md and not pa.types.is_timestamp(t):
        # CF time in a non-standard calendar: microseconds on 1970-01-01 of that calendar.
        return f"time in the {md.get(b'calendar', b'?').decode()} calendar"
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return "number"
    if pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_date(t) or pa.types.is_time(t):
        return f"time[{t}]"
    return None


def check_keys(schema: pa.Schema, keys: Sequence[str], *, side: str, source: str | None = None) -> list[str]:
    """Check that every key exists and is numeric; return the key kinds (for A/B comparison)."""
    where = f" in {source}" if source else ""
    dup = sorted({k for k in keys if list(keys).count(k) > 1})
    if dup:
        raise UsageError(f"key {', '.join(map(repr, dup))} named twice ({side}); name each key once")
    kinds = []
    for k in keys:
        if k not in schema.names:
            raise UsageError(
                f"key {k!r} does not exist{where} ({side}); available columns: {', '.join(schema.names)}"
            )
        kind = _key_kind(schema.field(k))
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
        if t != u and "calendar" in t + u and t.startswith("time") and u.startswith("time"):
            raise UsageError(
                f"key {x!r} of A ({source_a or 'A'}) is {t} but key {y!r} of B ({source_b or 'B'}) is {u}; "
                "times in different calendars cannot be compared: convert one input to the other's calendar"
            )
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
    return numpy_view(col).astype(np.float64, copy=False)


def numpy_view(col: pa.Array) -> np.ndarray:
    """A null-free int/float array's values as numpy, read from its data buffer (no copy).

    ``to_numpy(zero_copy_only=False)`` imports pandas in pyarrow 26 (about 0.25 s of every
    process) even where a view of the buffer is all that is needed."""
    t = col.type
    if (pa.types.is_integer(t) or pa.types.is_floating(t)) and not col.null_count and len(col):
        dt = np.dtype(t.to_pandas_dtype()) if not pa.types.is_float16(t) else np.dtype(np.float16)
        return np.frombuffer(col.buffers()[1], dtype=dt, count=len(col), offset=col.offset * dt.itemsize)
    return np.asarray(col.to_numpy(zero_copy_only=False))


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


# ---- tolerances on time keys ----------------------------------------------------------------

_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z]+)\s*$")
DURATION_SECONDS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0, "min": 60.0, "h": 3600.0, "hr": 3600.0,
                    "d": 86400.0, "day": 86400.0, "days": 86400.0, "w": 7 * 86400.0}
# Months and years are fixed lengths only in the 360-day calendar.
CALENDAR_SECONDS = {"mo": 30 * 86400.0, "y": 360 * 86400.0}
_RAW_PER_SECOND = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}


def duration_seconds(text: str, *, calendar: str | None, what: str) -> float:
    """``"90s"``, ``"6h"``, ``"30min"``, ``"2d"`` (and ``mo``/``y`` on the 360_day calendar) in seconds.

    ``m``/``M`` are refused: minute or month? Write ``min`` or ``mo``."""
    m = _DURATION.match(text)
    if not m:
        raise UsageError(f"{what} {text!r} is not a duration; write e.g. 90s, 30min, 6h, 2d")
    value, unit = float(m.group(1)), m.group(2)
    if unit in ("m", "M"):
        raise UsageError(f"{what} {text!r}: {unit!r} could be minutes or months; write min or mo")
    if unit in CALENDAR_SECONDS:
        if calendar != "360_day":
            raise UsageError(f"{what} {text!r}: months and years have no fixed length in the "
                             f"{calendar or 'standard'} calendar; give days or hours")
        return value * CALENDAR_SECONDS[unit]
    if unit not in DURATION_SECONDS:
        raise UsageError(f"{what} {text!r}: unknown unit {unit!r}; use us, ms, s, min, h, d, w")
    return value * DURATION_SECONDS[unit]


def time_key_scale(field: pa.Field) -> tuple[float, float, str | None] | None:
    """For a time key: (raw units per second, raw units per plain number, calendar); else None.

    A plain number on a decoded CF time key is in that variable's own units (``hours since``:
    hours); on a native timestamp (Parquet, Arrow) in the timestamp's unit (spec section 1)."""
    t, md = field.type, field.metadata or {}
    if b"smerge.cf_units" in md:
        unit_us = float(md.get(b"smerge.cf_unit_us", b"1"))
        return 1e6, unit_us, md.get(b"calendar", b"standard").decode()
    if pa.types.is_timestamp(t) or pa.types.is_duration(t):
        return _RAW_PER_SECOND[t.unit], 1.0, None
    return None


def key_eps(eps, keys: Sequence[str], schema: pa.Schema):
    """``--eps`` in the raw units of each key column: durations (``time=1h``) on time keys become
    numbers of the key's unit; plain numbers on CF time keys are in the variable's own units."""
    from collections.abc import Mapping

    scales = {k: time_key_scale(schema.field(k)) for k in keys if k in schema.names}

    def one(k: str, v) -> float:
        sc = scales.get(k)
        if isinstance(v, str):
            try:
                v = float(v)
            except ValueError:
                if sc is None:
                    raise UsageError(f"--eps for key {k!r} is {v!r}; {k!r} is not a time, so give a number") from None
                return duration_seconds(v, calendar=sc[2], what=f"--eps {k}=") * sc[0]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise UsageError(f"--eps for key {k!r} is {v!r}, not a number")
        return float(v) * sc[1] if sc is not None else float(v)

    if isinstance(eps, Mapping):
        return {k: (one(k, v) if k in scales else v) for k, v in eps.items()}
    if isinstance(eps, (str, int, float)):
        if isinstance(eps, str) and not any(scales.get(k) for k in keys):
            return one(keys[0], eps)
        return tuple(one(k, eps) for k in keys)
    return tuple(one(k, e) for k, e in zip(keys, eps)) if len(eps) == len(keys) else eps
