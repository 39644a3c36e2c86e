"""Inputs built to take the machine: a 6 KB netCDF file declaring 2**31 records, a FIFO, a
megabytes-long CSV header, requests for more memory than there is. Each is refused before it
allocates (exit 2, one line), under an address-space limit the test sets itself."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time

import netCDF4
import numpy as np
import pyarrow as pa
import pytest

from smerge.datasets import open_input

LIMIT = 3 << 30  # bytes of address space for each smerge process started here
SMERGE = [sys.executable, "-m", "smerge"]


def capped():
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def run(*args, cwd=None, timeout=120, stdin=subprocess.DEVNULL):
    t0 = time.monotonic()
    p = subprocess.run([*SMERGE, *map(str, args)], capture_output=True, text=True, preexec_fn=capped, cwd=cwd,
                       timeout=timeout, stdin=stdin)
    return p.returncode, p.stdout, p.stderr, time.monotonic() - t0


def one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("smerge: error: "), err
    assert "Traceback" not in err
    return lines[0]


def bomb(path, kind):
    """6 KB netCDF-4 files declaring a dimension of 2**31 with nothing written."""
    with netCDF4.Dataset(path, "w") as ds:
        if kind == "coordinate":  # a 1-D dimension with its coordinate variable
            ds.createDimension("x", 2**31)
            ds.createVariable("x", "f8", ("x",), chunksizes=(1 << 20,))
            ds.createVariable("T", "f4", ("x",), chunksizes=(1 << 20,))
        elif kind == "time":  # the outer dimension's CF time coordinate
            ds.createDimension("time", 2**31)
            ds.createDimension("y", 3)
            v = ds.createVariable("time", "f8", ("time",), chunksizes=(1 << 20,))
            v.units = "hours since 2000-01-01"
            ds.createVariable("T", "f4", ("time", "y"), chunksizes=(1 << 20, 3))
        else:  # an inner dimension of 2**31: one slab of the outer dimension is 2**31 records
            ds.createDimension("t", 2)
            ds.createDimension("y", 2**31)
            ds.createVariable("T", "f4", ("t", "y"), chunksizes=(1, 1 << 20))
    assert os.path.getsize(path) < 64 << 10
    return str(path)


@pytest.mark.parametrize("kind,needle", [("coordinate", "NaN or missing"), ("time", "'time'"),
                                          ("inner", "one slab of its outer dimension 't'")])
def test_dimension_bomb_cgm_is_refused_in_bounded_memory(kind, needle, tmp_path):
    f = bomb(tmp_path / "bomb.nc", kind)
    rc, so, se, secs = run("cgm", f, f, "--local", "-o", tmp_path / "o.parquet")
    assert rc == 2, se
    assert needle in one_line(se) and "bomb.nc" in se
    assert not (tmp_path / "o.parquet").exists()


@pytest.mark.parametrize("cmd", [("index", "build", "{f}", "-o", "{d}/idx"), ("rtm", "{f}", "{f}", "--local", "-o",
                                                                             "{d}/o.parquet")])
def test_dimension_bomb_index_is_refused_before_reading(cmd, tmp_path):
    f = bomb(tmp_path / "bomb.nc", "coordinate")
    args = [a.format(f=f, d=tmp_path) for a in cmd]
    rc, so, se, secs = run(*args, "--nan-keys", "unmatched")
    assert rc == 2, se
    line = one_line(se)
    assert "2,147,483,648 records" in line and "memory" in line and "bomb.nc" in line
    assert sorted(os.listdir(tmp_path)) == ["bomb.nc"]


def test_long_outer_coordinate_is_read_per_slab(tmp_path, monkeypatch):
    """An outer coordinate (or index) longer than WHOLE_COORDINATE is read with each slab: the
    records are the same as when it is read whole, in A's order too."""
    import smerge.datasets.netcdf as nc

    path = tmp_path / "g.nc"
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("time", 7)
        ds.createDimension("y", 3)
        ds.createDimension("x", 4)
        v = ds.createVariable("time", "f8", ("time",))
        v.units = "hours since 2000-01-01 06:00"
        v[:] = np.arange(7) * 6.0
        v[3] = np.ma.masked
        ds.createVariable("y", "f8", ("y",))[:] = [3.0, 2.0, 1.0]
        ds.createVariable("T", "f4", ("x", "y", "time"))[:] = np.arange(84).reshape(4, 3, 7)
    order = [("time", 1), ("y", 1), ("x", 1)]

    def table(**kw):
        src = open_input(str(path), keys=["time", "y", "x"], batch_rows=10, **kw)
        return pa.Table.from_batches(list(src.batches())), src

    whole, src_w = table(order=order)
    assert src_w.grid.reordered
    monkeypatch.setattr(nc, "WHOLE_COORDINATE", 2)
    lazy, src_l = table(order=order)
    assert src_l.schema == src_w.schema
    assert lazy.equals(whole)
    assert lazy["time"].null_count == 12


