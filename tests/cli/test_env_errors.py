"""Environment errors are exit 2 with one line naming the cause and the path, the partial output
removed: a full disk (a small tmpfs, filled), the file size limit (RLIMIT_FSIZE with SIGXFSZ
ignored, so writes fail with EFBIG) in every writer; batch jobs files that are not jobs files or
would be overwritten; a nested column to CSV."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli_run import run_cli  # noqa: E402 (tests/helpers: the shared CLI test helper)
from tmpfs import mounted_tmpfs  # noqa: E402 (tests/helpers)

SMERGE = os.path.join(os.path.dirname(sys.executable), "smerge")


def limits(fsize: int | None):
    def pre():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
        if fsize is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    return pre


def run(*args, fsize: int | None = None):
    p = subprocess.run([SMERGE, *map(str, args)], preexec_fn=limits(fsize), capture_output=True, text=True,
                       timeout=600)
    return p.returncode, p.stdout, p.stderr


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "internal error" not in lines[0] and len(lines[0]) < 400, lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def ab(tmp_path_factory):
    d = tmp_path_factory.mktemp("inputs")
    for name, seed in (("a", 0), ("b", 1)):
        rc, _, err = run("gen", d / f"{name}.nc", "--records", 20_000, "--seed", seed, "--grid", "20,50")
        assert rc == 0, err
    return d / "a.nc", d / "b.nc"


@pytest.fixture
def full_dir(tmp_path):
    """A 1 MiB tmpfs with no byte free (root only; skipped where it cannot be mounted)."""
    with mounted_tmpfs(tmp_path / "full", "1m") as d:  # (the RLIMIT_FSIZE tests cover the writers elsewhere)
        fd = os.open(d / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError:
            pass
        finally:
            os.close(fd)
        yield d


def entries(d) -> list[str]:
    return sorted(n for n in os.listdir(d) if n != "filler")


OUTS = ["o.parquet", "o.csv", "o.arrow", "o.nc", "ds/"]


@pytest.mark.parametrize("out", OUTS)
def test_cgm_on_a_full_disk(ab, full_dir, out):
    rc, _, err = run("cgm", *ab, "--local", "-o", f"{full_dir}/{out}")
    line = one_line(err)
    assert rc == 2 and "no space left on device" in line.lower() and str(full_dir) in line
    assert entries(full_dir) == []


@pytest.mark.parametrize("out", OUTS)
def test_cgm_past_the_file_size_limit(ab, tmp_path, out):
    rc, _, err = run("cgm", *ab, "--local", "-o", f"{tmp_path}/{out}", fsize=64 << 10)
    line = one_line(err)
    assert rc == 2 and "file too large" in line and f"{tmp_path}/{out.rstrip('/')}" in line
    assert os.listdir(tmp_path) == []


def test_index_build_on_a_full_disk_and_past_the_limit(ab, tmp_path, full_dir):
    rc, _, err = run("index", "build", ab[1], "-o", full_dir / "idx")
    assert rc == 2 and "no space left on device" in one_line(err) and "idx" in err  # not "Corrupted data file"
    assert entries(full_dir) == []
    rc, _, err = run("index", "build", ab[1], "-o", tmp_path / "idx", fsize=256 << 10)
    assert rc == 2 and "file too large" in one_line(err)
    assert os.listdir(tmp_path) == ["full"]


@pytest.mark.parametrize("out", ["g.nc", "g.parquet", "g.csv"])
def test_gen_past_the_file_size_limit(tmp_path, out):
    rc, _, err = run("gen", tmp_path / out, "--records", 200_000, fsize=256 << 10)
    assert rc == 2 and "file too large" in one_line(err)  # netCDF: not "HDF error"
    assert os.listdir(tmp_path) == []


def test_batch_summary_on_a_full_disk(ab, tmp_path, full_dir):
    jobs = tmp_path / "jobs.toml"
    jobs.write_text(f'[[job]]\na = "{ab[0]}"\nb = "{ab[1]}"\noutput = "{tmp_path}/o.parquet"\n')
    rc, _, err = run("batch", jobs, "--local", "--summary", full_dir / "summary.json")
    line = one_line(err)
    assert rc == 2 and "no space left on device" in line.lower() and "summary.json" in line
    assert entries(full_dir) == []


# ---- batch jobs files ---------------------------------------------------------------------------


@pytest.fixture
def jobs(ab, tmp_path):
    def make(extra: str = "") -> tuple:
        p = tmp_path / "jobs.toml"
        p.write_text(f'[[job]]\na = "{ab[0]}"\nb = "{ab[1]}"\noutput = "o.parquet"\n{extra}')
        return p, p.read_bytes()
    return make


def test_batch_refuses_its_jobs_file_as_summary(jobs, tmp_path, capsys):
    p, text = jobs()
    rc, _, err = run_cli(capsys, "batch", p, "--local", "--summary", p)
    assert rc == 2 and "is the jobs file" in one_line(err)
    assert p.read_bytes() == text and not (tmp_path / "o.parquet").exists()


def test_batch_refuses_its_jobs_file_as_stats(jobs, tmp_path, capsys):
    p, text = jobs('stats = "jobs.toml"\noverwrite = true\n')
    rc, _, err = run_cli(capsys, "batch", p, "--local")
    assert rc == 2 and "stats '" in err and "is the jobs file" in one_line(err)
    assert p.read_bytes() == text and not (tmp_path / "o.parquet").exists()


def test_batch_jobs_file_not_utf8_or_a_directory(tmp_path, capsys):
    bad = tmp_path / "latin1.toml"
    bad.write_bytes('[[job]]\na = "caf\xe9.nc"\n'.encode("latin-1"))
    rc, _, err = run_cli(capsys, "batch", bad, "--local")
    assert rc == 2 and "not UTF-8" in one_line(err) and "0xe9" in err
    rc, _, err = run_cli(capsys, "batch", tmp_path, "--local")
    assert rc == 2 and "is a directory, not a jobs file" in one_line(err)


def test_batch_summary_that_cannot_be_written_is_refused_before_the_run(jobs, tmp_path, capsys):
    p, _ = jobs()
    (tmp_path / "sumdir").mkdir()
    rc, _, err = run_cli(capsys, "batch", p, "--local", "--summary", tmp_path / "sumdir")
    assert rc == 2 and "sumdir" in one_line(err) and "is a directory" in err
    rc, _, err = run_cli(capsys, "batch", p, "--local", "--summary", tmp_path / "nodir" / "s.json")
    assert rc == 2 and "does not exist" in one_line(err)
    assert not (tmp_path / "o.parquet").exists()  # no job ran


# ---- nested columns to CSV -----------------------------------------------------------------------

def test_a_struct_column_to_csv_is_refused_before_the_run(tmp_path, capsys):
    n = 100
    pq.write_table(pa.table({"t": pa.array(range(n), pa.float64()),
                             "s": pa.array([{"a": i, "b": str(i) * 30} for i in range(n)])}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"t": pa.array(range(n), pa.float64()), "v": pa.array(range(n), pa.float64())}),
                   tmp_path / "b.parquet")
    rc, _, err = run_cli(capsys, "cgm", tmp_path / "a.parquet", tmp_path / "b.parquet", "--keys", "t", "--local",
                         "-o", tmp_path / "o.csv")
    line = one_line(err)
    assert rc == 2 and "column 's'" in line and "Parquet" in line and "Arrow" in line
    assert sorted(os.listdir(tmp_path)) == ["a.parquet", "b.parquet"]
    rc, _, err = run_cli(capsys, "cgm", tmp_path / "a.parquet", tmp_path / "b.parquet", "--keys", "t", "--local",
                         "-o", tmp_path / "o.arrow")
    assert rc == 0, err
