"""CF time units: smerge accepts the unit words and reference dates the installed cftime decodes, with
cftime's values, and refuses what cftime refuses with cftime's reason. Where cftime silently drops
part of a reference (an offset like -3:30, a lone hour, a decimal comma), smerge applies it; text it
cannot read at all is refused rather than dropped."""

from __future__ import annotations

import datetime as dt
import json
import warnings

import cftime
import netCDF4
import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smerge.datasets.cf_time import _UNIT_US, parse_cf_time
from smerge.errors import InputError
from cli_run import run_cli  # noqa: E402 (tests/helpers: the shared CLI test helper)

CALENDARS = ["standard", "gregorian", "proleptic_gregorian", "noleap", "365_day", "all_leap", "366_day", "360_day",
             "julian"]
# cftime's words, spellings it refuses (other tools' abbreviations, plurals it lacks), and case variants.
WORDS = sorted(cftime._cftime.UNIT_CONVERSION_FACTORS) + [
    "usec", "usecs", "us", "years", "year", "weeks", "week", "fortnights", "mon", "yr", "m", "Days", "HOURS",
    "Common_Years", "Months"]
VALUES = np.array([0.0, 1.0, 2.5, -3.0, 40.0, 1000.0])
ONE_US = dt.timedelta(microseconds=1)


def cftime_reading(values, units, calendar):
    """The oracle: cftime.num2date's dates as exact microseconds since 1970-01-01 in the calendar,
    or cftime's refusal (the exception's text)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dates = cftime.num2date(values, units, calendar)
    except Exception as e:  # noqa: BLE001 - whatever cftime raises is its refusal
        return None, " ".join(str(e).split())
    epoch = cftime.datetime(1970, 1, 1, calendar=calendar)
    return [(d - epoch) // ONE_US for d in np.atleast_1d(dates)], None


def smerge_reading(values, units, calendar):
    ct = parse_cf_time(units, calendar, source="in.nc", name="time")
    got, mask = ct.decode(np.asarray(values, dtype=np.float64))
    assert mask is None
    return got.tolist()


def test_unit_table_is_cftimes():
    """The unit table holds every word cftime knows, at cftime's length, and nothing else."""
    c = cftime._cftime
    assert _UNIT_US == c.UNIT_CONVERSION_FACTORS
    assert set(_UNIT_US) == set(c._units) | set(c.month_units) | set(c.year_units)


@pytest.mark.parametrize("calendar", CALENDARS)
@pytest.mark.parametrize("word", WORDS)
def test_every_word_in_every_calendar_as_cftime_decides(word, calendar):
    units = f"{word} since 1995-01-01"
    want, refusal = cftime_reading(VALUES, units, calendar)
    if refusal is None:
        assert smerge_reading(VALUES, units, calendar) == want
    else:
        with pytest.raises(InputError) as e:
            parse_cf_time(units, calendar, source="in.nc", name="time")
        msg = str(e.value)
        assert "\n" not in msg
        assert msg.startswith("in.nc: time variable 'time' has units ") and repr(units) in msg
        assert f"cftime refuses: {refusal}" in msg


def test_the_accepted_words_per_calendar():
    """The table above, spelled out for the words whose calendars are restricted (cftime 1.6)."""
    accepted = {w: [c for c in CALENDARS if cftime_reading([0.0], f"{w} since 1995-01-01", c)[1] is None]
                for w in WORDS}
    assert accepted["common_years"] == accepted["common_year"] == accepted["Common_Years"] == ["noleap", "365_day"]
    assert accepted["months"] == accepted["month"] == ["360_day"]
    for w in ("years", "year", "usec", "us", "weeks", "m", "yr"):
        assert accepted[w] == [], w
    for w in ("microsecs", "msec", "msecs", "ms", "secs", "s", "mins", "hr", "hrs", "h", "day", "d", "HOURS"):
        assert accepted[w] == CALENDARS, w
    day = 86400 * 10**6
    assert smerge_reading([1.0], "common_years since 1995-01-01", "noleap")[0] - \
        smerge_reading([0.0], "common_years since 1995-01-01", "noleap")[0] == 365 * day


REF_PARTS = st.fixed_dictionaries({
    "year": st.integers(1, 3000), "month": st.integers(1, 12), "day": st.integers(1, 31),
    "sep": st.sampled_from([" ", "T", "_"]),
    "hm": st.one_of(st.none(), st.tuples(st.integers(0, 23), st.integers(0, 59))),
    "sec": st.one_of(st.none(), st.integers(0, 59)), "frac": st.sampled_from(["", ".5", ".25", ".125", ".0"]),
    "tz": st.sampled_from(["", "Z", " UTC", " +05:30", "-0300", " +02", " -11:45"]),
    "pad": st.booleans(),
})


