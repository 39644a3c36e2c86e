"""Outputs cannot be raced or lost: the name is claimed atomically when the output is put in
place (renameat2 RENAME_NOREPLACE, or link/placeholder fallbacks), a folder is replaced by one
exchange (RENAME_EXCHANGE, or two renames that the next run undoes when killed between them)."""

from __future__ import annotations

import errno
import os
import resource
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import smerge.datasets.atomic_rename as atomic_rename
import smerge.datasets.output_commit as output_commit
from smerge.datasets.atomic_rename import RENAME_EXCHANGE, RENAME_NOREPLACE, renameat2
from smerge.datasets.output_commit import claim_file, replace_dir
from smerge.datasets.output_staging import MARKER, make_staging, make_temp_file
from smerge.datasets.writers import open_output
from smerge.errors import OutputError
from smerge.jobs.outputs import commit_outputs

SCHEMA = pa.schema([("x", pa.int64())])


def table(v: int, n: int = 1000) -> pa.Table:
    return pa.table({"x": pa.array([v] * n, pa.int64())})


def leftovers(folder) -> list[str]:
    return sorted(n for n in os.listdir(folder) if ".smerge-" in n)


def read_x(path) -> set[int]:
    return set(pq.read_table(str(path)).column("x").to_pylist())


def limit_as():
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


@pytest.fixture(params=["renameat2", "link", "placeholder"])
def claim_route(request, monkeypatch):
    """Every route of the atomic claim: the kernel's RENAME_NOREPLACE/EXCHANGE, else a hard
    link (files) or mkdir-then-rename (folders), else an O_EXCL placeholder renamed over."""
    if request.param != "renameat2":  # the claim (atomic_rename) and the exchange (output_commit)
        monkeypatch.setattr(atomic_rename, "renameat2", lambda *a: False)
        monkeypatch.setattr(output_commit, "renameat2", lambda *a: False)
    if request.param == "placeholder":
        def no_link(*a, **k):
            raise OSError(errno.EPERM, "links not supported here")
        monkeypatch.setattr(os, "link", no_link)
    return request.param


def test_renameat2_is_available_here(tmp_path):
    """Linux >= 3.15 on a local filesystem: the claim and the exchange are single syscalls."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("a")
    b.write_text("b")
    with pytest.raises(FileExistsError):
        renameat2(str(a), str(b), RENAME_NOREPLACE)
    assert renameat2(str(a), str(b), RENAME_EXCHANGE)
    assert (a.read_text(), b.read_text()) == ("b", "a")


@pytest.mark.parametrize("ext", [".parquet", ".csv", "/"])
def test_concurrent_writers_exactly_one_wins(tmp_path, claim_route, ext):
    """Eight threads write one output without --overwrite and commit at the same moment: one
    wins, every other fails with OutputError and removes its temporary file or folder; the
    output is the winner's, whole."""
    path = str(tmp_path / "o") + ext
    n = 8
    writers = [open_output(path, SCHEMA) for _ in range(n)]
    for i, w in enumerate(writers):
        w.write(table(i).to_batches()[0])
    gate, results = threading.Barrier(n), [None] * n

    def commit(i):
        gate.wait()
        try:
            writers[i].commit()
            results[i] = "won"
        except OutputError as e:
            results[i] = str(e)

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, r in enumerate(results) if r == "won"]
    assert len(winners) == 1, results
    assert all("was created by another run or program" in r for r in results if r != "won")
    if ext == ".csv":
        assert open(path).read() == "\"x\"\n" + f"{winners[0]}\n" * 1000
    else:
        assert read_x(path) == {winners[0]} and pq.read_table(path).num_rows == 1000
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("ext", [".arrow", "/"])
def test_a_file_created_at_the_output_during_the_run_is_kept(tmp_path, claim_route, ext):
    path = str(tmp_path / "o") + ext
    w = open_output(path, SCHEMA)
    w.write(table(1).to_batches()[0])
    target = path.rstrip("/")
    if ext == "/":
        os.mkdir(target)
        (tmp_path / "o" / "notes.txt").write_text("mine")
    else:
        open(target, "w").write("mine")
    with pytest.raises(OutputError, match="is kept and nothing was written"):
        w.commit()
    assert (open(os.path.join(target, "notes.txt")) if ext == "/" else open(target)).read() == "mine"
    assert leftovers(tmp_path) == []


def test_an_empty_folder_still_counts_as_absent(tmp_path, claim_route):
    (tmp_path / "ds").mkdir()
    with open_output(str(tmp_path / "ds") + "/", SCHEMA) as w:
        w.write(table(3).to_batches()[0])
    assert read_x(tmp_path / "ds") == {3} and (tmp_path / "ds" / MARKER).is_file()


