"""Inputs on an S3-compatible server (moto on loopback, started by the tests): Parquet, Zarr
stores and netCDF-4 files read in this process by byte ranges give the same merge as local
copies; missing credentials, buckets, keys and an unreachable endpoint are one line, exit 2."""

from __future__ import annotations

import json
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cloud_files import LATS, LONS, TIMES, cf_grid, zarr_copy

from smerge.cli.main import main
from smerge.datasets import open_input


def run(capsys, *args):
    rc = main([str(a) for a in args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def observations(path, nc) -> str:
    """Station-like observations near the grid's points, written by pandas."""
    import xarray as xr

    g = xr.open_dataset(nc, decode_times=False)
    rng = np.random.default_rng(3)
    n = 150
    ti = rng.integers(0, TIMES, n)
    yi, xi = rng.integers(0, LATS, n), rng.integers(0, LONS, n)
    days = pd.Timestamp("2001-02-27") + pd.to_timedelta(g["time"].values[ti], unit="D")
    df = pd.DataFrame({"time": days.astype("datetime64[us]"), "lat": g["lat"].values[yi] + rng.uniform(-1, 1, n),
                       "lon": g["lon"].values[xi] + rng.uniform(-1, 1, n), "obs": rng.normal(size=n)})
    df = df.sort_values(["time", "lat", "lon"]).reset_index(drop=True)
    df.to_parquet(path, index=False)
    return str(path)


def test_zarr_and_parquet_on_s3_merge_as_local_copies(s3, tmp_path, capsys):
    bucket, fs = s3
    nc = cf_grid(tmp_path / "model.nc", packed=False, calendar="standard")
    store = zarr_copy(nc, tmp_path / "model.zarr", zarr_format=3, consolidated=False, chunks={"time": 2})
    obs = observations(tmp_path / "obs.parquet", nc)
    fs.put(store, f"{bucket}/model.zarr", recursive=True)
    fs.put(obs, f"{bucket}/obs.parquet")
    args = ("--keys", "time,lat,lon", "--keys-b", "time,lat,lon", "--eps", "time=0s,lat=1.5,lon=1.5", "--json")
    rc, so, se = run(capsys, "cgm", store, obs, "--local", "-o", tmp_path / "local.parquet", *args)
    assert rc == 0, se
    local = json.loads(so)
    rc, so, se = run(capsys, "cgm", f"s3://{bucket}/model.zarr", f"s3://{bucket}/obs.parquet", "--local",
                     "-o", tmp_path / "remote.parquet", *args)
    assert rc == 0, se
    remote = json.loads(so)
    assert remote["matched"] == local["matched"] > 0
    assert pq.read_table(tmp_path / "remote.parquet").equals(pq.read_table(tmp_path / "local.parquet"))


@pytest.mark.parametrize("kind", ["netcdf4", "zarr2"])
def test_grids_on_s3_read_as_the_local_file(kind, s3, tmp_path):
    bucket, fs = s3
    nc = cf_grid(tmp_path / "g.nc")
    if kind == "netcdf4":
        fs.put(nc, f"{bucket}/g.nc")
        url = f"s3://{bucket}/g.nc"
    else:
        fs.put(zarr_copy(nc, tmp_path / "g.zarr", zarr_format=2, consolidated=True, chunks={"time": 2}),
               f"{bucket}/g.zarr", recursive=True)
        url = f"s3://{bucket}/g.zarr"
    want = open_input(nc, variables=["tas", "pr"], batch_rows=2 * LATS * LONS)
    got = open_input(url, variables=["tas", "pr"], batch_rows=2 * LATS * LONS)
    tw = pa.Table.from_batches(list(want.batches()))
    tg = pa.Table.from_batches(list(got.batches()))
    assert tg.equals(tw) and tg.num_rows == TIMES * LATS * LONS
    assert got.counters["masked"] == want.counters["masked"] > 0
    # a slab range: only its records
    part = pa.Table.from_batches(list(got.batches(2, 4)))
    assert part.equals(tw.slice(2 * LATS * LONS, 2 * LATS * LONS))


def _errors(capsys, tmp_path, url, ok):
    t0 = time.monotonic()
    rc, _, se = run(capsys, "cgm", ok, url, "--local", "-o", tmp_path / "o.parquet")
    took = time.monotonic() - t0
    assert rc == 2 and "Traceback" not in se and len(se.strip().splitlines()) == 1, se
    return se, took


def test_bad_object_store_inputs_are_one_line(s3, s3_server, tmp_path, capsys, monkeypatch):
    bucket, fs = s3
    ok = cf_grid(tmp_path / "g.nc", packed=False)
    fs.put(ok, f"{bucket}/g.nc")
    se, _ = _errors(capsys, tmp_path, f"s3://{bucket}/missing.nc", ok)
    assert f"no such key in bucket '{bucket}'" in se
    se, _ = _errors(capsys, tmp_path, "s3://no-such-bucket-xyz/g.nc", ok)
    assert "no bucket 'no-such-bucket-xyz'" in se
    se, _ = _errors(capsys, tmp_path, f"s3://{bucket}/", ok)
    assert "folder without Zarr metadata" in se
    # no credentials anywhere: the bucket and where they were looked for
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(k)
    import s3fs

    from smerge.datasets import remote
    s3fs.S3FileSystem.clear_instance_cache()
    remote._kind.cache_clear()
    se, _ = _errors(capsys, tmp_path, f"s3://{bucket}/g.nc", ok)
    assert f"no credentials for bucket '{bucket}'" in se and "~/.aws/credentials" in se and "SMERGE_ANON=1" in se
    # an endpoint nobody answers: a timeout, not a hang
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    import socket

    with socket.socket() as s:  # a port that accepts nothing
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", dead)
    monkeypatch.setenv("SMERGE_REMOTE_TIMEOUT", "2")
    s3fs.S3FileSystem.clear_instance_cache()
    remote._kind.cache_clear()
    se, took = _errors(capsys, tmp_path, f"s3://{bucket}/g.nc", ok)
    assert f"cannot reach {dead}" in se and took < 30


@pytest.mark.parametrize("ext", ["csv", "arrow", "parquet"])
def test_tables_on_s3_read_as_the_local_file(ext, s3, tmp_path):
    import pyarrow.csv as pcsv
    import pyarrow.feather as feather

    bucket, fs = s3
    n = 5000
    t = pa.table({"time": np.arange(n, dtype="i8"), "x": np.linspace(0, 1, n), "v": np.arange(n) % 7 * 1.5})
    local = tmp_path / f"t.{ext}"
    {"csv": lambda: pcsv.write_csv(t, local), "arrow": lambda: feather.write_feather(t, local),
     "parquet": lambda: pq.write_table(t, local, row_group_size=1000)}[ext]()
    fs.put(str(local), f"{bucket}/t.{ext}")
    want = open_input(str(local), keys=["time"], batch_rows=700)
    got = open_input(f"s3://{bucket}/t.{ext}", keys=["time"], batch_rows=700)
    assert pa.Table.from_batches(list(got.batches())).equals(pa.Table.from_batches(list(want.batches())))
    assert pa.Table.from_batches(list(got.batches(1200, 3100))).equals(
        pa.Table.from_batches(list(want.batches(1200, 3100))))
