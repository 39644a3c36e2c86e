"""On Spark, Zarr stores are read by the tasks themselves by chunk ranges of the leading key
(the netCDF slab plan, reopened in each task): output equal to --local. With an object-store
input, the S3 endpoint and credentials of the driver reach the Python workers."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "helpers"))
from cloud_files import cf_grid, zarr_copy  # noqa: E402

from smerge.jobs.pipeline import RunOptions, execute  # noqa: E402
from smerge.jobs.route import Route  # noqa: E402

SPARK = Route(True, "local[2]", "spark (--master local[2])")
EPS = {"time": "0s", "lat": 1.5, "lon": 1.5}


def observations(path, nc) -> str:
    import pandas as pd
    import xarray as xr

    g = xr.open_dataset(nc, decode_times=False)
    rng = np.random.default_rng(11)
    n = 300
    ti = np.sort(rng.integers(0, g.sizes["time"], n))
    yi, xi = rng.integers(0, g.sizes["y"], n), rng.integers(0, g.sizes["lon"], n)
    days = pd.Timestamp("2001-02-27") + pd.to_timedelta(g["time"].values[ti], unit="D")
    df = pd.DataFrame({"time": days.astype("datetime64[us]"), "lat": g["lat"].values[yi] + rng.uniform(-1, 1, n),
                       "lon": g["lon"].values[xi] + rng.uniform(-1, 1, n), "obs": rng.normal(size=n)})
    df.sort_values(["time", "lat", "lon"]).to_parquet(path, index=False)
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("zarr_format", [2, 3])
def test_zarr_store_on_spark_equals_local(zarr_format, tmp_path, spark, monkeypatch):
    from smerge.jobs.cgm import CGMJob

    monkeypatch.chdir(tmp_path)
    nc = cf_grid(tmp_path / "a.nc", packed=True, calendar="standard")
    store = zarr_copy(nc, tmp_path / "a.zarr", zarr_format=zarr_format, consolidated=zarr_format == 2,
                      chunks={"time": 2})
    b = observations(tmp_path / "b.parquet", nc)
    job = lambda o: CGMJob(a=store, b=b, keys_a=("time", "lat", "lon"), keys_b=("time", "lat", "lon"),  # noqa: E731
                           eps=EPS, output=o)
    local = execute(job("local.parquet"), RunOptions(local=True))
    on_spark = execute(job("spark.parquet"), RunOptions(partitions=3, spark=spark), route=SPARK)
    assert on_spark["execution"] == "spark" and on_spark["matched"] == local["matched"] > 0
    assert pq.read_table(tmp_path / "spark.parquet").equals(pq.read_table(tmp_path / "local.parquet"))
