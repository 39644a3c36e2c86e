"""An _Unsigned byte variable with valid_min or valid_range and no _FillValue is valid CF that
netCDF4-python (1.7) cannot mask (its default fill value does not convert to uint8): exit 2 in
one line saying what to add, not an internal error (exit 1). With a _FillValue it is read."""

from __future__ import annotations

import netCDF4
import numpy as np
import pytest

from smerge.cli.main import main


def _file(path, attrs):
    with netCDF4.Dataset(path, "w") as d:
        d.createDimension("x", 6)
        v = d.createVariable("x", "f8", ("x",))
        v[:] = np.arange(6)
        q = d.createVariable("Q", "i1", ("x",), fill_value=attrs.pop("_FillValue", None))
        q._Unsigned = "true"
        for k, a in attrs.items():
            setattr(q, k, a)
        q.set_auto_maskandscale(False)
        q[:] = np.array([0, 1, 127, -128, -127, -1], "i1")
    return str(path)


@pytest.mark.parametrize("attrs", [{"valid_min": np.int8(5)}, {"valid_range": np.array([0, -56], "i1")}])
def test_unsigned_with_valid_bounds_and_no_fill_is_exit_2(tmp_path, capsys, attrs):
    f = _file(tmp_path / "q.nc", attrs)
    assert main(["cgm", f, f, "--local", "-o", str(tmp_path / "o.parquet")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "variable 'Q' cannot be decoded by netCDF4-python" in err[0], err
    assert "needs a _FillValue attribute" in err[0]
    assert not (tmp_path / "o.parquet").exists()


def test_with_a_fill_value_it_is_read(tmp_path):
    import pyarrow.parquet as pq

    f = _file(tmp_path / "q.nc", {"valid_min": np.int8(5), "_FillValue": np.int8(-1)})
    assert main(["cgm", f, f, "--local", "-o", str(tmp_path / "o.parquet")]) == 0
    q = pq.read_table(tmp_path / "o.parquet")["Q"].to_pylist()
    assert q == [None, None, 127, 128, 129, None]  # below valid_min 5 and the fill (255) masked
