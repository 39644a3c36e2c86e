"""A grid dimension that no key is on (docs/data.md, "Keys are matched by name"): the records
along it have the same keys, so which of them pairs would be arbitrary. Either input with such
a dimension is refused, by cgm and rtm alike."""

from __future__ import annotations

import netCDF4
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from cli_run import run_cli  # noqa: E402 (tests/helpers: the shared CLI test helper)

LEVELS = (0.0, 250.0, 500.0)


def grid(path, *, level: bool, extra_2d: bool = False, offset: float = 0.0):
    """T on (time, [level,] lat, lon), 2 x [3 x] 2 x 2, T = offset + 10 * (flat index)."""
    dims = [("time", 2)] + ([("level", 3)] if level else []) + [("lat", 2), ("lon", 2)]
    with netCDF4.Dataset(path, "w") as ds:
        for name, n in dims:
            ds.createDimension(name, n)
            v = ds.createVariable(name, "f8", (name,))
            v[:] = LEVELS[:n] if name == "level" else np.arange(n, dtype=float)
        ds["time"].units = "hours since 2000-01-01"
        if level:
            ds["level"].units = "hPa"
            ds["level"].positive = "down"
        shape = tuple(n for _, n in dims)
        ds.createVariable("T", "f4", tuple(d for d, _ in dims))[:] = offset + np.arange(np.prod(shape)).reshape(shape) * 10
        if extra_2d:  # a lower-rank variable on the key dimensions only
            ds.createVariable("Tsfc", "f4", ("time", "lat", "lon"))[:] = 1000 + np.arange(8).reshape(2, 2, 2)
    return str(path)


@pytest.fixture
def stations(tmp_path):
    p = tmp_path / "st.parquet"
    pd.DataFrame({"time": pd.to_datetime(["2000-01-01 00:00", "2000-01-01 01:00"]), "lat": [0.0, 1.0],
                  "lon": [1.0, 0.0], "obs": [1.0, 2.0]}).to_parquet(p, index=False)
    return str(p)


def message(b, side, var="'T'", opt="--vars-b"):
    return (f"smerge: error: {b}: variable {var} ({side}) has the dimension 'level' (3) that no key (time,lat,lon) "
            "is on, so its records along it have the same keys and any of them could pair; select one level first "
            "(ncks -d level,0 or xarray's .isel(level=0)), name variables on the key dimensions only with "
            f"{opt}, or add 'level' as a key of both inputs when it has a coordinate\n")


@pytest.mark.parametrize("cmd", ["cgm", "rtm"])
def test_b_level_not_a_key_is_refused(cmd, stations, tmp_path, capsys):
    # before: exit 0, every station paired with level 0 (T 10 and 140) and no level column
    b = grid(tmp_path / "b4d.nc", level=True)
    out = tmp_path / "o.parquet"
    rc, _, err = run_cli(capsys, cmd, stations, b, "--local", "--keys", "time,lat,lon", "-o", out)
    assert (rc, err) == (2, message(b, "B"))
    assert not out.exists()


@pytest.mark.parametrize("cmd", ["cgm", "rtm"])
def test_b_level_not_a_key_grid_against_grid(cmd, tmp_path, capsys):
    a = grid(tmp_path / "a3d.nc", level=False)  # default keys time, lat, lon
    b = grid(tmp_path / "b4d.nc", level=True)
    rc, _, err = run_cli(capsys, cmd, a, b, "--local", "-o", tmp_path / "o.parquet")
    assert (rc, err) == (2, message(b, "B"))


def test_default_b_variable_of_highest_rank_is_refused_and_vars_b_fixes_it(stations, tmp_path, capsys):
    # the default variables are those of the highest rank (T), so B is refused; Tsfc on the key
    # dimensions, named with --vars-b, pairs one record per station
    b = grid(tmp_path / "b.nc", level=True, extra_2d=True)
    out = tmp_path / "o.parquet"
    rc, _, err = run_cli(capsys, "cgm", stations, b, "--local", "--keys", "time,lat,lon", "-o", out)
    assert (rc, err) == (2, message(b, "B"))
    rc, _, err = run_cli(capsys, "cgm", stations, b, "--local", "--keys", "time,lat,lon", "--vars-b", "Tsfc",
                         "-o", out, "--with-ids")
    assert rc == 0, err
    t = pq.read_table(out)
    # station 0: time 0, lat 0, lon 1 -> flat 1; station 1: time 1, lat 1, lon 0 -> flat 4 + 2 = 6
    assert t.column("Tsfc").to_pylist() == [1001.0, 1006.0]
    assert t.column("b_row").to_pylist() == [1, 6]


