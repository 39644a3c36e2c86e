"""--overwrite never deletes what smerge did not write (docs/data.md, "Outputs"): a folder smerge
wrote is replaced only while it holds nothing but the entries its marker lists (an older
marker: the names that version wrote); anything else in it, at the top or nested, found before
the run or when the output is put in place, keeps the folder byte for byte (exit 2)."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import smerge.datasets.output_commit as output_commit
from smerge.datasets import open_output
from smerge.datasets.output_commit import replace_dir
from smerge.datasets.output_staging import (MARKER, MARKER_HEAD, MARKER_TEXT, foreign_entry, make_staging,
                                            mark_dataset)
from smerge.datasets.outputs import check_target
from smerge.errors import OutputError

SCHEMA = pa.schema([("x", pa.int64())])


def batch(v: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array([v] * 10, pa.int64())], schema=SCHEMA)


def dataset(path, v: int, *, overwrite: bool = False) -> None:
    with open_output(str(path) + "/", SCHEMA, overwrite=overwrite) as w:
        w.write(batch(v))


def tree(path) -> dict:
    """Every entry under ``path``: a file's bytes, None for a folder, a link's target."""
    out = {}
    for root, dirs, files in os.walk(path):
        for n in dirs + files:
            p = os.path.join(root, n)
            rel = os.path.relpath(p, path)
            out[rel] = ("link", os.readlink(p)) if os.path.islink(p) else None if os.path.isdir(p) else \
                open(p, "rb").read()
    return out


def read_x(path) -> set[int]:
    return set(pq.read_table(str(path)).column("x").to_pylist())


def put(root, rel: str, data: bytes = b"mine") -> None:
    p = os.path.join(str(root), rel)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "wb") as f:
        f.write(data)


def leftovers(folder) -> list[str]:
    return sorted(n for n in os.listdir(folder) if ".smerge-" in n)


@pytest.fixture(params=["exchange", "two renames"])
def route(request, monkeypatch):
    """Both ways a folder is replaced: RENAME_EXCHANGE, or (where unsupported) aside then in."""
    if request.param != "exchange":
        monkeypatch.setattr(output_commit, "renameat2", lambda *a: False)
    return request.param


# ---- the marker lists what smerge wrote ------------------------------------------------------

def test_the_marker_lists_every_entry_smerge_put_in_the_folder(tmp_path):
    dataset(tmp_path / "ds", 1)
    head, _, rest = (tmp_path / "ds" / MARKER).read_text().partition("\n")
    assert head + "\n" == MARKER_HEAD and json.loads(rest) == {"entries": ["part-00000.parquet"]}
    # nested folders are listed with their files, folders ending with "/"
    staging = make_staging(str(tmp_path / "nested"), "tmp", dataset=True)
    put(staging, "v/c/0/0", b"chunk")
    put(staging, "zarr.json", b"{}")
    replace_dir(staging, str(tmp_path / "nested"), overwrite=False)
    listed = json.loads((tmp_path / "nested" / MARKER).read_text().partition("\n")[2])["entries"]
    assert listed == ["v/", "v/c/", "v/c/0/", "v/c/0/0", "zarr.json"]
    assert foreign_entry(str(tmp_path / "nested")) is None


# ---- the reproducer: files the user added are never deleted ------------------------------------

@pytest.mark.parametrize("added, named", [
    (["NOTES.txt", "analysis/result.csv"], "NOTES.txt"),
    (["analysis/result.csv"], "analysis/"),
    (["part-00001.parquet"], "part-00001.parquet"),  # a smerge-like name smerge did not write here
])
def test_a_folder_holding_a_users_file_is_never_replaced(tmp_path, route, added, named):
    ds = tmp_path / "ds"
    dataset(ds, 1)
    for rel in added:
        put(ds, rel)
    before = tree(tmp_path)
    with pytest.raises(OutputError, match=f"holds '{named}', which smerge did not write.*move '{named}' out"):
        check_target(str(ds), overwrite=True, folder=True)
    with pytest.raises(OutputError, match=f"holds '{named}'"):
        dataset(ds, 2, overwrite=True)
    # and at the commit itself (a caller that skipped the check before the run)
    staging = make_staging(str(ds), "tmp", dataset=True)
    put(staging, "part-00000.parquet", b"new")
    with pytest.raises(OutputError, match=f"holds '{named}'"):
        replace_dir(staging, str(ds), overwrite=True)
    os.rename(staging, tmp_path / "gone")  # the caller's to remove
    (tmp_path / "gone" / "part-00000.parquet").unlink()
    (tmp_path / "gone" / MARKER).unlink()
    (tmp_path / "gone").rmdir()
    assert tree(tmp_path) == before and read_x(ds / "part-00000.parquet") == {1}


def test_links_and_changed_kinds_are_foreign(tmp_path):
    ds = tmp_path / "ds"
    dataset(ds, 1)
    mine = tmp_path / "mine.txt"
    mine.write_text("years of work")
    os.symlink(mine, ds / "link.txt")
    with pytest.raises(OutputError, match="holds 'link.txt'"):
        check_target(str(ds), overwrite=True, folder=True)
    os.unlink(ds / "link.txt")
    os.rename(ds / "part-00000.parquet", tmp_path / "p")  # a listed file replaced by a link to a file of yours
    os.symlink(mine, ds / "part-00000.parquet")
    with pytest.raises(OutputError, match="holds 'part-00000.parquet'"):
        check_target(str(ds), overwrite=True, folder=True)
    os.unlink(ds / "part-00000.parquet")
    put(ds, "part-00000.parquet/notes.txt")  # ... or by a folder
    with pytest.raises(OutputError, match="holds 'part-00000.parquet/'"):
        check_target(str(ds), overwrite=True, folder=True)
    assert mine.read_text() == "years of work"


def test_a_clean_folder_is_still_replaced_also_with_entries_removed(tmp_path, route):
    ds = tmp_path / "ds"
    dataset(ds, 1)
    dataset(ds, 2, overwrite=True)
    assert read_x(ds) == {2} and sorted(os.listdir(ds)) == [MARKER, "part-00000.parquet"]
    os.unlink(ds / "part-00000.parquet")  # fewer entries than listed: still nothing foreign
    dataset(ds, 3, overwrite=True)
    assert read_x(ds) == {3} and leftovers(tmp_path) == []


def test_an_empty_folder_is_still_replaced(tmp_path):
    (tmp_path / "ds").mkdir()
    dataset(tmp_path / "ds", 1, overwrite=True)
    assert read_x(tmp_path / "ds") == {1}


def preorder(root, rel=""):
    """Every entry under ``root``: names sorted in each folder, a folder (ending "/") before what it holds."""
    for n in sorted(os.listdir(os.path.join(root, rel))):
        if os.path.isdir(os.path.join(root, rel, n)):
            yield rel + n + "/"
            yield from preorder(root, rel + n + "/")
        else:
            yield rel + n


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(extra=st.lists(st.lists(st.sampled_from(["a", "B", "part-00000.parquet", "v", "c", "0"]),
                               min_size=1, max_size=4).map("/".join), max_size=3, unique=True))
def test_any_added_entry_keeps_the_folder(tmp_path_factory, extra):
    """Whatever is added (at any depth), the folder is refused naming the first added entry
    (names sorted, a folder before what it holds); with nothing added it is replaced."""
    ds = tmp_path_factory.mktemp("p") / "ds"
    staging = make_staging(str(ds), "tmp", dataset=True)
    put(staging, "part-00000.parquet", b"old")
    put(staging, "v/c/0", b"chunk")
    replace_dir(staging, str(ds), overwrite=False)
    for rel in extra:
        try:
            put(ds, rel)
        except OSError:  # a path through an existing file, or onto a folder
            pass
    written = {MARKER, "part-00000.parquet", "v/", "v/c/", "v/c/0"}
    expect = [p for p in preorder(str(ds)) if p not in written]
    got = foreign_entry(str(ds))
    if not expect:
        assert got is None
        dataset(ds, 5, overwrite=True)
        assert read_x(ds) == {5}
    else:
        assert got == expect[0]
        before = tree(ds)
        with pytest.raises(OutputError, match="which smerge did not write"):
            dataset(ds, 5, overwrite=True)
        assert tree(ds) == before


# ---- a file added during the run ---------------------------------------------------------------

def test_a_file_added_during_the_run_is_kept_and_the_new_output_discarded(tmp_path, route):
    ds = tmp_path / "ds"
    dataset(ds, 1)
    w = open_output(str(ds) + "/", SCHEMA, overwrite=True)  # the check before the run passes
    w.write(batch(2))
    put(ds, "analysis/result.csv", b"1\n")  # meanwhile the user saves a result in the folder
    before = tree(ds)
    with pytest.raises(OutputError, match="holds 'analysis/', which smerge did not write \\(found when this run "
                                          "put its output in place: it is kept, this run's output discarded\\)"):
        w.commit()
    assert tree(ds) == before and read_x(ds / "part-00000.parquet") == {1} and leftovers(tmp_path) == []


def test_a_file_added_between_the_last_check_and_the_swap_is_given_back(tmp_path, route, monkeypatch):
    """The folder swapped out is checked again before it is removed: a file that appears after
    the check at the commit puts the old folder back (with the file) and fails the run."""
    ds = tmp_path / "ds"
    dataset(ds, 1)
    real = output_commit.refuse_existing_dir

    def late(path, opt, **kw):
        real(path, opt, **kw)
        put(ds, "NOTES.txt", b"my notes")  # right after the check passed

    monkeypatch.setattr(output_commit, "refuse_existing_dir", late)
    with pytest.raises(OutputError, match="holds 'NOTES.txt'.*this run's output discarded"):
        dataset(ds, 2, overwrite=True)
    assert (ds / "NOTES.txt").read_bytes() == b"my notes" and read_x(ds / "part-00000.parquet") == {1}
    assert sorted(os.listdir(ds)) == [MARKER, "NOTES.txt", "part-00000.parquet"] and leftovers(tmp_path) == []


# ---- folders of older smerge versions (the marker without a list) -------------------------------

def legacy(folder, files) -> None:
    os.mkdir(folder)
    for rel in files:
        put(folder, rel, b"old")
    (folder / MARKER).write_text(MARKER_TEXT)


@pytest.mark.parametrize("files", [
    ["part-00000.parquet", "part-00001.parquet"],  # Parquet dataset (Spark: one part per partition)
    ["zarr.json", "t/zarr.json", "t/c/0/0/0", "lat/zarr.json", "lat/c/0", "s/zarr.json", "s/c"],  # Zarr v3 store
    ["meta.json", "data.parquet", "order.npy", "rtree.dat", "rtree.idx"],  # index build
    [],
])
def test_an_older_smerges_folder_is_replaced_when_it_holds_only_what_that_version_wrote(tmp_path, files):
    legacy(tmp_path / "ds", files)
    check_target(str(tmp_path / "ds"), overwrite=True, folder=True)
    dataset(tmp_path / "ds", 4, overwrite=True)
    assert read_x(tmp_path / "ds") == {4} and _listed(tmp_path / "ds") == ["part-00000.parquet"]


def _listed(folder):
    return json.loads((folder / MARKER).read_text().partition("\n")[2])["entries"]


@pytest.mark.parametrize("files, named", [
    (["part-00000.parquet", "NOTES.txt"], "NOTES.txt"),
    (["part-00000.parquet", "analysis/result.csv"], "analysis/"),
    (["part-00000.parquet", "t/zarr.json"], "t/"),  # a Zarr array in a Parquet dataset
    (["zarr.json", "t/zarr.json", "t/c/0/notes.txt"], "t/c/0/notes.txt"),
    (["zarr.json", "t/zarr.json", "t/c/0", "analysis/result.csv"], "analysis/result.csv"),
    (["zarr.json", "part-00000.parquet"], "part-00000.parquet"),
    (["meta.json", "data.parquet", "notes.txt"], "notes.txt"),
])
def test_an_older_smerges_folder_holding_anything_else_is_kept(tmp_path, files, named):
    legacy(tmp_path / "ds", files)
    before = tree(tmp_path)
    with pytest.raises(OutputError, match=f"holds '{named}', which smerge did not write"):
        check_target(str(tmp_path / "ds"), overwrite=True, folder=True)
    with pytest.raises(OutputError, match=f"holds '{named}'"):
        dataset(tmp_path / "ds", 4, overwrite=True)
    assert tree(tmp_path) == before


def test_a_marker_edited_by_hand_counts_as_an_older_one(tmp_path):
    ds = tmp_path / "ds"
    dataset(ds, 1)
    put(ds, "NOTES.txt")
    for text in (MARKER_HEAD + '{"entries": ["part-00000.parquet", "NOTES.txt"]', MARKER_HEAD + "[]",
                 "anything\n" + json.dumps({"entries": ["NOTES.txt", "part-00000.parquet"]})):
        (ds / MARKER).write_text(text)
        with pytest.raises(OutputError, match="holds 'NOTES.txt'"):
            check_target(str(ds), overwrite=True, folder=True)
    mark_dataset(str(ds))  # listing it (what smerge does at the commit) makes it part of the output
    check_target(str(ds), overwrite=True, folder=True)
