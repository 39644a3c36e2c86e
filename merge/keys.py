"""Merge keys: validation against schemas and extraction to ``float64`` key matrices.

Keys are d >= 1 numeric columns compared lexicographically. Integer, float and decimal
columns are compared as float64. Every time representation is brought to one time base,
**microseconds since 1970-01-01 00:00:00 UTC** (``TIME_BASE``), before it is compared:
timestamps of any unit (s, ms, us, ns) with or without a time zone (a timestamp without a zone
is UTC, the CF convention; one with a zone is its UTC instant, which is what Arrow stores),
``date32``/``date64`` (midnight UTC), and CF times the netCDF reader decoded (already on the
base). So a key of A stored as ``timestamp[us]`` meets a key of B stored as ``timestamp[ns,
tz=Europe/Paris]`` or ``date32`` as the same instants. Time-of-day (``time32``/``time64``) and
``duration`` columns are on the same microsecond scale, comparable only with their own kind.
Float64 holds microseconds exactly within 2**53 us (about 285 years) of 1970; nanosecond
timestamps become fractional microseconds (about 0.25 us apart in this century).
"""

from __future__ import annotations

from typing import Iterable, Iterator, NamedTuple, Sequence

import numpy as np
import pyarrow as pa

from smerge.errors import InputError, UsageError, param
from smerge.merge.arrays import buffer_values, numeric_dtype
from smerge.merge.values import parse_duration

TIME_BASE = "microseconds since 1970-01-01 00:00:00 UTC"
US_PER_UNIT = {"s": 1e6, "ms": 1e3, "us": 1.0, "ns": 1e-3}
US_PER_DAY = 86400e6
# Calendars whose microseconds since 1970-01-01 are true instants (a decoded CF time in the
# standard calendar stays int64 when its dates reach before the Gregorian switch: still instants).
_INSTANT_CALENDARS = ("standard", "proleptic_gregorian")


class KeyKind(NamedTuple):
    """What a key column holds, for the A/B check: ``group`` must agree, ``words`` name it."""

    group: str  # "number", "instant", "calendar:<name>", "time of day", "duration"
    words: str


def key_kind(field: pa.Field) -> KeyKind | None:
    """The kind of key column ``field`` (None: not usable as a key)."""
    t = field.type
    md = field.metadata or {}
    if b"smerge.cf_units" in md:
        cal = md.get(b"calendar", b"standard").decode()
        units = md[b"smerge.cf_units"].decode(errors="replace")
        if cal in _INSTANT_CALENDARS:
            return KeyKind("instant", f"a time in the standard calendar (CF {units!r}, {cal})")
        return KeyKind(f"calendar:{cal}", f"a time in the {cal} calendar (CF {units!r})")
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        return KeyKind("number", f"a number ({t})")
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        return KeyKind("instant", f"a time in the standard calendar ({t})")
    if pa.types.is_time(t):
        return KeyKind("time of day", f"a time of day ({t})")
    if pa.types.is_duration(t):
        return KeyKind("duration", f"a duration ({t})")
    return None


def us_per_raw(t: pa.DataType) -> float | None:
    """Microseconds per stored unit of a time column of type ``t`` (None: not a time type)."""
    if pa.types.is_timestamp(t) or pa.types.is_time(t) or pa.types.is_duration(t):
        return US_PER_UNIT[t.unit]
    if pa.types.is_date32(t):
        return US_PER_DAY
    if pa.types.is_date64(t):
        return 1e3
    return None


def tick_ns(t: pa.DataType) -> int | None:
    """Nanoseconds of one tick of a timestamp/date type; None for plain numbers."""
    if pa.types.is_timestamp(t):
        return {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}[t.unit]
    if pa.types.is_date32(t):
        return 86400 * 10**9
    if pa.types.is_date64(t):
        return 10**6
    return None


def check_keys(schema: pa.Schema, keys: Sequence[str], *, side: str, source: str | None = None) -> list[KeyKind]:
    """Check that every key exists and is a number or a time; return the key kinds (for A/B comparison)."""
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
        kind = key_kind(schema.field(k))
        if kind is None:
            raise UsageError(
                f"key {k!r}{where} ({side}) has type {schema.field(k).type}; keys must be numeric or datetime"
            )
        kinds.append(kind)
    return kinds


_TIMES = ("instant", "calendar:")