def test_fifo_and_pipe_inputs_are_refused_at_once(tmp_path, ncar_dir):
    fifo = tmp_path / "in.parquet"
    os.mkfifo(fifo)
    rc, so, se, secs = run("cgm", fifo, f"{ncar_dir}/Pstorm.cdf", "--local", "-o", tmp_path / "o.parquet",
                           "--keys", "timestep,lat,lon", timeout=120)
    assert rc == 2 and "FIFO" in one_line(se) and secs < 60  # refused, not blocked opening the FIFO
    # /dev/stdin from a pipe: refused, not read with its first bytes gone
    p = subprocess.Popen(["cat", f"{ncar_dir}/Pstorm.cdf"], stdout=subprocess.PIPE)
    rc, so, se, secs = run("cgm", f"{ncar_dir}/Pstorm.cdf", "/dev/stdin", "--local", "-o", tmp_path / "o.parquet",
                           stdin=p.stdout, timeout=120)
    p.stdout.close()
    p.kill()
    p.wait()
    assert rc == 2 and "not a regular file" in one_line(se)
    assert sorted(os.listdir(tmp_path)) == ["in.parquet"]


def test_huge_window_kappa_and_gen_are_refused_before_allocating(tmp_path, ncar_dir):
    p = f"{ncar_dir}/Pstorm.cdf"
    rc, so, se, secs = run("cgm", p, p, "--local", "--window", "1000000000", "-o", tmp_path / "o.parquet")
    assert rc == 2 and "--window 1,000,000,000" in one_line(se) and "lower --window" in se
    rc, so, se, secs = run("gen", tmp_path / "g.parquet", "--records", "100000000000", "--randomize", "5")
    assert rc == 2 and "--randomize" in one_line(se) and "memory" in se and "--window" not in se
    rc, so, se, secs = run("gen", tmp_path / "g.parquet", "--records", "1000000000000")
    assert rc == 2 and "free on its filesystem" in one_line(se) and "--window" not in se
    assert os.listdir(tmp_path) == []


def test_long_csv_header(tmp_path):
    """A 10 MB header line is read (Arrow's block grows to hold it); a name that long is cut in
    messages; a header over 64 MiB is refused in one line."""
    name = "x" * 10_000_000
    path = tmp_path / "wide.csv"
    path.write_text(f"k,{name}\n1,2\n2,3\n")
    src = open_input(str(path), keys=["k"])
    assert pa.Table.from_batches(list(src.batches())).num_rows == 2
    rc, so, se, secs = run("cgm", path, path, "--local", "--keys", "nosuch", "-o", tmp_path / "o.parquet")
    line = one_line(se)
    assert rc == 2 and "no key 'nosuch'" in line and len(line) < 2100 and "10,000,000 characters" in line
    huge = tmp_path / "huge.csv"
    with open(huge, "w") as f:
        f.write("k," + "y" * (65 << 20) + "\n1,2\n")
    rc, so, se, secs = run("cgm", huge, huge, "--local", "--keys", "k", "-o", tmp_path / "o.parquet")
    assert rc == 2 and "header line is longer than 64 MiB" in one_line(se)
