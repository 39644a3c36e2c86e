"""Array indices are keys only when nothing locates the dimension in either input
(docs/data.md, "Keys are matched by name"): an index of A against a dimension of B that an
auxiliary coordinate locates (lon(x), a sub-region elsewhere) is refused, in both directions."""

from __future__ import annotations

import netCDF4
import numpy as np
import pyarrow.parquet as pq
import pytest

from cli_run import run_cli  # noqa: E402 (tests/helpers: the shared CLI test helper)


def grid(path, name, *, lon=None, mark="units"):
    """``name(y, x)`` on y = 0, 1, 2 (degrees_north) and x of 4 without a coordinate variable;
    ``lon``: values of an auxiliary coordinate lon(x), marked by ``mark``."""
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("y", 3)
        ds.createDimension("x", 4)
        v = ds.createVariable("y", "f8", ("y",))
        v.units = "degrees_north"
        v[:] = np.arange(3)
        if lon is not None:
            v = ds.createVariable("lon", "f8", ("x",))
            v[:] = lon
            if mark == "units":
                v.units = "degrees_east"
        v = ds.createVariable(name, "f4", ("y", "x"))
        v[:] = np.arange(12).reshape(3, 4)
        if lon is not None and mark == "coordinates":
            v.coordinates = "lon"
    return str(path)


@pytest.mark.parametrize("cmd", ["cgm", "rtm"])
@pytest.mark.parametrize("mark, how", [("units", "units degrees_east"), ("coordinates", "named in coordinates")])
def test_index_against_a_located_dimension_is_refused(cmd, mark, how, tmp_path, capsys):
    # before: exit 0, 12 pairs by array index although B's x is a sub-region at 30-60 E
    a = grid(tmp_path / "a.nc", "V")
    b = grid(tmp_path / "b_sub.nc", "W", lon=[30.0, 40.0, 50.0, 60.0], mark=mark)
    out = tmp_path / "o.parquet"
    rc, _, err = run_cli(capsys, cmd, a, b, "--local", "-o", out)
    assert (rc, err) == (2, (
        f"smerge: error: {a}: dimension 'x' (A) has no coordinate variable, so its records would be keyed by array "
        f"index, but {b} locates its dimension 'x' by 'lon' ({how}): index i of one file need not be index i of "
        f"the other (a sub-region, another grid); give 'x' the same coordinate in {a}, or name keys that locate "
        "the records in both with --keys/--keys-b\n"))
    assert not out.exists()
    # the other direction: A's key is lon, which B does not have
    rc, _, err = run_cli(capsys, cmd, b, a, "--local", "-o", out)
    assert rc == 2 and "B has no 'lon', a key of A (y,lon)" in err


def test_index_key_named_on_a_located_dimension_is_refused(tmp_path, capsys):
    b = grid(tmp_path / "b.nc", "W", lon=[30.0, 40.0, 50.0, 60.0])
    rc, _, err = run_cli(capsys, "cgm", b, b, "--local", "--keys", "y,x", "-o", tmp_path / "o.parquet")
    assert (rc, err) == (2, (
        f"smerge: error: {b}: dimension 'x' (A) is keyed by array index, but 'lon' (units degrees_east) locates it: "
        "indices are not places; name the variable that locates it as the key with --keys/--keys-b\n"))


def test_index_against_index_of_the_same_size_pairs_by_index(tmp_path, capsys):
    a = grid(tmp_path / "a.nc", "V")
    b = grid(tmp_path / "b.nc", "W")
    out = tmp_path / "o.parquet"
    rc, _, err = run_cli(capsys, "cgm", a, b, "--local", "-o", out, "--with-ids")
    assert rc == 0, err
    t = pq.read_table(out)
    assert t.column("a_row").to_pylist() == list(range(12))
    assert t.column("b_row").to_pylist() == list(range(12))
    assert t.column("x").to_pylist() == [0, 1, 2, 3] * 3
    assert t.column("W").to_pylist() == [float(i) for i in range(12)]


def test_located_dimension_pairs_by_its_coordinate(tmp_path, capsys):
    # both located by lon: the key is lon, so B's sub-region pairs the places it shares with A
    a = grid(tmp_path / "a.nc", "V", lon=[0.0, 10.0, 20.0, 30.0])
    b = grid(tmp_path / "b.nc", "W", lon=[20.0, 30.0, 40.0, 50.0])
    out = tmp_path / "o.parquet"
    rc, _, err = run_cli(capsys, "cgm", a, b, "--local", "-o", out, "--with-ids")
    assert rc == 0, err
    t = pq.read_table(out)
    assert t.column("lon").to_pylist() == [20.0, 30.0] * 3
    assert t.column("a_row").to_pylist() == [2, 3, 6, 7, 10, 11]
    assert t.column("b_row").to_pylist() == [0, 1, 4, 5, 8, 9]
