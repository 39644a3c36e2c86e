"""The exit-code list of issue 9 (items 5-7): hostile input on the command line is exit 2 with
exactly one stderr line saying what is wrong (and the accepted range), no traceback, and no
output file left behind. Each row was exit 1, exit 0 with a wrong result, or a misleading
message before the fix."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli_run import run_cli  # noqa: E402 (tests/helpers: the shared CLI test helper)


def assert_usage_error(rc, err, words, tmp_path, before):
    lines = err.strip().splitlines()
    assert rc == 2, err
    assert len(lines) == 1, err
    assert lines[0].startswith("smerge: error: "), err
    assert "Traceback" not in err and "internal error" not in err, err
    for w in ([words] if isinstance(words, str) else words):
        assert w in lines[0], lines[0]
    assert sorted(os.listdir(tmp_path)) == before, "something was written"


@pytest.fixture
def data(tmp_path):
    """Two small time-ordered streams with a float key ``k`` and a timestamp ``time``."""
    n = 50
    t = pa.array(np.arange(n, dtype=np.int64) * 3_600_000_000, pa.timestamp("us"))
    pq.write_table(pa.table({"time": t, "k": np.arange(n, dtype=np.float64), "x": np.arange(n)}),
                   tmp_path / "a.parquet")
    pq.write_table(pa.table({"time": t, "k": np.arange(n, dtype=np.float64) + 0.1, "y": np.arange(n) * 2.0}),
                   tmp_path / "b.parquet")
    return tmp_path


# ---- gen ------------------------------------------------------------------------------------

GEN_CASES = [
    # (OUT, options, words in the one stderr line)
    ("g.parquet", ["--vars", "lat,p"], "'lat' is a coordinate column"),
    ("g.parquet", ["--vars", "p,p"], "names 'p' twice"),
    ("g.nc", ["--vars", "time"], "'time' is a coordinate column"),
    ("g.nc", ["--vars", "lat,p"], "'lat' is a coordinate column"),
    ("g.csv", ["--vars", "LON"], "clashes with the coordinate column 'lon'"),
    ("g.nc", ["--vars", "a/b"], "group path"),
    ("g.nc", ["--vars", "-x"], "not a valid netCDF variable name"),
    ("g.parquet", ["--vars", ","], "--vars is an empty list"),
    ("g.parquet", ["--seed", "-1"], "--seed is -1; give an integer >= 0"),
    ("g.parquet", ["--jitter", "inf"], "--jitter is inf; give a finite number of degrees from 0 to 360"),
    ("g.parquet", ["--jitter", "nan"], "--jitter is nan"),
    ("g.parquet", ["--jitter", "1e308"], "from 0 to 360"),
    ("g.parquet", ["--randomize", "nan"], "give a percentage from 0 to 100"),
    ("g.parquet", ["--randomize", "101"], "give a percentage from 0 to 100"),
    ("g.parquet", ["--records", "0"], "give an integer from 1 to 10^12"),
    ("g.parquet", ["--records", "99999999999999999999"], "give an integer from 1 to 10^12"),
    ("g.parquet", ["--records", "1000000000000", "--grid", "1,1"], "past the last date a timestamp holds"),
    ("g.parquet", ["--grid", "99999999999,99999999999"], "from 1 to 10^6 each"),
    ("g.parquet", ["--grid", "0,5"], "NLAT is 0"),
    ("g.parquet", ["--grid", "5"], "is not NLAT,NLON"),
    ("g.parquet", ["--displacement", "99999999999999999999"], "from 0 to 10^12"),
    ("g.parquet", ["--displacement", "-1"], "--displacement is -1"),
    ("", [], "OUT is empty"),
]


@pytest.mark.parametrize("out, opts, words", GEN_CASES, ids=[" ".join([o] + p) for o, p, _ in GEN_CASES])
def test_gen_bad_options(tmp_path, capsys, monkeypatch, out, opts, words):
    monkeypatch.chdir(tmp_path)
    if "--records" not in opts:
        opts = ["--records", "10"] + opts
    rc, _, err = run_cli(capsys, "gen", out, *opts)
    assert_usage_error(rc, err, words, tmp_path, [])


# ---- cgm, rtm, wjoin: numeric options, empty strings, messages ------------------------------

MERGE = ["{a}", "{b}", "--keys", "k", "--local"]
WJOIN = ["wjoin", "{a}", "{b}", "--time", "time", "--local"]

CASES = [
    # (command line, words in the one stderr line)
    (["cgm", *MERGE, "--window", "99999999999999"], "the window size N must be an integer from 1 to 10^9"),
    (["cgm", *MERGE, "--window", "99999999999999999999999"], "from 1 to 10^9"),
    (["rtm", *MERGE, "--window", "99999999999999"], "from 1 to 10^9"),
    (["cgm", *MERGE, "--delta", "0.1", "--delta-windows", "99999999999999999999"],
     "--delta-windows is 99999999999999999999; use an integer from 1 to 10^9"),
    (["cgm", *MERGE, "--partitions", "0"], "--partitions is 0; give an integer from 1 to 2^31-1"),
    (["cgm", *MERGE, "--partitions", "99999999999"], "from 1 to 2^31-1"),
    (["rtm", *MERGE, "--partitions", "-3"], "--partitions is -3"),
    (["wjoin", "{a}", "{b}", "--time", "time", "--window", "1h", "--local", "--partitions", "0"], "--partitions is 0"),
    (["cgm", *MERGE, "-o", ""], "-o is empty"),
    (["cgm", *MERGE, "--stats", ""], "--stats is empty"),
    (["cgm", *MERGE, "--unmatched", " "], "--unmatched is empty"),
    (["cgm", *MERGE, "--format", ""], "--format is empty"),
    (["cgm", *MERGE, "--master", ""], "--master is empty"),
    (["cgm", "", "{b}", "--keys", "k", "--local"], "input 1 is empty"),
    (["rtm", "{a}", "", "--keys", "k", "--local"], "input 2 is empty"),
    (["rtm", *MERGE, "--token-file", ""], "--token-file is empty"),
    (["rtm", "{a}", "--keys", "k", "--local"], "rtm needs B: give a second input to index for this run, or --server"),
    ([*WJOIN, "--window", "1e400"], "--window '1e400' is too large to hold"),
    ([*WJOIN, "--window", "1e300s"], "is too large to hold"),
    ([*WJOIN, "--window", "1h", "--pair-window", "1,2=1e300d"], "--pair-window '1,2=1e300d' is too large"),
    ([*WJOIN, "--window", "1h", "--batch-rows", "99999999999"], "--batch-rows is 99999999999; give an integer from 1"),
    ([*WJOIN, "--window", "1h", "--batch-rows", "0"], "--batch-rows is 0"),
    ([*WJOIN, "--window", "1h", "--where", ""], "--where is empty"),
    ([*WJOIN, "--window", ""], "--window is empty"),
    (["wjoin", "{a}", "", "--time", "time", "--window", "1h", "--local"], "input 2 is empty"),
    # --where parse errors give the column in the user's text (was "at column ?")
    ([*WJOIN, "--window", "1h", "--where", "S1.k >"], "syntax error at the end (column 7)"),
    ([*WJOIN, "--window", "1h", "--where", "S1.k = = 2"], "syntax error at column 8"),
    ([*WJOIN, "--window", "1h", "--where", "S1.k >= S2.k AND"], "at the end (column 17)"),
    ([*WJOIN, "--window", "1h", "--where", "(S1.k > 1"], "at column 1: '(' was never closed"),
    ([*WJOIN, "--window", "1h", "--where", "S1.x > 99999999999999999999999"], "integer 99999999999999999999999 is out "
                                                                                "of range"),
]


@pytest.mark.parametrize("argv, words", CASES, ids=[" ".join(a[:1] + a[5:]) for a, _ in CASES])
def test_bad_options(data, capsys, monkeypatch, argv, words):
    monkeypatch.chdir(data)
    before = sorted(os.listdir(data))
    argv = [x.format(a=data / "a.parquet", b=data / "b.parquet") for x in argv]
    if "-o" not in argv:
        argv += ["-o", str(data / "out.parquet")]
    rc, _, err = run_cli(capsys, *argv)
    assert_usage_error(rc, err, words, data, before)


def test_wjoin_time_mix_names_the_streams(data, capsys):
    """Streams whose time columns cannot be compared: the message names each stream's file."""
    pq.write_table(pa.table({"time": np.arange(5, dtype=np.int64), "v": np.arange(5.0)}), data / "ints.parquet")
    before = sorted(os.listdir(data))
    rc, _, err = run_cli(capsys, "wjoin", data / "a.parquet", data / "ints.parquet", "--time", "time",
                         "--window", "1h", "--local", "-o", data / "out.parquet")
    assert_usage_error(rc, err, ["time columns cannot be compared", f"S1 ({data / 'a.parquet'}) has 'time' as",
                                 f"S2 ({data / 'ints.parquet'}) has 'time' as integer"], data, before)


