"""CF times keep their calendar through every command and output format, and `smerge wjoin --vars`.

Oracle: ``cftime.num2date`` of the values written in the input files. Parquet and Arrow keep a
time as a timestamp (standard calendars) or as int64 microseconds since 1970-01-01 in its own
calendar with ``units`` and ``calendar`` in the field metadata; CSV writes the latter as dates
in their calendar under ``<name> [<calendar>]``. Every time read back must equal the oracle's
date exactly (to the microsecond).
"""

from __future__ import annotations

import re
import warnings

import cftime
import netCDF4
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from smerge.cli.main import main
from smerge.datasets import open_input
from smerge.datasets.cf_time import BASE_UNITS
from smerge.datasets.writers import calendar_dates
from smerge.jobs.cgm import CGMJob, prepare as prepare_cgm
from smerge.jobs.wjoin import WJoinJob, prepare as prepare_wjoin

DAY_US = 86_400_000_000
# (calendar, units, A's values, B's values): month ends, the 29th/30th of February, fractions
# of hours and of seconds (whole microseconds, stored as integers: a float such as 100.000001 s
# is decoded to different microseconds by cftime and by smerge's rounding), and dates outside 1678-2262 or before 1582-10-15.
CASES = {
    "standard": ("standard", "hours since 2000-02-27 06:00", [0, 40.5, 48, 72.25], [1, 47.75, 96]),
    "proleptic_gregorian": ("proleptic_gregorian", "hours since 2000-02-27 06:00", [0, 40.5, 48, 72.25],
                            [1, 47.5, 96]),
    "noleap": ("noleap", "days since 2001-02-27", [0, 1, 1.5, 2.03125], [0.25, 1.25, 3]),
    "365_day": ("365_day", "days since 2004-02-27", [0, 1, 1.5, 2.5], [0.25, 1.25, 3]),
    "all_leap": ("all_leap", "days since 2001-02-27 12:00", [0, 1, 1.5, 2.5], [0.25, 2, 3]),
    "366_day": ("366_day", "days since 2001-02-27", [0, 1, 2, 2.5], [0.5, 2, 3]),
    "360_day": ("360_day", "days since 2001-02-28", [0, 1, 2.5, 3], [0.5, 2, 33]),
    "julian": ("julian", "microseconds since 1900-02-28 00:00:00",
               [0, 86_400_000_001, 86_400_500_000, 3 * DAY_US], [100_000_001, 2 * DAY_US, 4 * DAY_US]),
    "standard_pre_gregorian": ("standard", "days since 1582-10-01", [0, 3.5, 4, 4.5], [1, 4.25, 20]),
    "standard_1500": ("standard", "days since 1500-02-27", [0, 1, 2, 2.5], [0.5, 2, 3]),
    "standard_2300": ("standard", "days since 2300-02-27", [0, 1, 2, 2.5], [0.5, 2, 3]),
    "proleptic_1000": ("proleptic_gregorian", "days since 1000-02-27", [0, 1, 2, 2.5], [0.5, 2, 3]),
}
NON_TIMESTAMP = {"noleap", "365_day", "all_leap", "366_day", "360_day", "julian", "standard_pre_gregorian",
                 "standard_1500"}
_DATE = re.compile(r"^(-?\d+)-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?$")


def time_dtype(units: str) -> str:
    return "i8" if units.startswith("microseconds") else "f8"


def point_list(path, units, calendar, values, payload):
    """A CF point list: time(obs) named by x's ``coordinates`` (the key), payload x(obs)."""
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("obs", len(values))
        t = ds.createVariable("time", time_dtype(units), ("obs",))
        t.units, t.calendar = units, calendar
        t[:] = values
        x = ds.createVariable("x", "f8", ("obs",))
        x.coordinates = "time"
        x[:] = payload
    return str(path)


