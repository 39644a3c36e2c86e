"""Archives (ENGINES.md section 8): round trips, the sample's fraction and uniformity, killed
appends (SIGKILL in a subprocess), damaged manifests and blocks, bad fractions and schemas."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smerge.datasets import open_input
from smerge.datasets.archive import MANIFEST, AppendParams, append, read_manifest
from smerge.datasets.archive_read import SAMPLE_ENV, run_sample
from smerge.errors import InputError, UsageError

# chi-square 99% quantiles (df -> value), so no scipy is needed
CHI2_99 = {4: 13.277, 19: 36.191}


def make_source(path, n, t0=0, seed=0):
    rng = np.random.default_rng(seed)
    t = np.sort(rng.integers(t0, t0 + 10 * n, n))
    pq.write_table(pa.table({"t": t, "cat": rng.integers(0, 5, n), "v": rng.random(n)}), path)
    return str(path)


def do_append(archive, source, **kw):
    src = open_input(source)
    params = AppendParams(time="t", **{"run_blocks": 8, "block_rows": 500, "seed": 1, **kw})
    return append(str(archive), source, src.batches(), src.schema, params)


def read_all(path, **kw):
    src = open_input(str(path), **kw)
    return pa.Table.from_batches(list(src.batches()), schema=src.schema), src


def snapshot(folder):
    out = {}
    for root, _, files in os.walk(folder):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, folder)] = fh.read()
    return out


@pytest.fixture
def two_runs(tmp_path):
    s1 = make_source(tmp_path / "s1.parquet", 12_000, seed=1)
    s2 = make_source(tmp_path / "s2.parquet", 9_000, t0=50_000, seed=2)  # overlaps s1's time range
    arch = tmp_path / "arch"
    do_append(arch, s1)
    do_append(arch, s2)
    return arch, s1, s2


def test_round_trip_every_record_once_in_time_order_within_runs(two_runs):
    arch, s1, s2 = two_runs
    got, src = read_all(arch)
    want = pa.concat_tables([pq.read_table(s1), pq.read_table(s2)])
    assert got.num_rows == want.num_rows == src.num_rows == 21_000
    key = lambda tb: sorted(zip(tb.column("t").to_pylist(), tb.column("v").to_pylist()))  # noqa: E731
    assert key(got) == key(want)  # the multiset
    man = read_manifest(str(arch))
    assert len(man.runs) > 2 and all(len(r["blocks"]) <= 8 for r in man.runs)
    assert all(b["count"] <= 500 for r in man.runs for b in r["blocks"])
    parts = []
    for i in range(len(man.runs)):
        t = run_sample(man, i, 1.0, 0, None, {}).column("t").to_numpy()
        assert np.all(np.diff(t) >= 0)
        parts.append(t)
    assert np.array_equal(np.concatenate(parts), got.column("t").to_numpy())  # runs in append order
    # Each append's source was time-sorted, so each append's part of the stream is too.
    n1 = pq.read_metadata(s1).num_rows
    assert np.all(np.diff(got.column("t").to_numpy()[:n1]) >= 0)
    assert np.all(np.diff(got.column("t").to_numpy()[n1:]) >= 0)


def test_keys_and_variables_select_columns(two_runs):
    arch, _, _ = two_runs
    got, src = read_all(arch, keys=("t",), variables=("v",))
    assert got.schema.names == ["t", "v"] and src.keys == ("t",)


def test_sample_fraction_uniformity_and_bytes(tmp_path):
    rng = np.random.default_rng(7)
    n = 60_000
    # time buckets and categories unevenly filled, so a biased sample would show
    t = np.sort(rng.integers(0, 1_000_000, n) ** 2 // 1_000_000)
    cat = rng.choice(5, n, p=[0.4, 0.3, 0.15, 0.1, 0.05])
    pq.write_table(pa.table({"t": t, "cat": cat, "v": rng.random(n)}), tmp_path / "s.parquet")
    arch = tmp_path / "a"
    do_append(arch, str(tmp_path / "s.parquet"), run_blocks=10, block_rows=1000)
    total_bytes = sum(b["bytes"] for r in read_manifest(str(arch)).runs for b in r["blocks"])
    edges = np.quantile(t, np.linspace(0, 1, 21)[1:-1])
    full_t, full_c = np.bincount(np.searchsorted(edges, t, "right"), minlength=20), np.bincount(cat, minlength=5)
    for f in (0.1, 0.25, 0.5):
        got, src = read_all(arch, sample=f, sample_seed=11)
        frac = got.num_rows / n
        assert abs(frac - f) < 4 * np.sqrt(f * (1 - f) / n) + 0.005, (f, frac)
        st = np.bincount(np.searchsorted(edges, got.column("t").to_numpy(), "right"), minlength=20)
        sc = np.bincount(got.column("cat").to_numpy(), minlength=5)
        for obs, full, df in ((st, full_t, 19), (sc, full_c, 4)):
            exp = full * (obs.sum() / n)
            chi2 = float(((obs - exp) ** 2 / exp).sum())
            assert chi2 < CHI2_99[df], (f, df, chi2)
        # bytes: f of the archive, up to one whole block per run
        runs = read_manifest(str(arch)).runs
        max_block = max(b["bytes"] for r in runs for b in r["blocks"])
        assert src.counters["bytes_read"] <= f * total_bytes + len(runs) * max_block
        assert src.counters["sample_fraction"] == f and src.num_rows is None
    # seeded: the same seed gives the same sample, another seed another one
    a, _ = read_all(arch, sample=0.3, sample_seed=5)
    b, _ = read_all(arch, sample=0.3, sample_seed=5)
    c, _ = read_all(arch, sample=0.3, sample_seed=6)
    assert a.equals(b) and not a.equals(c)


def test_sample_is_in_time_order_within_runs(two_runs):
    arch, _, _ = two_runs
    man = read_manifest(str(arch))
    for i in range(len(man.runs)):
        t = run_sample(man, i, 0.3, 4, None, {})
        if t is not None:
            assert np.all(np.diff(t.column("t").to_numpy()) >= 0)


@pytest.mark.parametrize("f", [0, -0.5, 1.5, float("nan"), float("inf")])
def test_fraction_outside_0_1_refused(two_runs, f):
    with pytest.raises(UsageError, match=r"\(0, 1\]"):
        open_input(str(two_runs[0]), sample=f)


def test_fraction_from_environment(two_runs, monkeypatch):
    monkeypatch.setenv(SAMPLE_ENV, "0.5")
    _, src = read_all(two_runs[0])
    assert src.counters["sample_fraction"] == 0.5
    monkeypatch.setenv(SAMPLE_ENV, "half")
    with pytest.raises(UsageError, match=SAMPLE_ENV):
        open_input(str(two_runs[0]))


def test_sampling_a_plain_file_refused(two_runs):
    with pytest.raises(UsageError, match="archives only"):
        open_input(two_runs[1], sample=0.5)


def test_schema_differs_on_append_nothing_changed(two_runs, tmp_path):
    arch = two_runs[0]
    before = snapshot(arch)
    other = tmp_path / "o.parquet"
    pq.write_table(pa.table({"t": np.arange(10), "cat": np.arange(10), "v": np.arange(10)}), other)  # v int
    with pytest.raises(UsageError, match="differs from the archive"):
        do_append(arch, str(other))
    with pytest.raises(UsageError, match="time column"):
        src = open_input(two_runs[1])
        append(str(arch), two_runs[1], src.batches(), src.schema, AppendParams(time="v"))
    assert snapshot(arch) == before


def test_not_an_archive(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.txt").write_text("hi")
    with pytest.raises(InputError, match="is a directory"):
        open_input(str(tmp_path / "d"))
    with pytest.raises(InputError, match="not an smerge archive"):
        read_manifest(str(tmp_path / "d"))
    with pytest.raises(InputError, match="not empty"):
        do_append(tmp_path / "d", make_source(tmp_path / "s.parquet", 100))
    assert sorted(os.listdir(tmp_path / "d")) == ["x.txt"]


def _edit_manifest(arch, fn, fix_checksum=False):
    p = arch / MANIFEST
    meta = json.loads(p.read_text())
    fn(meta)
    if fix_checksum:
        from smerge.datasets.archive import _digest

        meta["manifest_sha256"] = _digest(meta)
    p.write_text(json.dumps(meta))


@pytest.mark.parametrize("damage,match", [
    (lambda a: (a / MANIFEST).write_text('{"format": "smerge-archive", "ver'), "cannot be read"),
    (lambda a: _edit_manifest(a, lambda m: m.update(count=m["count"] + 1)), "does not match its checksum"),
    (lambda a: _edit_manifest(a, lambda m: m.update(count=m["count"] + 1), True), "malformed"),
    (lambda a: _edit_manifest(a, lambda m: m.update(version=99), True), "not supported"),
    (lambda a: _edit_manifest(a, lambda m: m["runs"][0]["blocks"][0].update(file="../x.parquet"), True), "malformed"),
])
def test_damaged_manifest(two_runs, damage, match):
    arch = two_runs[0]
    damage(arch)
    with pytest.raises(InputError, match=match):
        open_input(str(arch))
    with pytest.raises(InputError, match=match):
        do_append(arch, two_runs[1])


def test_damaged_block(two_runs):
    arch = two_runs[0]
    man = read_manifest(str(arch))
    block = man.block_path(man.runs[1]["blocks"][0])
    data = bytearray(open(block, "rb").read())
    data[len(data) // 2] ^= 0xFF  # same size: found by its SHA-256 when read
    open(block, "wb").write(bytes(data))
    src = open_input(str(arch))
    with pytest.raises(InputError, match="does not match its SHA-256"):
        list(src.batches())
    open(block, "wb").write(bytes(data[:-10]))  # truncated: found when opened
    with pytest.raises(InputError, match="bytes"):
        open_input(str(arch))
    os.unlink(block)
    with pytest.raises(InputError, match="missing"):
        open_input(str(arch))


KILL_SCRIPT = r"""
import os, sys, time
import smerge.datasets.archive as A
from smerge.datasets import open_input
ready, where, layout = sys.argv[3], sys.argv[4], sys.argv[5]
calls = {"n": 0}
def hang():
    open(ready, "w").close()
    time.sleep(60)
