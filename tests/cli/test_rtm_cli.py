"""`smerge rtm` through the CLI: NCAR Ustorm+Vstorm equals `smerge cgm --local`, stats JSON,
unmatched outputs, --server against `smerge serve`, exit codes and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli_run import run_cli  # noqa: E402 (tests/helpers: the shared CLI test helper)

SMERGE = [sys.executable, "-m", "smerge"]
STATS_KEYS = {"algorithm", "a_records", "b_records", "matched", "a_unmatched", "b_unmatched", "match_pct",
              "report_windows", "kappa_min", "drop_rate_moving_max", "fetch_seconds", "merge_seconds",
              "write_seconds", "total_seconds", "params"}


def write(path, **cols):
    pq.write_table(pa.table(cols), path)
    return str(path)


@pytest.mark.slow
def test_ncar_ustorm_vstorm_rtm_equals_cgm(ncar_dir, tmp_path, capsys):
    u, v = os.path.join(ncar_dir, "Ustorm.cdf"), os.path.join(ncar_dir, "Vstorm.cdf")
    rc, out, err = run_cli(capsys, "rtm", u, v, "-o", tmp_path / "r.parquet", "--with-ids", "--json", "--kappa-max",
                           "--local")
    assert rc == 0, err
    s = json.loads(out)
    assert STATS_KEYS <= set(s)
    assert s["algorithm"] == "rtm" and s["match_pct"] == 100.0 and s["kappa_max"] == 1.0
    assert s["a_records"] == s["b_records"] == 76032 and s["a_unmatched"] == s["b_unmatched"] == 0
    assert s["params"]["refill"] == "page" and s["params"]["window_size"] == 5000
    rc, out, err = run_cli(capsys, "cgm", "--local", u, v, "-o", tmp_path / "c.parquet", "--with-ids", "--json")
    assert rc == 0, err
    assert json.loads(out)["match_pct"] == 100.0
    r = pq.read_table(tmp_path / "r.parquet").sort_by("a_row")
    c = pq.read_table(tmp_path / "c.parquet").sort_by("a_row")
    assert r.num_rows == 76032 and r.equals(c)
    # symdiff (the paper's variant) loses the tail of the boundary rows of each page
    rc, out, _ = run_cli(capsys, "rtm", u, v, "-o", tmp_path / "s.parquet", "--refill", "symdiff", "--json",
                         "--local")
    assert rc == 0 and json.loads(out)["match_pct"] < 100.0


@pytest.fixture
def ab(tmp_path):
    a = write(tmp_path / "a.parquet", k=np.array([2.0, 4, 6, 8, 10, 99]), x=np.arange(6))
    b = write(tmp_path / "b.parquet", k=np.arange(2.0, 11.0), y=np.arange(9) * 10)
    return a, b


@pytest.mark.slow
def test_rtm_outputs_stats_and_unmatched(ab, tmp_path, capsys):
    a, b = ab
    rc, out, err = run_cli(capsys, "rtm", a, b, "--keys", "k", "--window", "5", "-o", tmp_path / "o.parquet",
                           "--unmatched", tmp_path / "un", "--stats", tmp_path / "s.json", "--with-ids", "--local")
    assert rc == 0, err
    assert "smerge rtm" in out and "5 pairs" in out
    s = json.load(open(tmp_path / "s.json"))
    assert (s["matched"], s["a_unmatched"], s["b_unmatched"]) == (5, 1, 4)
    assert s["server"] == "embedded" and s["report_windows"] == 1 and s["kappa_min"] == 5 / 6
    o = pq.read_table(tmp_path / "o.parquet")
    assert o.column("y").to_pylist() == [0, 20, 40, 60, 80]
    assert pq.read_table(tmp_path / "un.a.parquet").column("a_row").to_pylist() == [5]
    assert pq.read_table(tmp_path / "un.b.parquet").column("b_row").to_pylist() == [1, 3, 5, 7]


@pytest.mark.slow
def test_rtm_against_running_server(ab, tmp_path):
    a, b = ab
    (tmp_path / "tok").write_text("cli-token-123456")
    p = subprocess.Popen(SMERGE + ["serve", b, "--keys", "k", "--port", "0", "--token-file", str(tmp_path / "tok")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = p.stdout.readline().strip()
        r = subprocess.run(SMERGE + ["rtm", a, "--server", url, "--token-file", str(tmp_path / "tok"), "--keys", "k",
                                     "--window", "5", "-o", str(tmp_path / "o.parquet"), "--json", "--local"],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["matched"] == 5
        (tmp_path / "bad").write_text("not-the-token")
        r = subprocess.run(SMERGE + ["rtm", a, "--server", url, "--token-file", str(tmp_path / "bad"), "--keys", "k",
                                     "-o", str(tmp_path / "o2.parquet"), "--local"], capture_output=True, text=True)
        assert r.returncode == 2 and "rejected the token" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "o2.parquet").exists()
    finally:
        p.terminate()
        p.wait(timeout=30)


@pytest.mark.parametrize("args, msg", [
    (["rtm", "{a}", "{tmp}/missing.parquet", "--keys", "k"], "no such file"),
    (["rtm", "{a}", "{b}", "--keys", "k", "--refill", "sideways"], "--refill"),
    (["rtm", "{a}", "{b}", "--keys", "k", "--window", "0"], "--window"),
    (["rtm", "{a}", "{b}", "--keys", "nokey"], "nokey"),
    (["rtm", "{a}", "{b}", "--keys", "k", "--server", "grpc://127.0.0.1:1"], "not both"),
    (["rtm", "{a}", "--keys", "k"], "--server"),
    (["rtm", "{a}", "--server", "http://x", "--keys", "k"], "grpc://HOST:PORT"),
    (["rtm", "{a}", "{b}", "--keys", "k", "--eps", "k=-1"], "--eps"),
    (["rtm", "{a}", "{b}", "--keys", "k", "-o", "{a}", "--overwrite"], "also an input"),
    (["rtm", "{a}", "{b}", "--keys", "k", "--stats", "{b}"], "also an input"),
    (["rtm", "{a}", "{b}", "--keys", "k", "-o", "{tmp}/o.parquet", "--stats", "{tmp}/o.parquet"], "also the path of -o"),
    (["rtm", "{a}", "{b}", "--keys", "k", "-o", "{tmp}/x.a.parquet", "--unmatched", "{tmp}/x"], "also the path of -o"),
    (["cgm", "{a}", "{b}", "--keys", "k", "--local", "--stats", "{a}"], "also an input"),
    (["wjoin", "{a}", "{b}", "--time", "k", "--window", "1", "--local", "--stats", "{b}"], "also an input"),
    (["serve"], "either B or --index"),
    (["serve", "{b}", "--keys", "k", "--host", "0.0.0.0", "--port", "0"], "requires a token"),
    (["serve", "--index", "{tmp}"], "not an smerge index"),
    (["index", "build", "{b}", "-o", "{tmp}/idx"], "no merge keys"),
])
def test_bad_input_exit_2_one_line_no_output(ab, tmp_path, capsys, args, msg):
    a, b = ab
    argv = [x.format(a=a, b=b, tmp=tmp_path) for x in args]
    if argv[0] == "rtm" and "-o" not in argv:
        argv += ["-o", str(tmp_path / "out.parquet")]
    rc, out, err = run_cli(capsys, *argv)
    assert rc == 2, (out, err)
    assert msg in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "out.parquet").exists() and not (tmp_path / "idx").exists()


@pytest.mark.slow
def test_existing_output_is_an_error_and_delta_exit_3(ab, tmp_path, capsys):
    a, b = ab
    (tmp_path / "o.parquet").write_bytes(b"keep")
    rc, _, err = run_cli(capsys, "rtm", a, b, "--keys", "k", "-o", tmp_path / "o.parquet", "--local")
    assert rc == 2 and "exists" in err and (tmp_path / "o.parquet").read_bytes() == b"keep"
    rc, _, err = run_cli(capsys, "rtm", a, b, "--keys", "k", "--window", "5", "-o", tmp_path / "d.parquet",
                         "--delta", "0.01", "--delta-windows", "1", "--local")
    assert rc == 3 and (tmp_path / "d.parquet").exists()


def test_help_says_rtm_routes_auto_by_default_with_local_in_process(ab, tmp_path, capsys):
    from typer.testing import CliRunner

    from smerge.cli.main import app

    res = CliRunner().invoke(app, ["rtm", "--help"], terminal_width=200)
    assert res.exit_code == 0 and "(--master auto) small inputs run in this process" in res.output
    for opt in ("--local", "--master", "--partitions", "--conf", "--verbose"):
        assert opt in res.output
    a, b = ab
    rc, out, err = run_cli(capsys, "rtm", a, b, "--keys", "k", "-o", tmp_path / "o.parquet", "--with-ids", "--local",
                           "--json")
    assert rc == 0, err
    assert json.loads(out)["execution"] == "local"
    assert pq.read_table(tmp_path / "o.parquet").num_rows == 5


def test_default_route_runs_small_inputs_in_process(ab, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("SMERGE_AUTO_MAX_BYTES", raising=False)
    a, b = ab
    rc, out, err = run_cli(capsys, "rtm", a, b, "--keys", "k", "-o", tmp_path / "o.parquet", "--stats",
                           tmp_path / "s.json")
    assert rc == 0, err
    assert "route     local (auto: " in out
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["execution"] == "local" and s["route"].startswith("local (auto: ")
