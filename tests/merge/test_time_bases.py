"""Every time representation on one time base (microseconds since 1970-01-01 UTC) before keys are
compared: CF numbers decoded by the netCDF reader, timestamps of any unit with or without a zone
(pandas ns, polars and DuckDB us, CSV ISO strings), dates, Arrow IPC. Each pair of
representations merged by ``smerge cgm --local`` (and ``rtm``) gives exactly the pairs pandas
finds on UTC instants; what cannot be compared (two calendars, time of day or duration against
an instant) is exit 2."""

from __future__ import annotations

import datetime as dt

import pandas as pd
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from smerge.cli.main import main
from smerge.merge.keys import column_f64, key_eps
from time_files import (EPS, EXPECTED, GRIDS, OBS, READ_TYPE, TABULAR, grid_records, oracle, write_csv,
                        write_files, write_grid_nc)


def in_parquet(t: pa.DataType) -> pa.DataType:
    """The type a Parquet output gives back: Parquet has no seconds unit, so ``timestamp[s]``
    is stored as milliseconds (the same instants)."""
    return pa.timestamp("ms", t.tz) if t.unit == "s" else t


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_files(tmp_path_factory.mktemp("times"))


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
    from smerge.index import BIndex
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
    write_csv(path, obs, lambda t: t.strftime("%Y-%m-%d"))
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
    write_grid_nc(nc, grid_records(), "hours since 2000-01-01 06:00", calendar="noleap")
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


@pytest.mark.parametrize("values", [[2**53, 2**53 + 1, 2**53 + 2], [-(2**53) - 2, 0], [2**53 + 4, None]])
def test_integer_keys_beyond_2_53_are_refused(values, tmp_path):
    """float64 cannot tell 2^53 + 1 from 2^53: such int64 keys would pair different records."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from smerge.cli.main import main

    p = tmp_path / "a.parquet"
    pq.write_table(pa.table({"k": pa.array(values, pa.int64()), "v": list(range(len(values)))}), p)
    rc = main(["cgm", str(p), str(p), "--keys", "k", "--local", "-o", str(tmp_path / "o.parquet"),
               "--nan-keys", "unmatched"])
    assert rc == 2 and not (tmp_path / "o.parquet").exists()


def test_integer_keys_within_2_53_are_exact(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from smerge.merge.keys import key_matrix

    t = pa.table({"k": pa.array([2**53, -(2**53), 2**53 - 1], pa.int64())})
    assert key_matrix(t, ["k"])[:, 0].tolist() == [2.0**53, -(2.0**53), 2.0**53 - 1]
    t = pa.table({"k": pa.array([2**53 + 1], pa.uint64())})
    with pytest.raises(Exception, match="2\\^53"):
        key_matrix(t, ["k"])