def check_key_compat(schema_a: pa.Schema, keys_a: Sequence[str], schema_b: pa.Schema, keys_b: Sequence[str],
                     *, source_a: str | None = None, source_b: str | None = None) -> None:
    """Keys of A and B must agree in number and kind: numbers with numbers, times with times of
    the same calendar (any representation: all are brought to ``TIME_BASE``), times of day with
    times of day, durations with durations."""
    ka = check_keys(schema_a, keys_a, side="A", source=source_a)
    kb = check_keys(schema_b, keys_b, side="B", source=source_b)
    if len(ka) != len(kb):
        raise UsageError(f"A has {len(ka)} keys and B has {len(kb)}; pass the same number with {param.keys}/{param.keys_b}")
    for x, y, t, u in zip(keys_a, keys_b, ka, kb):
        if t.group == u.group:
            continue
        what = f"key {x!r} of A ({source_a or 'A'}) is {t.words} but key {y!r} of B ({source_b or 'B'}) is {u.words}"
        if t.group.startswith(_TIMES) and u.group.startswith(_TIMES):
            raise UsageError(f"{what}; times in different calendars cannot be compared: convert one input to the "
                             "other's calendar")
        raise UsageError(f"{what}; keys must have the same kind to be compared (numbers with numbers, times with "
                         "times, times of day with times of day, durations with durations): cast one input, or "
                         "choose other keys")


EXACT_INT = 2**53  # float64 holds every integer up to here; beyond, neighbours compare equal


def _inexact_integers(col, values) -> InputError:
    eg = ""
    if values is not None:
        big = values[(values > EXACT_INT) | (values < -EXACT_INT)] if values.dtype.kind == "i" else \
            values[values > EXACT_INT]
        eg = f" (e.g. {int(big[0]):,})" if big.size else ""
    return InputError(
        f"a {col.type} key holds integers beyond 2^53{eg}, which smerge compares as float64, where "
        "neighbouring integers are equal: keys that differ would pair. Use a key within +-2^53 (an id split in "
        "two keys, or offset by a base), or cast it to float64 yourself if approximate keys are meant")