def test_overwrite_still_replaces_by_a_rename(tmp_path, claim_route):
    for ext in (".parquet", "/"):
        path = str(tmp_path / "o") + ext
        for v in (1, 2):
            with open_output(path, SCHEMA, overwrite=True) as w:
                w.write(table(v).to_batches()[0])
        assert read_x(path) == {2}
    assert leftovers(tmp_path) == []


def test_a_run_losing_a_later_output_takes_back_the_ones_it_claimed(tmp_path):
    """-o committed, then --unmatched lost to a file created meanwhile: the run leaves nothing."""
    out, un = str(tmp_path / "o.parquet"), str(tmp_path / "u.b.parquet")
    ws = [open_output(out, SCHEMA), open_output(un, SCHEMA)]
    for w in ws:
        w.write(table(5).to_batches()[0])
    open(un, "w").write("someone else's")
    with pytest.raises(OutputError, match="u.b.parquet"):
        commit_outputs(ws)
    assert not os.path.exists(out) and open(un).read() == "someone else's"
    assert leftovers(tmp_path) == []


def test_stats_claim_their_name_too(tmp_path):
    from smerge.jobs.outputs import write_stats

    p = str(tmp_path / "s.json")
    write_stats(p, {"a": 1}, overwrite=False)
    with pytest.raises(OutputError, match="^stats .*s.json' was created by another run"):
        write_stats(p, {"a": 2}, overwrite=False)
    write_stats(p, {"a": 3}, overwrite=True)
    assert open(p).read().split() == ["{", '"a":', "3", "}"]
    assert leftovers(tmp_path) == []


def test_claim_file_without_overwrite_never_replaces(tmp_path, claim_route):
    tmp = make_temp_file(str(tmp_path / "f.txt"))
    open(tmp, "w").write("new")
    (tmp_path / "f.txt").write_text("old")
    with pytest.raises(OutputError):
        claim_file(tmp, str(tmp_path / "f.txt"), overwrite=False)
    assert (tmp_path / "f.txt").read_text() == "old" and not os.path.exists(tmp)


# ---- replacing a folder -------------------------------------------------------------------------

def dataset(path, v):
    with open_output(str(path) + "/", SCHEMA, overwrite=True) as w:
        for b in table(v, 50_000).to_batches(max_chunksize=5000):
            w.write(b)


