"""Counts of items per time interval, from raw records and from derived-bodies (docs/semantics.md section 9).

``ItemCounts`` answers one query: ``every`` (intervals ``[j * every, (j + 1) * every)`` aligned to
multiples of ``every`` on the time axis) or one range ``[start, stop)``. Raw records count
exactly. A derived-body (item, lifetime v, count) covers ``[v * L, (v + 1) * L)``: an interval that
holds the whole lifetime gets its whole count; an interval that cuts it gets the share of the
lifetime it overlaps (the paper's uniform-density assumption, section 5), flagged as an estimate.
With correct-factor c > 0 a frequent item's lifetime count without a correct-body is within c of
the truth: also flagged as an estimate.

Times are numbers in the time column's own unit (``time_values``: timestamps as their int64
ticks). Memory: one row per (interval, item) seen, plus the bodies. Counting is numpy: a batch that
spans few intervals is counted in place (bincount over interval x item code), otherwise and when
parts are summed by one sort of an int64 key (a lexicographic sort where that key could overflow).
"""

from __future__ import annotations

import math
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from smerge.errors import InputError, UsageError, param
from smerge.merge.keys import numpy_view, tick_ns
from smerge.merge.values import parse_duration

COMPACT_ROWS = 1 << 22  # partial (interval, item) rows held before they are summed


def is_time_type(t: pa.DataType) -> bool:
    return pa.types.is_timestamp(t) or pa.types.is_date(t)


def check_time_type(t: pa.DataType, column: str) -> None:
    if not (is_time_type(t) or pa.types.is_integer(t) or pa.types.is_floating(t)):
        raise UsageError(f"{param.time} {column!r} is of type {t}; give a timestamp or numeric column")


def time_values(col: pa.Array | pa.ChunkedArray, column: str = "time") -> np.ndarray:
    """int64 ticks (timestamps, dates, integers) or float64; missing times are an input error."""
    if col.null_count:
        raise InputError(f"time column {column!r} has {col.null_count:,} missing value(s); every record needs a time")
    t = col.type
    if pa.types.is_floating(t):
        v = _numpy(pc.cast(col, pa.float64()))
        if np.isnan(v).any():
            raise InputError(f"time column {column!r} has NaN; every record needs a time")
        return v
    if pa.types.is_date32(t):
        col = pc.cast(col, pa.int32())
    return _numpy(pc.cast(col, pa.int64()))


