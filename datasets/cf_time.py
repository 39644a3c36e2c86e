"""CF time: ``"<unit> since <date>[ <time>][ <utc offset>]"`` in any CF calendar, decoded exactly.

A CF time variable is decoded to one time base shared by every input: **microseconds since
1970-01-01 00:00:00 UTC, counted in the variable's own calendar**. Both inputs' times are then
comparable as plain numbers, whatever their units, reference dates or UTC offsets.

- Standard calendars (``standard``/``gregorian`` from 1582-10-15 on, ``proleptic_gregorian``)
  become Arrow ``timestamp[us]``: its range is +-290,000 years, so dates outside 1678-2262 are
  exact (``datetime64[ns]`` would wrap them around).
- Other calendars (``noleap``/``365_day``, ``all_leap``/``366_day``, ``360_day``, ``julian``), and
  ``standard`` dates before the Gregorian switch, become ``int64`` microseconds on that base,
  with ``units`` and ``calendar`` in the field metadata. Two inputs in different calendars
  cannot be compared (``check_calendars``).

Which units are accepted is cftime's decision: ``parse_cf_time`` asks ``cftime.num2date`` and refuses
what it refuses, with its reason (``common_years`` only in ``noleap``/``365_day``, ``months`` only in
``360_day``, no ``years`` at all). The reference date is then read here too, because cftime silently
drops what it cannot parse: an offset such as ``-3:30`` or ``+5``, a lone hour (``2000-01-01 06``),
a time after two spaces, a decimal comma, trailing words. smerge applies those offsets and times,
and refuses a reference with text it cannot read rather than drop it: a silently wrong reference
pairs different instants. cftime does the calendar arithmetic (the reference date's distance from
1970-01-01 in its calendar). Values are ``offset + round(value * unit)`` in integer microseconds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from smerge.errors import InputError

BASE_UNITS = "microseconds since 1970-01-01 00:00:00"
META_UNITS, META_CALENDAR, META_SOURCE_UNITS = b"units", b"calendar", b"smerge.cf_units"
META_UNIT_US = b"smerge.cf_unit_us"

# cftime's unit words (cftime._cftime's unit lists and UNIT_CONVERSION_FACTORS), in microseconds.
# Which calendar may use which word is cftime's to say (parse_cf_time asks it); tests hold this
# table to the installed cftime.
_DAY_US = 86400 * 10**6
_UNIT_US = {
    **dict.fromkeys(("microseconds", "microsecond", "microsec", "microsecs"), 1),
    **dict.fromkeys(("milliseconds", "millisecond", "millisec", "millisecs", "msec", "msecs", "ms"), 10**3),
    **dict.fromkeys(("seconds", "second", "secs", "sec", "s"), 10**6),
    **dict.fromkeys(("minutes", "minute", "mins", "min"), 60 * 10**6),
    **dict.fromkeys(("hours", "hour", "hrs", "hr", "h"), 3600 * 10**6),
    **dict.fromkeys(("days", "day", "d"), _DAY_US),
    **dict.fromkeys(("months", "month"), 30 * _DAY_US),  # cftime: 360_day only
    **dict.fromkeys(("common_years", "common_year"), 365 * _DAY_US),  # cftime: noleap/365_day only
}
CALENDARS = {
    "standard": "standard", "gregorian": "standard", "proleptic_gregorian": "proleptic_gregorian",
    "noleap": "noleap", "365_day": "noleap", "all_leap": "all_leap", "366_day": "all_leap",
    "360_day": "360_day", "julian": "julian",
}
TIMESTAMP_CALENDARS = ("standard", "proleptic_gregorian")
# 1582-10-15 00:00 UTC in microseconds since 1970: standard == proleptic_gregorian from here on.
GREGORIAN_SWITCH_US = -12219292800 * 10**6

# "since" then the reference; also with no space before a date ("hours since2000-01-01"), which
# is then the CF shape that cftime refuses (exit 2), not a plain number
_SINCE = re.compile(r"^\s*([A-Za-z_]+)\s+since(?:\s+|(?=[+\-\d]))(.+?)\s*$", re.IGNORECASE)
# The reference: what cftime reads, and what it silently drops (a lone hour, a time after several
# spaces, a one-digit or space-separated offset, a decimal comma). The date-time separator is T,
# spaces, or one other character that is not a digit or a sign, as cftime allows.
_REF = re.compile(
    r"^(?P<y>[+-]?\d+)-(?P<mo>\d{1,2})-(?P<d>\d{1,2})"
    r"(?:(?:[T\s]+|[^\d\s+-])(?P<h>\d{1,2})(?::(?P<mi>\d{1,2})(?::(?P<s>\d{1,2})(?:[.,](?P<f>\d*))?)?)?)?"
    r"(?:\s*(?P<tz>Z|UTC|GMT|[+-]\d{1,2}(?::?\d{2})?))?$",
    re.IGNORECASE,
)
_REF_FORM = "YYYY-MM-DD[ hh[:mm[:ss[.ffffff]]]][ +hh:mm]"


def is_cf_time_units(units: object) -> bool:
    """True for ``"<word> since <anything>"`` (the CF time-units shape, valid or not)."""
    return isinstance(units, str) and bool(_SINCE.match(units))


@dataclass(frozen=True)
class CFTime:
    """One CF time variable's decoding: ``value -> offset_us + round(value * unit_us)``."""

    units: str
    calendar: str  # canonical name (CALENDARS values)
    unit_us: int
    offset_us: int

    def field_type(self, min_us: int | None = None) -> pa.DataType:
        """``timestamp[us]`` where the calendar is standard (and no date precedes the switch)."""
        if self.calendar == "proleptic_gregorian":
            return pa.timestamp("us")
        if self.calendar == "standard" and (min_us if min_us is not None else self.offset_us) >= GREGORIAN_SWITCH_US:
            return pa.timestamp("us")
        return pa.int64()

    def metadata(self, typ: pa.DataType) -> dict[bytes, bytes]:
        md = {META_SOURCE_UNITS: self.units.encode(), META_UNIT_US: str(self.unit_us).encode(),
              META_CALENDAR: self.calendar.encode()}
        if not pa.types.is_timestamp(typ):
            md[META_UNITS] = BASE_UNITS.encode()
        return md

    def decode(self, values: np.ndarray, *, source: str = "", name: str = "") -> tuple[np.ndarray, np.ndarray | None]:
        """Microseconds on the base (int64) and the mask of missing values (or None)."""
        mask = np.ma.getmaskarray(values) if np.ma.isMaskedArray(values) else None
        raw = np.ma.getdata(values) if mask is not None else np.asarray(values)
        if mask is not None and mask.any():  # a missing value's stored number (a fill value) is no time
            raw = np.where(mask, np.zeros((), raw.dtype), raw)
        if raw.dtype.kind in "iu":
            big = np.abs(raw.astype(np.float64)) * self.unit_us > 9.2e18
            if big.any():
                raise _overflow(source, name, self.units)
            out = raw.astype(np.int64) * np.int64(self.unit_us) + np.int64(self.offset_us)
        else:
            raw = raw.astype(np.float64, copy=False)
            nan = ~np.isfinite(raw)
            if nan.any():
                mask = nan if mask is None else (mask | nan)
                raw = np.where(nan, 0.0, raw)
            with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused just below
                scaled = np.rint(raw * float(self.unit_us))
            if (np.abs(scaled) > 9.2e18).any():
                raise _overflow(source, name, self.units)
            out = scaled.astype(np.int64) + np.int64(self.offset_us)
        if mask is not None and not mask.any():
            mask = None
        return out, mask


