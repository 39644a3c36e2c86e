"""CF time decoding (docs/data.md, "Time: CF decoding, one time base"), against cftime.num2date, and its use by cgm and wjoin."""

from __future__ import annotations

import json

import cftime
import netCDF4
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smerge.datasets import open_input
from smerge.datasets.cf_time import parse_cf_time
from smerge.errors import InputError
from cli_run import run_cli  # noqa: E402 (tests/helpers: the shared CLI test helper)

EPOCH = "microseconds since 1970-01-01 00:00:00"
CALENDARS = ["standard", "gregorian", "proleptic_gregorian", "noleap", "365_day", "all_leap", "366_day", "360_day",
             "julian"]


def cftime_us(values, units, calendar):
    """The independent oracle: cftime's dates, counted on smerge's base in the same calendar."""
    dates = cftime.num2date(values, units, calendar)
    return np.array([int(round(x)) for x in cftime.date2num(dates, EPOCH, calendar)], dtype=np.int64)


def time_file(path, values, units, calendar=None, *, var_dims=("time",), extra=None):
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("time", len(values))
        tv = ds.createVariable("time", "f8", ("time",))
        tv.units = units
        if calendar is not None:
            tv.calendar = calendar
        tv[:] = values
        v = ds.createVariable("v", "f4", ("time",))
        v[:] = np.arange(len(values), dtype=np.float32) if extra is None else extra
    return str(path)


def read_us(path):
    t = pa.Table.from_batches(list(open_input(path).batches()))
    col = t["time"]
    return t, col.cast(pa.int64()).to_numpy() if pa.types.is_timestamp(col.type) else col.to_numpy()


@pytest.mark.parametrize("calendar", CALENDARS)
@pytest.mark.parametrize("units", ["days since 0049-09-01", "hours since 1958-1-1", "days since 2000-01-01",
                                   "minutes since 2262-06-01 12:30", "seconds since 1582-10-15 00:00:00"])
def test_every_calendar_matches_cftime(tmp_path, calendar, units):
    vals = np.array([0.0, 1.0, 29.5, 365.0, 1460.25, 100000.0])
    path = time_file(tmp_path / "t.nc", vals, units, calendar)
    t, us = read_us(path)
    assert us.tolist() == cftime_us(vals, units, calendar).tolist()
    f = t.schema.field("time")
    standard_ok = calendar == "proleptic_gregorian" or (calendar in ("standard", "gregorian")
                                                        and "0049" not in units)
    assert pa.types.is_timestamp(f.type) == standard_ok
    if not standard_ok:  # numbers on a stated base, with the calendar
        assert f.metadata[b"units"] == EPOCH.encode() and f.metadata[b"calendar"]


def test_dates_outside_1678_2262_are_exact_not_wrapped(tmp_path):
    path = time_file(tmp_path / "t.nc", [0.0, 10.0], "days since 0049-09-01", "proleptic_gregorian")
    t, _ = read_us(path)
    assert [str(x) for x in t["time"].to_pylist()] == ["0049-09-01 00:00:00", "0049-09-11 00:00:00"]
    path = time_file(tmp_path / "u.nc", [0.0, 1.0], "days since 2500-01-01")
    t, _ = read_us(path)
    assert [str(x) for x in t["time"].to_pylist()] == ["2500-01-01 00:00:00", "2500-01-02 00:00:00"]


@pytest.mark.parametrize("units,first", [
    ("hours since 2000-01-01 06:00 +06:00", "2000-01-01 00:00:00"),
    ("hours since 2000-01-01 06:00:00 -3:30", "2000-01-01 09:30:00"),  # cftime ignores this offset
    ("hours since 2000-01-01T06:00:00Z", "2000-01-01 06:00:00"),
    ("hours since 2000-1-1 6:00 UTC", "2000-01-01 06:00:00"),
    ("days since 1958-1-1", "1958-01-01 00:00:00"),
])
def test_utc_offsets_and_unpadded_dates(tmp_path, units, first):
    t, _ = read_us(time_file(tmp_path / "t.nc", [0.0], units))
    assert str(t["time"][0].as_py()) == first


@settings(max_examples=60, deadline=None)
@given(calendar=st.sampled_from(CALENDARS), year=st.integers(1, 3000), month=st.integers(1, 12),
       day=st.integers(1, 28), hour=st.integers(0, 23), unit=st.sampled_from(["days", "hours", "minutes", "seconds"]),
       vals=st.lists(st.integers(-10**6, 10**6), min_size=1, max_size=5))
