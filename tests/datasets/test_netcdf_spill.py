"""netCDF output spills B's values in buckets of A's outer slabs: the file is the same whatever
the bucket size, nothing is left beside the output, and a failed run leaves nothing either."""

from __future__ import annotations

import os

import netCDF4
import numpy as np
import pytest

from smerge.cli.main import main


def grid(path, seed):
    rng = np.random.default_rng(seed)
    with netCDF4.Dataset(path, "w") as ds:
        for d, n in (("time", 7), ("lat", 5), ("lon", 4)):
            ds.createDimension(d, n)
            ds.createVariable(d, "f8", (d,))[:] = np.arange(n)
        ds.createVariable("p", "f4", ("time", "lat", "lon"))[:] = rng.normal(size=(7, 5, 4))
        name = ds.createVariable("name", str, ("time", "lat", "lon"))
        name[:] = np.array([f"s{i}" for i in range(140)], dtype=object).reshape(7, 5, 4)
    return str(path)


def read(path):
    with netCDF4.Dataset(path) as ds:
        return {v: np.ma.filled(ds[v][:], np.nan) if ds[v].dtype != str else ds[v][:] for v in ds.variables}


@pytest.mark.parametrize("cells,buckets", [(1 << 20, 512), (20, 512), (1, 3)])
def test_same_file_whatever_the_buckets(tmp_path, monkeypatch, cells, buckets):
    import smerge.datasets.netcdf_writer as W

    a, b = grid(tmp_path / "a.nc", 1), grid(tmp_path / "b.nc", 2)
    monkeypatch.setattr(W, "BUCKET_CELLS", cells)
    monkeypatch.setattr(W, "MAX_BUCKETS", buckets)
    out = tmp_path / "o.nc"
    # a small window: pairs arrive out of grid order, across buckets
    assert main(["cgm", a, b, "--local", "-o", str(out), "--window", "9", "--increment", "2", "--vars-b", "p"]) == 0
    got = read(out)
    assert sorted(os.listdir(tmp_path)) == ["a.nc", "b.nc", "o.nc"]
    with netCDF4.Dataset(b) as ds:
        want = ds["p"][:]
    m = ~np.isnan(got["p_b"])
    assert m.sum() > 0 and np.array_equal(got["p_b"][m], np.asarray(want)[m])
    monkeypatch.setattr(W, "BUCKET_CELLS", 1 << 18)
    monkeypatch.setattr(W, "MAX_BUCKETS", 512)
    ref = tmp_path / "ref.nc"
    assert main(["cgm", a, b, "--local", "-o", str(ref), "--window", "9", "--increment", "2", "--vars-b", "p"]) == 0
    r = read(ref)
    assert np.array_equal(r["p_b"], got["p_b"], equal_nan=True)


def test_a_failed_run_leaves_no_spill(tmp_path, monkeypatch):
    import smerge.datasets.netcdf_writer as W

    a, b = grid(tmp_path / "a.nc", 1), grid(tmp_path / "b.nc", 2)
    monkeypatch.setattr(W, "BUCKET_CELLS", 1)

    def boom(self):
        raise RuntimeError("disk full")

    monkeypatch.setattr(W.GridWriter, "_close", boom)
    rc = main(["cgm", a, b, "--local", "-o", str(tmp_path / "o.nc"), "--vars-b", "p"])
    assert rc == 1
    assert sorted(os.listdir(tmp_path)) == ["a.nc", "b.nc"]