def _overflow(source: str, name: str, units: str) -> InputError:
    return InputError(f"{source}: time variable {name!r} ({units!r}) holds values too far from 1970 to count in "
                      "microseconds (beyond +-292,000 years); check its values and units")


def parse_cf_time(units: object, calendar: object = None, *, source: str = "", name: str = "") -> CFTime | None:
    """The decoding of ``units`` in ``calendar`` (default ``standard``), or None when ``units``
    is not a CF time (no ``since``). Units cftime refuses, references smerge cannot read whole,
    and unknown calendars are an ``InputError``."""
    if not is_cf_time_units(units):
        return None
    where = f"{source}: time variable {name!r}"
    cal_raw = "standard" if calendar is None or str(calendar).strip() == "" else str(calendar).strip().lower()
    if cal_raw not in CALENDARS:
        raise InputError(f"{where} has calendar {calendar!r}; smerge decodes the CF calendars "
                         f"{', '.join(sorted(CALENDARS))}")
    cal = CALENDARS[cal_raw]
    cf_ref = _cftime_reference(str(units), cal_raw, where)
    m = _SINCE.match(units)
    unit = m.group(1).lower()
    unit_us = _UNIT_US.get(unit)
    if unit_us is None:  # a word a newer cftime accepts and this table does not know yet
        raise InputError(f"{where} has units {units!r}: cftime accepts the unit {unit!r} but smerge does not know "
                         "its length; write the values in days, hours, minutes, seconds, milliseconds or microseconds")
    ref = _REF.match(m.group(2).strip())
    if not ref:
        raise InputError(f"{where} has units {units!r}: smerge cannot read all of its reference date (cftime "
                         f"reads it as {cf_ref} and drops what it cannot parse); write it as {_REF_FORM}")
    offset = _ref_offset_us(ref, cal, where, units)
    return CFTime(units=str(units), calendar=cal, unit_us=unit_us, offset_us=offset)