def test_decoding_equals_cftime_hypothesis(calendar, year, month, day, hour, unit, vals):
    units = f"{unit} since {year}-{month}-{day} {hour}:00"
    ct = parse_cf_time(units, calendar)
    got, _ = ct.decode(np.array(vals, dtype=np.float64))
    assert got.tolist() == cftime_us(np.array(vals, dtype=np.float64), units, calendar).tolist()


@pytest.mark.parametrize("units,calendar,msg", [
    ("months since 2000-01-01", "standard", "cftime refuses: 'months since' units only allowed for '360_day'"),
    ("days since 2000-01-01", "mayan", "calendar 'mayan'"),
    ("days since yesterday", None, "cftime refuses: Unable to parse date string 'yesterday'"),
    ("fortnights since 2000-01-01", None, "cftime refuses: In general, units must be one of"),
])
def test_bad_time_units_are_input_errors(units, calendar, msg):
    with pytest.raises(InputError, match=msg):
        parse_cf_time(units, calendar, source="f.nc", name="time")


def test_360_day_months(tmp_path):
    t, us = read_us(time_file(tmp_path / "t.nc", [0.0, 1.0, 12.0], "months since 2000-01-01", "360_day"))
    day = 86400 * 10**6
    assert (us - us[0]).tolist() == [0, 30 * day, 360 * day]


# ---- cgm: one time base, calendars, durations ---------------------------------------------


def grid_file(path, times, units, calendar=None, values=None):
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("time", len(times))
        ds.createDimension("lat", 3)
        tv = ds.createVariable("time", "f8", ("time",))
        tv.units = units
        if calendar:
            tv.calendar = calendar
        tv[:] = times
        ds.createVariable("lat", "f4", ("lat",))[:] = [10.0, 20.0, 30.0]
        v = ds.createVariable("p", "f4", ("time", "lat"))
        v[:] = values if values is not None else np.arange(len(times) * 3, dtype=np.float32).reshape(-1, 3)
    return str(path)


def test_cgm_compares_instants_not_raw_numbers(tmp_path, capsys):
    # A at 00, 06, 12 h; B's numbers 0, 6 count from 06:00: the same instants are 06 and 12.
    a = grid_file(tmp_path / "a.nc", [0.0, 6.0, 12.0], "hours since 2000-01-01 00:00")
    b = grid_file(tmp_path / "b.nc", [0.0, 6.0], "hours since 2000-01-01 06:00")
    out = tmp_path / "o.parquet"
    rc, so, se = run_cli(capsys, "cgm", a, b, "--local", "-o", out, "--json")
    assert rc == 0, se
    t = pq.read_table(out)
    assert json.loads(so)["matched"] == 6
    assert sorted({str(x) for x in t["time"].to_pylist()}) == ["2000-01-01 06:00:00", "2000-01-01 12:00:00"]
    assert t.schema.field("time").type == pa.timestamp("us")


def test_cgm_durations_and_plain_numbers_on_time_keys(tmp_path, capsys):
    a = grid_file(tmp_path / "a.nc", [0.0, 6.0], "hours since 2000-01-01")
    b = grid_file(tmp_path / "b.nc", [0.5, 6.5], "hours since 2000-01-01")
    for eps, matched in (("time=1h", 6), ("time=20min", 0), ("time=1", 6), ("time=0.25", 0), ("0.6", 6)):
        rc, so, se = run_cli(capsys, "cgm", a, b, "--local", "-o", tmp_path / "o.parquet", "--overwrite",
                             "--eps", eps, "--json")
        assert rc == 0, (eps, se)
        assert json.loads(so)["matched"] == matched, eps
    for eps, msg in (("time=1M", "minutes or months"), ("time=1mo", "no fixed length"),
                     ("lat=1h", "not a time"), ("time=1h,time=2h", "twice")):
        rc, so, se = run_cli(capsys, "cgm", a, b, "--local", "-o", tmp_path / "x.parquet", "--eps", eps)
        assert rc == 2 and msg in se and len(se.strip().splitlines()) == 1, (eps, se)


def test_cgm_refuses_two_calendars_naming_both(tmp_path, capsys):
    a = grid_file(tmp_path / "a.nc", [0.0, 1.0], "days since 2000-01-01", "noleap")
    b = grid_file(tmp_path / "b.nc", [0.0, 1.0], "days since 2000-01-01", "360_day")
    rc, so, se = run_cli(capsys, "cgm", a, b, "--local", "-o", tmp_path / "o.parquet")
    assert rc == 2 and "noleap" in se and "360_day" in se and "a.nc" in se and "b.nc" in se
    assert not (tmp_path / "o.parquet").exists()
    # Same non-standard calendar: merged, and the output keeps the calendar in the field metadata.
    c = grid_file(tmp_path / "c.nc", [1.0], "days since 2000-01-01", "noleap")
    rc, so, se = run_cli(capsys, "cgm", a, c, "--local", "-o", tmp_path / "o.parquet", "--json")
    assert rc == 0 and json.loads(so)["matched"] == 3
    f = pq.read_schema(tmp_path / "o.parquet").field("time")
    assert f.type == pa.int64() and f.metadata[b"calendar"] == b"noleap" and f.metadata[b"units"] == EPOCH.encode()


