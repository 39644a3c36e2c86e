"""The default variables of a netCDF input (docs/data.md, "Keys are matched by name"): every
variable on exactly the record dimensions (those of the numeric variable with the most), text
included (NC_STRING, char with a string length); variables of lower rank are read only when
named."""

from __future__ import annotations

import netCDF4
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from cli_run import run_cli  # noqa: E402 (tests/helpers: the shared CLI test helper)
from smerge.datasets import open_input

NAMES = ["ab", "cde", "fghij"]
LABELS = ["x", "yy", "zzz"]


def labelled(path):
    """T(time) with a char name(time, strlen) and an NC_STRING vname(time), none referenced."""
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("time", 3)
        ds.createDimension("strlen", 5)
        v = ds.createVariable("time", "f8", ("time",))
        v.units = "hours since 2000-01-01"
        v[:] = [0, 1, 2]
        ds.createVariable("T", "f4", ("time",))[:] = [1, 2, 3]
        ds.createVariable("name", "S1", ("time", "strlen"))[:] = netCDF4.stringtochar(np.array(NAMES, "S5"))
        ds.createVariable("vname", str, ("time",))[:] = np.array(LABELS, object)
    return str(path)


def test_text_variables_on_the_record_dimensions_are_read_by_default(tmp_path):
    src = open_input(labelled(tmp_path / "l.nc"))
    assert src.keys == ("time",) and src.grid.variables == ("T", "name", "vname")
    t = pa.Table.from_batches(list(src.batches()))
    assert t.column("name").to_pylist() == NAMES
    assert t.column("vname").to_pylist() == LABELS


def test_text_variables_reach_the_output(tmp_path, capsys):
    # before: the output had time, T, time_b, T_b only
    p = labelled(tmp_path / "l.nc")
    out = tmp_path / "o.parquet"
    rc, _, err = run_cli(capsys, "cgm", p, p, "--local", "-o", out)
    assert rc == 0, err
    t = pq.read_table(out)
    assert t.column_names == ["time", "T", "name", "vname", "time_b", "T_b", "name_b", "vname_b"]
    for c, want in (("name", NAMES), ("vname", LABELS), ("name_b", NAMES), ("vname_b", LABELS)):
        assert t.column(c).to_pylist() == want


def test_lower_rank_variables_are_read_only_when_named(tmp_path, capsys):
    path = str(tmp_path / "g.nc")
    with netCDF4.Dataset(path, "w") as ds:
        for d, n in (("time", 2), ("lat", 2), ("lon", 3)):
            ds.createDimension(d, n)
            ds.createVariable(d, "f8", (d,))[:] = np.arange(n)
        ds["time"].units = "hours since 2000-01-01"
        ds.createVariable("T", "f4", ("time", "lat", "lon"))[:] = np.arange(12).reshape(2, 2, 3)
        ds.createVariable("P", "f4", ("time",))[:] = [1000, 990]
        ds.createVariable("label", str, ("time",))[:] = np.array(["a", "b"], object)
    src = open_input(path)
    assert src.keys == ("time", "lat", "lon") and src.grid.variables == ("T",)
    out = tmp_path / "o.parquet"
    # named, P and label are records of their own dimension: one per time
    rc, _, err = run_cli(capsys, "cgm", path, path, "--local", "--vars-a", "P,label", "--vars-b", "P", "-o", out)
    assert rc == 0, err
    t = pq.read_table(out)
    assert t.column_names == ["time", "P", "label", "time_b", "P_b"]
    assert t.column("P_b").to_pylist() == [1000.0, 990.0] and t.column("label").to_pylist() == ["a", "b"]
