"""Archives (docs/semantics.md section 8): round trips, the sample's fraction and uniformity, killed
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
from smerge.datasets.archive.aggregate import parse_aggregate, read_aggregate
from smerge.datasets.archive.append import AppendParams, append
from smerge.datasets.archive.manifest import blocks_for_fraction, read_block, read_manifest
from smerge.datasets.archive.probe import MANIFEST
from smerge.datasets.archive.read import SAMPLE_ENV, run_sample
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
        # a fixed fraction's sample size is known from the manifest and the seed, before any read
        assert src.counters["sample_fraction"] == f and src.num_rows == got.num_rows
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
        from smerge.datasets.archive.manifest import _digest

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
import smerge.datasets.archive.append as A
import smerge.datasets.archive.blocks as B
from smerge.datasets import open_input
ready, where, layout = sys.argv[3], sys.argv[4], sys.argv[5]
calls = {"n": 0}
def hang():
    open(ready, "w").close()
    while True:  # until the test kills this process (a slow machine must not let it go on)
        time.sleep(60)
if where == "block":  # in the middle of the run's file
    orig = B._write_blob
    def patched(f, data):
        calls["n"] += 1
        if calls["n"] == 3:
            f.flush()
            hang()
        orig(f, data)
    B._write_blob = patched
else:  # after the run's file (and aggregates) are fsynced, before the manifest is replaced
    orig = A._write_manifest
    def patched(d, meta):
        hang()
    A._write_manifest = patched
src = open_input(sys.argv[2])
extra = {} if layout == "rts" else {"copies": (0.2, 0.5, 0.8)}
A.append(sys.argv[1], sys.argv[2], src.batches(), src.schema, A.AppendParams(time="t", run_blocks=8, block_rows=500,
                                                                             **extra))
"""


def run_ids_on_disk(arch):
    return {n.split(".")[0] for n in os.listdir(arch / "runs")}


@pytest.fixture
def two_runs_eager(tmp_path):
    s1 = make_source(tmp_path / "s1.parquet", 12_000, seed=1)
    s2 = make_source(tmp_path / "s2.parquet", 9_000, t0=50_000, seed=2)
    arch = tmp_path / "arch"
    for s in (s1, s2):
        do_append(arch, s, copies=(0.2, 0.5, 0.8), aggregates=(parse_aggregate("1000:count,mean,min,max:cat"),))
    return arch, s1, s2


@pytest.mark.parametrize("layout", ["rts", "eager"])
@pytest.mark.parametrize("where", ["block", "manifest"])
def test_killed_append_leaves_archive_unchanged(request, tmp_path, where, layout):
    arch, s1, _ = request.getfixturevalue("two_runs" if layout == "rts" else "two_runs_eager")
    before_files = snapshot(arch)
    s3 = make_source(tmp_path / "s3.parquet", 3_000, t0=90_000, seed=3)
    before_manifest = (arch / MANIFEST).read_bytes()
    before, _ = read_all(arch)
    ready = tmp_path / "ready"
    p = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(arch), s3, str(ready), where, layout])
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.02)
        assert ready.exists(), "the append never reached the kill point"
        os.kill(p.pid, signal.SIGKILL)
    finally:
        p.wait()
    assert (arch / MANIFEST).read_bytes() == before_manifest
    assert read_all(arch)[0].equals(before)
    if layout == "eager":
        assert read_aggregate(str(arch), "1000_cat").num_rows > 0  # the killed run's aggregate files are not read
    do_append(arch, s3)  # the next append goes on and removes the leftovers
    after, _ = read_all(arch)
    assert after.num_rows == before.num_rows + 3_000
    listed = {r["id"] for r in read_manifest(str(arch)).runs}
    assert run_ids_on_disk(arch) == listed
    assert not [n for n in os.listdir(arch) if ".smerge-" in n]
    if layout == "eager":
        assert {n.split(".")[0] for n in os.listdir(arch / "aggregates" / "1000_cat")} == listed
    # the killed append changed no file the archive had before
    assert all(snapshot(arch).get(k) == v for k, v in before_files.items() if k not in (MANIFEST, ".lock"))


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


# ---- eager layout ------------------------------------------------------------------------------


