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

from smerge.cli.main import main


def run_cli(capsys, *args):
    rc = main([str(a) for a in args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


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
