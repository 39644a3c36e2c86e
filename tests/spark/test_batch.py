"""`smerge batch JOBS.toml`: one session, one stats JSON per job, a summary, failures isolated."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
from spark_data import write_stream

SMERGE = [sys.executable, "-m", "smerge"]


def run(*args, cwd):
    return subprocess.run([*SMERGE, *args], cwd=cwd, capture_output=True, text=True, timeout=400)


def jobs_file(tmp_path, ncar_dir) -> str:
    write_stream(tmp_path / "a.parquet", np.arange(100.0))
    write_stream(tmp_path / "b.parquet", np.arange(100.0) + 0.5)
    (tmp_path / "jobs.toml").write_text(f'''
[spark]
partitions = 2
conf = {{ "spark.sql.shuffle.partitions" = "4" }}

[defaults]
window = 2000
increment = 500
overwrite = true

[[job]]
name = "storms"
a = "{ncar_dir}/Pstorm.cdf"
b = "{ncar_dir}/Tstorm.cdf"
output = "out/storms.parquet"
eps = "lat=0.01,lon=0.01"
delta = 0.0
with_ids = true

[[job]]
name = "missing"
a = "nope.parquet"
b = "b.parquet"
keys = "k1"

[[job]]
name = "far"
a = "a.parquet"
b = "b.parquet"
keys = ["k1"]
eps = 0.1
delta = 0.2
output = "far.csv"
stats = "far-stats.json"

[[job]]
name = "url"
a = "file://{tmp_path}/a.parquet"
b = "file://{tmp_path}/b.parquet"
keys = "k1"
eps = 0.5
partitions = 1
''')
    os.mkdir(tmp_path / "out")
    return str(tmp_path / "jobs.toml")


@pytest.mark.slow
@pytest.mark.parametrize("mode", [["--partitions", "2"], ["--local", "--json"]])
def test_batch_runs_every_job_and_reports(tmp_path, ncar_dir, mode, spark_cli):
    """In this process, on the shared session (a real `smerge batch` process: the tests below)."""
    jf = jobs_file(tmp_path, ncar_dir)
    rc, _, err = spark_cli("batch", jf, *mode, cwd="/")
    assert rc == 2, err  # one job failed on bad input; the others completed
    assert "job missing failed" in err and "nope.parquet" in err
    assert spark_cli.masters == ([] if "--local" in mode else ["local[*]"])  # one session for the file
    summary = json.load(open(tmp_path / "jobs.summary.json"))
    status = {j["name"]: j["status"] for j in summary["jobs"]}
    assert status == {"storms": "ok", "missing": "failed", "far": "delta_violated", "url": "ok"}
    assert summary["exit_code"] == 2 and summary["failed"] == 1 and summary["delta_violated"] == 1
    storms = json.load(open(tmp_path / "out/storms.parquet.stats.json"))
    assert storms["matched"] == 76032 and storms["delta_ok"] is True
    assert storms["execution"] == ("local" if "--local" in mode else "spark")
    assert pq.read_table(tmp_path / "out/storms.parquet").num_rows == 76032
    far = json.load(open(tmp_path / "far-stats.json"))
    assert far["matched"] == 0 and far["delta_ok"] is False
    assert (tmp_path / "far.csv").exists()
    # inputs at URLs: Spark's readers on Spark, smerge's own for file:// with --local; the
    # default output goes beside the jobs file
    url = json.load(open(tmp_path / "a+b.parquet.stats.json"))
    assert url["matched"] == 100 and pq.read_table(tmp_path / "a+b.parquet").num_rows == 100
    assert url.get("plan", {}).get("a") == (None if "--local" in mode else "spark-scan")


@pytest.mark.slow
def test_batch_delta_only_exits_3(tmp_path, ncar_dir):
    jf = jobs_file(tmp_path, ncar_dir)
    text = open(jf).read()
    start = text.index('[[job]]\nname = "missing"')
    open(jf, "w").write(text[:start] + text[text.index('[[job]]\nname = "far"'):])
    r = run("batch", jf, "--local", "--json", cwd=tmp_path)
    assert r.returncode == 3, r.stderr
    assert json.loads(r.stdout)["delta_violated"] == 1


@pytest.mark.parametrize("body,msg", [
    ("[[job]]\na = 'x'\n", "no 'b'"),
    ("[[job]]\na = 'x'\nb = 'y'\nwindw = 3\n", "unknown key 'windw'"),
    ("[[job]]\na = 'x'\nb = 'y'\nwindow = 'big'\n", "wrong type"),
    ("[spark]\nmastr = 'local'\n[[job]]\na = 'x'\nb = 'y'\n", "unknown key"),
    ("[[job]]\nname='j'\na='x'\nb='y'\n[[job]]\nname='j'\na='x'\nb='y'\n", "unique"),
    ("a = [", "not valid TOML"),
    ("", "no [[job]]"),
])
def test_batch_bad_file_exit_2_before_spark(tmp_path, body, msg, capsys, monkeypatch):
    """(In this process: a bad file is refused before any session starts.)"""
    from cli_run import run_cli

    (tmp_path / "j.toml").write_text(body)
    monkeypatch.chdir(tmp_path)
    rc, _, err = run_cli(capsys, "batch", "j.toml")
    assert rc == 2 and msg in err and err.count("\n") == 1
    assert not (tmp_path / "j.summary.json").exists()


def test_dataset_output_job_keeps_its_stats_beside_the_folder(tmp_path):
    from smerge.cli.batch import make_job

    job = make_job({"name": "j", "a": str(tmp_path / "a.nc"), "b": str(tmp_path / "b.nc"),
                    "output": str(tmp_path / "out") + "/"})
    assert job.stats == str(tmp_path / "out.stats.json")


def test_batch_default_route_runs_small_jobs_in_process(tmp_path, monkeypatch):
    """Without --master or [spark] master the whole file takes one route (auto): these inputs
    are small, so every job runs in-process; the summary and each job's stats say so."""
    monkeypatch.delenv("SMERGE_AUTO_MAX_BYTES", raising=False)
    write_stream(tmp_path / "a.parquet", np.arange(100.0))
    write_stream(tmp_path / "b.parquet", np.arange(100.0) + 0.5)
    (tmp_path / "jobs.toml").write_text('[[job]]\nname = "ab"\na = "a.parquet"\nb = "b.parquet"\nkeys = "k1"\n'
                                        'eps = 0.5\noutput = "ab.parquet"\n')
    r = run("batch", str(tmp_path / "jobs.toml"), cwd="/")
    assert r.returncode == 0, r.stderr
    assert "(route: local (auto: " in r.stdout
    summary = json.load(open(tmp_path / "jobs.summary.json"))
    assert summary["execution"] == "local" and summary["master"] is None
    assert summary["route"].startswith("local (auto: ")
    stats = json.load(open(tmp_path / "ab.parquet.stats.json"))
    assert stats["execution"] == "local" and stats["route"] == summary["route"] and stats["matched"] == 100
