"""`smerge cgm` on Spark as a user runs it: exit codes, quiet stderr, and a real standalone cluster."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.slow

SMERGE = [sys.executable, "-m", "smerge"]


def smerge(*args, cwd, timeout=300):
    return subprocess.run([*SMERGE, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cli_spark_run_quiet_with_stats_and_delta(tmp_path, ncar_dir):
    a, b = os.path.join(ncar_dir, "Pstorm.cdf"), os.path.join(ncar_dir, "Tstorm.cdf")
    r = smerge("cgm", a, b, "--partitions", "2", "-o", "o.parquet", "--stats", "s.json", "--unmatched", "u",
               "--eps", "0.01", "--delta", "0.0", "--window", "100", "--increment", "100", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # Spark's own log stays off the terminal
    stats = json.load(open(tmp_path / "s.json"))
    assert stats["execution"] == "spark" and stats["partitions"] == 2
    assert stats["matched"] == 76032 and stats["delta_ok"] is True
    assert "session_start_seconds" in stats and stats["session_start_seconds"] > 0
    assert pq.read_table(tmp_path / "o.parquet").num_rows == 76032
    assert pq.read_table(tmp_path / "u.a.parquet").num_rows == 0
    # an existing output without --overwrite: exit 2, one line, before Spark starts
    r = smerge("cgm", a, b, "-o", "o.parquet", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "already exists" in r.stderr


def test_default_route_runs_inputs_above_the_threshold_on_spark(tmp_path, ncar_dir, monkeypatch, spark_cli):
    """--master auto (the default) above the threshold: Spark local[*], said in summary and stats.
    --conf smerge.auto.max_bytes takes precedence over $SMERGE_AUTO_MAX_BYTES. (In this process,
    on the shared session: ``spark_cli.masters`` are the masters the CLI asked Spark for.)"""
    monkeypatch.setenv("SMERGE_AUTO_MAX_BYTES", str(10**12))
    a, b = os.path.join(ncar_dir, "Pstorm.cdf"), os.path.join(ncar_dir, "Tstorm.cdf")
    size = os.path.getsize(a) + os.path.getsize(b)
    rc, out, err = spark_cli("cgm", a, b, "--eps", "0.01", "-o", "o.parquet", "--stats", "s.json", "--conf",
                             f"smerge.auto.max_bytes={size - 1}", cwd=tmp_path)
    assert rc == 0, err
    stats = json.load(open(tmp_path / "s.json"))
    assert stats["execution"] == "spark" and spark_cli.masters == ["local[*]"]
    assert stats["route"] == f"spark (auto: {size:,} B > {size - 1:,} B)"
    # the summary names the session's master (here the shared session's)
    assert f"route     {stats['route']}" in out and f"spark     {stats['master']}, " in out
    # a named master is Spark whatever the threshold
    rc, out, err = spark_cli("cgm", a, b, "--eps", "0.01", "-o", "m.parquet", "--master", "local[1]", "--json")
    assert rc == 0, err
    stats = json.loads(out)
    assert stats["execution"] == "spark" and stats["route"] == "spark (--master local[1])"
    assert spark_cli.masters == ["local[*]", "local[1]"]
    assert pq.read_table(tmp_path / "m.parquet").equals(pq.read_table(tmp_path / "o.parquet"))


def test_cli_spark_delta_violation_exits_3(tmp_path, spark_cli):
    """(In this process, on the shared session.)"""
    import numpy as np
    from spark_data import write_stream

    write_stream(tmp_path / "a.parquet", np.arange(100.0))
    write_stream(tmp_path / "b.parquet", np.arange(100.0) + 0.5)  # half of A's keys within eps=0.3? none
    rc, out, err = spark_cli("cgm", "a.parquet", "b.parquet", "--keys", "k1", "--eps", "0.3", "--partitions", "2",
                             "-o", "o.csv", "--delta", "0.1", "--json", cwd=tmp_path)
    assert rc == 3, err
    stats = json.loads(out)
    assert stats["delta_ok"] is False and stats["matched"] == 0 and stats["partitions"] == 2
    assert stats["execution"] == "spark"
    assert (tmp_path / "o.csv").read_text().splitlines() == ["\"k1\",\"v\",\"k1_b\",\"v_b\""]
    rc, out, err = spark_cli("cgm", "a.parquet", "b.parquet", "--keys", "k1", "--eps", "0.5", "--partitions", "2",
                             "-o", "p.csv", "--delta", "0.1", "--json")
    assert rc == 0, err
    stats = json.loads(out)
    assert stats["delta_ok"] is True and stats["matched"] >= 99  # a pair may be lost at the seam


def test_cli_bad_input_exit_2_no_output(tmp_path):
    (tmp_path / "a.csv").write_text("k,v\n1,2\n")
    r = smerge("cgm", "a.csv", "missing.csv", "--keys", "k", "-o", "o.parquet", cwd=tmp_path)
    assert r.returncode == 2 and "missing.csv" in r.stderr and "Traceback" not in r.stderr
    assert sorted(os.listdir(tmp_path)) == ["a.csv"]


def _wait(pred, timeout, what):
    t = time.monotonic()
    while time.monotonic() - t < timeout:
        if pred():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _master_json(ui_port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as f:
            return json.load(f)
    except OSError:
        return None


@pytest.fixture(scope="module")
def big_input(tmp_path_factory):
    """3M records: a Spark run on them is still going when its staging folder appears."""
    d = tmp_path_factory.mktemp("big")
    r = smerge("gen", "a.parquet", "--records", "3000000", "--randomize", "5", cwd=d)
    assert r.returncode == 0, r.stderr
    return d / "a.parquet"


def test_sigterm_stops_a_spark_run_and_removes_its_staging(tmp_path, big_input):
    # cron's `timeout` sends SIGTERM: the run stops like Ctrl-C (exit 130) and leaves nothing
    os.symlink(big_input, tmp_path / "a.parquet")
    os.mkdir(tmp_path / "out")
    proc = subprocess.Popen([*SMERGE, "cgm", "a.parquet", "a.parquet", "--keys", "time,lat,lon", "--partitions", "2",
                             "-o", "out/o.parquet"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    t0 = time.monotonic()
    while proc.poll() is None and not os.listdir(tmp_path / "out") and time.monotonic() - t0 < 240:
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before its staging folder was seen; use a larger input"
    proc.terminate()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.count("\n") == 1 and "interrupted; no output was written" in err
    assert os.listdir(tmp_path / "out") == []


def _children(pid: int) -> list[int]:
    """Pids of the processes whose parent is ``pid`` (the driver's JVM)."""
    out = []
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/stat") as f:
                if d.isdigit() and int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d))
        except (OSError, IndexError, ValueError):
            pass
    return out