if where == "block":  # in the middle of the run's file
    orig = A._write_blob
    def patched(f, data):
        calls["n"] += 1
        if calls["n"] == 3:
            f.flush()
            hang()
        orig(f, data)
    A._write_blob = patched
else:  # after the run's file (and aggregates) are fsynced, before the manifest is replaced
    orig = A._write_manifest
    def patched(d, meta):
        hang()
    A._write_manifest = patched
src = open_input(sys.argv[2])
A.append(sys.argv[1], sys.argv[2], src.batches(), src.schema, A.AppendParams(time="t", run_blocks=8, block_rows=500))
"""


def run_ids_on_disk(arch):
    return {n.split(".")[0] for n in os.listdir(arch / "runs")}


@pytest.mark.parametrize("where", ["block", "manifest"])
def test_killed_append_leaves_archive_unchanged(two_runs, tmp_path, where):
    arch, s1, _ = two_runs
    s3 = make_source(tmp_path / "s3.parquet", 3_000, t0=90_000, seed=3)
    before_manifest = (arch / MANIFEST).read_bytes()
    before, _ = read_all(arch)
    ready = tmp_path / "ready"
    p = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(arch), s3, str(ready), where, "rts"])
    try:
        deadline = time.time() + 30
        while not ready.exists() and time.time() < deadline and p.poll() is None:
            time.sleep(0.02)
        assert ready.exists(), "the append never reached the kill point"
        os.kill(p.pid, signal.SIGKILL)
    finally:
        p.wait()
    assert (arch / MANIFEST).read_bytes() == before_manifest
    assert read_all(arch)[0].equals(before)
    do_append(arch, s3)  # the next append goes on and removes the leftovers
    after, _ = read_all(arch)
    assert after.num_rows == before.num_rows + 3_000
    listed = {r["id"] for r in read_manifest(str(arch)).runs}
    assert run_ids_on_disk(arch) == listed
    assert not [n for n in os.listdir(arch) if ".smerge-" in n]


def test_empty_source_creates_an_empty_archive(tmp_path):
    src = tmp_path / "e.parquet"
    pq.write_table(pa.table({"t": pa.array([], pa.int64()), "v": pa.array([], pa.float64())}), src)
    do_append(tmp_path / "a", str(src))
    got, s = read_all(tmp_path / "a")
    assert got.num_rows == 0 and s.num_rows == 0 and got.schema.names == ["t", "v"]


def test_null_time_refused(tmp_path):
    src = tmp_path / "n.parquet"
    pq.write_table(pa.table({"t": pa.array([1.0, float("nan"), 3.0]), "v": [1, 2, 3]}), src)
    with pytest.raises(InputError, match="missing or NaN at record 1"):
        do_append(tmp_path / "a", str(src))


def test_failed_first_append_leaves_no_folder(tmp_path):
    src = tmp_path / "n.parquet"
    pq.write_table(pa.table({"t": pa.array([1.0, None, 3.0]), "v": [1, 2, 3]}), src)
    with pytest.raises(InputError, match="missing or NaN"):
        do_append(tmp_path / "new", str(src))
    assert not (tmp_path / "new").exists()
