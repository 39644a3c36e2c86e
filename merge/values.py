"""User text becomes typed values here, and only here: durations (one unit table), tolerances
(eps, one value or one per key), window sizes and fractions.

Every command and the library parse through this module, so ``1h`` means the same on every
option that takes a duration (``--eps time=1h``, ``wjoin --window``/``--pair-window``, ``count
--every``, ``archive --aggregate EVERY``, ``serve --summarize --lifetime``). Messages name the
parameter as the caller passes it in ``what`` (``smerge.errors.param`` references, shown as the
command line's flags by the CLI). The module imports only the standard library and smerge.errors.

Durations: a number and a unit, ``ns us ms s min h d w`` (also ``sec``, ``hr``, ``day``,
``days``; case is ignored), or a plain number (in the time column's own unit: the caller
converts it). Months ``mo`` and years ``y`` have a fixed length only in the ``360_day``
calendar (30 and 360 days). ``m`` and ``M`` are refused: minutes or months? Signs, ``nan`` and
``inf`` are not durations; a duration whose nanoseconds do not fit a float (``1e400``,
``1e300s``) is refused as too large.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from smerge.errors import UsageError, param

# The one unit table: nanoseconds per unit, exact integers.
NS_PER_UNIT = {"ns": 1, "us": 10**3, "ms": 10**6, "s": 10**9, "sec": 10**9, "min": 60 * 10**9,
               "h": 3600 * 10**9, "hr": 3600 * 10**9, "d": 86400 * 10**9, "day": 86400 * 10**9,
               "days": 86400 * 10**9, "w": 7 * 86400 * 10**9}
# Months and years: fixed lengths only in this calendar.
FIXED_YEAR_CALENDAR = "360_day"
CALENDAR_NS_PER_UNIT = {"mo": 30 * 86400 * 10**9, "y": 360 * 86400 * 10**9}
AMBIGUOUS_UNITS = ("m", "M")
UNITS_TEXT = "units ns us ms s min h d w; mo y on 360_day times"
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z]*)\s*$")

# Window sizes: the engines allocate their window buffers up front, so a larger N cannot be a
# real request (README lists the bound).
MAX_WINDOW_SIZE = 10**9


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


# ---- durations ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Duration:
    """``value`` in ``unit`` (a key of ``NS_PER_UNIT`` or ``CALENDAR_NS_PER_UNIT``), or a plain
    number in the time column's own unit (``unit`` None)."""

    value: float
    unit: str | None = None

    def __str__(self) -> str:
        return f"{self.value:g}{self.unit or ''}"

    @property
    def is_calendar(self) -> bool:
        return self.unit in CALENDAR_NS_PER_UNIT

    def nanoseconds(self, calendar: str | None = None, what: str = "the duration") -> float:
        """The duration in nanoseconds (a float: it may exceed int64). Months and years only in
        the 360_day calendar (``calendar`` None: the standard one)."""
        if self.unit is None:
            raise ValueError(f"{self} is a plain number: it has no length in nanoseconds of its own")
        if self.is_calendar:
            if calendar != FIXED_YEAR_CALENDAR:
                raise UsageError(f"{what} {str(self)!r}: months and years have no fixed length in the "
                                 f"{calendar or 'standard'} calendar; give days or hours")
            return self.value * CALENDAR_NS_PER_UNIT[self.unit]
        return self.value * NS_PER_UNIT[self.unit]

    def ticks(self, ns_per_tick: float | None, calendar: str | None = None, what: str = "the duration") -> float:
        """In ticks of a time column (``ns_per_tick``; None: a plain-number column). A plain
        number is already in ticks; a unit needs a time column."""
        if self.unit is None:
            return self.value
        if ns_per_tick is None:
            raise UsageError(f"{what} {str(self)!r} has a unit but the time column is a plain number; give a plain "
                             "number in the time column's unit")
        return self.nanoseconds(calendar, what) / ns_per_tick


def _too_large(what: str, shown) -> UsageError:
    return UsageError(f"{what} {shown!r} is too large to hold; give a finite duration such as 6h or 2d (one "
                      "longer than the data's time span is as good as none)")


def parse_duration(text: str | float | int | Duration, what: str = "the duration", *, shown: str | None = None,
                   positive: bool = False) -> Duration:
    """``"90s"``, ``"1.5h"``, ``"2d"``, ``"1mo"`` or a plain number (text or a number >= 0).

    ``shown`` is the text the messages quote (default ``text``: e.g. the whole ``I,J=DUR`` of a
    pair window); ``positive`` refuses 0."""
    if isinstance(text, Duration):
        d = text
    elif _is_number(text):
        if math.isnan(text) or text < 0:
            raise UsageError(f"{what} {text} must be a number >= 0")
        if math.isinf(text):
            raise _too_large(what, text if shown is None else shown)
        d = Duration(float(text))
    else:
        shown = str(text) if shown is None else shown
        m = _DURATION.match(str(text))
        unit = m.group(2) if m else ""
        if unit in AMBIGUOUS_UNITS:
            raise UsageError(f"{what} {shown!r}: {unit!r} could be minutes or months; write min or mo")
        unit = unit.lower()
        if not m or (unit and unit not in NS_PER_UNIT and unit not in CALENDAR_NS_PER_UNIT):
            raise UsageError(f"{what} {shown!r} is not a duration; write e.g. 90s, 30min, 6h, 2d ({UNITS_TEXT}) or a "
                             "plain number in the time column's unit")
        d = Duration(float(m.group(1)), unit or None)
        scale = NS_PER_UNIT.get(unit) or CALENDAR_NS_PER_UNIT.get(unit) or 1
        if not math.isfinite(d.value * scale):
            raise _too_large(what, shown)
    if positive and not d.value > 0:
        raise UsageError(f"{what} {text if shown is None else shown!r} must be a positive duration (> 0)")
    return d


