"""`smerge archive append|info` through the CLI, and an archive as the input of other commands:
cgm over an archive at f = 1 equals cgm over the original file; bad input is exit 2, one line."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smerge.datasets.archive.read import SAMPLE_ENV
from cli_run import run_cli  # noqa: E402 (tests/helpers: the shared CLI test helper)


def snapshot(folder):
    out = {}
    for root, _, files in os.walk(folder):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, folder)] = fh.read()
    return out


@pytest.fixture
def ab(tmp_path):
    n = 4000
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    pq.write_table(pa.table({"t": np.arange(0, 2 * n, 2.0), "x": np.arange(n)}), a)
    pq.write_table(pa.table({"t": np.arange(0, 3 * n, 3.0) + 0.1, "y": np.arange(n)}), b)
    return a, b


@pytest.fixture
def arch(ab, tmp_path, capsys):
    a, _ = ab
    out = tmp_path / "arch"
    half = tmp_path / "a1.parquet", tmp_path / "a2.parquet"
    t = pq.read_table(a)
    pq.write_table(t.slice(0, 2500), half[0])
    pq.write_table(t.slice(2500), half[1])
    for h in half:
        rc, so, se = run_cli(capsys, "archive", "append", out, h, "--time", "t", "--run-blocks", "4",
                             "--block-rows", "300", "--seed", "3")
        assert rc == 0, se
        assert "records of" in so
    return out


def test_info_verify_reads_every_block(arch, capsys):
    assert run_cli(capsys, "archive", "info", arch, "--verify")[0] == 0
    _flip_block(arch)
    assert run_cli(capsys, "archive", "info", arch)[0] == 0  # sizes unchanged: only --verify hashes
    rc, _, se = run_cli(capsys, "archive", "info", arch, "--verify")
    assert rc == 2 and "SHA-256" in se


def test_append_and_info(arch, capsys):
    rc, so, se = run_cli(capsys, "archive", "info", arch)
    assert rc == 0, se
    assert "4,000 records" in so and "time 0.0 .. 7998.0" in so
    rc, so, se = run_cli(capsys, "archive", "info", arch, "--json")
    d = json.loads(so)
    assert d["count"] == 4000 and d["runs"] == len(d["run_list"]) > 2 and d["time"] == "t"
    assert d["blocks"] <= 4 * d["runs"] and d["format"] == "smerge-archive/1"


def test_append_json(ab, tmp_path, capsys):
    rc, so, se = run_cli(capsys, "archive", "append", tmp_path / "z", ab[1], "--time", "t", "--json")
    assert rc == 0, se
    d = json.loads(so)
    assert d["records_added"] == 4000 and d["runs"] == 1


def test_cgm_over_archive_equals_the_original(ab, arch, tmp_path, capsys):
    a, b = ab
    outs = []
    for i, src in enumerate((a, arch)):
        out, stats = tmp_path / f"o{i}.parquet", tmp_path / f"s{i}.json"
        rc, _, se = run_cli(capsys, "cgm", src, b, "--keys", "t", "--eps", "0.6", "--local", "-o", out,
                            "--stats", stats)
        assert rc == 0, se
        s = json.loads(stats.read_text())
        outs.append((pq.read_table(out), s["matched"], s["a_records"]))
    assert outs[0][0].equals(outs[1][0])
    assert outs[0][1:] == outs[1][1:] and outs[0][1] > 0


def test_index_build_over_archive(arch, tmp_path, capsys):
    rc, so, se = run_cli(capsys, "index", "build", arch, "-o", tmp_path / "idx", "--keys", "t", "--json")
    assert rc == 0, se
    assert json.loads(so)["count"] == 4000


def test_cgm_sample_from_environment(ab, arch, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(SAMPLE_ENV, "0.5")
    stats = tmp_path / "s.json"
    rc, _, se = run_cli(capsys, "cgm", arch, ab[1], "--keys", "t", "--eps", "0.6", "--local", "-o",
                        tmp_path / "o.parquet", "--stats", stats)
    assert rc == 0, se
    n = json.loads(stats.read_text())["a_records"]
    assert 1600 < n < 2400
    monkeypatch.setenv(SAMPLE_ENV, "2")
    rc, so, se = run_cli(capsys, "cgm", arch, ab[1], "--keys", "t", "--eps", "0.6", "--local", "-o",
                         tmp_path / "o2.parquet")
    assert rc == 2 and len(se.strip().splitlines()) == 1 and "(0, 1]" in se
    assert not (tmp_path / "o2.parquet").exists()


def _break_manifest(arch):
    (arch / "manifest.json").write_text((arch / "manifest.json").read_text().replace('"count": 4000', '"count": 4001'))


def _flip_block(arch):
    blocks = sorted((arch / "runs").glob("*.blocks"))
    data = bytearray(blocks[0].read_bytes())
    data[20] ^= 0xFF
    blocks[0].write_bytes(bytes(data))


@pytest.mark.parametrize("damage,args,match", [
    (None, ["archive", "info", "{tmp}"], "not an smerge archive"),
    (_break_manifest, ["archive", "info", "{arch}"], "damaged archive"),
    (_break_manifest, ["cgm", "{arch}", "{b}", "--keys", "t", "--local", "-o", "{tmp}/o.parquet"], "damaged archive"),
    (_flip_block, ["cgm", "{arch}", "{b}", "--keys", "t", "--local", "-o", "{tmp}/o.parquet"], "SHA-256"),
    (_flip_block, ["index", "build", "{arch}", "--keys", "t", "-o", "{tmp}/idx"], "SHA-256"),
    (_flip_block, ["archive", "info", "{arch}", "--verify"], "SHA-256"),
    (None, ["archive", "append", "{arch}", "{b2}", "--time", "t"], "differs from the archive"),
    (None, ["archive", "append", "{arch}", "{tmp}/a1.parquet", "--time", "x"], "archive's time column is 't'"),
    (None, ["archive", "append", "{tmp}/new", "{b}", "--time", "nope"], "no time column 'nope'"),
    (None, ["archive", "append", "{arch}", "{arch}", "--time", "t"], "archive itself"),
    (None, ["archive", "append", "{arch}", "{b}", "--time", "t", "--run-blocks", "0"], "--run-blocks"),
    (None, ["archive", "append", "{arch}", "{b}", "--time", "t", "--block-rows", "0"], "--block-rows"),
    (None, ["archive", "append", "{tmp}", "{b}", "--time", "t"], "not empty"),
])
def test_bad_input_exit_2_nothing_changed(ab, arch, tmp_path, capsys, damage, args, match):
    b2 = tmp_path / "b2.parquet"
    pq.write_table(pa.table({"t": np.arange(5.0), "x": np.arange(5.0)}), b2)  # x double, not int64
    if damage:
        damage(arch)
    before, listing = snapshot(arch), sorted(os.listdir(tmp_path))
    rc, so, se = run_cli(capsys, *[a.format(tmp=tmp_path, arch=arch, b=ab[1], b2=b2) for a in args])
    assert rc == 2, (so, se)
    assert len(se.strip().splitlines()) == 1 and match in se, se
    assert snapshot(arch) == before and sorted(os.listdir(tmp_path)) == listing


def test_cgm_and_rtm_sample_options(ab, arch, tmp_path, capsys):
    for cmd in ("cgm", "rtm"):
        rc, so, se = run_cli(capsys, cmd, arch, ab[1], "--keys", "t", "--eps", "0.6", "--local", "-o",
                             tmp_path / f"{cmd}.parquet", "--sample-a", "0.5", "--json")
        assert rc == 0, se
        s = json.loads(so)
        assert s["a_sample_fraction"] == 0.5 and "b_sample_fraction" not in s
        assert 1600 < s["a_records"] < 2400
    # a request lasts one command: the next run reads the whole archive
    rc, so, se = run_cli(capsys, "cgm", arch, ab[1], "--keys", "t", "--eps", "0.6", "--local", "-o",
                         tmp_path / "full.parquet", "--json")
    s = json.loads(so)
    assert s["a_records"] == 4000 and s["a_sample_fraction"] == 1.0


def test_wjoin_sample_option(ab, arch, tmp_path, capsys):
    rc, so, se = run_cli(capsys, "wjoin", arch, ab[1], "--time", "t", "--window", "1", "--local", "-o",
                         tmp_path / "w.parquet", "--sample", "0.5", "--json")
    assert rc == 0, se
    s = json.loads(so)
    assert s["sample_fractions"] == [0.5, None] and 1600 < s["records_read"]["S1"] < 2400
    assert s["tuples_estimate"] == s["tuples"] / 0.5
    assert s["tuples_estimate_95"][0] <= s["tuples_estimate"] <= s["tuples_estimate_95"][1]


@pytest.mark.parametrize("args,match", [
    (["cgm", "{arch}", "{b}", "--keys", "t", "--local", "--sample-a", "0"], "(0, 1]"),
    (["cgm", "{arch}", "{b}", "--keys", "t", "--local", "--sample-a", "1.5"], "(0, 1]"),
    (["cgm", "{arch}", "{b}", "--keys", "t", "--local", "--sample-b", "0.5"], "not an archive folder"),
    (["rtm", "{arch}", "{b}", "--keys", "t", "--local", "--sample-a", "nan"], "(0, 1]"),
    (["wjoin", "{b}", "{b}", "--time", "t", "--window", "1", "--local", "--sample", "0.5"], "no input is an archive"),
    (["wjoin", "{arch}", "{b}", "--time", "t", "--window", "1", "--local", "--sample", "abc"], "fraction in (0, 1]"),
])
def test_bad_sample_options(ab, arch, tmp_path, capsys, args, match):
    out = tmp_path / "o.parquet"
    rc, so, se = run_cli(capsys, *[a.format(arch=arch, b=ab[1]) for a in args], "-o", out)
    assert rc == 2 and len(se.strip().splitlines()) == 1 and match in se, se
    assert not out.exists()


def test_rtm_with_b_an_archive_equals_the_file(ab, tmp_path, capsys):
    a, b = ab
    barch = tmp_path / "barch"
    rc, _, se = run_cli(capsys, "archive", "append", barch, b, "--time", "t", "--run-blocks", "4",
                        "--block-rows", "300", "--seed", "4")
    assert rc == 0, se
    outs = []
    for i, src in enumerate((b, barch)):  # B is read and indexed by the server this run starts
        out = tmp_path / f"r{i}.parquet"
        rc, so, se = run_cli(capsys, "rtm", a, src, "--keys", "t", "--eps", "0.6", "--local", "-o", out, "--json")
        assert rc == 0, se
        outs.append((pq.read_table(out).sort_by("t"), json.loads(so)["matched"]))
    assert outs[0][0].equals(outs[1][0]) and outs[0][1] == outs[1][1] > 0


def test_estimates_and_their_95_intervals(ab, arch, tmp_path, capsys, monkeypatch):
    rc, so, se = run_cli(capsys, "cgm", arch, ab[1], "--keys", "t", "--eps", "0.6", "--local", "-o",
                         tmp_path / "full.parquet", "--json")
    full = json.loads(so)
    assert "matched_estimate" not in full and "a_records_estimate" not in full  # f = 1: counts are exact
    # The interval is binomial: calibrated over the random layout and the sample together, not for
    # one layout (docs/archive.md). So: three layouts x 20 sample seeds; expected coverage ~95%.
    covered = 0
    for layout in (3, 4, 5):
        lay = tmp_path / f"lay{layout}"
        rc, _, se = run_cli(capsys, "archive", "append", lay, ab[0], "--time", "t", "--run-blocks", "4",
                            "--block-rows", "300", "--seed", layout)
        assert rc == 0, se
        for seed in range(20):
            monkeypatch.setenv("SMERGE_ARCHIVE_SEED", str(seed))
            rc, so, se = run_cli(capsys, "cgm", lay, ab[1], "--keys", "t", "--eps", "0.6", "--local", "-o",
                                 tmp_path / "s.parquet", "--overwrite", "--sample-a", "0.5", "--json")
            assert rc == 0, se
            s = json.loads(so)
            assert s["matched_estimate"] == s["matched"] / 0.5 and s["a_records_estimate"] == s["a_records"] / 0.5
            lo, hi = s["matched_estimate_95"]
            covered += lo <= full["matched"] <= hi
    assert covered >= 51, covered  # of 60

@pytest.fixture
def earch(ab, tmp_path, capsys):
    out = tmp_path / "earch"
    rc, so, se = run_cli(capsys, "archive", "append", out, ab[0], "--time", "t", "--copies", "0.2,0.4,0.6,0.8",
                         "--aggregate", "100:count,mean,min,max", "--run-blocks", "4", "--block-rows", "300",
                         "--seed", "3")
    assert rc == 0, se
    return out


def test_eager_append_and_info(ab, earch, capsys, tmp_path):
    rc, so, se = run_cli(capsys, "archive", "info", earch)
    assert rc == 0, se
    assert "eager" in so and "copy at 0.2 reduction (keeps 0.8)" in so and "copy at 0.8 reduction (keeps 0.2)" in so
    assert "aggregate 100: every 100, count,mean,min,max of x" in so
    rc, so, _ = run_cli(capsys, "archive", "info", earch, "--json", "--verify")
    d = json.loads(so)
    assert d["layout"] == "eager" and d["count"] == 4000 and d["runs"] == 4  # runs of R x B = 1200 records
    assert [c["level"] for c in d["copies"]] == [0.2, 0.4, 0.6, 0.8]
    counts = [c["count"] for c in d["copies"]]
    assert counts == sorted(counts, reverse=True) and all(abs(c["count"] - 4000 * c["fraction"]) < 200
                                                          for c in d["copies"])
    assert d["aggregates"][0]["name"] == "100" and d["aggregates"][0]["values"] == ["x"]
    assert os.path.isdir(d["aggregates"][0]["path"])
    # every command reads the primary copy at f = 1: cgm over it equals cgm over the file
    for src, o in ((ab[0], "f.parquet"), (earch, "e.parquet")):
        rc, _, se = run_cli(capsys, "cgm", src, ab[1], "--keys", "t", "--eps", "0.6", "--local", "-o", tmp_path / o)
        assert rc == 0, se
    f, e = pq.read_table(tmp_path / "f.parquet"), pq.read_table(tmp_path / "e.parquet")
    assert f.num_rows > 1000 and e.equals(f)
    # a later append keeps the archive's layout, copies and aggregates when they are not given
    rc, so, se = run_cli(capsys, "archive", "append", earch, ab[0], "--time", "t", "--json")
    assert rc == 0, se
    assert json.loads(so)["layout"] == "eager"
    d = json.loads(run_cli(capsys, "archive", "info", earch, "--json")[1])
    assert d["count"] == 8000 and d["aggregates"][0]["rows"] > 0


@pytest.mark.parametrize("args,match", [
    (["--copies", "0"], "(0, 1)"), (["--copies", "1"], "(0, 1)"), (["--copies", "0.2,1.5"], "(0, 1)"),
    (["--copies", "-0.1"], "(0, 1)"), (["--copies", "a,b"], "reduction levels"), (["--copies", "0.2,0.2"], "distinct"),
    (["--copies", "0.5", "--layout", "randomize-then-sort"], "eager"), (["--layout", "eager"], "needs --copies"),
    (["--layout", "sorted"], "--layout"),
    (["--aggregate", "1h"], "EVERY:FUNCS"), (["--aggregate", "1h:median"], "not 'median'"),
    (["--aggregate", "0:count"], "positive duration"), (["--aggregate", "5:count:zz"], "'zz'"),
    (["--aggregate", "1h:count"], "plain number"),
    (["--aggregate", "10:count", "--aggregate", "10:max"], "given twice"),
])
def test_bad_eager_and_aggregate_options_exit_2_nothing_written(ab, tmp_path, capsys, args, match):
    listing = sorted(os.listdir(tmp_path))
    rc, so, se = run_cli(capsys, "archive", "append", tmp_path / "new", ab[0], "--time", "t", *args)
    assert rc == 2, (so, se)
    assert len(se.strip().splitlines()) == 1 and match in se, se
    assert sorted(os.listdir(tmp_path)) == listing


@pytest.mark.parametrize("args,match", [
    (["{b2}"], "differs from the archive"),
    (["{a}", "--copies", "0.5"], "differ from the archive's"),
    (["{a}", "--layout", "randomize-then-sort"], "archive's layout is eager"),
    (["{a}", "--aggregate", "100:count"], "differs from the archive's aggregates"),
])
def test_bad_append_to_eager_archive_exit_2_nothing_changed(ab, earch, tmp_path, capsys, args, match):
    b2 = tmp_path / "b2.parquet"
    pq.write_table(pa.table({"t": np.arange(5.0), "x": np.arange(5.0)}), b2)  # x double, not int64
    before = snapshot(earch)
    rc, so, se = run_cli(capsys, "archive", "append", earch,
                         *[a.format(a=ab[0], b2=b2) for a in args[:1]], "--time", "t", *args[1:])
    assert rc == 2, (so, se)
    assert len(se.strip().splitlines()) == 1 and match in se, se
    assert snapshot(earch) == before