def reference(p):
    f = "{:04d}-{:02d}-{:02d}" if p["pad"] else "{}-{}-{}"
    s = f.format(p["year"], p["month"], p["day"])
    if p["hm"] is not None:
        s += p["sep"] + "{:02d}:{:02d}".format(*p["hm"])
        if p["sec"] is not None:
            s += ":{:02d}{}".format(p["sec"], p["frac"])
    return s + p["tz"]


@settings(max_examples=300, deadline=None)
@given(calendar=st.sampled_from(CALENDARS), word=st.sampled_from(sorted(_UNIT_US)), ref=REF_PARTS,
       vals=st.lists(st.integers(-10**5, 10**5).map(lambda i: i / 4), min_size=1, max_size=4))
def test_any_reference_spelling_equals_cftime_or_is_refused_with_its_reason(calendar, word, ref, vals):
    """Spellings cftime reads whole (any padding, T/space/_ separator, seconds, fractions, offsets):
    smerge's values equal num2date's; what cftime refuses (bad day, unit in this calendar, the
    Gregorian gap) smerge refuses with cftime's reason."""
    units = f"{word} since {reference(ref)}"
    want, refusal = cftime_reading(np.array(vals), units, calendar)
    if refusal is None:
        assert smerge_reading(vals, units, calendar) == want, units
    else:
        with pytest.raises(InputError, match="cftime refuses") as e:
            parse_cf_time(units, calendar, source="in.nc", name="time")
        assert refusal in str(e.value)


@pytest.mark.parametrize("ref,same_as", [
    # cftime drops these offsets (one-digit hour, space before an unpadded one) and reads UTC.
    ("2000-01-01 06:00:00 -3:30", "2000-01-01 06:00:00 -03:30"),
    ("2000-01-01 06:00:00.0 -6:00", "2000-01-01 06:00:00 -06:00"),
    ("2000-01-01 06:00 +5", "2000-01-01 06:00 +05:00"),
    ("2000-01-01 06:00  +05:00", "2000-01-01 06:00 +05:00"),
    # cftime reads a lone hour, or a time after two spaces, as midnight.
    ("2000-01-01 06", "2000-01-01 06:00"),
    ("2000-01-01T06", "2000-01-01 06:00"),
    ("2000-01-01  06:30", "2000-01-01 06:30"),
    # cftime drops a decimal comma's fraction, and loses a microsecond in float arithmetic.
    ("2000-01-01 06:30:15,5", "2000-01-01 06:30:15.5"),
    ("2000-01-01 00:00:00.000249", None),
])
@pytest.mark.parametrize("calendar", ["standard", "noleap", "360_day"])
def test_what_cftime_drops_smerge_applies(ref, same_as, calendar):
    got = smerge_reading([0.0, 1.0], f"hours since {ref}", calendar)
    if same_as is None:  # 249 microseconds after midnight, exactly as written (cftime: 248)
        want, _ = cftime_reading([0.0, 1.0], "hours since 2000-01-01", calendar)
        assert [g - w for g, w in zip(got, want)] == [249, 249]
        assert cftime.num2date(0, f"hours since {ref}", calendar).microsecond == 248
    else:
        want, refusal = cftime_reading([0.0, 1.0], f"hours since {same_as}", calendar)
        assert refusal is None and got == want
        assert cftime_reading([0.0, 1.0], f"hours since {ref}", calendar)[0] != want  # cftime differs here


@pytest.mark.parametrize("ref,reading", [
    ("2000-01-01 garbage", "2000-01-01 00:00:00"),
    ("2000-01-01 06:30 UTC+1", "2000-01-01 06:30:00"),
    ("2000-01-01 06:30 +05:30:00", "2000-01-01 01:00:00"),
])
def test_text_cftime_ignores_is_refused_not_dropped(ref, reading):
    units = f"days since {ref}"
    assert str(cftime.num2date(0, units, "standard")) == reading  # cftime accepts, dropping the tail
    with pytest.raises(InputError) as e:
        parse_cf_time(units, "standard", source="in.nc", name="time")
    msg = str(e.value)
    assert msg.startswith(f"in.nc: time variable 'time' has units {units!r}: smerge cannot read all of its reference")
    assert f"cftime reads it as {reading}" in msg and "YYYY-MM-DD" in msg


