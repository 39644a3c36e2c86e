"""Every time representation on one time base (microseconds since 1970-01-01 UTC) before keys are
compared: CF numbers decoded by the netCDF reader, timestamps of any unit with or without a zone
(pandas ns, polars and DuckDB us, CSV ISO strings), dates, Arrow IPC. Each pair of
representations merged by ``smerge cgm --local`` (and ``rtm``) gives exactly the pairs pandas
finds on UTC instants; what cannot be compared (two calendars, time of day or duration against
an instant) is exit 2."""

from __future__ import annotations

import datetime as dt

import duckdb
import netCDF4
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from smerge.cli.main import main
from smerge.merge.keys import column_f64, key_eps

GRID_T = pd.to_datetime(["2000-01-01 06:00", "2000-01-01 12:00", "2000-01-01 18:00", "2000-01-02 00:00"])
LATS, LONS = [10.0, 20.0], [100.0, 110.0]
# Station observations (UTC): within 30 min of a cell, exactly 30 min (kept: |d| <= eps), 30 min
# and 1 s (dropped), and 1 h off (dropped).
OBS = pd.DataFrame({
    "station": ["S5", "S1", "S2", "S3", "S4"],
    "time": pd.to_datetime(["2000-01-01 05:00:00", "2000-01-01 06:10:00", "2000-01-01 12:29:59",
                            "2000-01-01 18:30:01", "2000-01-01 23:30:00"]),
    "lat": [10.0, 10.1, 19.9, 10.0, 20.0],
    "lon": [100.0, 100.2, 110.0, 110.0, 100.0],
    "obs": [5.0, 1.0, 2.0, 3.0, 4.0],
})
EPS = "time=30min,lat=0.5,lon=0.5"


def grid_records() -> pd.DataFrame:
    t, la, lo = np.meshgrid(np.arange(4), np.arange(2), np.arange(2), indexing="ij")
    return pd.DataFrame({"time": GRID_T[t.ravel()], "lat": np.array(LATS)[la.ravel()],
                         "lon": np.array(LONS)[lo.ravel()], "temp": np.arange(16, dtype=np.float32)})


def oracle(a: pd.DataFrame, b: pd.DataFrame, eps_t=pd.Timedelta("30min")) -> set[tuple[int, int]]:
    """(a_row, b_row) of every A and B record within eps on each key, on UTC instants (pandas)."""
    x = a[["time", "lat", "lon"]].reset_index(names="a_row").merge(
        b[["time", "lat", "lon"]].reset_index(names="b_row"), how="cross")
    ok = ((x.time_x - x.time_y).abs() <= eps_t) & ((x.lat_x - x.lat_y).abs() <= 0.5) & \
        ((x.lon_x - x.lon_y).abs() <= 0.5)
    return set(zip(x.a_row[ok].tolist(), x.b_row[ok].tolist()))


# ---- writers: the same records (times: naive UTC instants) in one representation ----------

def _nc(path, df, units, calendar="standard"):
    with netCDF4.Dataset(path, "w") as ds:
        for d, n in (("time", 4), ("lat", 2), ("lon", 2)):
            ds.createDimension(d, n)
        t = ds.createVariable("time", "f8", ("time",))
        t.units, t.calendar = units, calendar
        t[:] = [0, 6, 12, 18]
        ds.createVariable("lat", "f4", ("lat",))[:] = LATS
        ds.createVariable("lon", "f4", ("lon",))[:] = LONS
        ds.createVariable("temp", "f4", ("time", "lat", "lon"))[:] = df.temp.to_numpy().reshape(4, 2, 2)


def _csv(path, df, fmt):
    out = df.copy()
    out["time"] = [fmt(t) for t in df.time]
    out.to_csv(path, index=False)