def gridded(path, units, calendar, values, nlat=2):
    """T(time, lat) on the coordinate variables time(time), lat(lat)."""
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("time", len(values))
        ds.createDimension("lat", nlat)
        t = ds.createVariable("time", time_dtype(units), ("time",))
        t.units, t.calendar = units, calendar
        t[:] = values
        ds.createVariable("lat", "f4", ("lat",))[:] = np.arange(nlat, dtype=np.float32)
        ds.createVariable("T", "f4", ("time", "lat"))[:] = np.arange(len(values) * nlat, dtype=np.float32).reshape(
            len(values), nlat)
    return str(path)


def as_tuple(d) -> tuple:
    return (d.year, d.month, d.day, d.hour, d.minute, d.second, d.microsecond)


def oracle(values, units, calendar) -> list[tuple]:
    vals = np.asarray(values, np.int64 if time_dtype(units) == "i8" else np.float64)
    return [as_tuple(d) for d in np.atleast_1d(cftime.num2date(vals, units, calendar))]


def parse_date(text: str) -> tuple:
    m = _DATE.match(text)
    assert m, text
    y, mo, d, h, mi, s, frac = m.groups()
    return (int(y), int(mo), int(d), int(h), int(mi), int(s), int((frac or "0").ljust(6, "0")))


def stored_times(table: pa.Table, name: str, calendar: str) -> list[tuple]:
    """The dates of a time column read back from Parquet/Arrow, through its own metadata."""
    f = table.schema.field(name)
    md = f.metadata or {}
    assert md.get(b"calendar") == calendar.encode(), (name, md)
    if pa.types.is_timestamp(f.type):  # Python datetimes (proleptic Gregorian), years 1..9999
        return [as_tuple(d) for d in table.column(name).to_pylist()]
    assert md.get(b"units") == BASE_UNITS.encode(), md
    us = table.column(name).to_numpy().astype(np.int64)
    return [as_tuple(d) for d in np.atleast_1d(cftime.num2date(us, md[b"units"].decode(), calendar))]


def canonical(calendar: str) -> str:
    return {"365_day": "noleap", "366_day": "all_leap", "gregorian": "standard"}.get(calendar, calendar)


def run(capsys, *args) -> None:
    rc = main([str(a) for a in args] + ["--local"])
    err = capsys.readouterr().err
    assert rc == 0, err


def check_csv(path, cols: dict[str, list[tuple]], calendar: str, non_timestamp: bool) -> None:
    """Every column of ``cols`` read back by pandas as text equals the oracle's dates."""
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    for name, want in cols.items():
        header = f"{name} [{canonical(calendar)}]" if non_timestamp else name
        assert header in df.columns, (header, list(df.columns))
        got = [parse_date(s) for s in df[header]]
        assert got == want, name
        if non_timestamp:  # the text is a date of that calendar: cftime parses it back to the same instant
            back = [cftime.datetime(*t, calendar=canonical(calendar)) for t in got]
            assert [as_tuple(d) for d in back] == want


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("layout", ["points", "grid"])
def test_wjoin_keeps_calendar_in_every_format(tmp_path, capsys, case, layout):
    cal, units, va, vb = CASES[case]
    a = point_list(tmp_path / "a.nc", units, cal, va, np.arange(len(va), dtype=float))
    if layout == "points":
        b = point_list(tmp_path / "b.nc", units, cal, vb, 10.0 + np.arange(len(vb)))
        b_index = np.arange(len(vb))
    else:
        b = gridded(tmp_path / "b.nc", units, cal, vb)
        b_index = np.repeat(np.arange(len(vb)), 2)  # row r of the grid is time step r // nlat
    want_a, want_b = oracle(va, units, cal), oracle(vb, units, cal)
    tables = {}
    for ext in ("parquet", "arrow", "csv"):
        out = tmp_path / f"j.{ext}"
        run(capsys, "wjoin", a, b, "--time", "time", "--window", "40d", "--with-ids", "-o", out)
        if ext == "csv":
            df = pd.read_csv(out, dtype=str, keep_default_na=False)
            rows_a, rows_b = df["S1_row"].astype(int).to_numpy(), df["S2_row"].astype(int).to_numpy()
            check_csv(out, {"S1_time": [want_a[r] for r in rows_a], "S2_time": [want_b[b_index[r]] for r in rows_b]},
                      cal, case in NON_TIMESTAMP)
            continue
        t = pq.read_table(out) if ext == "parquet" else feather.read_table(out)
        tables[ext] = t
        assert t.num_rows == len(va) * len(vb) * (1 if layout == "points" else 2)  # 40 days hold every pair
        assert pa.types.is_timestamp(t.schema.field("S1_time").type) == (case not in NON_TIMESTAMP)
        rows_a, rows_b = t["S1_row"].to_numpy(), t["S2_row"].to_numpy()
        for col, want in (("S1_time", [want_a[r] for r in rows_a]), ("S2_time", [want_b[b_index[r]] for r in rows_b])):
            assert stored_times(t, col, canonical(cal)) == want, (ext, col)
    assert tables["parquet"].equals(tables["arrow"], check_metadata=True)