# ---- inputs: corrupt, misnamed, empty, header-only ------------------------------------------

def _parquet_head(data, n):
    return (data / "a.parquet").read_bytes()[:n]


INPUT_CASES = [
    # (file name, its bytes (or a function of the data folder), words)
    ("x.parquet", b"hello world\n", "x.parquet: not readable as Parquet: it does not start with the Parquet marker"),
    ("x.parquet", lambda d: _parquet_head(d, 300), ["not readable as Parquet (", "the file is truncated or corrupt"]),
    ("x.parquet", b"", "x.parquet: is empty (0 bytes), not a Parquet file"),
    ("x.arrow", b"garbage\n", "x.arrow: not readable as Arrow IPC: it does not start with the Arrow file or stream"),
    ("x.arrow", b"", "is empty (0 bytes), not an Arrow IPC file"),
    ("x.csv", b"\x00\x01\x02binary", "x.csv: not readable as CSV: it holds binary data"),
    ("x.csv", b"\x1f\x8b\x08\x00gzipped", "not readable as CSV: it holds binary data"),
    ("x.csv", b"", "is empty (0 bytes), not a CSV file"),
    ("x.nc", b"garbage\n", "x.nc: not readable as netCDF: its first bytes are not a netCDF header"),
    ("x.bin", b"\x00\x13garbage", "x.bin: not a supported format: its first bytes match none of"),
    ("x.dat", b"k\n1\n2\n", "if it is a one-column CSV file, name it .csv"),
    # a header-only CSV has no types: a clear message (an empty Parquet file keeps its types)
    ("x.csv", b"time,k,x\n", "x.csv: a header (time, k, x) and no data rows, so its column types cannot be known"),
    ("x.csv", b"time,k,x\n\n", "and no data rows"),
    ("x.csv", b"time,k,x\n2000-01-01,,1\n", "key column 'k' has no values in the first rows"),
]