def _numpy(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A null-free numeric column as numpy through its buffers (``to_numpy`` imports pandas: ~0.7 s)."""
    chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
    if len(chunks) == 1:
        return numpy_view(chunks[0])
    return np.concatenate([numpy_view(c) for c in chunks]) if chunks else np.empty(0, col.type.to_pandas_dtype())


def _time_type(t: pa.DataType | pa.Field) -> tuple[pa.DataType, int | None, str | None]:
    """(type, nanoseconds per tick or None, CF calendar or None) of a time column given by its type
    or its field. A field of a decoded CF time in a calendar Arrow has no type for (``noleap``,
    ``360_day``, ...) is int64 microseconds on the 1970 base, its calendar in the field metadata."""
    if isinstance(t, pa.Field):
        from smerge.datasets.cf_time import field_calendar

        cal = field_calendar(t)
        if cal is not None and pa.types.is_int64(t.type):
            return t.type, 10**3, cal
        t = t.type
    return t, tick_ns(t), None


def duration_ticks(text: str | float, t: pa.DataType | pa.Field, what: str) -> int | float:
    """A duration (``90s``, ``1h``, ``1mo`` on a 360_day time, or a plain number in the column's
    unit) in ticks of ``t``, > 0."""
    t, ns, cal = _time_type(t)
    ticks = parse_duration(text, what, positive=True).ticks(ns, cal, what)
    if not math.isfinite(ticks) or ticks <= 0:
        raise UsageError(f"{what} {text!r} must be a finite duration > 0")
    if pa.types.is_floating(t):
        return float(ticks)
    if ticks != int(ticks) or ticks > 2**62:
        raise UsageError(f"{what} {text!r} is not a whole number of the time column's ticks ({t}) up to 2^62")
    return int(ticks)


_DATE_TIME = re.compile(r"^\s*([+-]?\d+)-(\d{1,2})-(\d{1,2})(?:[T\s](\d{1,2}):(\d{2})(?::(\d{2}))?)?Z?\s*$")


def time_point(text: str, t: pa.DataType | pa.Field, what: str) -> int | float:
    """``--from``/``--to``: an ISO date-time on timestamp/date columns and decoded CF times (in
    their calendar), else a number."""
    t, _, cal = _time_type(t)
    if cal is not None:
        return _calendar_point(text, cal, what)
    if is_time_type(t):
        try:
            unit = t.unit if pa.types.is_timestamp(t) else ("D" if pa.types.is_date32(t) else "ms")
            return int(np.datetime64(str(text).strip().rstrip("Z"), unit).astype(np.int64))
        except ValueError:
            raise UsageError(f"{what} {text!r} is not a date-time; write e.g. 2024-01-31T12:00:00") from None
    try:
        v = float(text)
    except ValueError:
        raise UsageError(f"{what} {text!r} is not a number (the time column is numeric)") from None
    if not math.isfinite(v):
        raise UsageError(f"{what} {text!r} must be finite")
    return int(v) if pa.types.is_integer(t) and v == int(v) else v


def _calendar_point(text: str, calendar: str, what: str) -> int:
    """A date-time in a CF calendar as microseconds since 1970-01-01 in that calendar."""
    import datetime as dt

    import cftime

    m = _DATE_TIME.match(str(text))
    if not m:
        raise UsageError(f"{what} {text!r} is not a date-time; write e.g. 2024-01-31T12:00:00 (in the time "
                         f"column's {calendar} calendar)")
    y, mo, d, h, mi, sec = (int(g or 0) for g in m.groups())
    try:
        when = cftime.datetime(y, mo, d, h, mi, sec, calendar=calendar)
    except ValueError as e:
        raise UsageError(f"{what} {text!r} is not a date of the {calendar} calendar: {e}") from None
    return (when - cftime.datetime(1970, 1, 1, calendar=calendar)) // dt.timedelta(microseconds=1)


def lifetime_ids(times: np.ndarray, length: int | float) -> np.ndarray:
    """v = floor(t / L): lifetimes aligned to multiples of L."""
    if times.dtype.kind == "f":
        return np.floor(times / length).astype(np.int64)
    return np.floor_divide(times, np.int64(length))


class ItemCounts:
    """Accumulates one count query; ``table()`` gives (start, end, item, count, exact)."""

    def __init__(self, item_type: pa.DataType, time_type: pa.DataType, *, every: int | float | None = None,
                 start: int | float | None = None, stop: int | float | None = None):
        if (every is None) == (start is None or stop is None):
            raise UsageError(f"give either {param.every} DUR or both {param.start} T and {param.stop} T")
        if every is None and not start < stop:
            raise UsageError(f"{param.start} {start} must be before {param.stop} {stop}")
        self.item_type, self.time_type = item_type, time_type
        self.every, self.start, self.stop = every, start, stop
        self._parts: list[pa.Table] = []
        self._rows = 0
        self._bodies: list[pa.Table] = []

    def _intervals(self, times: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        if self.every is not None:
            return lifetime_ids(times, self.every), None
        keep = (times >= self.start) & (times < self.stop)
        return np.zeros(int(keep.sum()), np.int64), keep

    def add_raw(self, items: pa.Array, times: np.ndarray) -> None:
        """Raw records (one per row)."""
        if len(items) == 0:
            return
        ids, keep = self._intervals(times)
        if keep is not None:
            items = items.filter(pa.array(keep))
        if len(items) == 0:
            return
        # numpy, not Acero's group_by: buffers received over Flight may be unaligned for Acero
        enc = pc.dictionary_encode(items)
        codes = _numpy(enc.indices).astype(np.int64)
        nd = max(1, len(enc.dictionary))
        lo = int(ids.min())
        if (int(ids.max()) - lo + 1) * nd <= 4 * len(codes) + 4096:  # few intervals: count in place, no sort
            n = np.bincount((ids - lo) * nd + codes, minlength=(int(ids.max()) - lo + 1) * nd)
            combined = np.flatnonzero(n)
            part = pa.table({"iv": combined // nd + lo, "item": enc.dictionary.take(pa.array(combined % nd)),
                             "n": n[combined].astype(np.int64)})
        else:
            iv, first, inv = _group(ids, codes)
            part = pa.table({"iv": iv, "item": enc.dictionary.take(pa.array(codes[first])),
                             "n": np.bincount(inv, minlength=len(iv)).astype(np.int64)})
        self._parts.append(part)
        self._rows += part.num_rows
        if self._rows > COMPACT_ROWS and len(self._parts) > 1:
            self._compact()

    def _compact(self) -> None:
        t = pa.concat_tables(self._parts)
        iv, items, inv = _group_items(_numpy(t.column("iv")), t.column("item").combine_chunks())
        n = np.bincount(inv, weights=_numpy(t.column("n")), minlength=len(iv))
        t = pa.table({"iv": iv, "item": items, "n": np.rint(n).astype(np.int64)})
        self._parts = [t]
        self._rows = t.num_rows

    def add_bodies(self, kind: str, items: pa.Array, lifetime: int, counts: np.ndarray) -> None:
        """Forecast-bodies (``kind`` "forecast") or correct-bodies ("correct") of one lifetime."""
        n = len(items)
        if n == 0:
            return
        corr = kind == "correct"
        self._bodies.append(pa.table({
            "v": np.full(n, lifetime, np.int64), "item": items.take(pa.array(np.arange(n))),  # an aligned copy
            "count": np.asarray(counts, np.int64), "corrected": np.full(n, corr)}))

    def table(self, lifetime: int | float | None = None, correct_factor: float = 0.0) -> pa.Table:
        """The answer, sorted by interval then item: ``start``/``end`` in the time column's type,
        ``count`` (float64; whole numbers where exact) and ``exact``."""
        ivs, items, counts, exact = [], [], [], []
        if self._parts:
            self._compact()
            p = self._parts[0]
            ivs.append(_numpy(p.column("iv")))
            items.append(p.column("item").combine_chunks())
            counts.append(_numpy(p.column("n")).astype(np.float64))
            exact.append(np.ones(p.num_rows, bool))
        if self._bodies:
            if lifetime is None:
                raise ValueError("bodies need the lifetime length")
            b = pa.concat_tables(self._bodies).group_by(["v", "item"]).aggregate(
                [("count", "sum"), ("corrected", "any")]).rename_columns(["v", "item", "count", "corrected"])
            v = _numpy(b.column("v"))
            total = _numpy(b.column("count")).astype(np.float64)
            sure = (correct_factor == 0) | _numpy(pc.cast(b.column("corrected"), pa.uint8())).astype(bool)
            for iv, pos, share in self._shares(v, lifetime):
                ivs.append(np.full(len(pos), iv, np.int64))
                items.append(b.column("item").take(pa.array(pos)).combine_chunks())
                counts.append(total[pos] * share)
                exact.append(sure[pos] & (share == 1.0))
        if not ivs:
            return self._empty()
        iv, item, inv = _group_items(np.concatenate(ivs), pa.chunked_array(items, self.item_type).combine_chunks())
        count = np.bincount(inv, weights=np.concatenate(counts), minlength=len(iv))
        estimated = np.bincount(inv, weights=~np.concatenate(exact), minlength=len(iv)) > 0
        t = pa.table({"iv": iv, "item": item, "count": count, "exact": ~estimated})
        t = t.filter(pa.array(count != 0)).sort_by([("iv", "ascending"), ("item", "ascending")])
        return self._bounds(t)

    def _shares(self, v: np.ndarray, length: int | float):
        """(interval id, rows of ``v``, share of the lifetime inside the interval) per overlap."""
        for lt in np.unique(v):
            pos = np.nonzero(v == lt)[0]
            lo, hi = lt * length, (lt + 1) * length
            if self.every is None:
                overlap = min(hi, self.stop) - max(lo, self.start)
                if overlap > 0:
                    yield 0, pos, 1.0 if overlap >= length else overlap / length
                continue
            first, last = int(lo // self.every), int(math.ceil(hi / self.every)) - 1
            for j in range(first, last + 1):
                overlap = min(hi, (j + 1) * self.every) - max(lo, j * self.every)
                if overlap > 0:
                    yield j, pos, 1.0 if overlap >= length else overlap / length

    def _bounds(self, t: pa.Table) -> pa.Table:
        iv = _numpy(t.column("iv"))
        if self.every is not None:
            start, end = iv * self.every, (iv + 1) * self.every
        else:
            start, end = np.full(len(iv), self.start), np.full(len(iv), self.stop)
        return pa.table({"start": self._as_time(start), "end": self._as_time(end), "item": t.column("item"),
                         "count": t.column("count"), "exact": t.column("exact")})

    def _as_time(self, v: np.ndarray) -> pa.Array:
        tt = self.time_type
        if pa.types.is_timestamp(tt) or pa.types.is_date64(tt):
            return pa.array(np.asarray(v, np.int64)).cast(tt)
        if pa.types.is_date32(tt):
            return pa.array(np.asarray(v, np.int64).astype(np.int32)).cast(tt)
        return pa.array(v)

    def _empty(self) -> pa.Table:
        tt = self.time_type if is_time_type(self.time_type) else (
            pa.float64() if pa.types.is_floating(self.time_type) else pa.int64())
        return pa.table({"start": pa.array([], tt), "end": pa.array([], tt), "item": pa.array([], self.item_type),
                         "count": pa.array([], pa.float64()), "exact": pa.array([], pa.bool_())})


def _group(iv: np.ndarray, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct (iv, code) pairs in (iv, code) order: (their iv, a row holding each, the pair of
    every row). One int64 key when iv's range times the codes fits, else a lexicographic sort."""
    lo, nd = int(iv.min()), int(codes.max()) + 1
    if (int(iv.max()) - lo + 1) * nd < 2**62:
        key = (iv - lo) * nd + codes
        order = np.argsort(key)
        sk = key[order]
        new = np.ones(len(order), bool)
        new[1:] = sk[1:] != sk[:-1]
    else:
        order = np.lexsort((codes, iv))
        s_iv, s_c = iv[order], codes[order]
        new = np.ones(len(order), bool)
        new[1:] = (s_iv[1:] != s_iv[:-1]) | (s_c[1:] != s_c[:-1])
    inv = np.empty(len(order), np.int64)
    inv[order] = np.cumsum(new) - 1
    first = order[new]
    return iv[first], first, inv


def _group_items(iv: np.ndarray, items: pa.Array) -> tuple[np.ndarray, pa.Array, np.ndarray]:
    """Distinct (iv, item) pairs: (their iv, their items, the pair of every row)."""
    enc = pc.dictionary_encode(items)
    codes = _numpy(enc.indices).astype(np.int64)
    giv, first, inv = _group(np.asarray(iv, np.int64), codes)
    return giv, items.take(pa.array(first)), inv