def column_f64(col: pa.Array | pa.ChunkedArray, *, exact_ints: bool = True) -> np.ndarray:
    """A key column as float64: numbers as they are, times on ``TIME_BASE`` (see the module doc)."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    t = col.type
    if pa.types.is_decimal(t):  # DuckDB writes `SELECT 45.25 AS lat` as decimal(4, 2): compared as float64
        col, t = col.cast(pa.float64()), pa.float64()
    scale = us_per_raw(t)
    if scale is not None:
        col = col.view(pa.int32() if t.bit_width == 32 else pa.int64())
    # integers past 2^53 are refused (``exact_ints``); a CF time in another calendar is int64
    # microseconds, compared to float64's spacing like every time (docs/data.md, "Precision")
    wide = exact_ints and scale is None and t.bit_width == 64 and pa.types.is_integer(t)
    if wide and not col.null_count and len(col):
        raw = numpy_view(col)
        if int(raw.max()) > EXACT_INT or (t == pa.int64() and int(raw.min()) < -EXACT_INT):
            raise _inexact_integers(col, raw)
    if col.null_count:
        try:
            col = col.cast(pa.float64()).fill_null(float("nan"))  # a safe cast: refuses integers past 2^53
        except pa.ArrowInvalid:
            raise _inexact_integers(col, None) from None
    v = numpy_view(col).astype(np.float64, copy=False)
    if scale is None or scale == 1.0:
        return v
    # Multiplying by 1e6, 1e3 or 86400e6 is exact while the result fits 53 bits; ns are divided
    # (x / 1000 is correctly rounded, x * 1e-3 is not).
    return v / 1000.0 if scale == 1e-3 else v * scale


def numpy_view(col: pa.Array) -> np.ndarray:
    """A null-free int/float array's values as numpy, read from its data buffer (no copy).

    ``to_numpy(zero_copy_only=False)`` imports pandas in pyarrow 26 (about 0.25 s of every
    process) even where a view of the buffer is all that is needed."""
    dt = numeric_dtype(col.type)
    if dt is not None and not col.null_count and len(col):
        return buffer_values(col, dt)
    return np.asarray(col.to_numpy(zero_copy_only=False))


def key_columns(batch: pa.RecordBatch | pa.Table, keys: Sequence[str]) -> tuple[np.ndarray, ...]:
    """The keys of ``batch`` as ``float64`` columns, one per key (a ``float64`` column without
    nulls is a view of the batch's buffer, not a copy)."""
    cols = []
    for k in keys:
        try:
            md = batch.schema.field(k).metadata or {}
            cols.append(column_f64(batch.column(k), exact_ints=b"smerge.cf_units" not in md))
        except InputError as e:
            raise InputError(f"key {k!r}: {e}") from None
    return tuple(cols)


def key_matrix(batch: pa.RecordBatch | pa.Table, keys: Sequence[str]) -> np.ndarray:
    """The keys of ``batch`` as a C-ordered ``float64`` array of shape ``(rows, len(keys))``."""
    out = np.empty((batch.num_rows, len(keys)), dtype=np.float64)
    for c, col in enumerate(key_columns(batch, keys)):
        out[:, c] = col
    return out


def nan_rows(keys: np.ndarray | tuple[np.ndarray, ...]) -> np.ndarray:
    """Boolean mask of rows with any NaN (or missing) key; ``keys``: a key matrix or the tuple
    of ``key_columns``."""
    cols = keys if isinstance(keys, tuple) else [keys[:, c] for c in range(keys.shape[1])]
    if not cols:
        return np.zeros(keys.shape[0], dtype=bool)
    bad = np.isnan(cols[0])
    for col in cols[1:]:
        bad |= np.isnan(col)
    return bad


class KeyedBatch(NamedTuple):
    """A record batch with its key matrix (or ``key_columns``) and NaN-key mask computed ahead
    (in a reader thread)."""

    batch: pa.RecordBatch
    keys: np.ndarray | tuple[np.ndarray, ...]
    nan: np.ndarray | None = None  # computed by the engine when not given


def with_keys(batches: Iterable[pa.RecordBatch], keys: Sequence[str], *,
              columns: bool = False) -> Iterator[KeyedBatch]:
    """Attach each batch's key matrix (with ``columns``: its ``key_columns``, which the CGM engine
    reads as they are) and NaN mask; run it inside a reader thread."""
    for b in batches:
        k = key_columns(b, keys) if columns else key_matrix(b, keys)
        yield KeyedBatch(b, k, nan_rows(k))


# ---- tolerances on time keys ----------------------------------------------------------------

def time_key_scale(field: pa.Field) -> tuple[float, float, str | None] | None:
    """For a time key: (raw units per second, raw units per plain number, calendar); else None.

    Raw units are those of the key matrix: microseconds (``TIME_BASE``) for every time. A plain
    number on a decoded CF time key is in that variable's own units (``hours since``: hours); on
    a native time column (Parquet, Arrow, CSV) in the column's stored unit: seconds for
    ``timestamp[s]``, nanoseconds for ``timestamp[ns]``, days for ``date32``, milliseconds for
    ``date64``."""
    t, md = field.type, field.metadata or {}
    if b"smerge.cf_units" in md:
        unit_us = float(md.get(b"smerge.cf_unit_us", b"1"))
        return 1e6, unit_us, md.get(b"calendar", b"standard").decode()
    per = us_per_raw(t)
    return None if per is None else (1e6, per, None)


def key_eps(eps, keys: Sequence[str], schema: pa.Schema):
    """``--eps`` in the raw units of each key column (those of ``key_matrix``): durations
    (``time=1h``) on time keys become microseconds, whatever either input's representation;
    plain numbers on time keys are in A's stored unit (``time_key_scale``), converted too."""
    from collections.abc import Mapping

    scales = {k: time_key_scale(schema.field(k)) for k in keys if k in schema.names}

    def one(k: str, v) -> float:
        sc = scales.get(k)
        if isinstance(v, str):
            try:
                v = float(v)
            except ValueError:
                if sc is None:
                    raise UsageError(f"{param.eps} for key {k!r} is {v!r}; {k!r} is not a time, so give a number") from None
                return parse_duration(v, f"{param.eps} {k}=").nanoseconds(sc[2], f"{param.eps} {k}=") / 1e9 * sc[0]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise UsageError(f"{param.eps} for key {k!r} is {v!r}, not a number")
        return float(v) * sc[1] if sc is not None else float(v)

    if isinstance(eps, Mapping):
        return {k: (one(k, v) if k in scales else v) for k, v in eps.items()}
    if isinstance(eps, (str, int, float)):
        if isinstance(eps, str) and not any(scales.get(k) for k in keys):
            return one(keys[0], eps)
        return tuple(one(k, eps) for k in keys)
    return tuple(one(k, e) for k, e in zip(keys, eps)) if len(eps) == len(keys) else eps