def _duckdb(path, df, tz: bool):
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.register("src", df)
    t = "CAST(time AS TIMESTAMP) AT TIME ZONE 'UTC'" if tz else "CAST(time AS TIMESTAMP)"
    rest = ", ".join(f'"{c}"' for c in df.columns if c != "time")
    con.execute(f"COPY (SELECT {t} AS time, {rest} FROM src) TO '{path}' (FORMAT parquet)")
    con.close()


def _polars(path, df):
    import polars as pl

    pl.from_pandas(df).with_columns(pl.col("time").cast(pl.Datetime("us"))).write_parquet(path)


def _ipc(path, df):
    t = pa.Table.from_pandas(df, preserve_index=False)
    col = pa.array(df.time.to_numpy().astype("datetime64[ms]").astype(np.int64), pa.timestamp("ms", "+05:30"))
    t = t.set_column(t.schema.get_field_index("time"), "time", col)
    with pa.ipc.new_file(path, t.schema) as w:
        w.write_table(t)


TABULAR = {
    "pandas-ns": (".parquet", lambda p, d: d.to_parquet(p)),
    "pandas-utc": (".parquet", lambda p, d: d.assign(time=d.time.dt.tz_localize("UTC")).to_parquet(p)),
    "pandas-paris": (".parquet", lambda p, d: d.assign(
        time=d.time.dt.tz_localize("UTC").dt.tz_convert("Europe/Paris")).to_parquet(p)),
    "polars-us": (".parquet", _polars),
    "duckdb": (".parquet", lambda p, d: _duckdb(p, d, tz=False)),
    "duckdb-tz": (".parquet", lambda p, d: _duckdb(p, d, tz=True)),
    "csv-iso": (".csv", lambda p, d: _csv(p, d, lambda t: t.strftime("%Y-%m-%dT%H:%M:%S"))),
    "csv-offset": (".csv", lambda p, d: _csv(p, d, lambda t: (t + pd.Timedelta("2h")).strftime(
        "%Y-%m-%dT%H:%M:%S+02:00"))),
    "arrow-ipc": (".arrow", _ipc),
}
GRIDS = {
    "cf-hours": "hours since 2000-01-01 06:00",
    "cf-offset": "hours since 2000-01-01 08:00 +02:00",
}
# The type each representation's time column has as smerge reads it.
READ_TYPE = {
    "cf-hours": pa.timestamp("us"), "cf-offset": pa.timestamp("us"), "pandas-ns": pa.timestamp("ns"),
    "pandas-utc": pa.timestamp("ns", "UTC"), "pandas-paris": pa.timestamp("ns", "Europe/Paris"),
    "polars-us": pa.timestamp("us"), "duckdb": pa.timestamp("us"), "duckdb-tz": pa.timestamp("us", "UTC"),
    "csv-iso": pa.timestamp("s"), "csv-offset": pa.timestamp("s", "UTC"), "arrow-ipc": pa.timestamp("ms", "+05:30"),
}


def in_parquet(t: pa.DataType) -> pa.DataType:
    """The type a Parquet output gives back: Parquet has no seconds unit, so ``timestamp[s]``
    is stored as milliseconds (the same instants)."""
    return pa.timestamp("ms", t.tz) if t.unit == "s" else t


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """{(representation, "grid" | "obs"): path}: the grid (A) in every representation, the
    observations (B) in every tabular one."""
    d = tmp_path_factory.mktemp("times")
    out = {}
    for name, units in GRIDS.items():
        out[name, "grid"] = str(d / f"grid-{name}.nc")
        _nc(out[name, "grid"], grid_records(), units)
    for name, (ext, write) in TABULAR.items():
        for what, df in (("grid", grid_records()), ("obs", OBS)):
            out[name, what] = str(d / f"{what}-{name}{ext}")
            write(out[name, what], df)
    return out


