"""The output-safety rule (docs/data.md, "Outputs", ``smerge.datasets.outputs``): what --overwrite may
replace, distinct paths, umask modes, and the leftovers of killed runs."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap

import pyarrow as pa
import pytest

from smerge.datasets import open_output
from smerge.datasets.output_commit import replace_dir
from smerge.datasets.output_staging import (MARKER, host_tag, make_staging, make_temp_file, owner_gone, remove_stale,
                                            temp_name)
from smerge.datasets.outputs import check_distinct, check_target
from smerge.errors import OutputError
from smerge.jobs import write_stats

SCHEMA = pa.schema([("k", pa.float64())])
BATCH = pa.record_batch([pa.array([1.0, 2.0])], schema=SCHEMA)


def tree(path) -> dict:
    """Every file under ``path`` with its bytes (to show nothing was touched)."""
    out = {}
    for root, _, files in os.walk(path):
        for f in files:
            p = os.path.join(root, f)
            out[os.path.relpath(p, path)] = open(p, "rb").read()
    return out


@pytest.fixture
def foreign(tmp_path):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "thesis.tex").write_text("years of work")
    return d


# ---- what may be replaced ------------------------------------------------------------------

def test_folder_without_marker_is_never_replaced(foreign):
    before = tree(foreign)
    with pytest.raises(OutputError, match="smerge did not write"):
        check_target(str(foreign), overwrite=True, folder=True)
    with pytest.raises(OutputError, match="already exists"):
        check_target(str(foreign), overwrite=False, folder=True)
    with pytest.raises(OutputError, match="is a directory"):
        check_target(str(foreign), overwrite=True, folder=False)
    # the writer itself refuses too, and leaves nothing behind
    with pytest.raises(OutputError, match="smerge did not write"):
        open_output(str(foreign) + "/", SCHEMA, overwrite=True)
    assert tree(foreign) == before and sorted(os.listdir(foreign.parent)) == ["mine"]


def test_marked_folder_is_replaced_and_the_new_one_is_marked(tmp_path):
    out = str(tmp_path / "ds")
    with open_output(out + "/", SCHEMA) as w:
        w.write(BATCH)
    assert sorted(os.listdir(out)) == [MARKER, "part-00000.parquet"]
    (tmp_path / "ds" / "stale.parquet").write_bytes(b"x")  # not smerge's: the folder is kept
    before = tree(out)
    with pytest.raises(OutputError, match="holds 'stale.parquet', which smerge did not write"):
        check_target(out, overwrite=True, folder=True)
    with pytest.raises(OutputError, match="holds 'stale.parquet'"):
        open_output(out, SCHEMA, overwrite=True)
    assert tree(out) == before and sorted(os.listdir(tmp_path)) == ["ds"]
    (tmp_path / "ds" / "stale.parquet").unlink()
    check_target(out, overwrite=True, folder=True)
    with open_output(out, SCHEMA, overwrite=True) as w:
        w.write(BATCH)
    assert sorted(os.listdir(out)) == [MARKER, "part-00000.parquet"]
    assert sorted(os.listdir(tmp_path)) == ["ds"]


def test_empty_folder_counts_as_absent(tmp_path):
    (tmp_path / "empty").mkdir()
    check_target(str(tmp_path / "empty"), overwrite=False, folder=True)
    with open_output(str(tmp_path / "empty") + "/", SCHEMA) as w:
        w.write(BATCH)
    assert MARKER in os.listdir(tmp_path / "empty")


def test_a_folder_that_holds_an_input_is_never_replaced_even_with_a_marker(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / MARKER).write_text("")
    (d / "sub").mkdir()
    (d / "sub" / "A.nc").write_bytes(b"data")
    with pytest.raises(OutputError, match="contains the input"):
        check_target(str(d), overwrite=True, folder=True, inputs=[str(d / "sub" / "A.nc")])
    with pytest.raises(OutputError, match="contains the input"):  # compared by real path
        check_target(str(d) + "/", overwrite=True, folder=True, inputs=[f"file://{tmp_path}/./d/sub/../sub/A.nc"])


def test_an_input_reached_by_another_name_is_refused(tmp_path):
    a = tmp_path / "A.parquet"
    a.write_bytes(b"data")
    (tmp_path / "link.parquet").symlink_to(a)
    os.link(a, tmp_path / "hard.parquet")
    for p in ("link.parquet", "hard.parquet"):
        with pytest.raises(OutputError, match="also an input"):
            check_target(str(tmp_path / p), overwrite=True, folder=False, inputs=[str(a)])
    assert a.read_bytes() == b"data"


def test_the_current_directory_is_never_replaced(tmp_path, monkeypatch):
    d = tmp_path / "here"
    d.mkdir()
    (d / MARKER).write_text("")
    (d / "x").write_text("x")
    monkeypatch.chdir(d)
    for p in (".", str(d), str(tmp_path)):
        with pytest.raises(OutputError):
            check_target(p, overwrite=True, folder=True)
    assert (d / "x").read_text() == "x"


def test_parent_that_is_a_file_is_named(tmp_path):
    (tmp_path / "regular").write_text("x")
    with pytest.raises(OutputError, match=r"regular' is a file, not a directory"):
        check_target(str(tmp_path / "regular" / "x.parquet"), overwrite=False, folder=False)
    with pytest.raises(OutputError, match=r"regular' is a file, not a directory"):
        check_target(str(tmp_path / "regular" / "deeper" / "x"), overwrite=False, folder=True)
    with pytest.raises(OutputError, match="does not exist"):
        check_target(str(tmp_path / "no" / "x.parquet"), overwrite=False, folder=False)


def test_replace_dir_checks_the_rule_again_at_the_rename(tmp_path, foreign):
    staging = make_staging(str(foreign), "tmp", dataset=True)
    with pytest.raises(OutputError, match="smerge did not write"):
        replace_dir(staging, str(foreign), overwrite=True)
    assert (foreign / "thesis.tex").read_text() == "years of work"
    # a symlink in the way is removed, never what it points to
    link = tmp_path / "link"
    link.symlink_to(foreign)
    replace_dir(staging, str(link), overwrite=True)
    assert (link / MARKER).is_file() and not link.is_symlink()
    assert (foreign / "thesis.tex").read_text() == "years of work"


def test_distinct_paths(tmp_path):
    a, o = str(tmp_path / "a.parquet"), str(tmp_path / "o.parquet")
    with pytest.raises(OutputError, match="also the path of -o"):
        check_distinct([a], [("-o", o, False), ("--stats", str(tmp_path / "." / "o.parquet"), False)])
    with pytest.raises(OutputError, match="also an input"):
        check_distinct([a], [("-o", a, False)])
    with pytest.raises(OutputError, match="inside the folder output of -o"):
        check_distinct([a], [("-o", str(tmp_path / "ds") + "/", True), ("--stats", str(tmp_path / "ds" / "s"), False)])
    with pytest.raises(OutputError, match="would hold the input"):
        check_distinct([a], [("-o", str(tmp_path), True)])
    check_distinct([a, None, "hdfs://x/a"], [("-o", o, False), ("--stats", str(tmp_path / "s.json"), False)])


# ---- modes -----------------------------------------------------------------------------------

@pytest.fixture(params=[0o022, 0o027])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


@pytest.mark.parametrize("ext", [".parquet", ".csv", ".arrow", "/"])
def test_outputs_honour_the_umask(tmp_path, umask, ext):
    path = str(tmp_path / "o") + ext
    with open_output(path, SCHEMA) as w:
        w.write(BATCH)
    write_stats(str(tmp_path / "s.json"), {"x": 1})
    assert mode(tmp_path / "s.json") == 0o666 & ~umask
    if ext == "/":
        assert mode(path) == 0o777 & ~umask
        for f in os.listdir(path):
            assert mode(os.path.join(path, f)) == 0o666 & ~umask, f
    else:
        assert mode(path) == 0o666 & ~umask


# ---- leftovers of killed runs ------------------------------------------------------------------

KILLED = textwrap.dedent("""
    import sys, time
    from smerge.datasets.outputs import make_staging, make_temp_file
    target = sys.argv[1]
    print(make_temp_file(target), make_staging(target, "spark"), make_staging(target + "x", "tmp", dataset=True),
          flush=True)
    time.sleep(600)