@pytest.mark.parametrize("ref", ["2000-01-01 24:00", "2000-01-01 23:59:60", "2000", "2000-01", "2000/01/01",
                                 "20000101", "0000-01-01", "1582-10-10"])
def test_references_cftime_refuses_are_refused_with_its_reason(ref):
    units = f"days since {ref}"
    _, refusal = cftime_reading([0.0], units, "standard")
    assert refusal
    with pytest.raises(InputError) as e:
        parse_cf_time(units, "standard", source="in.nc", name="time")
    assert f"which cftime refuses: {refusal}" in str(e.value)


def test_leap_day_reference_in_noleap_and_day_31_in_360_day():
    for units, cal, reason in [("days since 2000-02-29", "noleap", "cannot specify a leap day"),
                               ("days since 2000-01-31", "360_day", "only 30 days in every month")]:
        with pytest.raises(InputError, match=reason):
            parse_cf_time(units, cal, source="in.nc", name="time")


def test_utc_offset_bounds():
    assert smerge_reading([0.0], "hours since 2000-01-02 00:00 +15:00", "standard") == \
        cftime_reading([0.0], "hours since 2000-01-02 00:00 +15:00", "standard")[0]
    with pytest.raises(InputError, match="UTC offset out of range"):  # cftime reads 5 h 99 min
        parse_cf_time("hours since 2000-01-01 00:00 +05:99", "standard", source="in.nc", name="time")


# ---- through the CLI ------------------------------------------------------------------------


def grid_file(path, times, units, calendar):
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("time", len(times))
        ds.createDimension("lat", 2)
        tv = ds.createVariable("time", "f8", ("time",))
        tv.units = units
        tv.calendar = calendar
        tv[:] = times
        ds.createVariable("lat", "f4", ("lat",))[:] = [10.0, 20.0]
        ds.createVariable("p", "f4", ("time", "lat"))[:] = np.arange(len(times) * 2, dtype=np.float32).reshape(-1, 2)
    return str(path)


def test_cgm_on_common_years_noleap(tmp_path, capsys):
    # A: 1995, 1996, 1997 (common years from 1995-01-01); B counts days from 1996-01-01: 0 and 365 are
    # 1996 and 1997, 100 days matches nothing.
    a = grid_file(tmp_path / "a.nc", [0.0, 1.0, 2.0], "common_years since 1995-01-01", "noleap")
    b = grid_file(tmp_path / "b.nc", [0.0, 100.0, 365.0], "days since 1996-01-01", "365_day")
    out = tmp_path / "o.parquet"
    rc, so, se = run_cli(capsys, "cgm", a, b, "--local", "-o", out, "--json")
    assert rc == 0, se
    assert json.loads(so)["matched"] == 4
    t = pq.read_table(out)
    f = t.schema.field("time")
    assert f.metadata[b"calendar"] == b"noleap"
    day = 86400 * 10**6
    assert sorted(set(t["time"].to_pylist())) == [(1996 - 1970) * 365 * day, (1997 - 1970) * 365 * day]


def test_cgm_refuses_a_unit_cftime_refuses_naming_file_variable_units(tmp_path, capsys):
    a = grid_file(tmp_path / "a.nc", [0.0, 1.0], "common_years since 1995-01-01", "360_day")
    b = grid_file(tmp_path / "b.nc", [0.0, 1.0], "days since 1995-01-01", "360_day")
    rc, so, se = run_cli(capsys, "cgm", a, b, "--local", "-o", tmp_path / "o.parquet")
    assert rc == 2
    line = se.strip()
    assert "\n" not in line and "Traceback" not in line
    assert a in line and "'time'" in line and "'common_years since 1995-01-01'" in line
    assert "'common_years' units only allowed for '365_day' and 'noleap' calendars" in line


def test_units_without_a_space_after_since_are_refused_not_read_as_numbers(tmp_path, capsys):
    """'hours since2000-01-01' is the CF time shape that cftime refuses: exit 2 naming it, as for
    any unit cftime refuses (it was read as a plain number and compared with plain numbers)."""
    a = grid_file(tmp_path / "a.nc", [0.0, 1.0], "hours since2000-01-01", "standard")
    b = grid_file(tmp_path / "b.nc", [0.0, 1.0], "hours since 2000-01-01", "standard")
    rc, so, se = run_cli(capsys, "cgm", a, b, "--local", "-o", tmp_path / "o.parquet")
    assert rc == 2 and len(se.strip().splitlines()) == 1, se
    assert a in se and "'hours since2000-01-01'" in se
    assert not (tmp_path / "o.parquet").exists()