@pytest.mark.parametrize("case", ["360_day", "julian", "standard_pre_gregorian", "noleap", "standard"])
def test_cgm_csv_writes_calendar_dates(tmp_path, capsys, case):
    """The CSV writer is shared: cgm's pairs read back as the same dates, and its Parquet keeps the metadata."""
    cal, units, va, _ = CASES[case]
    a = point_list(tmp_path / "a.nc", units, cal, va, np.arange(len(va), dtype=float))
    b = point_list(tmp_path / "b.nc", units, cal, va, 10.0 + np.arange(len(va)))
    want = oracle(va, units, cal)
    out = tmp_path / "m.csv"
    run(capsys, "cgm", a, b, "--with-ids", "-o", out)
    df = pd.read_csv(out, dtype=str, keep_default_na=False)
    assert len(df) == len(va)
    check_csv(out, {"time": [want[int(r)] for r in df["a_row"]], "time_b": [want[int(r)] for r in df["b_row"]]},
              cal, case in NON_TIMESTAMP)
    run(capsys, "cgm", a, b, "--with-ids", "-o", tmp_path / "m.parquet")
    t = pq.read_table(tmp_path / "m.parquet")
    assert stored_times(t, "time", canonical(cal)) == [want[r] for r in t["a_row"].to_numpy()]


def test_csv_dates_are_what_pandas_users_see(tmp_path, capsys):
    """A 360_day column is text a reader cannot take for a Gregorian date; other columns keep their names."""
    cal, units, va, vb = CASES["360_day"]
    a = point_list(tmp_path / "a.nc", units, cal, va, [1.0, 2, 3, 4])
    b = point_list(tmp_path / "b.nc", units, cal, vb, [5.0, 6, 7])
    out = tmp_path / "j.csv"
    run(capsys, "wjoin", a, b, "--time", "time", "--window", "12h", "-o", out)
    df = pd.read_csv(out)
    assert list(df.columns) == ["S1_time [360_day]", "S1_x", "S2_time [360_day]", "S2_x"]
    assert df.values.tolist() == [["2001-02-28 00:00:00", 1.0, "2001-02-28 12:00:00", 5.0],
                                  ["2001-02-29 00:00:00", 2.0, "2001-02-28 12:00:00", 5.0],
                                  ["2001-02-30 12:00:00", 3.0, "2001-02-30 00:00:00", 6.0]]


@pytest.mark.parametrize("command", ["cgm", "rtm"])
def test_cgm_rtm_parquet_arrow_keep_calendar(tmp_path, capsys, command):
    cal, units, va, _ = CASES["all_leap"]
    a = point_list(tmp_path / "a.nc", units, cal, va, np.arange(len(va), dtype=float))
    b = point_list(tmp_path / "b.nc", units, cal, va, 10.0 + np.arange(len(va)))
    want = oracle(va, units, cal)
    for ext in ("parquet", "arrow"):
        out = tmp_path / f"m.{ext}"
        run(capsys, command, a, b, "--with-ids", "-o", out)
        t = pq.read_table(out) if ext == "parquet" else feather.read_table(out)
        assert stored_times(t, "time", "all_leap") == [want[r] for r in t["a_row"].to_numpy()]
        assert stored_times(t, "time_b", "all_leap") == [want[r] for r in t["b_row"].to_numpy()]