def _cftime_reference(units: str, calendar: str, where: str) -> str:
    """cftime's reading of ``units``' reference date in ``calendar``, or its refusal as an ``InputError``."""
    import warnings

    import cftime

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # cftime's CFWarning on year 0; its refusal says what matters
            return str(cftime.num2date(0, units, calendar))
    except Exception as e:  # noqa: BLE001 - ValueError, TypeError, OverflowError: cftime's reason, passed on
        reason = " ".join(str(e).split()) or type(e).__name__
        raise InputError(f"{where} has units {units!r} in the {calendar} calendar, which cftime refuses: {reason}; "
                         f"fix the units attribute (<unit> since {_REF_FORM})") from None


def _ref_offset_us(ref: re.Match, cal: str, where: str, units: str) -> int:
    import cftime

    y, mo, d = int(ref.group("y")), int(ref.group("mo")), int(ref.group("d"))
    h, mi, sec = (int(ref.group(k) or 0) for k in ("h", "mi", "s"))
    micro = int((ref.group("f") or "")[:6].ljust(6, "0"))  # exact decimal, cut at microseconds as cftime does
    try:
        cftime.datetime(y, mo, d, h, mi, sec, micro, calendar=cal)  # cftime's checks of every field
        # Whole days (small, exact in any float) from 1970-01-01 in this calendar.
        days = cftime.date2num(cftime.datetime(y, mo, d, calendar=cal), "days since 1970-01-01", calendar=cal)
    except (ValueError, TypeError) as e:
        raise InputError(f"{where} has units {units!r}: {e}; fix the units attribute") from None
    offset = int(round(float(days))) * _DAY_US + ((h * 60 + mi) * 60 + sec) * 10**6 + micro
    tz = (ref.group("tz") or "").upper()
    if tz and tz not in ("Z", "UTC", "GMT"):
        sign = -1 if tz[0] == "-" else 1
        body = tz[1:].replace(":", "")
        hh, mm = (int(body[:-2] or 0), int(body[-2:])) if len(body) > 2 else (int(body), 0)
        if hh > 23 or mm >= 60:
            raise InputError(f"{where} has units {units!r} with a UTC offset out of range (hours 0-23, minutes "
                             "0-59); fix the units attribute")
        offset -= sign * (hh * 60 + mm) * 60 * 10**6  # local time at UTC+hh:mm is hh:mm later than UTC
    return offset


def field_calendar(field: pa.Field) -> str | None:
    """The calendar of a decoded CF time field (or None for any other field)."""
    md = field.metadata or {}
    cal = md.get(META_CALENDAR)
    return cal.decode() if cal is not None and META_SOURCE_UNITS in md else None


def field_unit_us(field: pa.Field) -> int | None:
    """Microseconds per unit of the source variable of a decoded CF time field (or None)."""
    md = field.metadata or {}
    v = md.get(META_UNIT_US)
    return int(v) if v is not None else None


__all__ = ["CFTime", "parse_cf_time", "is_cf_time_units", "field_calendar", "field_unit_us", "CALENDARS",
           "BASE_UNITS", "GREGORIAN_SWITCH_US"]