def run(capsys, *args):
    rc = main([str(a) for a in args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def merged_pairs(capsys, tmp_path, engine, a, b, eps=EPS, extra=()):
    out = tmp_path / f"{engine}.parquet"
    rc, _, err = run(capsys, engine, a, *([b] if b else []), "--keys", "time,lat,lon", "--eps", eps, "--local", "--with-ids",
                     "-o", out, "--overwrite", *extra)
    assert rc == 0, err
    t = pq.read_table(out)
    return set(zip(t.column("a_row").to_pylist(), t.column("b_row").to_pylist())), t


EXPECTED = {(0, 1), (7, 2), (14, 4)}  # S1 at 06:00 (10,100); S2 at 12:00 (20,110); S4 at 00:00 (20,100)


def test_oracle_worked_example():
    """The everyday case by hand: 3 of the 5 stations fall within 30 min and 0.5 degrees of a cell."""
    assert oracle(grid_records(), OBS) == EXPECTED


def test_files_have_the_representations_meant(files):
    from smerge.datasets import open_input

    for (name, what), path in files.items():
        assert open_input(path, keys=["time", "lat", "lon"]).schema.field("time").type == READ_TYPE[name], (name, what)


@pytest.mark.parametrize("b_rep", sorted(TABULAR))
@pytest.mark.parametrize("a_rep", sorted(GRIDS) + sorted(TABULAR))
def test_every_pair_of_representations_gives_the_oracle_pairs(files, capsys, tmp_path, a_rep, b_rep):
    a, b = files[a_rep, "grid"], files[b_rep, "obs"]
    pairs, t = merged_pairs(capsys, tmp_path, "cgm", a, b)
    assert pairs == oracle(grid_records(), OBS) == EXPECTED
    # Each side's key columns keep their own type in the output; B's times are B's instants.
    assert t.schema.field("time").type == in_parquet(READ_TYPE[a_rep])
    assert t.schema.field("time_b").type == in_parquet(READ_TYPE[b_rep])
    got = pd.to_datetime(t.column("time_b").cast(pa.timestamp("us", "UTC")).to_pylist()).tz_localize(None)
    assert list(got) == list(OBS.time.iloc[t.column("b_row").to_pylist()])


@pytest.mark.parametrize("a_rep,b_rep", [("cf-hours", "pandas-ns"), ("cf-offset", "csv-offset"),
                                         ("pandas-paris", "duckdb"), ("arrow-ipc", "polars-us")])
def test_rtm_gives_the_same_pairs(files, capsys, tmp_path, a_rep, b_rep):
    pairs, _ = merged_pairs(capsys, tmp_path, "rtm", files[a_rep, "grid"], files[b_rep, "obs"])
    assert pairs == EXPECTED


def test_rtm_against_a_server_indexing_another_representation(files, capsys, tmp_path):
    """The index server's keys (pandas ns, Europe/Paris) on the same base as A's CF times."""
    from smerge.datasets import open_input
    from smerge.index.rtree_index import BIndex
    from smerge.transport.flight_server import IndexServer

    src = open_input(files["pandas-paris", "obs"], keys=["time", "lat", "lon"])
    token = "time-bases-token-0123456789"
    (tmp_path / "tok").write_text(token)
    server = IndexServer(BIndex.from_source(src), port=0, token=token)
    server.start_background()
    try:
        pairs, t = merged_pairs(capsys, tmp_path, "rtm", files["cf-hours", "grid"], None,
                                extra=("--server", server.url, "--token-file", tmp_path / "tok"))
    finally:
        server.shutdown()
    assert pairs == EXPECTED
    assert t.schema.field("time_b").type == pa.timestamp("ns", "Europe/Paris")


def test_worked_example_summary(files, capsys, tmp_path):
    """Station observations written by pandas ``to_parquet`` merged with a CF netCDF grid."""
    rc, out, err = run(capsys, "cgm", files["cf-hours", "grid"], files["pandas-ns", "obs"], "--keys", "time,lat,lon",
                       "--eps", EPS, "--local", "-o", tmp_path / "o.parquet")
    assert rc == 0, err
    assert "matched   3 pairs (18.75% of A)" in out and "unmatched A 13  B 2" in out
    t = pq.read_table(tmp_path / "o.parquet").to_pandas()
    assert t.station.tolist() == ["S1", "S2", "S4"] and t.temp.tolist() == [0.0, 7.0, 14.0]


# ---- dates ---------------------------------------------------------------------------------

def test_csv_dates_are_midnight_utc(files, capsys, tmp_path):
    """ISO dates in CSV (read as date32) are instants at 00:00 UTC."""
    obs = pd.DataFrame({"time": pd.to_datetime(["2000-01-01", "2000-01-02"]), "lat": [10.0, 10.0],
                        "lon": [100.0, 110.0], "obs": [1.0, 2.0]})
    path = tmp_path / "dates.csv"
    _csv(path, obs, lambda t: t.strftime("%Y-%m-%d"))
    assert pcsv.read_csv(path).schema.field("time").type == pa.date32()
    for a in ("cf-hours", "pandas-paris", "csv-offset"):
        pairs, t = merged_pairs(capsys, tmp_path, "cgm", files[a, "grid"], path)
        assert pairs == oracle(grid_records(), obs) == {(13, 1)}
        assert t.schema.field("time_b").type == pa.date32()


def test_dates_far_from_1970_meet_timestamps_exactly(tmp_path, capsys):
    """date32 of year 1000 and 2500 against timestamp[s] / timestamp[us] of the same instants
    (out of datetime64[ns] range: nothing is cast to ns, nothing overflows)."""
    days = [dt.date(1000, 3, 1), dt.date(1969, 12, 31), dt.date(2500, 6, 1)]
    a = tmp_path / "a.arrow"
    with pa.ipc.new_file(a, pa.schema([("t", pa.date32())])) as w:
        w.write_table(pa.table({"t": pa.array(days, pa.date32())}))
    for unit in ("s", "us"):
        b = tmp_path / f"b-{unit}.parquet"
        inst = [dt.datetime(d.year, d.month, d.day) for d in days]
        pq.write_table(pa.table({"t": pa.array(inst, pa.timestamp(unit, "UTC"))}), b)
        rc, _, err = run(capsys, "cgm", a, b, "--keys", "t", "--local", "--with-ids", "-o", tmp_path / "o.parquet",
                         "--overwrite")
        assert rc == 0, err
        t = pq.read_table(tmp_path / "o.parquet")
        assert t.column("a_row").to_pylist() == t.column("b_row").to_pylist() == [0, 1, 2]
    v = column_f64(pa.array(days, pa.date32()))
    assert v.tolist() == [(d - dt.date(1970, 1, 1)).days * 86400e6 for d in days]


# ---- tolerances ----------------------------------------------------------------------------

@pytest.mark.parametrize("a_rep,plain,expected", [
    ("pandas-ns", "1800000000000", EXPECTED),  # A's unit: nanoseconds
    ("pandas-ns", "1799999999000", EXPECTED - {(14, 4)}),  # S4 is exactly 30 min off (1 us more)
    ("csv-iso", "1800", EXPECTED),  # seconds
    ("csv-iso", "1799", EXPECTED - {(14, 4)}),
    ("cf-hours", "0.5", EXPECTED),  # the CF variable's own unit: hours
    ("polars-us", "1800000000", EXPECTED),  # microseconds
    ("arrow-ipc", "1800000", EXPECTED),  # milliseconds
])
def test_plain_number_eps_is_in_a_s_stored_unit(files, capsys, tmp_path, a_rep, plain, expected):
    pairs, _ = merged_pairs(capsys, tmp_path, "cgm", files[a_rep, "grid"], files["pandas-paris", "obs"],
                            eps=f"time={plain},lat=0.5,lon=0.5")
    assert pairs == expected


def test_key_eps_on_the_base():
    schema = pa.schema([("ns", pa.timestamp("ns", "UTC")), ("s", pa.timestamp("s")), ("d", pa.date32()),
                        ("d64", pa.date64()), ("x", pa.float64())])
    keys = ["ns", "s", "d", "d64", "x"]
    assert key_eps({"ns": "1h", "s": "1h", "d": "1h", "d64": "1h", "x": 2}, keys, schema) == {
        k: 3600e6 for k in keys[:4]} | {"x": 2}
    assert key_eps({"ns": 1000, "s": 1, "d": 1, "d64": 1, "x": 1}, keys, schema) == {
        "ns": 1.0, "s": 1e6, "d": 86400e6, "d64": 1e3, "x": 1}


def test_nanoseconds_become_fractional_microseconds(tmp_path, capsys):
    """Half a microsecond apart: no pair at eps 0, a pair at 1us."""
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    t0 = pd.Timestamp("2000-01-01 06:00")
    pd.DataFrame({"t": [t0 + pd.Timedelta(500, "ns")]}).to_parquet(a)
    pq.write_table(pa.table({"t": pa.array([t0.to_pydatetime() + dt.timedelta(microseconds=1)],
                                           pa.timestamp("us"))}), b)
    for eps, n in (("0", 0), ("t=1us", 1)):
        rc, _, err = run(capsys, "cgm", a, b, "--keys", "t", "--eps", eps, "--local", "-o", tmp_path / "o.parquet",
                         "--overwrite")
        assert rc == 0, err
        assert pq.read_table(tmp_path / "o.parquet").num_rows == n


# ---- what cannot be compared ---------------------------------------------------------------

def test_two_calendars_exit_2_naming_both(files, capsys, tmp_path):
    nc = tmp_path / "noleap.nc"
    _nc(nc, grid_records(), "hours since 2000-01-01 06:00", calendar="noleap")
    rc, _, err = run(capsys, "cgm", nc, files["pandas-ns", "obs"], "--keys", "time,lat,lon", "--eps", EPS,
                     "--local", "-o", tmp_path / "o.parquet")
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "noleap calendar" in err and "standard calendar (timestamp[ns])" in err
    assert "different calendars" in err and not (tmp_path / "o.parquet").exists()


@pytest.mark.parametrize("col,words", [
    (pa.array([dt.time(6, 10)], pa.time32("s")), "a time of day (time32[ms])"),  # Parquet: ms
    (pa.array([dt.timedelta(hours=6)], pa.duration("us")), "a duration (duration[us])"),
    (pa.array([6.0]), "a number (double)"),
])
def test_time_of_day_duration_or_number_against_an_instant_exit_2(files, capsys, tmp_path, col, words):
    b = tmp_path / "b.parquet"
    pq.write_table(pa.table({"time": col, "lat": [10.0], "lon": [100.0]}), b)
    rc, _, err = run(capsys, "cgm", files["cf-hours", "grid"], b, "--keys", "time,lat,lon", "--local",
                     "-o", tmp_path / "o.parquet")
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert words in err and "a time in the standard calendar" in err and "same kind" in err


def test_times_of_day_in_two_units_compare(tmp_path, capsys):
    a, b = tmp_path / "a.parquet", tmp_path / "b.csv"
    pq.write_table(pa.table({"t": pa.array([dt.time(6, 0), dt.time(7, 0)], pa.time64("us"))}), a)
    b.write_text("t\n06:20:00\n08:00:00\n")
    assert pcsv.read_csv(b).schema.field("t").type == pa.time32("s")
    rc, _, err = run(capsys, "cgm", a, b, "--keys", "t", "--eps", "t=30min", "--local", "--with-ids",
                     "-o", tmp_path / "o.parquet")
    assert rc == 0, err
    t = pq.read_table(tmp_path / "o.parquet")
    assert (t.column("a_row").to_pylist(), t.column("b_row").to_pylist()) == ([0], [0])
