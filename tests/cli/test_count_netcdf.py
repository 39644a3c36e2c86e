"""smerge count on netCDF: the records every other command reads (default keys and data variables,
one per grid point), the item a coordinate, a key or a data variable, the time a coordinate or a
decoded CF time. Local counts equal the same file served over grpc:// and an independent oracle
(xarray's flattened records, pandas groupby)."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys

import cftime
import netCDF4
import numpy as np
import pyarrow.parquet as pq
import pytest
import xarray as xr

from cli_run import run_cli  # noqa: E402 (tests/helpers: the shared CLI test helper)

SMERGE = [sys.executable, "-m", "smerge"]
TOKEN = "count-netcdf-token-0123456789"
PSTORM = "/usr/share/ncarg/data/cdf/Pstorm.cdf"
DAY_US = 86400 * 10**6


def count_table(capsys, tmp_path, source, *args, name="c"):
    out = tmp_path / f"{name}.parquet"
    rc, so, err = run_cli(capsys, "count", source, *args, "-o", out, "--overwrite", "--json")
    assert rc == 0, err
    return pq.read_table(out), json.loads(so)


def rows(table):
    """(start, item, count) per answer, every answer exact."""
    assert all(table.column("exact").to_pylist())
    return sorted(zip(table.column("start").to_pylist(), table.column("item").to_pylist(),
                      [int(c) for c in table.column("count").to_pylist()]))


def oracle(path, var, item, time, every, *, calendar=None):
    """pandas groupby on xarray's flattened records of ``var``: (interval start, item, count)."""
    with xr.open_dataset(path, decode_times=xr.coders.CFDatetimeCoder(use_cftime=True)) as ds:
        df = ds[var].to_dataframe().reset_index()
    t = df[time]
    if calendar is not None:  # decoded dates -> microseconds since 1970-01-01 in the calendar
        epoch = cftime.datetime(1970, 1, 1, calendar=calendar)
        t = t.map(lambda d: (d - epoch) // dt.timedelta(microseconds=1))
    df["start"] = (t.astype("int64") // every) * every
    g = df.groupby(["start", item]).size()
    return sorted((int(s), i.item() if hasattr(i, "item") else i, int(n)) for (s, i), n in g.items())


def serve(path, tmp_path, *extra):
    tok = tmp_path / "token"
    tok.write_text(TOKEN)
    p = subprocess.Popen([*SMERGE, "serve", str(path), "--host", "127.0.0.1", "--port", "0", "--token-file",
                          str(tok), *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = p.stdout.readline().strip()
    if not url.startswith("grpc"):
        p.kill()
        pytest.fail(p.stderr.read())
    return p, url


@pytest.fixture
def noleap_file(tmp_path):
    """time (6-hourly across 28 February into March in noleap: no 29th) x lat x lon; kind, an
    integer data variable, p a float one."""
    path = tmp_path / "noleap.nc"
    rng = np.random.default_rng(3)
    nt, ny, nx = 20, 3, 4
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("time", nt)
        ds.createDimension("lat", ny)
        ds.createDimension("lon", nx)
        tv = ds.createVariable("time", "f8", ("time",))
        tv.units = "hours since 1999-02-27 00:00"
        tv.calendar = "noleap"
        tv[:] = np.arange(nt) * 6.0
        ds.createVariable("lat", "f4", ("lat",))[:] = [-10.0, 0.0, 10.0]
        ds.createVariable("lon", "f4", ("lon",))[:] = [0.0, 90.0, 180.0, 270.0]
        ds.createVariable("kind", "i4", ("time", "lat", "lon"))[:] = rng.integers(0, 4, (nt, ny, nx))
        ds.createVariable("p", "f4", ("time", "lat", "lon"))[:] = rng.random((nt, ny, nx))
    return path


@pytest.mark.skipif(not os.path.exists(PSTORM), reason="NCAR example data not installed")
def test_pstorm_coordinate_item_plain_time(tmp_path, capsys):
    """The reported case: lat counted over the plain-number timestep, every 24."""
    table, s = count_table(capsys, tmp_path, PSTORM, "--item", "lat", "--time", "timestep", "--every", 24)
    got = rows(table)
    assert got == oracle(PSTORM, "p", "lat", "timestep", 24)
    assert s["records_raw"] == 64 * 33 * 36 and sum(n for *_, n in got) == 64 * 33 * 36
    assert got[0] == (0, 20.0, 4 * 36)  # timesteps 0, 6, 12, 18 x 36 longitudes


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(PSTORM), reason="NCAR example data not installed")
def test_pstorm_local_equals_served(tmp_path, capsys, monkeypatch):
    p, url = serve(PSTORM, tmp_path)
    try:
        monkeypatch.setenv("SMERGE_TOKEN", TOKEN)
        for args in (["--item", "lat", "--time", "timestep", "--every", "24"],
                     ["--item", "timestep", "--time", "lon", "--every", "10"],
                     ["--item", "lon", "--time", "timestep", "--from", "30", "--to", "100"]):
            local, ls = count_table(capsys, tmp_path, PSTORM, *args, name="local")
            served, ss = count_table(capsys, tmp_path, url, *args, name="served")
            assert local.equals(served), args
            assert ls["mode"] == "local" and ss["mode"] == "stream" and ls["records_raw"] == ss["records_raw"]
    finally:
        p.terminate()
        p.wait(30)


def test_noleap_time_data_variable_item_every_day(noleap_file, tmp_path, capsys):
    table, _ = count_table(capsys, tmp_path, noleap_file, "--item", "kind", "--time", "time", "--every", "1d")
    got = rows(table)
    assert got == oracle(noleap_file, "kind", "kind", "time", DAY_US, calendar="noleap")
    f = table.schema.field("start")
    assert f.metadata[b"calendar"] == b"noleap" and table.schema.field("end").metadata[b"calendar"] == b"noleap"
    # 27 and 28 February, then 1 March: 20 six-hourly steps are 5 days, no 29th in noleap
    epoch = cftime.datetime(1970, 1, 1, calendar="noleap")
    days = sorted({s for s, _, _ in got})
    assert [str(epoch + dt.timedelta(microseconds=d)) for d in days] == [
        "1999-02-27 00:00:00", "1999-02-28 00:00:00", "1999-03-01 00:00:00", "1999-03-02 00:00:00",
        "1999-03-03 00:00:00"]
    assert sum(n for *_, n in got) == 20 * 3 * 4


def test_noleap_range_and_hours(noleap_file, tmp_path, capsys):
    """--from/--to are dates in the time's calendar: 28 February to 1 March is one noleap day."""
    table, _ = count_table(capsys, tmp_path, noleap_file, "--item", "lat", "--time", "time",
                           "--from", "1999-02-28", "--to", "1999-03-01")
    assert rows(table) == [(table.column("start")[0].as_py(), lat, 4 * 4) for lat in (-10.0, 0.0, 10.0)]
    table, _ = count_table(capsys, tmp_path, noleap_file, "--item", "lon", "--time", "time", "--every", "12h")
    assert rows(table) == oracle(noleap_file, "p", "lon", "time", 12 * 3600 * 10**6, calendar="noleap")
    rc, _, err = run_cli(capsys, "count", noleap_file, "--item", "lat", "--time", "time", "--from", "1999-02-29",
                         "--to", "1999-03-01")
    assert rc == 2 and "noleap" in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_noleap_local_equals_served(noleap_file, tmp_path, capsys, monkeypatch):
    """The plain stream, and the summarised one (lifetime 1d in the noleap calendar, c = 0: exact)."""
    p, url = serve(noleap_file, tmp_path, "--keys", "time,lat,lon", "--summarize", "kind", "--time", "time",
                   "--lifetime", "1d")
    try:
        monkeypatch.setenv("SMERGE_TOKEN", TOKEN)
        for args, mode in ((["--item", "kind", "--time", "time", "--every", "1d"], "summary"),
                           (["--item", "lat", "--time", "time", "--from", "1999-02-28", "--to", "1999-03-01"],
                            "stream")):
            local, _ = count_table(capsys, tmp_path, noleap_file, *args, name="local")
            served, s = count_table(capsys, tmp_path, url, *args, name="served")
            assert local.equals(served, check_metadata=True), args
            assert s["mode"] == mode
    finally:
        p.terminate()
        p.wait(30)


def test_plain_number_time_and_a_unit_on_it(tmp_path, capsys):
    path = tmp_path / "plain.nc"
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("step", 10)
        ds.createDimension("x", 2)
        ds.createVariable("step", "i4", ("step",))[:] = np.arange(10) * 5
        ds.createVariable("x", "f4", ("x",))[:] = [1.0, 2.0]
        ds.createVariable("cls", "i2", ("step", "x"))[:] = (np.arange(20) % 3).reshape(10, 2)
    table, _ = count_table(capsys, tmp_path, path, "--item", "cls", "--time", "step", "--every", 20)
    assert rows(table) == oracle(path, "cls", "cls", "step", 20)
    assert rows(table)[:3] == [(0, 0, 3), (0, 1, 3), (0, 2, 2)]
    rc, _, err = run_cli(capsys, "count", path, "--item", "cls", "--time", "step", "--every", "1d")
    assert rc == 2 and "has a unit but the time column is a plain number" in err


def test_bad_item_and_time_names(noleap_file, capsys):
    rc, _, err = run_cli(capsys, "count", noleap_file, "--item", "nope", "--time", "time", "--every", "1d")
    line = err.strip()
    assert rc == 2 and "\n" not in line and "Traceback" not in line
    assert "--item 'nope'" in line and str(noleap_file) in line and "it has time, lat, lon, kind, p" in line
    rc, _, err = run_cli(capsys, "count", noleap_file, "--item", "kind", "--time", "when", "--every", "1d")
    assert rc == 2 and "--time 'when'" in err and str(noleap_file) in err and "it has" in err