def test_eager_round_trip_every_record_once_copies_hold_their_fraction(two_runs_eager):
    arch, s1, s2 = two_runs_eager
    got, src = read_all(arch)  # f = 1: the primary copies
    want = pa.concat_tables([pq.read_table(s1), pq.read_table(s2)])
    key = lambda tb: sorted(zip(tb.column("t").to_pylist(), tb.column("v").to_pylist()))  # noqa: E731
    assert got.num_rows == src.num_rows == 21_000 and key(got) == key(want)
    man = read_manifest(str(arch))
    assert man.layout == "eager" and man.meta["copies"] == [0.8, 0.5, 0.2]
    assert all(r["count"] <= 8 * 500 for r in man.runs)
    full = set(zip(want.column("t").to_pylist(), want.column("v").to_pylist()))
    for level in (0.2, 0.5, 0.8):
        rows = []
        for r in man.runs:
            c = next(c for c in r["copies"] if c["level"] == level)
            assert c["fraction"] == pytest.approx(1 - level)
            for b in c["blocks"]:
                t = read_block(man, b)
                assert t.num_rows <= 500
                rows += list(zip(t.column("t").to_pylist(), t.column("v").to_pylist()))
            ts = [x[0] for x in rows[-c["count"]:]] if c["count"] else []
            assert ts == sorted(ts)  # a copy of a run is in time order
        n, p = len(rows), 1 - level
        assert len(set(rows)) == n and set(rows) <= full  # a subset of the stream, each record once
        assert abs(n - p * 21_000) < 4 * np.sqrt(21_000 * p * (1 - p))  # kept with probability 1 - level
    # the primary copy of a run is in time order
    for r in man.runs:
        ts = np.concatenate([read_block(man, b).column("t").to_numpy() for b in r["blocks"]])
        assert np.all(np.diff(ts) >= 0)


@pytest.mark.parametrize("f", [0.01, 0.1, 0.2, 0.21, 0.45, 0.5, 0.5000001, 0.79, 0.8, 0.81, 1.0])
def test_eager_reads_the_smallest_copy_holding_f(two_runs_eager, f):
    arch = two_runs_eager[0]
    man = read_manifest(str(arch))
    want = min(x for x in (0.2, 0.5, 0.8, 1.0) if x >= f - 1e-12)
    rng = np.random.default_rng(0)
    for i, r in enumerate(man.runs):
        blocks, rep = blocks_for_fraction(man, i, f, rng)
        assert rep == pytest.approx(want) and rep >= f - 1e-12
        expect = r["blocks"] if want == 1.0 else next(c["blocks"] for c in r["copies"] if c["fraction"] == rep)
        assert blocks == expect
        # what it holds: at least f of the run in expectation (the copy's count within binomial bounds)
        count = sum(b["count"] for b in blocks)
        assert count >= f * r["count"] - 4 * np.sqrt(r["count"] * 0.25)
    assert rng.random() == np.random.default_rng(0).random()  # eager choices draw nothing


def test_eager_bytes_read_are_a_step_function_of_f(two_runs_eager):
    man = read_manifest(str(two_runs_eager[0]))

    def nbytes(f):
        return sum(b["bytes"] for i in range(len(man.runs)) for b in blocks_for_fraction(man, i, f)[0])

    steps = [nbytes(f) for f in (0.05, 0.2, 0.3, 0.5, 0.6, 0.8, 0.9, 1.0)]
    assert steps[0] == steps[1] < steps[2] == steps[3] < steps[4] == steps[5] < steps[6] == steps[7]
    assert steps[1] < 0.3 * steps[-1] and steps[3] < 0.6 * steps[-1]


def test_rts_blocks_for_fraction_draws_as_the_reader_did(two_runs):
    man = read_manifest(str(two_runs[0]))
    for f in (0.1, 0.3, 0.99):
        rng_a, rng_b = np.random.default_rng([4, 1]), np.random.default_rng([4, 1])
        blocks, rep = blocks_for_fraction(man, 1, f, rng_a)
        r = len(man.runs[1]["blocks"])
        k = max(1, int(np.ceil(r * f - 1e-9)))
        idx = sorted(rng_b.choice(r, size=k, replace=False).tolist())
        assert blocks == [man.runs[1]["blocks"][i] for i in idx] and rep == k / r
    assert blocks_for_fraction(man, 0, 1.0) == (man.runs[0]["blocks"], 1.0)


def test_eager_sampled_read_uniform(two_runs_eager):
    """The copy chosen for f, thinned to f, is a uniform sample (chi-square over time buckets and categories)."""
    arch, s1, s2 = two_runs_eager
    man = read_manifest(str(arch))
    want = pa.concat_tables([pq.read_table(s1), pq.read_table(s2)])
    t_all, c_all = want.column("t").to_numpy(), want.column("cat").to_numpy()
    edges = np.quantile(t_all, np.linspace(0, 1, 21)[1:-1])
    for f in (0.15, 0.4):
        parts = []
        for i in range(len(man.runs)):
            rng = np.random.default_rng([9, i])
            blocks, rep = blocks_for_fraction(man, i, f, rng)
            for b in blocks:
                t = read_block(man, b)
                parts.append(t.filter(pa.array(rng.random(t.num_rows) < f / rep)))
        got = pa.concat_tables(parts)
        assert abs(got.num_rows / 21_000 - f) < 4 * np.sqrt(f * (1 - f) / 21_000)
        st = np.bincount(np.searchsorted(edges, got.column("t").to_numpy(), "right"), minlength=20)
        sc = np.bincount(got.column("cat").to_numpy(), minlength=5)
        for obs, full, df in ((st, np.bincount(np.searchsorted(edges, t_all, "right"), minlength=20), 19),
                              (sc, np.bincount(c_all, minlength=5), 4)):
            exp = full * (obs.sum() / 21_000)
            assert float(((obs - exp) ** 2 / exp).sum()) < CHI2_99[df]


