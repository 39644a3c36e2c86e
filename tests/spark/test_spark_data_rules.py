"""docs/data.md hold on Spark as in-process: keys by name (a transposed B), CF time on
one base (different reference dates, an offset), values masked by valid_range counted."""

from __future__ import annotations

import json

import netCDF4
import numpy as np
import pyarrow.parquet as pq
import pytest

from smerge.cli.main import main

pytestmark = pytest.mark.slow


def grid(path, *, order=("time", "lat", "lon"), units="hours since 2000-01-01 00:00", t0=0.0, seed=0):
    rng = np.random.default_rng(seed)
    sizes = {"time": 4, "lat": 5, "lon": 6}
    vals = {"time": t0 + np.arange(4) * 6.0, "lat": np.linspace(-20, 20, 5), "lon": np.linspace(0, 50, 6)}
    field = rng.integers(0, 120, size=(4, 5, 6)).astype("i2")
    with netCDF4.Dataset(path, "w") as ds:
        for d in order:
            ds.createDimension(d, sizes[d])
            v = ds.createVariable(d, "f8", (d,))
            v[:] = vals[d]
        ds["time"].units = units
        p = ds.createVariable("p", "i2", tuple(order), fill_value=-1)
        p.valid_range = np.array([0, 100], "i2")
        p.set_auto_maskandscale(False)
        p[:] = np.transpose(field, [("time", "lat", "lon").index(d) for d in order])
    return str(path)


def run(capsys, *args):
    rc = main([str(a) for a in args])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    return json.loads(cap.out)


def test_spark_equals_local_on_transposed_offset_times_and_masks(tmp_path, capsys, spark):
    from smerge.jobs import CGMJob, prepare
    from smerge.spark.cgm.runner import run_cgm_spark

    a = grid(tmp_path / "a.nc")
    # B: same instants counted from 06:00 (values -6, 0, 6, 12), dimensions transposed.
    b = grid(tmp_path / "b.nc", order=("time", "lon", "lat"), units="hours since 2000-01-01 06:00", t0=-6.0, seed=1)
    out = tmp_path / "local.parquet"
    s_local = run(capsys, "cgm", a, b, "--local", "-o", out, "--with-ids", "--json")
    t_local = pq.read_table(out).sort_by([("a_row", "ascending")])
    assert s_local["matched"] == 120
    assert s_local["a_masked"] > 0 and s_local["b_masked"] > 0
    assert (np.asarray(t_local["lat"]) == np.asarray(t_local["lat_b"])).all()
    assert (np.asarray(t_local["time"].cast("int64")) == np.asarray(t_local["time_b"].cast("int64"))).all()
    for parts in (1, 2):
        o = str(tmp_path / f"spark{parts}.parquet")
        s = run_cgm_spark(prepare(CGMJob(a=a, b=b, output=o, with_ids=True)), partitions=parts, spark=spark)
        assert s["execution"] == "spark"
        assert (s["matched"], s["a_masked"], s["b_masked"]) == (120, s_local["a_masked"], s_local["b_masked"])
        assert pq.read_table(o).sort_by([("a_row", "ascending")]).equals(t_local)