def test_one_level_selected_pairs_that_level(stations, tmp_path, capsys):
    import xarray as xr

    b = grid(tmp_path / "b4d.nc", level=True)
    sel = tmp_path / "b500.nc"
    with xr.open_dataset(b) as ds:
        ds.isel(level=2, drop=True).to_netcdf(sel)
    out = tmp_path / "o.parquet"
    rc, _, err = run_cli(capsys, "cgm", stations, sel, "--local", "--keys", "time,lat,lon", "-o", out)
    assert rc == 0, err
    # T index (time, level 2, lat, lon): 12*time + 8 + 2*lat + lon, times 10
    assert pq.read_table(out).column("T").to_pylist() == [90.0, 220.0]


@pytest.mark.parametrize("cmd", ["cgm", "rtm"])
def test_a_level_not_a_key_is_refused(cmd, tmp_path, capsys):
    # A's three levels share their keys: cgm pairs each B record once, rtm once per A window,
    # so only one level (the first) would pair, the others counted unmatched
    a = grid(tmp_path / "a4d.nc", level=True, offset=0.5)
    b = grid(tmp_path / "b3d.nc", level=False)
    rc, _, err = run_cli(capsys, cmd, a, b, "--local", "--keys", "time,lat,lon", "-o", tmp_path / "o.parquet")
    assert (rc, err) == (2, message(a, "A", opt="--vars-a"))


def test_level_as_key_of_both_pairs_every_level(tmp_path, capsys):
    a = grid(tmp_path / "a4d.nc", level=True, offset=0.5)
    b = grid(tmp_path / "b4d.nc", level=True)
    out = tmp_path / "o.parquet"
    rc, _, err = run_cli(capsys, "cgm", a, b, "--local", "-o", out, "--with-ids")  # default keys time,level,lat,lon
    assert rc == 0, err
    t = pq.read_table(out)
    assert t.column("b_row").to_pylist() == list(range(24))
    assert t.column("T_b").to_pylist() == (np.arange(24) * 10.0).tolist()


@pytest.mark.slow
def test_a_level_not_a_key_is_refused_against_a_server(tmp_path):
    import subprocess
    import sys

    a = grid(tmp_path / "a4d.nc", level=True)
    b = grid(tmp_path / "b3d.nc", level=False)
    (tmp_path / "tok").write_text("unkeyed-dims-token")
    p = subprocess.Popen([sys.executable, "-m", "smerge", "serve", b, "--port", "0", "--token-file",
                          str(tmp_path / "tok")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = p.stdout.readline().strip()
        out = tmp_path / "o.parquet"
        r = subprocess.run([sys.executable, "-m", "smerge", "rtm", a, "--server", url, "--token-file",
                            str(tmp_path / "tok"), "--local", "--keys", "time,lat,lon", "-o", str(out)],
                           capture_output=True, text=True)
        assert (r.returncode, r.stderr) == (2, message(a, "A", opt="--vars-a"))
        assert not out.exists()
    finally:
        p.terminate()
        p.wait(30)


def test_index_build_of_a_b_with_a_dimension_no_key_is_on_is_refused(tmp_path, capsys):
    """`smerge index build` (and `serve`, which shares the check) of such a B: an rtm --server
    run against it could pair any level; exit 2 before anything is written."""
    b = grid(tmp_path / "b4d.nc", level=True)
    out = tmp_path / "idx"
    rc, _, err = run_cli(capsys, "index", "build", b, "--keys", "time,lat,lon", "-o", out)
    assert rc == 2 and err == message(b, "B", opt="--vars") and not out.exists()


def test_serve_of_a_b_with_a_dimension_no_key_is_on_is_refused(tmp_path, capsys):
    b = grid(tmp_path / "b4d.nc", level=True)
    rc, _, err = run_cli(capsys, "serve", b, "--keys", "time,lat,lon")
    assert rc == 2 and err == message(b, "B", opt="--vars")
