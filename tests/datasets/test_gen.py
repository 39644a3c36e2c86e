"""`smerge.datasets.gen` parameter checks (issue 9 items 5-6): every bad value is a UsageError
naming the option and its accepted range, raised before any record or file is made."""

from __future__ import annotations

import math

import netCDF4
import numpy as np
import pytest

from smerge.datasets.gen import GenParams, check_netcdf_names, generate, write_netcdf
from smerge.errors import UsageError


@pytest.mark.parametrize("kw, words", [
    (dict(variables=("lat", "p")), "'lat' is a coordinate column"),
    (dict(variables=("time",)), "'time' is a coordinate column"),
    (dict(variables=("Lon",)), "clashes with the coordinate column 'lon'"),
    (dict(variables=("p", "p")), "names 'p' twice"),
    (dict(variables=("p", "P")), "differing only in case"),
    (dict(variables=()), "variables is empty"),
    (dict(variables=("a\nb",)), "control character"),
    (dict(variables=(" p",)), "spaces around it"),
    (dict(seed=-1), "seed is -1; give an integer >= 0"),
    (dict(jitter=math.inf), "jitter is inf; give a finite number of degrees from 0 to 360"),
    (dict(jitter=math.nan), "jitter is nan"),
    (dict(jitter=-0.1), "jitter is -0.1"),
    (dict(jitter=1e300), "from 0 to 360"),
    (dict(randomize=math.nan), "randomize is nan; give a percentage from 0 to 100"),
    (dict(randomize=100.5), "randomize is 100.5"),
    (dict(randomize=-1), "randomize is -1"),
    (dict(records=0), "records is 0; give an integer from 1 to 10^12"),
    (dict(records=-5), "records is -5"),
    (dict(records=10**20), "records is 100000000000000000000"),
    (dict(records=10**12, nlat=1, nlon=1), "past the last date a timestamp holds"),
    (dict(displacement=-1), "displacement is -1; give a number of records from 0 to 10^12"),
    (dict(displacement=10**20), "displacement is"),
    (dict(nlat=0), "NLAT is 0; give NLAT,NLON from 1 to 10^6 each"),
    (dict(nlon=10**11), "NLON is 100000000000"),
])
def test_bad_parameters_are_usage_errors(kw, words):
    args = dict(records=10, **kw) if "records" not in kw else kw
    with pytest.raises(UsageError) as e:
        GenParams(**args)
    assert words in str(e.value)
    assert "\n" not in str(e.value)


def test_limits_are_inclusive_and_numpy_scalars_pass():
    GenParams(records=10**12, jitter=360.0, randomize=100, displacement=10**12, nlat=10**6, nlon=10**6, seed=2**70)
    GenParams(records=np.int64(10), seed=np.int64(3), randomize=np.float64(5.0))


@pytest.mark.parametrize("name, words", [("a/b", "group path"), ("-x", "not a valid netCDF variable name"),
                                         ("x" * 300, "not a valid netCDF variable name")])
def test_netcdf_names_checked_without_a_file(tmp_path, monkeypatch, name, words):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as e:
        check_netcdf_names(GenParams(records=10, variables=(name, "p")))
    assert words in str(e.value)
    assert list(tmp_path.iterdir()) == []


def test_valid_unusual_names_write_every_column(tmp_path):
    """Unicode and dotted names are kept as given, each its own column beside time/lat/lon."""
    p = GenParams(records=12, nlat=2, nlon=3, variables=("é", "x.y"))
    check_netcdf_names(p)
    b = next(generate(p))
    assert b.schema.names == ["time", "lat", "lon", "é", "x.y"]
    write_netcdf(str(tmp_path / "g.nc"), p)
    with netCDF4.Dataset(tmp_path / "g.nc") as ds:
        assert set(ds.variables) == {"time", "lat", "lon", "é", "x.y"} and not ds.groups
        assert ds["time"].shape == (2,) and ds["é"].shape == (2, 2, 3)
