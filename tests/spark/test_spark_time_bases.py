"""Time keys on one base on Spark: station observations written by pandas (timestamp[ns]) merged
with a CF netCDF grid give on ``--master local[2]`` exactly the ``--local`` pairs; Spark's own
readers (``--conf smerge.reader=spark``) take times without a zone as UTC whatever the JVM's zone."""

from __future__ import annotations

import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from smerge.spark.session import session_settings
from time_files import EPS, EXPECTED, write_files

pytestmark = pytest.mark.slow

SMERGE = [sys.executable, "-m", "smerge"]


def pairs_of(path) -> list[tuple]:
    t = pq.read_table(path)
    return sorted(zip(t.column("a_row").to_pylist(), t.column("b_row").to_pylist(), t.column("station").to_pylist()))


def cgm(a, b, out, *args, env=None):
    r = subprocess.run([*SMERGE, "cgm", a, b, "--keys", "time,lat,lon", "--eps", EPS, "--with-ids", "-o", str(out),
                        *args], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr
    return pairs_of(out)


def cgm_local(capsys, a, b, out):
    """``cgm(a, b, out, "--local")`` in this process."""
    from cli_run import run_cli

    rc, _, err = run_cli(capsys, "cgm", a, b, "--keys", "time,lat,lon", "--eps", EPS, "--with-ids", "-o", out,
                         "--local")
    assert rc == 0, err
    return pairs_of(out)


def test_the_session_reads_times_without_a_zone_as_utc():
    assert session_settings("local[2]", None)["spark.sql.session.timeZone"] == "UTC"
    assert session_settings("local[2]", {"spark.sql.session.timeZone": "Asia/Tokyo"})[
        "spark.sql.session.timeZone"] == "Asia/Tokyo"


def test_pandas_observations_on_a_netcdf_grid_spark_equals_local(tmp_path, spark, capsys):
    from smerge.jobs.cgm import CGMJob
    from smerge.jobs.pipeline import RunOptions, execute
    from smerge.jobs.route import Route

    f = write_files(tmp_path)
    a, b = f["cf-hours", "grid"], f["pandas-ns", "obs"]
    local = cgm_local(capsys, a, b, tmp_path / "local.parquet")
    assert [(x, y) for x, y, _ in local] == sorted(EXPECTED)
    from smerge.merge.values import parse_eps

    job = CGMJob(a=a, b=b, keys_a=("time", "lat", "lon"), eps=parse_eps(EPS), with_ids=True,
                 output=str(tmp_path / "spark.parquet"))
    s = execute(job, RunOptions(partitions=2, spark=spark), route=Route(True, "local[2]", "spark (--master local[2])"))
    assert s["execution"] == "spark"
    assert pairs_of(tmp_path / "spark.parquet") == local
    t = pq.read_table(tmp_path / "spark.parquet")
    assert str(t.schema.field("time_b").type) == "timestamp[ns]" and str(t.schema.field("time").type) == \
        "timestamp[us]"


def test_spark_readers_take_naive_times_as_utc_in_any_jvm_zone(tmp_path, capsys):
    """ISO datetimes without an offset in CSV, read by Spark's CSV reader in a JVM whose zone is
    Europe/Paris, pair as in-process (they would be an hour early in the JVM's zone)."""
    f = write_files(tmp_path)
    a, b = f["polars-us", "grid"], f["csv-iso", "obs"]
    env = {**os.environ, "TZ": "Europe/Paris", "SMERGE_AUTO_MAX_BYTES": "0"}
    local = cgm_local(capsys, a, b, tmp_path / "local.parquet")
    spark = cgm(a, b, tmp_path / "spark.parquet", "--master", "local[2]", "--partitions", "2", "--conf",
                "smerge.reader=spark", env=env)
    assert [(x, y) for x, y, _ in spark] == [(x, y) for x, y, _ in local] == sorted(EXPECTED)
