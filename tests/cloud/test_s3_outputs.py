"""Outputs on an S3-compatible server (moto on loopback, started by the tests): -o and --stats
to s3:// are written locally, uploaded at the commit and equal to the local output; an existing
key is refused without --overwrite (before the run, and at the commit by a conditional put);
a failed run leaves no key; a missing bucket is one line, exit 2."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest
from cloud_files import cf_grid

from smerge.cli.main import main

ARGS = ("--keys", "time,lat,lon", "--keys-b", "time,lat,lon", "--eps", "time=0s,lat=1.5,lon=1.5", "--local")


def run(capsys, *args):
    rc = main([str(a) for a in args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def inputs(tmp_path, *, nan_last=False):
    """A (a netCDF grid) and B (station-like observations near its points, by pandas)."""
    import xarray as xr

    nc = cf_grid(tmp_path / "a.nc", packed=False, calendar="standard")
    g = xr.open_dataset(nc, decode_times=False)
    rng = np.random.default_rng(5)
    n = 200
    ti = rng.integers(0, g.sizes["time"], n)
    yi, xi = rng.integers(0, g.sizes["y"], n), rng.integers(0, g.sizes["lon"], n)
    days = pd.Timestamp("2001-02-27") + pd.to_timedelta(g["time"].values[ti], unit="D")
    df = pd.DataFrame({"time": days.astype("datetime64[us]"), "lat": g["lat"].values[yi] + rng.uniform(-1, 1, n),
                       "lon": g["lon"].values[xi] + rng.uniform(-1, 1, n), "obs": rng.normal(size=n)})
    df = df.sort_values(["time", "lat", "lon"]).reset_index(drop=True)
    if nan_last:
        df.loc[n - 1, "lat"] = np.nan
    df.to_parquet(tmp_path / "b.parquet", index=False, row_group_size=50)
    return nc, str(tmp_path / "b.parquet")


def read_back(fs, key, ext, local):
    if ext == "csv":
        with fs.open(key, "rb") as f:
            return f.read() == open(local, "rb").read()
    if ext == "arrow":
        with fs.open(key, "rb") as f:
            return feather.read_table(f).equals(feather.read_table(local))
    if ext == "dataset":
        parts = sorted(k for k in fs.find(key) if k.endswith(".parquet"))
        got = pa.concat_tables(pq.read_table(fs.open(k, "rb")) for k in parts)
        want = pq.read_table(local)
        return got.equals(want) and fs.exists(key + "/.smerge-dataset")
    with fs.open(key, "rb") as f:
        return pq.read_table(f).equals(pq.read_table(local))


@pytest.mark.parametrize("ext", ["parquet", "csv", "arrow", "dataset"])
def test_outputs_on_s3_equal_the_local_output(ext, s3, tmp_path, capsys):
    bucket, fs = s3
    a, b = inputs(tmp_path)
    local = tmp_path / ("local/" if ext == "dataset" else f"local.{ext}")
    url = f"s3://{bucket}/out/" if ext == "dataset" else f"s3://{bucket}/out/m.{ext}"
    rc, so, se = run(capsys, "cgm", a, b, *ARGS, "-o", local, "--stats", tmp_path / "s.json")
    assert rc == 0, se
    rc, so, se = run(capsys, "cgm", a, b, *ARGS, "-o", url, "--stats", f"s3://{bucket}/stats.json")
    assert rc == 0, se
    key = url[len("s3://"):].rstrip("/")
    want = str(local).rstrip("/")
    if ext == "dataset":
        want = [str(p) for p in (tmp_path / "local").iterdir() if p.suffix == ".parquet"][0]
    assert read_back(fs, key, ext, want)
    stats = json.loads(fs.cat(f"{bucket}/stats.json"))
    assert stats["matched"] == json.loads((tmp_path / "s.json").read_text())["matched"] > 0
    assert stats["output"] == url
    # nothing but the outputs: no temporary key was left in the bucket
    assert {k for k in fs.find(bucket) if ".smerge-" in k.rsplit("/", 1)[-1] and "dataset" not in k} == set()


def test_existing_key_refused_without_overwrite(s3, tmp_path, capsys):
    bucket, fs = s3
    a, b = inputs(tmp_path)
    fs.pipe(f"{bucket}/m.parquet", b"someone else's")
    rc, so, se = run(capsys, "cgm", a, b, *ARGS, "-o", f"s3://{bucket}/m.parquet")
    assert rc == 2 and len(se.strip().splitlines()) == 1 and "already exists; pass --overwrite" in se, se
    assert fs.cat(f"{bucket}/m.parquet") == b"someone else's"
    rc, so, se = run(capsys, "cgm", a, b, *ARGS, "-o", f"s3://{bucket}/m.parquet", "--overwrite")
    assert rc == 0, se
    assert pq.read_table(fs.open(f"{bucket}/m.parquet", "rb")).num_rows > 0
    # a folder of someone else's objects is never replaced, an object is not a folder
    fs.pipe(f"{bucket}/theirs/x.txt", b"x")
    rc, so, se = run(capsys, "cgm", a, b, *ARGS, "-o", f"s3://{bucket}/theirs/", "--overwrite")
    assert rc == 2 and "smerge did not write" in se and fs.cat(f"{bucket}/theirs/x.txt") == b"x", se
    fs.pipe(f"{bucket}/d.parquet/x.txt", b"x")
    rc, so, se = run(capsys, "cgm", a, b, *ARGS, "-o", f"s3://{bucket}/d.parquet", "--overwrite")
    assert rc == 2 and "is a folder (objects below it)" in se, se
    # our own dataset folder is replaced with --overwrite, its old objects gone
    rc, so, se = run(capsys, "cgm", a, b, *ARGS, "-o", f"s3://{bucket}/ours/")
    assert rc == 0, se
    fs.pipe(f"{bucket}/ours/part-99999.parquet", b"stale")  # not smerge's: the prefix is kept
    rc, so, se = run(capsys, "cgm", a, b, *ARGS, "-o", f"s3://{bucket}/ours/")
    assert rc == 2 and "already exists" in se
    rc, so, se = run(capsys, "cgm", a, b, *ARGS, "-o", f"s3://{bucket}/ours/", "--overwrite")
    assert rc == 2 and "holds 'part-99999.parquet', which smerge did not write" in se, se
    assert fs.cat(f"{bucket}/ours/part-99999.parquet") == b"stale"
    fs.rm(f"{bucket}/ours/part-99999.parquet")
    rc, so, se = run(capsys, "cgm", a, b, *ARGS, "-o", f"s3://{bucket}/ours/", "--overwrite")
    assert rc == 0, se
    assert sorted(k.rsplit("/", 1)[-1] for k in fs.find(f"{bucket}/ours")) == [".smerge-dataset", "part-00000.parquet"]


def test_key_taken_during_the_run_is_kept(s3, tmp_path):
    """The conditional put at the commit: a key created after the check is not replaced."""
    from smerge.datasets import open_output
    from smerge.errors import OutputError

    bucket, fs = s3
    t = pa.table({"x": np.arange(10)})
    w = open_output(f"s3://{bucket}/race.parquet", t.schema)
    for batch in t.to_batches():
        w.write(batch)
    fs.pipe(f"{bucket}/race.parquet", b"the other run")
    with pytest.raises(OutputError, match="created by another run"):
        w.commit()
    assert fs.cat(f"{bucket}/race.parquet") == b"the other run"
    assert not w.tmp or not __import__("os").path.exists(w.tmp)


def test_failed_run_leaves_no_key(s3, tmp_path, capsys, monkeypatch):
    from smerge.datasets import writers

    bucket, fs = s3
    a, b = inputs(tmp_path, nan_last=True)  # B's last key is NaN: the run fails after it has begun writing
    aborted = []
    abort = writers.Output.abort
    monkeypatch.setattr(writers.Output, "abort", lambda self: (aborted.append((self.path, self.rows)), abort(self)))
    rc, so, se = run(capsys, "cgm", a, b, *ARGS, "-o", f"s3://{bucket}/m.parquet",
                     "--stats", f"s3://{bucket}/s.json")
    assert rc == 2 and len(se.strip().splitlines()) == 1 and "NaN" in se, se
    assert [p for p, _ in aborted] == [f"s3://{bucket}/m.parquet"]  # the output was open when the run failed
    assert fs.find(bucket) == []


def test_bad_output_bucket_is_one_line(s3, tmp_path, capsys):
    bucket, fs = s3
    a, b = inputs(tmp_path)
    for url, words in ((f"s3://no-such-bucket-q/m.parquet", "no bucket 'no-such-bucket-q'"),
                       (f"s3://{bucket}", "names a bucket, not an object"),
                       (f"s3://{bucket}/m.xyz", "cannot tell the format")):
        rc, so, se = run(capsys, "cgm", a, b, *ARGS, "-o", url)
        assert rc == 2 and len(se.strip().splitlines()) == 1 and words in se and "Traceback" not in se, se
    assert fs.find(bucket) == []