def test_cgm_360_day_months_as_eps(tmp_path, capsys):
    a = grid_file(tmp_path / "a.nc", [0.0, 60.0], "days since 2000-01-01", "360_day")
    b = grid_file(tmp_path / "b.nc", [25.0, 85.0], "days since 2000-01-01", "360_day")
    rc, so, se = run_cli(capsys, "cgm", a, b, "--local", "-o", tmp_path / "o.parquet", "--eps", "time=1mo", "--json")
    assert rc == 0, se
    assert json.loads(so)["matched"] == 6


# ---- wjoin ------------------------------------------------------------------------------------


def test_wjoin_decodes_old_dates_and_calendars(tmp_path, capsys):
    s1 = time_file(tmp_path / "s1.nc", [0.0, 1.0, 2.0], "days since 0049-09-01", "noleap")
    s2 = time_file(tmp_path / "s2.nc", [24.0, 36.0], "hours since 0049-09-01", "noleap")
    out = tmp_path / "o.parquet"
    rc, so, se = run_cli(capsys, "wjoin", s1, s2, "--time", "time", "--window", "1h", "--local", "-o", out)
    assert rc == 0, se
    t = pq.read_table(out)
    assert t.num_rows == 1  # day 1 == hour 24; hour 36 is 12 h from day 1 and day 2
    # A plain-number window on a decoded CF time is refused (its unit would be a guess).
    rc, so, se = run_cli(capsys, "wjoin", s1, s2, "--time", "time", "--window", "1", "--local", "-o",
                         tmp_path / "x.parquet")
    assert rc == 2 and "unit" in se
    s3 = time_file(tmp_path / "s3.nc", [0.0], "days since 0049-09-01", "360_day")
    rc, so, se = run_cli(capsys, "wjoin", s1, s3, "--time", "time", "--window", "1h", "--local", "-o",
                         tmp_path / "y.parquet")
    assert rc == 2 and "noleap" in se and "360_day" in se


def test_wjoin_old_standard_dates_are_not_wrapped(tmp_path, capsys):
    s1 = time_file(tmp_path / "s1.nc", [0.0, 1.0], "days since 0049-09-01", "proleptic_gregorian")
    s2 = time_file(tmp_path / "s2.nc", [0.0, 1.0], "days since 0049-09-01", "proleptic_gregorian")
    out = tmp_path / "o.parquet"
    rc, so, se = run_cli(capsys, "wjoin", s1, s2, "--time", "time", "--window", "1h", "--local", "-o", out)
    assert rc == 0, se
    t = pq.read_table(out)
    years = {x.year for c in t.column_names if c.startswith("time") or c.endswith("time")
             for x in t[c].to_pylist()}
    assert years == {49}


def test_wjoin_equality_on_old_times_hashes_without_overflow(tmp_path, capsys):
    s1 = time_file(tmp_path / "s1.nc", [0.0, 1.0, 2.0], "days since 0049-09-01", "proleptic_gregorian")
    s2 = time_file(tmp_path / "s2.nc", [24.0, 48.0, 60.0], "hours since 0049-09-01", "proleptic_gregorian")
    out = tmp_path / "o.parquet"
    rc, so, se = run_cli(capsys, "wjoin", s1, s2, "--time", "time", "--window", "1d", "--on", "time",
                         "--method", "hash", "--local", "-o", out)
    assert rc == 0, se
    t = pq.read_table(out)
    assert sorted(str(x) for x in t["S1_time"].to_pylist()) == ["0049-09-02 00:00:00", "0049-09-03 00:00:00"]


def test_time_too_far_from_1970_is_one_line(tmp_path):
    """A float CF time that overflows microseconds is exit 2 with one line on stderr (numpy's
    overflow RuntimeWarning used to print two more lines first). A separate process: pytest
    would catch the warning itself."""
    import subprocess
    import sys

    time_file(tmp_path / "big.nc", [0.0, 1e300], "days since 2000-01-01")
    r = subprocess.run([sys.executable, "-m", "smerge", "cgm", str(tmp_path / "big.nc"), str(tmp_path / "big.nc"),
                        "--local", "-o", str(tmp_path / "o.parquet")], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"smerge: error: {tmp_path / 'big.nc'}: time variable 'time' ('days since 2000-01-01') holds values too far "
        "from 1970 to count in microseconds (beyond +-292,000 years); check its values and units"]