def test_sigkill_leftovers_are_removed_by_the_next_run_to_the_same_place(tmp_path, big_input, spark_cli):
    """kill -9 of a Spark run leaves its staging folder (nothing can clean up); the next run
    writing to the same folder removes it, since its owner is gone (issue 15 item 4). The next
    run merges a small input, in this process on the shared session: the sweep is the same."""
    os.symlink(big_input, tmp_path / "a.parquet")
    os.mkdir(tmp_path / "out")
    outs = ["--partitions", "2", "-o", "out/o.parquet", "--unmatched", "out/u", "--stats", "out/s.json"]
    args = ["cgm", "a.parquet", "a.parquet", "--keys", "time,lat,lon", *outs]
    proc = subprocess.Popen([*SMERGE, *args], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    t0 = time.monotonic()
    while proc.poll() is None and not os.listdir(tmp_path / "out") and time.monotonic() - t0 < 240:
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before its staging folder was seen; use a larger input"
    jvms = _children(proc.pid)
    proc.kill()
    proc.communicate(timeout=60)
    _wait(lambda: not any(os.path.exists(f"/proc/{p}") for p in jvms), 120, "the killed run's JVM to exit")
    left = os.listdir(tmp_path / "out")
    assert left and all(".smerge-spark-" in n for n in left), left
    rc, _, err = spark_cli("gen", "s.parquet", "--records", "2000", "--randomize", "5", cwd=tmp_path)
    assert rc == 0, err
    rc, out, err = spark_cli("cgm", "s.parquet", "s.parquet", "--keys", "time,lat,lon", *outs, "--json", cwd=tmp_path)
    assert rc == 0, err
    assert json.loads(out)["execution"] == "spark"
    assert sorted(os.listdir(tmp_path / "out")) == ["o.parquet", "s.json", "u.a.parquet", "u.b.parquet"]


def test_standalone_cluster_equals_local(tmp_path, ncar_dir):
    import pyspark

    spark_home = os.path.dirname(pyspark.__file__)
    spark_class = os.path.join(spark_home, "bin", "spark-class")
    port, ui, wui = free_port(), free_port(), free_port()
    env = dict(os.environ, SPARK_HOME=spark_home, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
               SPARK_LOG_DIR=str(tmp_path), SPARK_WORKER_DIR=str(tmp_path / "work"))
    log = open(tmp_path / "cluster.log", "w")
    master = subprocess.Popen([spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(port), "--webui-port", str(ui)], env=env, stdout=log, stderr=log)
    worker = None
    try:
        _wait(lambda: _master_json(ui) is not None, 90, "the Spark master")
        worker = subprocess.Popen([spark_class, "org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}",
                                   "--host", "127.0.0.1", "--cores", "2", "--memory", "2g", "--webui-port", str(wui),
                                   "--work-dir", str(tmp_path / "work")], env=env, stdout=log, stderr=log)
        _wait(lambda: (_master_json(ui) or {}).get("aliveworkers", 0) >= 1, 90, "the Spark worker")
        a, b = os.path.join(ncar_dir, "Pstorm.cdf"), os.path.join(ncar_dir, "Tstorm.cdf")
        common = ["--eps", "0.01", "--with-ids", "--window", "2000", "--increment", "500"]
        r = smerge("cgm", a, b, "--local", "-o", "local.parquet", *common, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        local = pq.read_table(tmp_path / "local.parquet")
        # relative paths from a working folder that is not the executors' (issue 15 item 1): inputs,
        # a dataset folder output, --unmatched and --stats are made absolute on the driver
        job = tmp_path / "job"
        (job / "data").mkdir(parents=True)
        (job / "out").mkdir()
        for f in (a, b):
            os.symlink(f, job / "data" / os.path.basename(f))
        r = smerge("cgm", "data/Pstorm.cdf", "data/Tstorm.cdf", "--master", f"spark://127.0.0.1:{port}",
                   "--partitions", "2", "-o", "out/ds/", "--unmatched", "out/u", "--stats", "out/s.json", "--json",
                   "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.executor.memory=1g",
                   *common, cwd=job, timeout=400)
        assert r.returncode == 0, r.stderr + open(tmp_path / "cluster.log").read()[-3000:]
        stats = json.loads(r.stdout)
        assert stats["master"] == f"spark://127.0.0.1:{port}" and stats["partitions"] == 2
        stats = json.load(open(job / "out" / "s.json"))
        # the statistics name the paths as the user did, on Spark as in-process
        assert stats["a"] == "data/Pstorm.cdf" and stats["output"] == "out/ds/"
        assert stats["route"] == f"spark (--master spark://127.0.0.1:{port})"
        assert pq.read_table(job / "out" / "ds").equals(local)
        assert pq.read_table(job / "out" / "u.a.parquet").num_rows == stats["a_unmatched"]
        assert not [n for n in os.listdir(job / "out") if n.startswith(".")]  # no staging left
        # B at a file:// URL, read on the cluster by Spark's Parquet reader (A through the netCDF source)
        import pyarrow as pa

        from smerge.datasets import open_input

        src = open_input(b)
        pq.write_table(pa.Table.from_batches(list(src.batches()), schema=src.schema), tmp_path / "t.parquet",
                       row_group_size=4000)
        r = smerge("cgm", a, f"file://{tmp_path}/t.parquet", "--keys", ",".join(src.keys), "--master",
                   f"spark://127.0.0.1:{port}", "--partitions", "2", "-o", "url.parquet", "--conf",
                   "spark.driver.host=127.0.0.1", "--conf", "spark.executor.memory=1g", "--json", *common,
                   cwd=tmp_path, timeout=400)
        assert r.returncode == 0, r.stderr + open(tmp_path / "cluster.log").read()[-3000:]
        stats = json.loads(r.stdout)
        assert stats["plan"] == {"a": "spark-scan", "b": "spark-scan"} and stats["partitions"] == 2
        assert pq.read_table(tmp_path / "url.parquet").cast(local.schema).equals(local)
        # the jobs really ran on the cluster: the master lists the finished applications
        _wait(lambda: len((_master_json(ui) or {}).get("completedapps", [])) >= 2, 60, "the finished applications")
    finally:
        for proc in (worker, master):
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        log.close()