# ---- aggregates --------------------------------------------------------------------------------


def _oracle(con, every, by):
    keys = ", ".join(["w"] + by)
    return con.execute(f"""
        SELECT floor(t / {every})::BIGINT * {every} AS w, {", ".join(by) + "," if by else ""}
               count(*) AS n, count(v) AS v_n, avg(v) AS v_mean, min(v) AS v_min, max(v) AS v_max,
               min(k) AS k_min, max(k) AS k_max
        FROM src GROUP BY {keys} ORDER BY {keys}""").fetchall()


def test_aggregates_equal_a_duckdb_groupby(tmp_path):
    import duckdb

    rng = np.random.default_rng(3)
    tables = []
    for i, n in enumerate((7_000, 5_000)):  # the second append overlaps the first: windows span runs
        t = np.sort(rng.integers(-20_000 + 30_000 * i, 60_000 + 30_000 * i, n))
        v = rng.normal(size=n)
        v[rng.random(n) < 0.05] = np.nan
        tables.append(pa.table({"t": t, "cat": rng.integers(0, 4, n), "k": rng.integers(-50, 50, n),
                                "v": pa.array(v, from_pandas=True)}))
        pq.write_table(tables[-1], tmp_path / f"s{i}.parquet")
    arch = tmp_path / "a"
    specs = (parse_aggregate("1000:count,mean,min,max:cat"), parse_aggregate("7000:min,max,count"))
    for i in range(2):
        do_append(arch, str(tmp_path / f"s{i}.parquet"), run_blocks=4, block_rows=600, aggregates=specs)
    man = read_manifest(str(arch))
    assert len(man.runs) > 4 and all(len(r["aggregates"]) == 2 for r in man.runs)
    con = duckdb.connect()
    con.register("src", pa.concat_tables(tables))
    got = read_aggregate(str(arch), "1000_cat")
    assert got.column_names == ["window", "cat", "count", "k_count", "k_mean", "k_min", "k_max", "v_count", "v_mean",
                                "v_min", "v_max"]
    rows = _oracle(con, 1000, ["cat"])
    assert got.num_rows == len(rows)
    assert got.column("window").to_pylist() == [r[0] for r in rows]
    assert got.column("cat").to_pylist() == [r[1] for r in rows]
    assert got.column("count").to_pylist() == [r[2] for r in rows]
    assert got.column("v_count").to_pylist() == [r[3] for r in rows]
    np.testing.assert_allclose(got.column("v_mean").to_numpy(zero_copy_only=False),
                               np.array([r[4] for r in rows], dtype=float), rtol=1e-9)
    assert got.column("v_min").to_pylist() == [r[5] for r in rows]
    assert got.column("v_max").to_pylist() == [r[6] for r in rows]
    assert got.column("k_min").to_pylist() == [r[7] for r in rows]
    assert got.column("k_max").to_pylist() == [r[8] for r in rows]
    got2 = read_aggregate(str(arch), "7000")
    rows2 = _oracle(con, 7000, [])
    assert got2.column_names == ["window", "count", "cat_min", "cat_max", "k_min", "k_max", "v_min", "v_max"]
    assert got2.column("window").to_pylist() == [r[0] for r in rows2]
    assert got2.column("count").to_pylist() == [r[1] for r in rows2]
    assert got2.column("k_max").to_pylist() == [r[7] for r in rows2]
    # each run's partial file is plain Parquet at the documented path
    r0 = man.runs[0]
    part = pq.read_table(arch / "aggregates" / "1000_cat" / f"{r0['id']}.parquet")
    assert sum(part.column("count").to_pylist()) == r0["count"]
    with pytest.raises(UsageError, match="no aggregate"):
        read_aggregate(str(arch), "1h")