# ---- --vars ----------------------------------------------------------------------------------

def families(path, first="lat_bnds"):
    """Two families of equal rank: grid-cell bounds lat_bnds(lat, nv) (no variable names them as
    its bounds) and the data T(time, lat). The default choice takes the first created."""
    with netCDF4.Dataset(path, "w") as ds:
        for d, n in (("time", 3), ("lat", 2), ("nv", 2)):
            ds.createDimension(d, n)
        t = ds.createVariable("time", "f8", ("time",))
        t.units, t.calendar = "days since 2001-02-28", "360_day"
        t[:] = [0, 1, 2]
        ds.createVariable("lat", "f4", ("lat",))[:] = [10, 20]
        order = ["lat_bnds", "T"] if first == "lat_bnds" else ["T", "lat_bnds"]
        for name in order:
            if name == "lat_bnds":
                ds.createVariable("lat_bnds", "f4", ("lat", "nv"))[:] = [[5, 15], [15, 25]]
            else:
                ds.createVariable("T", "f4", ("time", "lat"))[:] = np.arange(6, dtype=np.float32).reshape(3, 2)
                ds.createVariable("q", "f4", ("time", "lat"))[:] = -np.arange(6, dtype=np.float32).reshape(3, 2)
    return str(path)


def run_rc(capsys, *args):
    rc = main([str(a) for a in args] + ["--local"])
    cap = capsys.readouterr()
    return rc, cap.err


def test_vars_choose_the_family_with_time(tmp_path, capsys):
    a, b = families(tmp_path / "a.nc"), families(tmp_path / "b.nc", first="T")
    out = tmp_path / "j.parquet"
    rc, err = run_rc(capsys, "wjoin", a, b, "--time", "time", "--window", "0d", "-o", out)
    assert rc == 2 and "S1: no time column 'time'" in err and "--vars 1=" in err, err
    assert len(err.strip().splitlines()) == 1 and not out.exists()
    rc, err = run_rc(capsys, "wjoin", a, b, "--time", "time", "--window", "0d", "--vars", "1=T", "-o", out)
    assert rc == 0, err
    t = pq.read_table(out)
    assert t.column_names == ["S1_time", "S1_lat", "S1_T", "S2_time", "S2_lat", "S2_T", "S2_q"]
    assert t.schema.field("S1_time").metadata[b"calendar"] == b"360_day"
    # equal times: 2 x 2 grid cells per time step
    assert t.num_rows == 12 and t["S1_time"].to_pylist() == t["S2_time"].to_pylist()
    assert sorted(zip(t["S1_T"].to_pylist(), t["S2_T"].to_pylist()))[:4] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # one list for every stream; a stream's own list overrides it
    rc, err = run_rc(capsys, "wjoin", a, b, "--time", "time", "--window", "0d", "--vars", "T,q", "--vars", "2=q",
                     "-o", out, "--overwrite")
    assert rc == 0, err
    assert pq.read_table(out).column_names == ["S1_time", "S1_lat", "S1_T", "S1_q", "S2_time", "S2_lat", "S2_q"]