""")


def start_writer(target):
    p = subprocess.Popen([sys.executable, "-c", KILLED, target], stdout=subprocess.PIPE, text=True)
    return p, p.stdout.readline().split()


def test_leftovers_of_a_killed_run_are_removed_once_the_owner_is_gone(tmp_path):
    target = str(tmp_path / "o.parquet")
    dead, dead_paths = start_writer(target)
    alive, alive_paths = start_writer(target)
    os.kill(dead.pid, signal.SIGKILL)
    dead.wait()
    try:
        assert all(os.path.exists(p) for p in dead_paths + alive_paths)
        assert all(owner_gone(os.path.basename(p)) for p in dead_paths)
        assert not any(owner_gone(os.path.basename(p)) for p in alive_paths)
        other_host = temp_name(target).replace(host_tag(), "0" * 10 if host_tag() != "0" * 10 else "1" * 10)
        open(other_host, "w").close()
        untagged = tmp_path / ".o.parquet.abc123.smerge-tmp"  # an older smerge's name: owner unknown
        untagged.write_text("")
        (tmp_path / "user.smerge-tmp-file").write_text("not ours")
        # the next run writing there sweeps what provably belongs to a dead run, nothing else
        with open_output(target, SCHEMA) as w:
            w.write(BATCH)
        assert not any(os.path.exists(p) for p in dead_paths)
        assert all(os.path.exists(p) for p in alive_paths)
        assert os.path.exists(other_host) and untagged.exists() and (tmp_path / "user.smerge-tmp-file").exists()
    finally:
        alive.kill()
        alive.wait()
    assert sorted(remove_stale(str(tmp_path))) == sorted(alive_paths)


def test_temp_names_carry_the_owner(tmp_path):
    t = make_temp_file(str(tmp_path / "x.csv"))
    assert os.path.basename(t).startswith(".x.csv.smerge-tmp-") and f"-{os.getpid()}-" in t
    assert not owner_gone(os.path.basename(t))  # this process runs
    s = make_staging(str(tmp_path / "ds") + "/", "rtm")
    assert os.path.basename(s).startswith(".ds.smerge-rtm-") and os.path.isdir(s)


def test_stale_spark_logs_are_removed(tmp_path, monkeypatch):
    import tempfile

    from smerge.spark.session import remove_stale_logs, spark_log_path

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    dead = tmp_path / f"smerge-spark-{host_tag()}-{p.pid}.log"
    mine = spark_log_path()
    foreign_host = tmp_path / f"smerge-spark-{'0' * 10 if host_tag() != '0' * 10 else '1' * 10}-{p.pid}.log"
    old = tmp_path / "smerge-spark-4242.log"  # an older smerge's name, last written before this boot
    for f in (dead, mine, foreign_host, old):
        open(f, "w").close()
    os.utime(old, (1.0, 1.0))
    fresh_old = tmp_path / "smerge-spark-4243.log"  # untagged and written since boot: owner unknown
    fresh_old.write_text("")
    remove_stale_logs(keep=0)
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(str(f)) for f in (mine, foreign_host, fresh_old))


def test_logs_of_failed_runs_rotate_and_a_successful_run_removes_its_own(tmp_path, monkeypatch):
    """A run that succeeds removes its log (the CLI calls discard_log); logs of failed or killed
    runs (their process is gone) are kept, the newest KEEP_FAILED_LOGS of them."""
    import tempfile

    from smerge.spark.session import KEEP_FAILED_LOGS, discard_log, remove_stale_logs, spark_log_path

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    logs = []
    for i in range(KEEP_FAILED_LOGS + 2):
        p = subprocess.Popen([sys.executable, "-c", "pass"])
        p.wait()
        log = tmp_path / f"smerge-spark-{host_tag()}-{p.pid}.log"
        log.write_text("failed")
        os.utime(log, (1000.0 + i, 1000.0 + i))
        logs.append(log.name)
    open(spark_log_path(), "w").close()
    remove_stale_logs()
    assert sorted(os.listdir(tmp_path)) == sorted(logs[2:] + [os.path.basename(spark_log_path())])
    discard_log()
    assert sorted(os.listdir(tmp_path)) == sorted(logs[2:])
