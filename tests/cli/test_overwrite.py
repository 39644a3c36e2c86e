"""--overwrite and the other output-safety rules through every command (docs/data.md, "Outputs"):
inputs and foreign files stay intact, exit 2, one line on stderr; outputs honour the umask."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smerge.datasets.output_staging import MARKER
from cli_run import run_cli  # noqa: E402 (tests/helpers: the shared CLI test helper)

SMERGE = [sys.executable, "-m", "smerge"]


def tree(path) -> dict:
    out = {}
    for root, dirs, files in os.walk(path):
        for f in files + dirs:
            p = os.path.join(root, f)
            out[os.path.relpath(p, path)] = None if os.path.isdir(p) else open(p, "rb").read()
    return out


def assert_refused(rc, se, needle, *, before, root):
    assert rc == 2, se
    lines = [ln for ln in se.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("smerge: error: ") and needle in lines[0], se
    assert tree(root) == before, "something was touched"


@pytest.fixture
def d(tmp_path):
    """A folder holding the inputs (Parquet) and a file of the user's."""
    d = tmp_path / "d"
    d.mkdir()
    pq.write_table(pa.table({"k": np.arange(20.0), "x": np.arange(20)}), d / "A.parquet")
    pq.write_table(pa.table({"k": np.arange(20.0) + 0.1, "y": np.arange(20)}), d / "B.parquet")
    (d / "notes.txt").write_text("mine")
    return d


# ---- a folder holding the inputs is never replaced -------------------------------------------

def test_cgm_local_folder_output_over_the_inputs_netcdf(tmp_path, capsys, ncar_dir):
    """The case of issue 9: `smerge cgm d/A.nc d/B.nc --local -o d --overwrite` deleted d/."""
    d = tmp_path / "d"
    d.mkdir()
    shutil.copy(f"{ncar_dir}/Pstorm.cdf", d / "A.nc")
    shutil.copy(f"{ncar_dir}/Tstorm.cdf", d / "B.nc")
    before = tree(tmp_path)
    for o in (d, f"{d}/"):
        rc, _, se = run_cli(capsys, "cgm", d / "A.nc", d / "B.nc", "--local", "-o", o, "--overwrite")
        assert_refused(rc, se, "input", before=before, root=tmp_path)


@pytest.mark.parametrize("args", [
    ["cgm", "{d}/A.parquet", "{d}/B.parquet", "--keys", "k", "--local", "-o", "{d}", "--overwrite"],
    ["cgm", "{d}/A.parquet", "{d}/B.parquet", "--keys", "k", "--local", "-o", "{tmp}", "--overwrite"],
    ["rtm", "{d}/A.parquet", "{d}/B.parquet", "--keys", "k", "--local", "-o", "{d}/", "--overwrite"],
    ["wjoin", "{d}/A.parquet", "{d}/B.parquet", "--time", "k", "--window", "1", "--local", "-o", "{d}",
     "--overwrite"],
    ["index", "build", "{d}/B.parquet", "--keys", "k", "-o", "{d}", "--overwrite"],
    ["index", "build", "{d}/B.parquet", "--keys", "k", "-o", "{d}/", "--overwrite"],
    ["index", "build", "{d}/B.parquet", "--keys", "k", "-o", "{d}/B.parquet", "--overwrite"],
])
def test_folder_or_path_of_an_input_is_refused(args, d, tmp_path, capsys):
    argv = [a.format(d=d, tmp=tmp_path) for a in args]
    before = tree(tmp_path)
    rc, _, se = run_cli(capsys, *argv)
    assert_refused(rc, se, "input", before=before, root=tmp_path)


def test_current_directory_is_never_replaced(d, tmp_path, capsys, monkeypatch):
    """`-o . --overwrite` was exit 1 (rename of '.'); it is exit 2 whatever '.' holds."""
    here = tmp_path / "here"
    here.mkdir()
    (here / "keep.txt").write_text("keep")
    monkeypatch.chdir(here)
    before = tree(tmp_path)
    for o in (".", "./"):
        rc, _, se = run_cli(capsys, "cgm", d / "A.parquet", d / "B.parquet", "--keys", "k", "--local", "-o", o,
                            "--overwrite")
        assert_refused(rc, se, "current directory", before=before, root=tmp_path)
    (here / MARKER).write_text("")  # even a folder smerge wrote, while it is the current directory
    before = tree(tmp_path)
    rc, _, se = run_cli(capsys, "cgm", d / "A.parquet", d / "B.parquet", "--keys", "k", "--local", "-o", ".",
                        "--overwrite")
    assert_refused(rc, se, "current directory", before=before, root=tmp_path)
    monkeypatch.chdir(d)  # and '.' holding the inputs
    rc, _, se = run_cli(capsys, "cgm", "A.parquet", "B.parquet", "--keys", "k", "--local", "-o", ".", "--overwrite")
    assert_refused(rc, se, "input", before=before, root=tmp_path)