def test_aggregate_windows_of_timestamps(tmp_path):
    import duckdb

    rng = np.random.default_rng(5)
    n = 5_000
    t = (np.datetime64("2024-03-01T00:00:00", "ms") + np.sort(rng.integers(0, 3 * 86400_000, n)).astype("timedelta64[ms]"))
    tb = pa.table({"t": t, "station": rng.choice(["a", "b", "c"], n), "v": rng.random(n)})
    pq.write_table(tb, tmp_path / "s.parquet")
    do_append(tmp_path / "a", str(tmp_path / "s.parquet"), run_blocks=4, block_rows=500,
              aggregates=(parse_aggregate("1h:count,mean:station"),))
    got = read_aggregate(str(tmp_path / "a"), "1h_station")
    assert got.schema.field("window").type == pa.timestamp("ms")
    con = duckdb.connect()
    con.register("src", tb)
    rows = con.execute("SELECT date_trunc('hour', t) AS w, station, count(*), avg(v) FROM src GROUP BY ALL "
                       "ORDER BY w, station").fetchall()
    assert [(r[0], r[1], r[2]) for r in rows] == list(zip(got.column("window").to_pylist(),
                                                          got.column("station").to_pylist(),
                                                          got.column("count").to_pylist()))
    np.testing.assert_allclose(got.column("v_mean").to_numpy(), [r[3] for r in rows], rtol=1e-9)


@pytest.mark.parametrize("text,match", [
    ("1h", "EVERY:FUNCS"), ("1h:count:a:b", "EVERY:FUNCS"), ("0:count", "positive duration"),
    ("1 fortnight:count", "not a duration"), ("1m:count", "minutes or months"), ("1h:sum", "not 'sum'"),
    ("1h:count,count", "distinct"), ("1h:", "FUNCS"), ("1h:count:a,,b", "BY"), ("1h:count:a,a", "BY"),
])
def test_aggregate_parse_errors(text, match):
    with pytest.raises(UsageError, match=match):
        parse_aggregate(text)


def test_aggregate_and_copies_checked_against_the_stream(two_runs, tmp_path):
    s = two_runs[1]
    for aggs, match in (((parse_aggregate("1h:count"),), "plain number"), ((parse_aggregate("10:mean:nope"),), "nope"),
                        ((parse_aggregate("10:mean:t"),), "drop 't'"), ((parse_aggregate("2.5:count"),), "whole")):
        with pytest.raises(UsageError, match=match):
            do_append(tmp_path / "new", s, aggregates=aggs)
        assert not (tmp_path / "new").exists()
    for copies in ((0.0,), (1.0,), (0.5, 0.5), (-0.2,)):
        with pytest.raises(UsageError, match="^copies "):
            do_append(tmp_path / "new", s, copies=copies)
    arch = two_runs[0]  # randomize-then-sort: eager options refused on append
    before = snapshot(arch)
    with pytest.raises(UsageError, match="layout"):
        do_append(arch, s, layout="eager", copies=(0.5,))
    with pytest.raises(UsageError, match="aggregate"):
        do_append(arch, s, aggregates=(parse_aggregate("10:count"),))
    assert snapshot(arch) == before


def test_eager_read_through_the_reader_reads_the_chosen_copy(two_runs_eager):
    arch = two_runs_eager[0]
    man = read_manifest(str(arch))
    for f, level in ((0.15, 0.8), (0.3, 0.5), (0.5, 0.5), (0.7, 0.2)):
        got, src = read_all(arch, sample=f, sample_seed=3)
        copy_bytes = sum(b["bytes"] for r in man.runs for c in r["copies"] if c["level"] == level for b in c["blocks"])
        assert src.counters["bytes_read"] == copy_bytes
        assert abs(got.num_rows / 21_000 - f) < 4 * np.sqrt(f * (1 - f) / 21_000)
    got, src = read_all(arch, sample=1.0)
    assert src.counters["bytes_read"] == sum(b["bytes"] for r in man.runs for b in r["blocks"])


@pytest.mark.parametrize("copies", [(), (0.5,)])
def test_bad_time_later_keeps_the_runs_committed_before(tmp_path, copies):
    """The commit of a run runs beside the next run's writing: an append stopped by a bad record
    still commits the runs before it whole, and leaves no file of the stopped run."""
    t = np.arange(12_000, dtype=float)
    t[11_000] = np.nan
    table = pa.table({"t": t, "cat": np.zeros(12_000, np.int64), "v": np.ones(12_000)})
    params = AppendParams(time="t", run_blocks=8, block_rows=500, seed=1, copies=copies)  # runs of <= 4,000 records
    with pytest.raises(InputError, match="missing or NaN at record 11000"):
        # batches of 1,000: the bad record is seen after some runs were written
        append(str(tmp_path / "a"), "n", table.to_batches(1000), table.schema, params)
    man = read_manifest(str(tmp_path / "a"))
    got, _ = read_all(tmp_path / "a")
    assert man.count == got.num_rows and 4_000 <= got.num_rows <= 11_000
    assert got.column("t").to_pylist() == list(np.arange(got.num_rows, dtype=float))
    assert run_ids_on_disk(tmp_path / "a") == {r["id"] for r in man.runs}
