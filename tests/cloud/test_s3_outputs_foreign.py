"""--overwrite of a dataset "folder" (key prefix) on an object store never removes an object
smerge did not write (moto on loopback): the marker object lists what smerge uploaded; any
other object below the prefix keeps it (exit 2, every object unchanged), found before the run
or at the commit; an object put after the commit's check is never among those removed."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smerge.cli.main import main
from smerge.datasets import remote
from smerge.datasets.output_staging import MARKER, MARKER_HEAD, MARKER_TEXT


def run(capsys, *args):
    rc = main([str(a) for a in args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.fixture
def job(tmp_path):
    pq.write_table(pa.table({"k": np.arange(20.0), "x": np.arange(20)}), tmp_path / "A.parquet")
    pq.write_table(pa.table({"k": np.arange(20.0) + 0.1, "y": np.arange(20)}), tmp_path / "B.parquet")
    return ["cgm", tmp_path / "A.parquet", tmp_path / "B.parquet", "--keys", "k", "--eps", "0.2", "--local"]


def objects(fs, prefix) -> dict:
    return {k: fs.cat(k) for k in fs.find(prefix)}


def test_the_marker_object_lists_what_smerge_uploaded(s3, job, capsys):
    bucket, fs = s3
    rc, _, se = run(capsys, *job, "-o", f"s3://{bucket}/ours/")
    assert rc == 0, se
    head, _, rest = fs.cat(f"{bucket}/ours/{MARKER}").decode().partition("\n")
    assert head + "\n" == MARKER_HEAD and json.loads(rest) == {"entries": ["part-00000.parquet"]}


@pytest.mark.parametrize("added, named", [(["NOTES.txt", "analysis/result.csv"], "NOTES.txt"),
                                          (["analysis/result.csv"], "analysis/result.csv")])
def test_a_prefix_holding_a_users_object_is_never_replaced(s3, job, capsys, added, named):
    bucket, fs = s3
    url = f"s3://{bucket}/ours/"
    rc, _, se = run(capsys, *job, "-o", url)
    assert rc == 0, se
    for rel in added:
        fs.pipe(f"{bucket}/ours/{rel}", b"mine")
    before = objects(fs, f"{bucket}/ours")
    rc, _, se = run(capsys, *job, "-o", url, "--overwrite")
    assert rc == 2 and len(se.strip().splitlines()) == 1, se
    assert f"holds '{named}', which smerge did not write" in se and "choose another -o" in se
    assert objects(fs, f"{bucket}/ours") == before


def test_an_object_put_during_the_run_is_kept(s3, job, capsys, monkeypatch):
    bucket, fs = s3
    url = f"s3://{bucket}/ours/"
    rc, _, se = run(capsys, *job, "-o", url)
    assert rc == 0, se
    before = objects(fs, f"{bucket}/ours")
    real = remote.upload_dir

    def meanwhile(local, path, **kw):  # between the checks before the run and the upload
        fs.pipe(f"{bucket}/ours/NOTES.txt", b"my notes")
        return real(local, path, **kw)

    monkeypatch.setattr(remote, "upload_dir", meanwhile)
    rc, _, se = run(capsys, *job, "-o", url, "--overwrite")
    assert rc == 2 and "holds 'NOTES.txt', which smerge did not write (found when this run put its output" in se, se
    assert objects(fs, f"{bucket}/ours") == {**before, f"{bucket}/ours/NOTES.txt": b"my notes"}


def test_an_object_put_after_the_commits_check_is_not_removed(s3, job, capsys, monkeypatch):
    """The upload removes only the old objects the check saw: one put after it stays."""
    bucket, fs = s3
    url = f"s3://{bucket}/ours/"
    rc, _, se = run(capsys, *job, "-o", url)
    assert rc == 0, se
    real = remote.check_output

    def late(path, **kw):
        keys = real(path, **kw)
        if kw.get("during"):
            fs.pipe(f"{bucket}/ours/late.txt", b"mine")
        return keys

    monkeypatch.setattr(remote, "check_output", late)
    rc, _, se = run(capsys, *job, "-o", url, "--overwrite")
    assert rc == 0, se
    assert fs.cat(f"{bucket}/ours/late.txt") == b"mine"


@pytest.mark.parametrize("extra, ok", [([], True), (["notes.txt"], False), (["t/zarr.json"], False)])
def test_an_older_smerges_prefix(s3, job, capsys, extra, ok):
    """A marker object of an older smerge (no list): only the names that version wrote."""
    bucket, fs = s3
    fs.pipe(f"{bucket}/old/part-00000.parquet", b"old part")
    fs.pipe(f"{bucket}/old/part-00001.parquet", b"old part")
    for rel in extra:
        fs.pipe(f"{bucket}/old/{rel}", b"mine")
    fs.pipe(f"{bucket}/old/{MARKER}", MARKER_TEXT.encode())
    before = objects(fs, f"{bucket}/old")
    rc, _, se = run(capsys, *job, "-o", f"s3://{bucket}/old/", "--overwrite")
    if ok:
        assert rc == 0, se
        assert sorted(k.rsplit("/", 1)[-1] for k in fs.find(f"{bucket}/old")) == [MARKER, "part-00000.parquet"]
    else:
        assert rc == 2 and f"holds '{extra[0]}'" in se, se
        assert objects(fs, f"{bucket}/old") == before