# ---- only a file, or a folder smerge wrote -----------------------------------------------------

@pytest.mark.parametrize("cmd", ["cgm", "rtm", "wjoin", "index", "gen"])
def test_foreign_folder_is_never_replaced_and_smerges_own_is(cmd, d, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    argv = {
        "cgm": ["cgm", d / "A.parquet", d / "B.parquet", "--keys", "k", "--local", "-o", out],
        "rtm": ["rtm", d / "A.parquet", d / "B.parquet", "--keys", "k", "--local", "-o", out],
        "wjoin": ["wjoin", d / "A.parquet", d / "B.parquet", "--time", "k", "--window", "1", "--local", "-o", out],
        "index": ["index", "build", d / "B.parquet", "--keys", "k", "-o", out],
        "gen": ["gen", out, "--records", "100", "--grid", "5,10"],
    }[cmd]
    before = tree(tmp_path)
    rc, _, se = run_cli(capsys, *argv)
    assert_refused(rc, se, "--overwrite", before=before, root=tmp_path)
    rc, _, se = run_cli(capsys, *argv, "--overwrite")
    assert_refused(rc, se, "smerge did not write", before=before, root=tmp_path)
    (out / "thesis.tex").unlink()  # empty: nothing to lose, written without --overwrite
    rc, _, se = run_cli(capsys, *argv)
    assert rc == 0, se
    assert (out / MARKER).is_file()
    rc, _, se = run_cli(capsys, *argv)
    assert rc == 2 and "already exists" in se
    rc, _, se = run_cli(capsys, *argv, "--overwrite")  # smerge's own folder: replaced
    assert rc == 0, se
    assert (out / MARKER).is_file() and sorted(os.listdir(tmp_path)) == ["d", "out"]


# ---- a folder smerge wrote, holding files of the user's ------------------------------------------

def _written_folder(kind, d, tmp_path, ncar_dir, capsys):
    """(the folder, the cgm arguments but -o) after `smerge cgm ... -o` wrote it: a Parquet dataset
    folder, or a Zarr store on the NCAR grid."""
    if kind == "dataset":
        out, argv = tmp_path / "out", ["cgm", d / "A.parquet", d / "B.parquet", "--keys", "k", "--local"]
    else:
        shutil.copy(f"{ncar_dir}/Pstorm.cdf", tmp_path / "A.nc")
        shutil.copy(f"{ncar_dir}/Tstorm.cdf", tmp_path / "B.nc")
        out, argv = tmp_path / "out.zarr", ["cgm", tmp_path / "A.nc", tmp_path / "B.nc", "--local"]
    rc, _, se = run_cli(capsys, *argv, "-o", out)
    assert rc == 0, se
    return out, argv


@pytest.mark.parametrize("kind", ["dataset", "zarr"])
@pytest.mark.parametrize("added, named", [
    (["NOTES.txt", "analysis/result.csv"], "NOTES.txt"),  # the tester's case
    (["analysis/result.csv"], "analysis/"),
    ("nested", None),  # inside a folder smerge wrote (Zarr: a chunk folder)
])
def test_overwrite_keeps_a_smerge_folder_holding_a_users_files(kind, added, named, d, tmp_path, capsys, ncar_dir,
                                                              tmp_path_factory):
    """`smerge cgm ... -o out` then files of the user's in out/: `--overwrite` exits 2 with one
    line naming the first of them, every file byte-identical; moved out, the folder is replaced."""
    out, argv = _written_folder(kind, d, tmp_path, ncar_dir, capsys)
    written, snapshot = tree(out), tmp_path_factory.mktemp("snapshot") / "out"
    shutil.copytree(out, snapshot, symlinks=True)
    if added == "nested":
        sub = "p/c/0/" if kind == "zarr" else "part-00000.parquet/"
        if kind == "dataset":  # a folder of the user's named like a part
            os.rename(out / "part-00000.parquet", tmp_path / "part")
        added, named = [f"{sub}mine.txt"], f"{sub}mine.txt" if kind == "zarr" else sub
    for rel in added:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text("my notes")
    before = tree(tmp_path)
    rc, _, se = run_cli(capsys, *argv, "-o", out, "--overwrite")
    assert_refused(rc, se, f"holds '{named}', which smerge did not write", before=before, root=tmp_path)
    assert "move" in se and "choose another -o" in se
    shutil.rmtree(out)  # the user's files moved out: the folder as smerge wrote it
    shutil.copytree(snapshot, out, symlinks=True)
    assert tree(out) == written
    rc, _, se = run_cli(capsys, *argv, "-o", out, "--overwrite")
    assert rc == 0, se
    assert set(tree(out)) == set(written) and not [n for n in os.listdir(tmp_path) if ".smerge-" in n]


def test_index_build_keeps_an_index_folder_holding_a_users_file(d, tmp_path, capsys):
    argv = ["index", "build", d / "B.parquet", "--keys", "k", "-o", tmp_path / "idx"]
    rc, _, se = run_cli(capsys, *argv)
    assert rc == 0, se
    (tmp_path / "idx" / "queries").mkdir()
    (tmp_path / "idx" / "queries" / "q1.json").write_text("{}")
    before = tree(tmp_path)
    rc, _, se = run_cli(capsys, *argv, "--overwrite")
    assert_refused(rc, se, "holds 'queries/', which smerge did not write", before=before, root=tmp_path)
    shutil.rmtree(tmp_path / "idx" / "queries")
    rc, _, se = run_cli(capsys, *argv, "--overwrite")
    assert rc == 0, se
    assert sorted(os.listdir(tmp_path)) == ["d", "idx"]


@pytest.mark.parametrize("kind", ["dataset", "zarr"])
def test_a_file_added_to_the_folder_during_the_run_is_kept(kind, d, tmp_path, capsys, ncar_dir, monkeypatch):
    """A file saved in the output folder while the run writes (after the checks before the run):
    the run exits 2 when it would put its output in place, the file and the previous output
    kept, and this run's output discarded (no staging folder left)."""
    import smerge.datasets.writers as writers

    out, argv = _written_folder(kind, d, tmp_path, ncar_dir, capsys)
    real = writers.replace_dir

    def meanwhile(staging, target, **kw):  # the hook between the run and putting its output in place
        (out / "NOTES.txt").write_text("my notes")
        return real(staging, target, **kw)

    monkeypatch.setattr(writers, "replace_dir", meanwhile)
    written = tree(out)
    rc, _, se = run_cli(capsys, *argv, "-o", out, "--overwrite")
    assert rc == 2 and se.count("\n") == 1, se
    assert "holds 'NOTES.txt', which smerge did not write (found when this run put its output in place" in se
    assert tree(out) == {**written, "NOTES.txt": b"my notes"}
    assert not [n for n in os.listdir(tmp_path) if ".smerge-" in n]


def test_index_build_over_an_existing_file_is_exit_2(d, tmp_path, capsys):
    f = tmp_path / "existing_file"
    f.write_text("keep")
    before = tree(tmp_path)
    rc, _, se = run_cli(capsys, "index", "build", d / "B.parquet", "--keys", "k", "-o", f, "--overwrite")
    assert_refused(rc, se, "is a file, not a dataset directory", before=before, root=tmp_path)


def test_a_regular_file_as_the_output_directory_is_named(d, tmp_path, capsys):
    (tmp_path / "regularfile").write_text("x")
    before = tree(tmp_path)
    for cmd in (["cgm", d / "A.parquet", d / "B.parquet", "--keys", "k", "--local"],
                ["wjoin", d / "A.parquet", d / "B.parquet", "--time", "k", "--window", "1", "--local"],
                ["gen", "--records", "100"]):
        out = ["-o", tmp_path / "regularfile" / "x.parquet"] if cmd[0] != "gen" else [tmp_path / "regularfile" / "x.nc"]
        rc, _, se = run_cli(capsys, *cmd, *out)
        assert_refused(rc, se, "regularfile' is a file, not a directory", before=before, root=tmp_path)


def test_stats_is_not_replaced_without_overwrite(d, tmp_path, capsys):
    s = tmp_path / "s.json"
    s.write_text("my notes")
    before = tree(tmp_path)
    base = ["--keys", "k", "--local", "--stats", s]
    for cmd in (["cgm", d / "A.parquet", d / "B.parquet", "-o", tmp_path / "o.parquet", *base],
                ["rtm", d / "A.parquet", d / "B.parquet", "-o", tmp_path / "o.parquet", *base],
                ["wjoin", d / "A.parquet", d / "B.parquet", "--time", "k", "--window", "1", "--local",
                 "-o", tmp_path / "o.parquet", "--stats", s]):
        rc, _, se = run_cli(capsys, *cmd)
        assert_refused(rc, se, "--stats", before=before, root=tmp_path)
    rc, _, se = run_cli(capsys, "cgm", d / "A.parquet", d / "B.parquet", "-o", tmp_path / "o.parquet", *base,
                        "--overwrite")
    assert rc == 0, se
    assert json.loads(s.read_text())["a_records"] == 20


# ---- two outputs with one path ---------------------------------------------------------------

@pytest.mark.parametrize("args, needle", [
    (["rtm", "{d}/A.parquet", "{d}/B.parquet", "--keys", "k", "--local", "-o", "{tmp}/o.parquet",
      "--stats", "{tmp}/./o.parquet"], "also the path of -o"),
    (["cgm", "{d}/A.parquet", "{d}/B.parquet", "--keys", "k", "--local", "-o", "{tmp}/o.parquet",
      "--unmatched", "{d}/A", "--overwrite"], "input"),  # {d}/A.a.parquet: made an input below
    (["rtm", "{d}/A.parquet", "{d}/B.parquet", "--keys", "k", "--local", "-o", "{tmp}/ds/",
      "--unmatched", "{tmp}/ds/u"], "inside the folder output of -o"),
    (["cgm", "{d}/A.parquet", "{d}/B.parquet", "--keys", "k", "--local", "-o", "{tmp}/ds",
      "--stats", "{tmp}/ds/s.json"], "inside the folder output of -o"),
    (["wjoin", "{d}/A.parquet", "{d}/B.parquet", "--time", "k", "--window", "1", "--local", "-o", "{tmp}/o.parquet",
      "--stats", "{tmp}/o.parquet"], "also the path of -o"),
    (["wjoin", "{d}/A.parquet", "{d}/B.parquet", "--time", "k", "--window", "1", "--local", "-o", "{d}/../d/A.parquet",
      "--overwrite"], "also an input"),
])
def test_outputs_of_one_run_with_one_path(args, needle, d, tmp_path, capsys):
    if "--unmatched" in args:
        os.rename(d / "A.parquet", d / "A.a.parquet")
        args = [a.replace("{d}/A.parquet", "{d}/A.a.parquet") for a in args]
    before = tree(tmp_path)
    rc, _, se = run_cli(capsys, *[a.format(d=d, tmp=tmp_path) for a in args])
    assert_refused(rc, se, needle, before=before, root=tmp_path)


def batch_file(tmp_path, d, jobs: str) -> str:
    p = tmp_path / "jobs.toml"
    p.write_text(f'[defaults]\nkeys = "k"\nwindow = 10\nincrement = 2\n\n{jobs}'.replace("{d}", str(d)))
    return str(p)


@pytest.mark.parametrize("jobs, needle", [
    ('[[job]]\nname = "one"\na = "{d}/A.parquet"\nb = "{d}/B.parquet"\noutput = "o.parquet"\n'
     '[[job]]\nname = "two"\na = "{d}/B.parquet"\nb = "{d}/A.parquet"\noutput = "./o.parquet"\n',
     "job 'two' output"),
    ('[[job]]\nname = "one"\na = "{d}/A.parquet"\nb = "{d}/B.parquet"\noutput = "ab.parquet"\n'
     '[[job]]\nname = "two"\na = "ab.parquet"\nb = "{d}/A.parquet"\noutput = "x.parquet"\n',
     "is also an input"),
    ('[[job]]\nname = "one"\na = "{d}/A.parquet"\nb = "{d}/B.parquet"\noutput = "ds/"\n'
     '[[job]]\nname = "two"\na = "{d}/B.parquet"\nb = "{d}/A.parquet"\noutput = "ds/x.parquet"\n',
     "inside the folder output"),
    ('[[job]]\nname = "one"\na = "{d}/A.parquet"\nb = "{d}/B.parquet"\noutput = "o.parquet"\n'
     '[[job]]\nname = "two"\na = "{d}/B.parquet"\nb = "{d}/A.parquet"\noutput = "p.parquet"\n'
     'stats = "o.parquet.stats.json"\n', "job 'two' stats"),
])
def test_batch_jobs_with_one_output_path_fail_before_anything_runs(jobs, needle, d, tmp_path, capsys):
    f = batch_file(tmp_path, d, jobs)
    before = tree(tmp_path)
    rc, so, se = run_cli(capsys, "batch", f, "--local")
    assert_refused(rc, se, needle, before=before, root=tmp_path)  # no output, no stats, no summary


def test_batch_with_distinct_outputs_runs(d, tmp_path, capsys):
    f = batch_file(tmp_path, d, '[[job]]\nname = "one"\na = "{d}/A.parquet"\nb = "{d}/B.parquet"\noutput = "o.parquet"\n'
                                '[[job]]\nname = "two"\na = "{d}/B.parquet"\nb = "{d}/A.parquet"\noutput = "p/"\n')
    rc, so, se = run_cli(capsys, "batch", f, "--local")
    assert rc == 0, se
    assert (tmp_path / "p" / MARKER).is_file() and (tmp_path / "o.parquet").is_file()


# ---- umask --------------------------------------------------------------------------------------

def modes(root) -> dict:
    return {os.path.relpath(os.path.join(r, n), root): stat.S_IMODE(os.stat(os.path.join(r, n)).st_mode)
            for r, ds, fs in os.walk(root) for n in ds + fs}


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_every_in_process_output_honours_the_umask(mask, d, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    old = os.umask(mask)
    try:
        runs = [
            ["cgm", d / "A.parquet", d / "B.parquet", "--keys", "k", "--local", "-o", out / "c.parquet",
             "--unmatched", out / "cu", "--stats", out / "c.json"],
            ["cgm", d / "A.parquet", d / "B.parquet", "--keys", "k", "--local", "-o", out / "cds/"],
            ["rtm", d / "A.parquet", d / "B.parquet", "--keys", "k", "--local", "-o", out / "r.csv",
             "--stats", out / "r.json"],
            ["wjoin", d / "A.parquet", d / "B.parquet", "--time", "k", "--window", "1", "--local",
             "-o", out / "w.arrow"],
            ["gen", out / "g.parquet", "--records", "100", "--grid", "5,10"],
            ["gen", out / "g.nc", "--records", "100", "--grid", "5,10"],
            ["index", "build", d / "B.parquet", "--keys", "k", "-o", out / "idx"],
        ]
        for argv in runs:
            rc, _, se = run_cli(capsys, *argv)
            assert rc == 0, (argv, se)
    finally:
        os.umask(old)
    got = modes(out)
    assert {"c.parquet", "cu.a.parquet", "c.json", "cds", f"cds/{MARKER}", "r.csv", "w.arrow", "g.nc", "idx",
            "idx/meta.json"} <= set(got)
    for name, m in got.items():
        want = (0o777 if os.path.isdir(out / name) else 0o666) & ~mask
        assert m == want, f"{name}: {oct(m)}, want {oct(want)}"


# ---- Spark: the same rule ----------------------------------------------------------------------

def spark_cgm(tmp_path, *args, mask=0o022):
    return subprocess.run([*SMERGE, "cgm", "d/A.parquet", "d/B.parquet", "--keys", "k", "--eps", "0.2", "--master",
                           "local[2]", "--partitions", "2", *args], cwd=tmp_path, capture_output=True, text=True, timeout=400,
                          preexec_fn=lambda: os.umask(mask))


def spark_cgm_here(spark_cli, tmp_path, *args):
    """``spark_cgm`` in this process, on the shared session (tests/conftest.py)."""
    return spark_cli("cgm", "d/A.parquet", "d/B.parquet", "--keys", "k", "--eps", "0.2", "--master", "local[2]",
                     "--partitions", "2", *args, cwd=tmp_path)


def test_cgm_spark_folder_output_over_the_inputs(d, tmp_path, spark_cli):
    """`-o d/` on Spark deleted d/ with the inputs: exit 2 (before Spark starts)."""
    before = tree(tmp_path)
    for o in ("d/", "d", "."):
        rc, _, se = spark_cgm_here(spark_cli, tmp_path, "-o", o, "--overwrite")
        assert rc == 2 and se.count("\n") == 1 and "input" in se, se
        assert tree(tmp_path) == before
    assert spark_cli.masters == []


@pytest.mark.slow
def test_spark_dataset_folder_is_marked_replaced_and_honours_the_umask(d, tmp_path, spark_cli):
    """A fresh JVM (as every CLI run starts) under umask 027: files 0640, folders 0750; the
    dataset folder carries the marker, so --overwrite replaces it; a foreign one is refused
    (these two runs in this process, on the shared session)."""
    (tmp_path / "out").mkdir()
    r = spark_cgm(tmp_path, "-o", "out/ds/", "--unmatched", "out/u", "--stats", "out/s.json", mask=0o027)
    assert r.returncode == 0, r.stderr
    got = modes(tmp_path / "out")
    assert {"ds", f"ds/{MARKER}", "ds/part-00000.parquet", "u.a.parquet", "s.json"} <= set(got)
    for name, m in got.items():
        want = 0o750 if os.path.isdir(tmp_path / "out" / name) else 0o640
        assert m == want, f"{name}: {oct(m)}, want {oct(want)}"
    assert json.loads((tmp_path / "out" / "ds" / MARKER).read_text().partition("\n")[2]) == {
        "entries": sorted(n for n in os.listdir(tmp_path / "out" / "ds") if n != MARKER)}  # what smerge wrote
    (tmp_path / "out" / "ds" / "stale.parquet").write_bytes(b"x")  # not smerge's: the folder is kept
    before = tree(tmp_path)
    rc, _, se = spark_cgm_here(spark_cli, tmp_path, "-o", "out/ds", "--overwrite")
    assert rc == 2 and se.count("\n") == 1 and "holds 'stale.parquet', which smerge did not write" in se, se
    assert tree(tmp_path) == before
    (tmp_path / "out" / "ds" / "stale.parquet").unlink()
    rc, _, se = spark_cgm_here(spark_cli, tmp_path, "-o", "out/ds", "--overwrite")
    assert rc == 0, se
    assert spark_cli.masters == ["local[2]"]
    assert sorted(os.listdir(tmp_path / "out" / "ds")) == [MARKER, "part-00000.parquet", "part-00001.parquet"]
    assert pq.read_table(tmp_path / "out" / "ds").num_rows == 20
    (tmp_path / "out" / "ds" / MARKER).unlink()  # now a folder smerge did not write
    before = tree(tmp_path)
    rc, _, se = spark_cgm_here(spark_cli, tmp_path, "-o", "out/ds/", "--overwrite")
    assert rc == 2 and se.count("\n") == 1 and "smerge did not write" in se, se
    assert tree(tmp_path) == before
    assert not [f for f in os.listdir(tmp_path / "out") if ".smerge-" in f]


@pytest.mark.slow
def test_spark_rechecks_the_rule_when_it_moves_the_folder_into_place(d, tmp_path, spark):
    """A folder of the user's appears at -o while the run is on (after the checks before Spark):
    the run refuses to move its dataset folder over it. (On the shared session.)"""
    from smerge.errors import OutputError
    from smerge.jobs import CGMJob, prepare
    from smerge.spark.cgm.runner import run_cgm_spark

    out = tmp_path / "ds"
    prep = prepare(CGMJob(a=f"{d}/A.parquet", b=f"{d}/B.parquet", keys_a=("k",), output=f"{out}/", overwrite=True))
    os.mkdir(out)
    (out / "thesis.tex").write_text("years of work")
    with pytest.raises(OutputError, match="smerge did not write"):
        run_cgm_spark(prep, partitions=2, spark=spark)
    assert os.listdir(out) == ["thesis.tex"]
    assert sorted(os.listdir(tmp_path)) == ["d", "ds"]  # no staging folder left
