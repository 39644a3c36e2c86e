"""On Spark (a session of its own, --master local[2], started by the command after the S3
environment is set), a Zarr store and a netCDF-4 file on the loopback S3 server are read by the
tasks themselves and merge as the same inputs do in-process; the session hands the endpoint and
credentials to the Python workers (spark.executorEnv)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from cloud_files import cf_grid, zarr_copy

from smerge.spark.session import FORWARDED_ENV, session_settings

sys.path.insert(0, os.path.dirname(__file__))
from test_s3 import observations  # noqa: E402

SMERGE = os.path.join(os.path.dirname(sys.executable), "smerge")
ARGS = ("--keys", "time,lat,lon", "--keys-b", "time,lat,lon", "--eps", "time=0s,lat=1.5,lon=1.5", "--json")


def test_session_forwards_the_s3_environment(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("SMERGE_REMOTE_TIMEOUT", "7")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    conf = session_settings("local[2]", None)
    assert conf["spark.executorEnv.AWS_ENDPOINT_URL"] == "http://127.0.0.1:9"
    assert conf["spark.executorEnv.SMERGE_REMOTE_TIMEOUT"] == "7"
    assert "spark.executorEnv.AWS_SESSION_TOKEN" not in conf and "AWS_SESSION_TOKEN" in FORWARDED_ENV
    assert session_settings("local[2]", {"spark.executorEnv.AWS_ENDPOINT_URL": "x"})[
        "spark.executorEnv.AWS_ENDPOINT_URL"] == "x"  # --conf wins


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["zarr", "netcdf4"])
def test_object_store_grids_on_spark_equal_in_process(kind, s3, tmp_path):
    bucket, fs = s3
    nc = cf_grid(tmp_path / "model.nc", packed=False, calendar="standard")
    obs = observations(tmp_path / "obs.parquet", nc)
    if kind == "zarr":
        fs.put(zarr_copy(nc, tmp_path / "model.zarr", zarr_format=3, consolidated=False, chunks={"time": 2}),
               f"{bucket}/model.zarr", recursive=True)
        url = f"s3://{bucket}/model.zarr"
    else:
        fs.put(nc, f"{bucket}/model.nc")
        url = f"s3://{bucket}/model.nc"
    fs.put(obs, f"{bucket}/obs.parquet")
    env = dict(os.environ, SMERGE_AUTO_MAX_BYTES="0")
    runs = {}
    for name, route in (("local", ("--local",)), ("spark", ("--master", "local[2]", "--partitions", "3"))):
        p = subprocess.run([SMERGE, "cgm", url, f"s3://{bucket}/obs.parquet", *route, *ARGS,
                            "-o", str(tmp_path / f"{name}.parquet")], capture_output=True, text=True, env=env,
                           timeout=300)
        assert p.returncode == 0, p.stderr
        runs[name] = json.loads(p.stdout)
    assert runs["spark"]["execution"] == "spark" and runs["spark"]["matched"] == runs["local"]["matched"] > 0
    assert pq.read_table(tmp_path / "spark.parquet").equals(pq.read_table(tmp_path / "local.parquet"))