# ---- tolerances (eps) -----------------------------------------------------------------------

def parse_eps(text: str, what: str = param.eps) -> float | str | dict[str, float | str]:
    """``0.01``, ``lat=0.01,lon=0.01,time=0`` or with durations on time keys: ``time=1h``.

    Durations stay text here (checked for their form): only the key's type says what they are
    (``merge.keys.key_eps`` converts them, and refuses them on keys that are not times)."""
    text = text.strip()

    def number_or_duration(v: str, part: str) -> float | str:
        v = v.strip()
        try:
            return float(v)
        except ValueError:
            if v[:1].isdigit() or v[:1] == ".":
                parse_duration(v, part)  # the form only; the key's type decides the rest
                return v
            raise UsageError(f"{part} {v!r} is not a number or a duration; use {what} 0.01 or "
                             f"{what} lat=0.01,time=1h") from None

    if "=" not in text:
        return number_or_duration(text, what)
    out: dict[str, float | str] = {}
    for part in text.split(","):
        k, sep, v = part.partition("=")
        if not sep or not k.strip():
            raise UsageError(f"{what} part {part!r} is not KEY=VALUE; use {what} lat=0.01,lon=0.02")
        if k.strip() in out:
            raise UsageError(f"{what} names key {k.strip()!r} twice; give one tolerance per key")
        out[k.strip()] = number_or_duration(v, f"{what} value for {k.strip()!r}:")
    return out


def eps_per_key(eps: float | Sequence[float] | Mapping[str, float], keys: Sequence[str],
                what: str = param.eps) -> tuple[float, ...]:
    """One tolerance per key: a scalar applies to all keys; a mapping names keys (others 0).
    The values are checked where they are used (``check_eps``, by the engines' parameters)."""
    if isinstance(eps, Mapping):
        unknown = sorted(set(eps) - set(keys))
        if unknown:
            raise UsageError(f"{what} names {', '.join(unknown)}, which are not merge keys; the keys are "
                             f"{', '.join(keys)}")
        return tuple(float(eps.get(k, 0.0)) for k in keys)
    if _is_number(eps):
        return (float(eps),) * len(keys)
    out = tuple(float(e) for e in eps)
    if len(out) != len(keys):
        raise UsageError(f"{what} has {len(out)} values but there are {len(keys)} keys ({', '.join(keys)})")
    return out


def check_eps(eps: Sequence[float], keys: Sequence[str], what: str = param.eps) -> None:
    """Every tolerance a finite number >= 0, one per key."""
    if len(eps) != len(keys):
        raise UsageError(f"{len(eps)} tolerances for {len(keys)} keys")
    for k, e in zip(keys, eps):
        if not _is_number(e) or math.isnan(e) or e < 0 or math.isinf(e):
            raise UsageError(f"{what} for key {k!r} is {e}; a tolerance must be a finite number >= 0")


# ---- counts and fractions -------------------------------------------------------------------

def check_window_size(n, what: str = param.window_size) -> int:
    """The window size N: an integer from 1 to ``MAX_WINDOW_SIZE``."""
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_WINDOW_SIZE:
        raise UsageError(f"{what} is {n}; the window size N must be an integer from 1 to 10^9 "
                         "(its buffers, about 200 bytes a record, are allocated up front)")
    return n


def check_count(n, what: str, lo: int, hi: int, meaning: str = "") -> int:
    """An integer in [lo, hi] (``meaning``: what the number is, for the message)."""
    if not isinstance(n, int) or isinstance(n, bool) or not lo <= n <= hi:
        top = "10^9" if hi == 10**9 else f"{hi:,}"
        raise UsageError(f"{what} is {n}; {meaning + ' ' if meaning else ''}use an integer from {lo:,} to {top}")
    return n


def check_fraction(f, what: str, *, zero: bool = False, note: str = "") -> float:
    """A fraction in (0, 1] (``zero``: in [0, 1]); ``note`` ends the message, e.g. what 1 means."""
    low = "[0" if zero else "(0"
    if not _is_number(f) or not ((0.0 <= f) if zero else (0.0 < f)) or not f <= 1.0:
        raise UsageError(f"{what} is {f!r}; it must be in {low}, 1]{' ' + note if note else ''}")
    return float(f)


def parse_fraction(text: str, what: str, *, zero: bool = False, note: str = "", hint: str = "e.g. 0.25") -> float:
    """``check_fraction`` of a number written as text."""
    try:
        f = float(text)
    except (TypeError, ValueError):
        raise UsageError(f"{what} is {text!r}; give a fraction in {'[0' if zero else '(0'}, 1], {hint}") from None
    return check_fraction(f, what, zero=zero, note=note)


__all__ = ["NS_PER_UNIT", "CALENDAR_NS_PER_UNIT", "FIXED_YEAR_CALENDAR", "MAX_WINDOW_SIZE", "Duration",
           "parse_duration", "parse_eps", "eps_per_key", "check_eps", "check_window_size", "check_count",
           "check_fraction", "parse_fraction"]