def test_the_exchange_leaves_a_complete_output_at_every_moment(tmp_path):
    """A reader polling the folder while it is replaced 30 times always finds a complete
    dataset (the old or the new one), never a missing or half-moved one. The reader lists and
    reads one folder (opened once); when that folder is no longer the one at the path (it
    opened the old one just before the swap, which is being removed) it reads again."""
    ds = tmp_path / "ds"
    dataset(ds, 0)
    stop, seen, bad = threading.Event(), set(), []

    def reader():
        while not stop.is_set():
            try:
                fd = os.open(ds, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    names = set(os.listdir(fd))
                    with os.fdopen(os.open("part-00000.parquet", os.O_RDONLY, dir_fd=fd), "rb") as f:
                        t = pq.read_table(f)
                    if os.fstat(fd).st_ino != os.stat(ds).st_ino:
                        continue  # the old folder, swapped out since it was opened
                finally:
                    os.close(fd)
                vals = set(t.column("x").to_pylist())
                if MARKER not in names or t.num_rows != 50_000 or len(vals) != 1:
                    bad.append((names, t.num_rows, vals))
                seen.update(vals)
            except (OSError, pa.ArrowInvalid) as e:
                # the file read may be the old one, removed after the exchange: open it again
                if not isinstance(e, FileNotFoundError) or not os.path.isdir(ds):
                    bad.append(repr(e))

    t = threading.Thread(target=reader)
    t.start()
    try:
        for v in range(1, 31):
            dataset(ds, v)
            # the reader keeps polling through the next exchange; wait until it has read this
            # one complete (on a busy machine every read could otherwise overlap a swap and the
            # test would check nothing)
            deadline = time.monotonic() + 60
            while v not in seen and not bad and t.is_alive() and time.monotonic() < deadline:
                time.sleep(0.001)
    finally:
        stop.set()
        t.join()
    assert not bad, bad[:3]
    assert read_x(ds) == {30} and seen >= set(range(1, 31))
    assert leftovers(tmp_path) == []


def test_a_foreign_folder_swapped_in_is_given_back(tmp_path, monkeypatch):
    """The rule is checked again after the exchange: a folder without smerge's marker put at
    the path between the check and the exchange is swapped back, not removed."""
    ds = tmp_path / "ds"
    dataset(ds, 0)
    staging = make_staging(str(ds), "tmp", dataset=True)
    real = output_commit.refuse_existing_dir
    calls = []

    def sneaky(path, opt, **kw):
        real(path, opt, **kw)
        if not calls:  # after the check passed: someone replaces the folder with their own
            calls.append(1)
            os.rename(ds, tmp_path / "moved")
            os.mkdir(ds)
            (ds / "thesis.tex").write_text("years of work")

    monkeypatch.setattr(output_commit, "refuse_existing_dir", sneaky)
    with pytest.raises(OutputError, match="smerge did not write"):
        replace_dir(staging, str(ds), overwrite=True)
    assert (ds / "thesis.tex").read_text() == "years of work"


KILL_BETWEEN = textwrap.dedent("""
    import os, signal, sys
    import pyarrow as pa
    import smerge.datasets.atomic_rename as atomic_rename
    import smerge.datasets.output_commit as output_commit
    from smerge.datasets.writers import open_output

    atomic_rename.renameat2 = output_commit.renameat2 = lambda *a: False  # no exchange here: the two-rename fallback
    real = os.rename
    def rename(src, dst):
        real(src, dst)
        if ".smerge-old-" in os.path.basename(dst):  # the old folder is aside, the new one not yet in
            os.kill(os.getpid(), signal.SIGKILL)
    os.rename = rename
    with open_output(sys.argv[1] + "/", pa.schema([("x", pa.int64())]), overwrite=True) as w:
        w.write(pa.record_batch([pa.array([99], pa.int64())], names=["x"]))
""")


@pytest.mark.parametrize("next_run", ["index", "dataset", "file"])
def test_killed_between_the_two_renames_the_next_run_restores_the_old_folder(tmp_path, next_run):
    ds = tmp_path / "ds"
    dataset(ds, 7)
    p = subprocess.run([sys.executable, "-c", KILL_BETWEEN, str(ds)], preexec_fn=limit_as, capture_output=True)
    assert p.returncode == -signal.SIGKILL
    assert not ds.exists() and any(".ds.smerge-old-" in n for n in os.listdir(tmp_path))
    # the next run writing there (whatever it writes) puts the previous output back first
    if next_run == "dataset":
        with pytest.raises(OutputError, match="already exists"):
            open_output(str(ds) + "/", SCHEMA)
    elif next_run == "file":
        with open_output(str(tmp_path / "other.parquet"), SCHEMA) as w:
            w.write(table(1).to_batches()[0])
    else:
        from smerge.datasets import open_input
        from smerge.index import build_index

        pq.write_table(pa.table({"k": [1.0, 2.0], "j": [1.0, 2.0]}), str(tmp_path / "b.parquet"))
        with pytest.raises(OutputError, match="already exists"):
            build_index(open_input(str(tmp_path / "b.parquet"), keys=("k", "j")), str(ds))
    assert read_x(ds) == {7} and (ds / MARKER).is_file()
    assert not any(".smerge-old-" in n for n in leftovers(tmp_path))
    if next_run == "file":  # a run that writes sweeps the dead run's staging folder too
        assert leftovers(tmp_path) == []


def test_two_cli_runs_racing_for_one_output(tmp_path):
    """Two `smerge cgm --local` runs started together on one -o without --overwrite: one exits
    0, the other 2 with one line; the output equals a run alone."""
    from smerge.datasets.gen import GenParams, generate

    p = GenParams(records=200_000, randomize=1.0, displacement=100, jitter=0.0, seed=0, nlat=50, nlon=100,
                  variables=("p",))
    for name in ("a", "b"):
        pq.write_table(pa.Table.from_batches(list(generate(p))), str(tmp_path / f"{name}.parquet"))
    smerge = os.path.join(os.path.dirname(sys.executable), "smerge")
    cmd = [smerge, "cgm", str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet"), "--local", "--keys",
           "time,lat,lon", "-o"]
    procs = [subprocess.Popen(cmd + [str(tmp_path / "o.parquet")], preexec_fn=limit_as, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    res = [(q.wait(), q.stderr.read()) for q in procs]
    assert sorted(r[0] for r in res) == [0, 2], res
    err = next(e for c, e in res if c == 2)
    assert len(err.strip().splitlines()) == 1 and "o.parquet" in err
    subprocess.run(cmd + [str(tmp_path / "alone.parquet")], preexec_fn=limit_as, check=True, capture_output=True)
    assert pq.read_table(str(tmp_path / "o.parquet")).equals(pq.read_table(str(tmp_path / "alone.parquet")))
    assert leftovers(tmp_path) == []