# (command, case): wjoin has no key columns, so the key-column cases are cgm's only.
BAD_INPUT_RUNS = [(cmd, case) for cmd in ("cgm", "wjoin") for case in INPUT_CASES
                  if cmd == "cgm" or "key column 'k'" not in str(case[2])]


@pytest.mark.parametrize("command, name, content, words", [(c, *case) for c, case in BAD_INPUT_RUNS],
                         ids=[f"{c}-{case[0]}-{INPUT_CASES.index(case)}" for c, case in BAD_INPUT_RUNS])
def test_bad_inputs(data, capsys, command, name, content, words):
    path = data / name
    path.write_bytes(content(data) if callable(content) else content)
    before = sorted(os.listdir(data))
    if command == "cgm":
        argv = ["cgm", path, data / "b.parquet", "--keys", "k", "--local"]
    else:
        argv = ["wjoin", path, data / "b.parquet", "--time", "time", "--window", "1h", "--local"]
    rc, _, err = run_cli(capsys, *argv, "-o", data / "out.parquet")
    assert_usage_error(rc, err, words, data, before)


def test_content_decides_before_the_extension(data, capsys):
    """A Parquet file named .arrow or .csv, and an Arrow file named .parquet, are read by content;
    an empty Parquet file (its types known) is zero records, exit 0."""
    t = pq.read_table(data / "a.parquet")
    (data / "pq.arrow").write_bytes((data / "a.parquet").read_bytes())
    (data / "pq.csv").write_bytes((data / "a.parquet").read_bytes())
    with pa.OSFile(str(data / "ar.parquet"), "wb") as f:
        with pa.ipc.new_file(f, t.schema) as w:
            w.write_table(t)
    pq.write_table(t.slice(0, 0), data / "empty.parquet")
    for name, n in (("pq.arrow", 50), ("pq.csv", 50), ("ar.parquet", 50), ("empty.parquet", 0)):
        rc, out, err = run_cli(capsys, "cgm", data / name, data / "b.parquet", "--keys", "k", "--local", "--json",
                               "-o", data / f"out-{name}.parquet")
        assert rc == 0, err
        assert f'"a_records": {n}' in out


# ---- Click's usage errors point at the right command's help ---------------------------------

@pytest.mark.parametrize("argv, words", [
    (["index", "build", "{b}"], "Missing option '-o' / '--output'. (see smerge index build --help)"),
    (["index", "build", "{b}", "--bogus", "-o", "idx"], "(see smerge index build --help)"),
    (["index", "build", "{b}", "-o"], "Option '-o' requires an argument. (see smerge index build --help)"),
    (["cgm", "{a}", "{b}", "--window"], "Option '--window' requires an argument. (see smerge cgm --help)"),
    (["gen", "g.parquet", "--records", "1e999"], "(see smerge gen --help)"),
    (["index", "bogus"], "No such command 'bogus'. (see smerge index --help)"),
])
def test_usage_errors_name_the_full_command(data, capsys, monkeypatch, argv, words):
    monkeypatch.chdir(data)
    before = sorted(os.listdir(data))
    rc, _, err = run_cli(capsys, *[x.format(a=data / "a.parquet", b=data / "b.parquet") for x in argv])
    assert_usage_error(rc, err, words, data, before)


def test_where_infinite_literal(data, capsys):
    before = sorted(os.listdir(data))
    rc, _, err = run_cli(capsys, "wjoin", data / "a.parquet", data / "b.parquet", "--time", "time", "--window", "1h",
                         "--local", "--where", "S1.k > 1e999", "-o", data / "out.parquet")
    assert_usage_error(rc, err, "a number literal overflows a double", data, before)
