"""netCDF output of a CGM run on Spark keeps geolocation as --local does (docs/data.md, "Outputs")."""

from __future__ import annotations

import netCDF4
import numpy as np
import pytest
from cf_files import dangling, station_report

from smerge.jobs import CGMJob, prepare, run_local
from smerge.spark.cgm.runner import run_cgm_spark


def contents(path) -> dict:
    """Every variable's dimensions, raw values and attributes (the file's history aside)."""
    out = {}
    with netCDF4.Dataset(path) as ds:
        for n, v in ds.variables.items():
            v.set_auto_maskandscale(False)
            v.set_auto_chartostring(False)
            out[n] = (v.dimensions, np.asarray(v[...]), {a: v.getncattr(a) for a in v.ncattrs()})
    return out


@pytest.mark.slow
def test_station_report_on_spark_keeps_geolocation(tmp_path, spark):
    a, b = tmp_path / "a.nc", tmp_path / "b.nc"
    station_report(a)
    station_report(b, b=True, drop=3)
    base = dict(a=str(a), b=str(b), keys_a=("time", "lat", "lon"), batch_rows=2)
    run_local(prepare(CGMJob(output=str(tmp_path / "local.nc"), **base)))
    run_cgm_spark(prepare(CGMJob(output=str(tmp_path / "spark.nc"), **base)), partitions=2, spark=spark)
    out = str(tmp_path / "spark.nc")
    assert dangling(out) == []
    got, want, src = contents(out), contents(tmp_path / "local.nc"), contents(a)
    assert {"lat", "lon", "time", "station_name", "p", "q"} <= got.keys() == want.keys()
    for n in ("lat", "lon", "time", "station_name"):
        np.testing.assert_array_equal(got[n][1], src[n][1], err_msg=n)
        assert got[n][2].keys() == src[n][2].keys(), n
    for n in got:
        assert got[n][0] == want[n][0], n
        np.testing.assert_array_equal(got[n][1], want[n][1], err_msg=n)
        assert got[n][2].keys() == want[n][2].keys(), n
    np.testing.assert_array_equal(got["q"][1], [100, 101, 102, np.nan, 104, 105])
