"""`smerge wjoin` through the CLI: outputs, stats, exit codes, NCAR storm grids vs the oracle."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from wjoin_oracle import oracle_tuples

from smerge.cli.main import main
from cli_run import run_cli as shared_run_cli  # noqa: E402 (tests/helpers)
from smerge.datasets import open_input


def write(path, **cols):
    pq.write_table(pa.table(cols), path)
    return str(path)


def run_cli(capsys, *args):
    """In-process runs (``--local``); Spark runs are in tests/spark/test_spark_wjoin.py."""
    return shared_run_cli(capsys, *args, extra=["--local"])


@pytest.fixture
def three(tmp_path):
    rng = np.random.default_rng(3)
    paths, tables = [], []
    for i in range(3):
        t = pa.table({"t": np.sort(rng.integers(0, 200, 150)), "k": rng.integers(0, 4, 150),
                      "v": rng.normal(size=150)})
        tables.append(t)
        paths.append(write(tmp_path / f"s{i + 1}.parquet", **{c: t[c] for c in t.column_names}))
    return paths, tables


def test_outputs_prefixed_ids_stats_and_oracle(three, tmp_path, capsys):
    paths, tables = three
    out, st = tmp_path / "j.parquet", tmp_path / "j.json"
    rc, so, se = run_cli(capsys, "wjoin", *paths, "--time", "t", "--window", "4", "--pair-window", "1,3=2",
                         "--where", "S1.k = S2.k and S2.v < S3.v", "--with-ids", "-o", out, "--stats", st)
    assert rc == 0, se
    res = pq.read_table(out)
    assert res.column_names == ["S1_t", "S1_k", "S1_v", "S2_t", "S2_k", "S2_v", "S3_t", "S3_k", "S3_v",
                                "S1_row", "S2_row", "S3_row"]
    got = sorted(zip(*(res[f"S{i}_row"].to_pylist() for i in (1, 2, 3))))
    exp = oracle_tuples(tables, "t", {(0, 1): 4, (0, 2): 2, (1, 2): 4}, "s1.k = s2.k AND s2.v < s3.v")
    assert got == exp and len(exp) > 0
    stats = json.loads(st.read_text())
    assert stats["tuples"] == len(exp)
    assert stats["records_read"] == {"S1": 150, "S2": 150, "S3": 150}
    assert set(stats["peak_buffered"]) == {"S1", "S2", "S3"}
    assert all(0 < v <= 150 for v in stats["peak_buffered"].values())
    assert stats["method"] == "nested-loop"  # S3 is not linked by an equality
    for k in ("fetch_seconds", "join_seconds", "write_seconds", "total_seconds", "params"):
        assert k in stats
    assert stats["params"]["pair_windows"] == [[1, 3, "2"]]
    assert "tuples" in so and f"{len(exp):,}" in so


def test_json_aliases_and_on(three, tmp_path, capsys):
    paths, tables = three
    out = tmp_path / "j.csv"
    rc, so, se = run_cli(capsys, "wjoin", *paths[:2], "--time", "t", "--window", "3", "--on", "k",
                         "--aliases", "north,south", "--where", "north.v > south.v", "-o", out, "--json")
    assert rc == 0, se
    stats = json.loads(so)
    assert stats["method"] == "hash"
    exp = oracle_tuples(tables[:2], "t", {(0, 1): 3}, "s1.k = s2.k AND s1.v > s2.v")
    assert stats["tuples"] == len(exp)
    header = out.read_text().splitlines()[0]
    assert header.replace('"', "") == "north_t,north_k,north_v,south_t,south_k,south_v"


@pytest.mark.parametrize("args,message", [
    (["--where", "S1.nope > 1"], "unknown column S1.nope"),
    (["--where", "S1.v >"], "syntax error"),
    (["--where", "S1.v.__class__ == 1"], "attribute access is not allowed"),
    (["--where", "max(S1.v, S2.v) > 1"], "calls are not allowed except abs"),
    (["--where", "__import__('os').getcwd() == 1"], "calls are not allowed except abs"),
    (["--pair-window", "1,2=none"], "do not connect all streams"),
    (["--pair-window", "1,7=3"], "stream numbers must be"),
    (["--window", "fast"], "not a duration"),
    (["--window", "3h"], "has a unit but the time column is a plain number"),
    (["--on", "zz"], "has no column 'zz'"),
    (["--time", "t,t,t"], "--time names 3 columns for 2 streams"),
    (["--time", "t,x"], "S2: no time column 'x'"),
])
def test_bad_input_exit_2_one_line_no_output(three, tmp_path, capsys, args, message):
    paths, _ = three
    out = tmp_path / "bad.parquet"
    base = ["--time", "t"] if "--time" not in args else []
    win = ["--window", "3"] if "--window" not in args else []
    rc, so, se = run_cli(capsys, "wjoin", *paths[:2], *base, *win, *args, "-o", out)
    assert rc == 2
    assert message in se and len(se.strip().splitlines()) == 1 and "Traceback" not in se
    assert not out.exists() and not [f for f in os.listdir(tmp_path) if "smerge-tmp" in f]


def test_existing_output_needs_overwrite_and_unsorted_input(three, tmp_path, capsys):
    paths, _ = three
    out = tmp_path / "j.parquet"
    out.write_text("keep")
    rc, _, se = run_cli(capsys, "wjoin", *paths[:2], "--time", "t", "--window", "3", "-o", out)
    assert rc == 2 and "already exists" in se and out.read_text() == "keep"
    bad = write(tmp_path / "bad.parquet", t=np.array([3, 1, 2]))
    rc, _, se = run_cli(capsys, "wjoin", paths[0], bad, "--time", "t", "--window", "3", "-o", tmp_path / "x.parquet")
    assert rc == 2 and "decreases at row 1" in se and not (tmp_path / "x.parquet").exists()


def test_subprocess_exit_code_for_bad_expression(three, tmp_path):
    paths, _ = three
    r = subprocess.run([sys.executable, "-m", "smerge", "wjoin", *paths[:2], "--time", "t", "--window", "3",
                        "--where", "S1.v > 1 or (lambda: 1)()", "-o", str(tmp_path / "o.parquet"), "--local"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("smerge: error: --where")


def test_storm_grids_three_way_on_the_same_cell_equal_the_oracle(ncar_dir, tmp_path, capsys):
    files = [os.path.join(ncar_dir, f"{v}storm.cdf") for v in "PTU"]
    out = tmp_path / "storm.parquet"
    rc, so, se = run_cli(capsys, "wjoin", *files, "--time", "timestep", "--window", "6", "--on", "lat,lon",
                         "--where", "S1.p > 100000 and S2.t < 290 and abs(S3.u) > 5", "--with-ids", "-o", out,
                         "--json", "--batch-rows", "20000")
    assert rc == 0, se
    stats = json.loads(so)
    tables = [pa.Table.from_batches(list(open_input(f, decode_times=True).batches())) for f in files]
    exp = oracle_tuples(tables, "timestep", {(0, 1): 6, (0, 2): 6, (1, 2): 6},
                        "s1.lat = s2.lat AND s1.lat = s3.lat AND s1.lon = s2.lon AND s1.lon = s3.lon "
                        "AND s1.p > 100000 AND s2.t < 290 AND abs(s3.u) > 5")
    res = pq.read_table(out)
    got = sorted(zip(*(res[f"S{i}_row"].to_pylist() for i in (1, 2, 3))))
    assert got == exp and len(exp) > 1000
    assert stats["method"] == "hash" and stats["tuples"] == len(exp)
    assert stats["records_read"] == {"S1": 76032, "S2": 76032, "S3": 76032}
    # within 6 hours a cell meets at most 3 time steps (t-6, t, t+6): 3 slabs of 33 x 36 cells
    assert max(stats["peak_buffered"].values()) <= 3 * 33 * 36
    # all members of a tuple share the cell, and the timesteps are within 6 hours pairwise
    assert res["S1_lat"].equals(res["S3_lat"]) and res["S2_lon"].equals(res["S3_lon"])
    ts = np.stack([res[f"S{i}_timestep"].to_numpy() for i in (1, 2, 3)])
    assert np.abs(ts[:, None, :] - ts[None, :, :]).max() <= 6


def test_default_route_runs_small_inputs_in_process(three, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("SMERGE_AUTO_MAX_BYTES", raising=False)
    paths, _ = three
    rc = main(["wjoin", *paths, "--time", "t", "--window", "4", "-o", str(tmp_path / "j.parquet"), "--stats",
               str(tmp_path / "j.json")])  # without --local (this file's run_cli adds it)
    out = capsys.readouterr().out
    assert rc == 0 and "route     local (auto: " in out
    s = json.loads((tmp_path / "j.json").read_text())
    assert s["execution"] == "local" and s["route"].startswith("local (auto: ")
