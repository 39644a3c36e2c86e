"""Sampled archive inputs through the CLI: ``--sample auto --budget`` for cgm, rtm, wjoin and
count; cgm's matched on a sample equals the oracle the calibration test stands on; count's
estimates equal the materialised sample's counts over f; bad options (exit 2, one line, no
output); the hybrid query (a live ``grpc://`` stream from ``smerge serve`` against an archive)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smerge.datasets import open_input
from cli_run import run_cli  # noqa: E402 (tests/helpers: the shared CLI test helper)

SMERGE = [sys.executable, "-m", "smerge"]
TOKEN = "archive-sampling-token-0123456789"


@pytest.fixture
def ab(tmp_path):
    """A: t = 0, 2, 4, ..., B: t = 0.1, 3.1, 6.1, ...: with eps 0.6 the A records with t % 6 == 0
    match, each with one B record and no other candidate (CGM's pairing is then exact)."""
    n = 6000
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    rng = np.random.default_rng(2)
    pq.write_table(pa.table({"t": np.arange(0, 2 * n, 2.0), "x": np.arange(n), "cat": rng.integers(0, 4, n)}), a)
    pq.write_table(pa.table({"t": np.arange(0, 3 * n, 3.0) + 0.1, "y": np.arange(n)}), b)
    return a, b


@pytest.fixture
def arch(ab, tmp_path, capsys):
    arch = tmp_path / "arch"
    rc, _, se = run_cli(capsys, "archive", "append", arch, ab[0], "--time", "t", "--run-blocks", "8",
                        "--block-rows", "150", "--seed", "3")
    assert rc == 0, se
    return arch


def test_cgm_matched_on_a_sample_equals_the_oracle(ab, arch, tmp_path, capsys, monkeypatch):
    """What tests/datasets/test_archive_sampling.py's calibration counts (records with t % 6 == 0
    in the sample) is what cgm reports as matched for the same sample."""
    for seed in (0, 1, 2):
        monkeypatch.setenv("SMERGE_ARCHIVE_SEED", str(seed))
        rc, so, se = run_cli(capsys, "cgm", arch, ab[1], "--keys", "t", "--eps", "0.6", "--local", "-o",
                             tmp_path / "s.parquet", "--overwrite", "--sample-a", "0.5", "--json")
        assert rc == 0, se
        s = json.loads(so)
        src = open_input(str(arch), sample=0.5, sample_seed=seed)
        t = np.concatenate([b.column("t").to_numpy() for b in src.batches()])
        assert s["matched"] == int(np.sum(t % 6 == 0)) and s["a_records"] == len(t)
        assert s["matched_estimate"] == s["matched"] / 0.5


def _full_and_auto(capsys, args, out_full, out_auto, budget, sample_opt):
    rc, so, se = run_cli(capsys, *args, "-o", out_full, "--json")
    assert rc == 0, se
    rc, so2, se = run_cli(capsys, *args, "-o", out_auto, "--json", sample_opt, "auto", "--budget", budget)
    assert rc == 0, se
    return json.loads(so), json.loads(so2)


@pytest.mark.parametrize("cmd", ["cgm", "rtm"])
def test_auto_with_an_ample_budget_equals_the_full_run(ab, arch, tmp_path, capsys, cmd):
    args = [cmd, arch, ab[1], "--keys", "t", "--eps", "0.6", "--local"]
    full, auto = _full_and_auto(capsys, args, tmp_path / "f.parquet", tmp_path / "s.parquet", "600", "--sample-a")
    assert auto["a_sample_mode"] == "auto" and auto["a_sample_budget"] == 600
    assert set(auto["a_sample_run_fractions"]) == {1.0} and auto["a_sample_fraction"] == 1.0
    assert auto["matched"] == full["matched"] > 0
    assert pq.read_table(tmp_path / "s.parquet").sort_by("t").equals(pq.read_table(tmp_path / "f.parquet").sort_by("t"))


def test_wjoin_and_count_auto_with_an_ample_budget(ab, arch, tmp_path, capsys):
    args = ["wjoin", arch, ab[1], "--time", "t", "--window", "1", "--local"]
    full, auto = _full_and_auto(capsys, args, tmp_path / "f.parquet", tmp_path / "s.parquet", "600", "--sample")
    assert auto["sample_fractions"] == [1.0, None] and auto["sample_mode"] == "auto"
    assert auto["sample_run_fractions"][1] is None and set(auto["sample_run_fractions"][0]) == {1.0}
    assert auto["tuples"] == full["tuples"] > 0
    args = ["count", arch, "--item", "cat", "--time", "t", "--every", "1000"]
    full, auto = _full_and_auto(capsys, args, tmp_path / "f.csv", tmp_path / "s.csv", "600", "--sample")
    assert auto["sample_fraction"] == 1.0 and auto["estimated_answers"] == 0
    assert (tmp_path / "s.csv").read_text() == (tmp_path / "f.csv").read_text()


def test_auto_with_a_tiny_budget_reads_one_block_per_run(ab, arch, tmp_path, capsys):
    rc, so, se = run_cli(capsys, "cgm", arch, ab[1], "--keys", "t", "--eps", "0.6", "--local", "-o",
                         tmp_path / "s.parquet", "--sample-a", "auto", "--budget", "0.001", "--json")
    assert rc == 0, se
    s = json.loads(so)
    from smerge.datasets.archive.manifest import read_manifest

    runs = read_manifest(str(arch)).runs
    assert s["a_sample_run_fractions"] == [1 / len(r["blocks"]) for r in runs]  # the least a read can do
    assert s["a_sample_fraction"] < 0.2 and s["a_records"] < 1500
    lo, hi = s["matched_estimate_95"]
    assert lo <= s["matched_estimate"] <= hi and s["a_records_estimate_95"][0] <= 6000 <= s["a_records_estimate_95"][1]


def test_count_estimates_are_the_samples_counts_over_f(arch, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SMERGE_ARCHIVE_SEED", "7")
    out = tmp_path / "c.parquet"
    rc, so, se = run_cli(capsys, "count", arch, "--item", "cat", "--time", "t", "--every", "2000", "--sample",
                         "0.25", "-o", out, "--json")
    assert rc == 0, se
    s = json.loads(so)
    got = pq.read_table(out)
    src = open_input(str(arch), sample=0.25, sample_seed=7)
    tab = pa.Table.from_batches(list(src.batches()))
    t, cat = tab.column("t").to_numpy(), tab.column("cat").to_numpy()
    want = {}
    for iv, c in zip((t // 2000).astype(int), cat):
        want[(iv * 2000, int(c))] = want.get((iv * 2000, int(c)), 0) + 1
    assert {(int(r["start"]), r["item"]): r["count"] for r in got.to_pylist()} == {k: v / 0.25 for k, v in want.items()}
    assert not any(got.column("exact").to_pylist())
    assert s["sample_fraction"] == 0.25 and s["records_received"] == len(t)
    assert s["records_estimate"] == len(t) / 0.25


@pytest.mark.parametrize("args,match", [
    (["cgm", "{arch}", "{b}", "--keys", "t", "--local", "--sample-a", "auto"], "needs --budget"),
    (["cgm", "{arch}", "{b}", "--keys", "t", "--local", "--budget", "5"], "applies to --sample auto"),
    (["cgm", "{arch}", "{b}", "--keys", "t", "--local", "--sample-a", "0.5", "--budget", "5"], "applies to --sample auto"),
    (["cgm", "{arch}", "{b}", "--keys", "t", "--local", "--sample-a", "auto", "--budget", "0"], "--budget is '0'"),
    (["cgm", "{arch}", "{b}", "--keys", "t", "--local", "--sample-a", "auto", "--budget", "abc"], "--budget is 'abc'"),
    (["rtm", "{arch}", "{b}", "--keys", "t", "--local", "--sample-a", "auto", "--budget", "-1"], "--budget is '-1'"),
    (["cgm", "{arch}", "{b}", "--keys", "t", "--local", "--sample-b", "auto", "--budget", "5"], "not an archive folder"),
    (["cgm", "{arch}", "{b}", "--keys", "t", "--master", "local[1]", "--sample-a", "auto", "--budget", "5"], "--local"),
    (["wjoin", "{b}", "{b}", "--time", "t", "--window", "1", "--local", "--sample", "auto", "--budget", "5"],
     "no input is an archive"),
    (["wjoin", "{arch}", "{b}", "--time", "t", "--window", "1", "--local", "--sample", "auto"], "needs --budget"),
    (["count", "{b}", "--item", "y", "--time", "t", "--every", "10", "--sample", "0.5"], "no input is an archive"),
    (["count", "{arch}", "--item", "cat", "--time", "t", "--every", "10", "--budget", "3"], "applies to --sample auto"),
])
def test_bad_auto_options(ab, arch, tmp_path, capsys, args, match):
    out = tmp_path / "o.parquet"
    rc, so, se = run_cli(capsys, *[a.format(arch=arch, b=ab[1]) for a in args], "-o", out)
    assert rc == 2 and len(se.strip().splitlines()) == 1 and match in se, se
    assert not out.exists()


# --------------------------------------------------------------------------------------------
# The hybrid query: a live stream (served over loopback) against an archive, --sample auto


def _serve(path, *extra):
    tok = path.parent / "token"
    tok.write_text(TOKEN)
    p = subprocess.Popen([*SMERGE, "serve", str(path), "--port", "0", "--token-file", str(tok), *extra],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = p.stdout.readline().strip()
    assert url.startswith("grpc"), p.stderr.read()
    return p, url


@pytest.mark.slow
def test_hybrid_live_stream_against_an_archive(ab, arch, tmp_path, capsys, monkeypatch):
    p, url = _serve(ab[1], "--keys", "t")
    try:
        monkeypatch.setenv("SMERGE_TOKEN", TOKEN)
        base = ["wjoin", url, arch, "--time", "t", "--window", "1", "--local", "--json", "--overwrite"]
        rc, so, se = run_cli(capsys, *base, "-o", tmp_path / "full.parquet")
        assert rc == 0, se
        full = json.loads(so)
        rc, so, se = run_cli(capsys, *base, "-o", tmp_path / "ample.parquet", "--sample", "auto", "--budget", "600")
        assert rc == 0, se
        ample = json.loads(so)
        assert ample["sample_fractions"] == [None, 1.0] and ample["tuples"] == full["tuples"] > 0
        assert pq.read_table(tmp_path / "ample.parquet").equals(pq.read_table(tmp_path / "full.parquet"))
        rc, so, se = run_cli(capsys, *base, "-o", tmp_path / "tiny.parquet", "--sample", "auto", "--budget", "0.001")
        assert rc == 0, se
        tiny = json.loads(so)
        assert tiny["sample_fractions"][0] is None and tiny["sample_fractions"][1] < 0.2
        assert tiny["tuples"] < full["tuples"]
        lo, hi = tiny["tuples_estimate_95"]
        assert lo <= tiny["tuples_estimate"] <= hi and tiny["tuples_estimate"] == pytest.approx(
            tiny["tuples"] / tiny["sample_fractions"][1])
    finally:
        p.terminate()
        p.wait(timeout=30)


def test_auto_from_the_environment(arch, tmp_path, capsys, monkeypatch):
    """SMERGE_ARCHIVE_SAMPLE=auto with SMERGE_ARCHIVE_BUDGET: every archive input of any command."""
    monkeypatch.setenv("SMERGE_ARCHIVE_SAMPLE", "auto")
    monkeypatch.setenv("SMERGE_ARCHIVE_BUDGET", "600")
    rc, so, se = run_cli(capsys, "count", arch, "--item", "cat", "--time", "t", "--every", "1000", "--json")
    assert rc == 0, se
    s = json.loads(so)
    assert s["sample_mode"] == "auto" and s["sample_budget"] == 600 and set(s["sample_run_fractions"]) == {1.0}
    assert s["records_received"] == 6000 and s["estimated_answers"] == 0
    monkeypatch.delenv("SMERGE_ARCHIVE_BUDGET")
    rc, so, se = run_cli(capsys, "count", arch, "--item", "cat", "--time", "t", "--every", "1000", "--json")
    assert rc == 2 and len(se.strip().splitlines()) == 1 and "SMERGE_ARCHIVE_BUDGET" in se, se


@pytest.mark.parametrize("cmd", ["cgm", "wjoin"])
def test_run_over_a_sample_equals_the_run_over_the_materialised_sample(ab, arch, tmp_path, capsys, monkeypatch,
                                                                       cmd):
    """A cgm or wjoin over an archive read at F = 0.5 gives the same rows as the same command over
    that sample written out as a plain Parquet file (same seed)."""
    monkeypatch.setenv("SMERGE_ARCHIVE_SEED", "7")
    src = open_input(str(arch), sample=0.5, sample_seed=7)
    sample = pa.Table.from_batches(list(src.batches()))
    assert 0 < sample.num_rows < 6000
    mat = tmp_path / "sample.parquet"
    pq.write_table(sample, mat)
    opts = (["--keys", "t", "--eps", "0.6"] if cmd == "cgm" else ["--time", "t", "--window", "1"])
    sample_opt = "--sample-a" if cmd == "cgm" else "--sample"
    rc, so, se = run_cli(capsys, cmd, arch, ab[1], *opts, "--local", "-o", tmp_path / "s.parquet",
                         sample_opt, "0.5", "--json")
    assert rc == 0, se
    rc, so2, se = run_cli(capsys, cmd, mat, ab[1], *opts, "--local", "-o", tmp_path / "m.parquet", "--json")
    assert rc == 0, se
    got, want = pq.read_table(tmp_path / "s.parquet"), pq.read_table(tmp_path / "m.parquet")
    assert got.num_rows > 0
    assert got.replace_schema_metadata(None).equals(want.replace_schema_metadata(None))
