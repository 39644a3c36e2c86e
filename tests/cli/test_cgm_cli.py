"""`smerge cgm` / `smerge gen` through the CLI: outputs, stats JSON, exit codes, bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smerge.cli.main import main
from cli_run import run_cli  # noqa: E402 (tests/helpers: the shared CLI test helper)

SMERGE = [sys.executable, "-m", "smerge"]


def write(path, **cols):
    pq.write_table(pa.table(cols), path)
    return str(path)


@pytest.fixture
def ab(tmp_path):
    a = write(tmp_path / "a.parquet", k=np.arange(100.0), x=np.arange(100))
    b = write(tmp_path / "b.parquet", k=np.arange(0.0, 100.0, 2) + 0.1, y=np.arange(50) * 2)
    return a, b


def test_cgm_outputs_stats_and_unmatched(ab, tmp_path, capsys):
    a, b = ab
    out, stats = tmp_path / "o.parquet", tmp_path / "s.json"
    rc, so, se = run_cli(capsys, "cgm", a, b, "--keys", "k", "--eps", "0.2", "--window", "10", "--increment", "2",
                         "--local", "-o", out, "--stats", stats, "--unmatched", tmp_path / "un", "--with-ids",
                         "--kappa-max")
    assert rc == 0, se
    s = json.loads(stats.read_text())
    for key in ("algorithm", "a_records", "b_records", "matched", "a_unmatched", "b_unmatched", "match_pct",
                "report_windows", "kappa_min", "drop_rate_moving_max", "kappa_max", "fetch_seconds",
                "merge_seconds", "write_seconds", "total_seconds", "params"):
        assert key in s
    assert s["algorithm"] == "cgm" and s["a_records"] == 100 and s["b_records"] == 50
    assert s["matched"] == 50 and s["a_unmatched"] == 50 and s["b_unmatched"] == 0
    assert s["match_pct"] == 50.0 and s["kappa_max"] == 0.5
    assert s["params"]["window_size"] == 10 and s["params"]["eps"] == {"k": 0.2}
    t = pq.read_table(out)
    assert t.schema.names == ["k", "x", "k_b", "y", "a_row", "b_row"]
    assert t["a_row"].to_pylist() == list(range(0, 100, 2)) and t["b_row"].to_pylist() == list(range(50))
    ua = pq.read_table(tmp_path / "un.a.parquet")
    assert ua.num_rows == 50 and sorted(ua["a_row"].to_pylist()) == list(range(1, 100, 2))
    assert pq.read_table(tmp_path / "un.b.parquet").num_rows == 0
    assert "matched" in so


def test_cgm_json_on_stdout_and_default_output_name(ab, tmp_path, capsys, monkeypatch):
    a, b = ab
    monkeypatch.chdir(tmp_path)
    rc, so, _ = run_cli(capsys, "cgm", a, b, "--keys", "k", "--eps", "k=0.2", "--local", "--json")
    assert rc == 0
    assert json.loads(so)["matched"] == 50
    assert (tmp_path / "a+b.parquet").exists()


@pytest.mark.parametrize("fmt", ["csv", "arrow"])
def test_cgm_other_output_formats(ab, tmp_path, capsys, fmt):
    a, b = ab
    out = tmp_path / f"o.{fmt}"
    rc, _, se = run_cli(capsys, "cgm", a, b, "--keys", "k", "--eps", "0.2", "--local", "-o", out)
    assert rc == 0, se
    from smerge.datasets import open_input

    t = pa.Table.from_batches(list(open_input(str(out), keys=["k"]).batches()))
    assert t.num_rows == 50 and t.schema.names == ["k", "x", "k_b", "y"]


def test_delta_violation_exit_3_outputs_complete(ab, tmp_path, capsys):
    a, b = ab
    out = tmp_path / "o.parquet"
    rc, so, _ = run_cli(capsys, "cgm", a, b, "--keys", "k", "--eps", "0.2", "--local", "-o", out,
                        "--delta", "0.1", "--json")
    assert rc == 3
    s = json.loads(so)
    assert s["delta_ok"] is False and pq.read_table(out).num_rows == 50


def test_gen_then_cgm_with_jitter_needs_eps(tmp_path, capsys):
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    assert main(["gen", str(a), "--records", "20000", "--seed", "1"]) == 0
    assert main(["gen", str(b), "--records", "20000", "--seed", "2", "--jitter", "0.001", "--randomize", "5"]) == 0
    capsys.readouterr()
    rc, so, _ = run_cli(capsys, "cgm", a, b, "--keys", "time,lat,lon", "--local", "--json", "-o", tmp_path / "x.parquet")
    assert rc == 0 and json.loads(so)["matched"] < 100
    # Jitter on lat (a leading key) breaks the exact lexicographic order within a lat row, so a
    # sweep finds only part of the pairs; a small least increment K keeps the unmatched records
    # in the window until a later sweep pairs them (the paper's K trade-off, docs/cgm.md).
    eps = ["--eps", "time=0,lat=0.002,lon=0.002"]
    rc, so, _ = run_cli(capsys, "cgm", a, b, "--keys", "time,lat,lon", *eps, "--increment", "1",
                        "--local", "--json", "-o", tmp_path / "y.parquet", "--kappa-max")
    s = json.loads(so)
    assert rc == 0 and s["kappa_max"] == 1.0 and s["match_pct"] >= 99.0
    rc, so, _ = run_cli(capsys, "cgm", a, b, "--keys", "time,lat,lon", *eps, "--increment", "1000",
                        "--local", "--json", "-o", tmp_path / "z.parquet")
    assert rc == 0 and 30.0 < json.loads(so)["match_pct"] < s["match_pct"]


# ---- bad input: one line on stderr, exit 2, no traceback, nothing written ----------------

def assert_clean_error(rc, so, se, tmp_path, before, needle):
    assert rc == 2, (so, se)
    lines = [ln for ln in se.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("smerge: error: "), se
    assert needle in lines[0], se
    assert "Traceback" not in se
    assert sorted(os.listdir(tmp_path)) == before, "an output file was left behind"


def bad_cases(tmp_path, ncar):
    P, T = f"{ncar}/Pstorm.cdf", f"{ncar}/Tstorm.cdf"
    trunc = tmp_path / "trunc.cdf"
    trunc.write_bytes(open(P, "rb").read()[:150_000])
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x00\x13garbage" * 10)
    nan = write(tmp_path / "nan.parquet", k=[1.0, float("nan"), 3.0])
    ok = write(tmp_path / "ok.parquet", k=[1.0, 2.0, 3.0])
    ts = write(tmp_path / "ts.parquet", k=pa.array([1, 2, 3], pa.timestamp("s")))
    exists = tmp_path / "exists.parquet"
    exists.write_bytes(b"old")
    out = ["-o", str(tmp_path / "out.parquet")]
    return [
        ("missing file", ["cgm", tmp_path / "nope.nc", T, "--local", *out], "no such file"),
        ("directory", ["cgm", tmp_path, T, "--local", *out], "is a directory"),
        ("unreadable file", ["cgm", "/proc/self/mem", T, "--local", *out], "cannot be read"),
        ("unsupported format", ["cgm", junk, T, "--local", *out], "not a supported format"),
        ("truncated netCDF", ["cgm", trunc, T, "--local", *out], "truncated"),
        ("unknown key", ["cgm", P, T, "--keys", "timestep,lat,depth", "--local", *out], "depth"),
        ("unknown variable", ["cgm", P, T, "--vars-a", "q", "--local", *out], "'q'"),
        ("key count differs", ["cgm", P, T, "--keys", "timestep,lat", "--keys-b", "lat", "--local", *out], "keys"),
        ("key type differs", ["cgm", ok, ts, "--keys", "k", "--local", *out], "same kind"),
        ("NaN key", ["cgm", nan, ok, "--keys", "k", "--local", *out], "row 1"),
        ("negative eps", ["cgm", P, T, "--eps", "-0.5", "--local", *out], ">= 0"),
        ("eps not a number", ["cgm", P, T, "--eps", "abc", "--local", *out], "not a number"),
        ("eps unknown key", ["cgm", P, T, "--eps", "depth=1", "--local", *out], "depth"),
        ("N < 1", ["cgm", P, T, "--window", "0", "--local", *out], "window"),
        ("K < 1", ["cgm", P, T, "--increment", "0", "--local", *out], "increment"),
        ("K > N", ["cgm", P, T, "--window", "10", "--increment", "11", "--local", *out], "K <= N"),
        ("existing output", ["cgm", P, T, "--local", "-o", exists], "--overwrite"),
        ("unwritable directory", ["cgm", P, T, "--local", "-o", "/sys/smerge-out.parquet"], "/sys"),
        ("missing output directory", ["cgm", P, T, "--local", "-o", tmp_path / "no" / "o.parquet"], "does not exist"),
        ("netCDF output from tabular A", ["cgm", ok, ok, "--keys", "k", "--local", "-o", tmp_path / "o.nc"], "netCDF"),
        ("bad option value", ["cgm", P, T, "--window", "many", "--local", *out], "window"),
        ("gen bad records", ["gen", tmp_path / "g.parquet", "--records", "0"], "records"),
    ]


@pytest.mark.parametrize("case", range(22))
def test_bad_input(case, tmp_path, capsys, ncar_dir):
    name, args, needle = bad_cases(tmp_path, ncar_dir)[case]
    before = sorted(os.listdir(tmp_path))
    rc, so, se = run_cli(capsys, *args)
    assert_clean_error(rc, so, se, tmp_path, before, needle)


def test_bad_input_as_a_process(tmp_path, ncar_dir):
    """The installed console entry point: exit code 2, one line, no traceback."""
    exe = shutil.which("smerge", path=os.path.dirname(sys.executable)) or "smerge"
    p = subprocess.run([exe, "cgm", str(tmp_path / "nope.nc"), f"{ncar_dir}/Tstorm.cdf", "--local"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "no such file" in p.stderr
    assert os.listdir(tmp_path) == []


def test_without_local_runs_on_spark_with_the_local_result(ab, tmp_path, spark_cli):
    """(On the shared session: tests/conftest.py's ``spark_cli``.)"""
    a, b = ab
    rc, so, se = spark_cli("cgm", a, b, "--keys", "k", "--eps", "0.2", "--master", "local[1]", "--json",
                           "-o", tmp_path / "s.parquet", "--with-ids")
    assert rc == 0, se
    s = json.loads(so)
    assert s["execution"] == "spark" and s["matched"] == 50 and spark_cli.masters == ["local[1]"]
    rc, _, _ = spark_cli("cgm", a, b, "--keys", "k", "--eps", "0.2", "--local", "-o", tmp_path / "l.parquet",
                         "--with-ids")
    assert rc == 0
    assert pq.read_table(tmp_path / "s.parquet").equals(pq.read_table(tmp_path / "l.parquet"))


def test_default_route_runs_small_inputs_in_process_and_says_why(ab, tmp_path, capsys, monkeypatch):
    """--master auto (the default): inputs below the threshold run without a JVM; the summary
    and the statistics name the route and the reason."""
    monkeypatch.delenv("SMERGE_AUTO_MAX_BYTES", raising=False)
    a, b = ab
    size = os.path.getsize(a) + os.path.getsize(b)
    rc, so, se = run_cli(capsys, "cgm", a, b, "--keys", "k", "--eps", "0.2", "-o", tmp_path / "o.parquet",
                         "--stats", tmp_path / "s.json")
    assert rc == 0, se
    assert "ran       in-process" in so and "route     local (auto: " in so
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["execution"] == "local" and s["route"].startswith("local (auto: ") and s["route"].endswith(" GB)")
    assert f"{size / 1000:.1f} kB <= " in s["route"]
    rc, so, _ = run_cli(capsys, "cgm", a, b, "--keys", "k", "--local", "--json", "-o", tmp_path / "l.parquet")
    assert rc == 0 and json.loads(so)["route"] == "local (--local)"
    # the threshold from the environment; --local wins over any threshold (and over --master)
    monkeypatch.setenv("SMERGE_AUTO_MAX_BYTES", str(size))
    rc, so, _ = run_cli(capsys, "cgm", a, b, "--keys", "k", "--json", "-o", tmp_path / "e.parquet")
    assert rc == 0 and json.loads(so)["execution"] == "local"
    monkeypatch.setenv("SMERGE_AUTO_MAX_BYTES", "0")
    rc, so, _ = run_cli(capsys, "cgm", a, b, "--keys", "k", "--json", "--local", "--master", "local[1]",
                        "-o", tmp_path / "m.parquet")
    assert rc == 0 and json.loads(so)["execution"] == "local"


@pytest.mark.parametrize("value", ["-1", "lots"])
def test_bad_auto_threshold_is_a_usage_error(ab, tmp_path, capsys, value):
    a, b = ab
    rc, _, err = run_cli(capsys, "cgm", a, b, "--keys", "k", "--conf", f"smerge.auto.max_bytes={value}",
                         "-o", tmp_path / "o.parquet")
    assert rc == 2 and "smerge.auto.max_bytes" in err and not (tmp_path / "o.parquet").exists()


def test_progress_bar_on_stderr_only_when_asked(ab, tmp_path, capsys):
    a, b = ab
    rc, so, se = run_cli(capsys, "cgm", a, b, "--keys", "k", "--local", "--json", "--progress",
                         "-o", tmp_path / "p.parquet")
    assert rc == 0 and json.loads(so)["a_records"] == 100 and "A:" in se and "records" in se
    rc, so, se = run_cli(capsys, "cgm", a, b, "--keys", "k", "--local", "--json", "-o", tmp_path / "q.parquet")
    assert rc == 0 and se == ""  # stderr is not a terminal here: no bar by default