@pytest.mark.parametrize("vars_,msg", [
    (["1=lat_bnds"], "S1: no time column 'time'; it has lat, nv, lat_bnds"),
    (["1=nope"], "a.nc: no variable 'nope'; it has time, lat, lat_bnds, T, q"),
    (["2=T,T"], "'T' named twice"),
    (["1=T", "1=q"], "stream 1's variables twice"),
    (["T", "q"], "given twice"),
    (["3=T"], "stream number 3 is not in 1..2"),
    (["x=T"], "is not I=V1,V2 or V1,V2"),
    (["1=T,,q"], "empty name"),
    (["1=T,lat_bnds"], "choose variables on the same dimensions"),
])
def test_vars_errors_are_exit_2(tmp_path, capsys, vars_, msg):
    a, b = families(tmp_path / "a.nc"), families(tmp_path / "b.nc", first="T")
    out = tmp_path / "j.parquet"
    args = [x for v in vars_ for x in ("--vars", v)]
    rc, err = run_rc(capsys, "wjoin", a, b, "--time", "time", "--window", "1d", *args, "-o", out)
    assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_vars_on_tables_keep_time_and_on_columns(tmp_path, capsys):
    a, b = tmp_path / "a.parquet", tmp_path / "b.csv"
    pq.write_table(pa.table({"k": [1, 2, 1], "t": [0, 1, 2], "v": [1.0, 2, 3], "w": [4, 5, 6]}), a)
    b.write_text("t,k,v,w\n0,1,10,40\n2,1,30,60\n")
    out = tmp_path / "j.parquet"
    rc, err = run_rc(capsys, "wjoin", a, b, "--time", "t", "--window", "1", "--on", "k", "--vars", "1=w",
                     "--vars", "2=t,v", "-o", out)
    assert rc == 0, err
    t = pq.read_table(out)
    assert t.column_names == ["S1_t", "S1_k", "S1_w", "S2_t", "S2_k", "S2_v"]
    assert t.to_pylist() == [{"S1_t": 0, "S1_k": 1, "S1_w": 4, "S2_t": 0, "S2_k": 1, "S2_v": 10.0},
                             {"S1_t": 2, "S1_k": 1, "S1_w": 6, "S2_t": 2, "S2_k": 1, "S2_v": 30.0}]
    rc, err = run_rc(capsys, "wjoin", a, b, "--time", "t", "--window", "1", "--vars", "2=nope", "-o", out,
                     "--overwrite")
    assert rc == 2 and "b.csv: no column 'nope'; its columns are t, k, v, w" in err, err
    rc, err = run_rc(capsys, "wjoin", a, b, "--time", "s", "--window", "1", "--vars", "v", "-o", out,
                     "--overwrite")
    assert rc == 2 and "a.parquet: no column 's'" in err and "it has k, t, v, w" in err, err


@pytest.mark.parametrize("make", ["families_T_first", "grid", "points"])
def test_default_variables_are_cgms(tmp_path, make):
    """wjoin and cgm open a netCDF input through the same reader: the same default variables and keys."""
    p = tmp_path / "a.nc"
    if make == "families_T_first":
        path = families(p, first="T")
    elif make == "grid":
        path = gridded(p, "days since 2001-01-01", "noleap", [0, 1, 2])
    else:
        path = point_list(p, "days since 2001-01-01", "julian", [0, 1, 2], [1.0, 2, 3])
    w = prepare_wjoin(WJoinJob(inputs=(path, path), time=("time",), window="1d", output=str(tmp_path / "o.parquet")))
    c = prepare_cgm(CGMJob(a=path, b=path, output=str(tmp_path / "o.parquet")))
    assert w.sources[0].schema.equals(c.src_a.schema, check_metadata=True)
    assert w.sources[0].schema.equals(open_input(path).schema, check_metadata=True)


@pytest.mark.parametrize("calendar", ["standard", "proleptic_gregorian", "noleap", "all_leap", "360_day", "julian"])
def test_calendar_dates_equal_cftime_text(calendar):
    """The CSV text of a time is cftime's, also for years before 1 and fractions of a second."""
    rng = np.random.default_rng(7)
    us = np.concatenate([[0, 1, -1, 86_400_000_000, -86_400_000_001], rng.integers(-10**17, 10**17, 5000)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", cftime.CFWarning)  # years before 1
        want = [str(d) for d in cftime.num2date(us, BASE_UNITS, calendar=calendar)]
    assert calendar_dates(pa.array(us), calendar).to_pylist() == want
    assert calendar_dates(pa.array([5, None], pa.int64()), calendar).to_pylist() == ["1970-01-01 00:00:00.000005",
                                                                                      None]
