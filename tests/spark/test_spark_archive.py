"""Archive inputs on Spark (issue 12): a sampled read at a fixed fraction F gives the same output
rows and order as ``--local`` for cgm, rtm and wjoin, with the same statistics (fractions,
estimates); the tasks read only the runs of their row ranges; auto and a bad F are exit 2, one
line, before Spark starts."""

from __future__ import annotations

import math
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smerge.cli.main import main
from smerge.cli.sampling import apply_sample_all, apply_samples, sample_stats, wjoin_sample_stats

pytestmark = pytest.mark.slow

FRACTIONS = (0.25, 0.5, 1.0)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A: t = 0, 2, 4, ... (6,000 records) archived in 6 runs of 8 blocks; B: t = 0.1, 3.1, ...
    With eps 0.6 each A record with t % 6 == 0 has exactly one candidate."""
    tmp = tmp_path_factory.mktemp("arch")
    n = 6000
    a, b = tmp / "a.parquet", tmp / "b.parquet"
    pq.write_table(pa.table({"t": np.arange(0, 2 * n, 2.0), "x": np.arange(n)}), a)
    pq.write_table(pa.table({"t": np.arange(0, 3 * n, 3.0) + 0.1, "k": np.arange(n) % 5, "y": np.arange(n)}), b)
    arch = tmp / "arch"
    assert main(["archive", "append", str(arch), str(a), "--time", "t", "--run-blocks", "8", "--block-rows", "150",
                 "--seed", "3"]) == 0
    return str(arch), str(b)


def _cgm(spark, tmp, arch, b, f, parts, tag):
    from smerge.jobs import CGMJob, prepare, run_local
    from smerge.spark.cgm.runner import run_cgm_spark

    out = {}
    for route in ("local", "spark"):
        s = apply_samples((("--sample-a", str(f), arch), ("--sample-b", None, b)), spark=route == "spark")
        job = CGMJob(a=arch, b=b, output=str(tmp / f"{tag}-{route}.parquet"), keys_a=("t",), eps=(0.6,),
                     window_size=64, least_increment_a=16,
                     least_increment_b=16, with_ids=True, unmatched=str(tmp / f"{tag}-{route}-un"), overwrite=True,
                     batch_rows=100, sampling=s)
        prep = prepare(job)
        r = run_local(prep) if route == "local" else run_cgm_spark(prep, spark=spark, partitions=parts)
        out[route] = sample_stats(r, (("a", arch), ("b", b)), s)
    return out["local"], out["spark"]


@pytest.mark.parametrize("f", FRACTIONS)
@pytest.mark.parametrize("parts", [1, 2])
def test_cgm_on_an_archive_sample_equals_local(spark, tmp_path, data, f, parts):
    arch, b = data
    loc, spk = _cgm(spark, tmp_path, arch, b, f, parts, f"c{parts}")
    assert spk["execution"] == "spark" and spk["partitions"] == parts
    for name in ("-spark.parquet", "-spark-un.a.parquet", "-spark-un.b.parquet"):
        got = pq.read_table(tmp_path / f"c{parts}{name}")
        want = pq.read_table(tmp_path / f"c{parts}{name.replace('spark', 'local')}")
        assert got.equals(want), name  # same rows, same order
    for k in ("a_records", "b_records", "matched", "a_unmatched", "b_unmatched", "a_sample_fraction",
              "b_sample_fraction", "a_records_estimate", "a_records_estimate_95", "matched_estimate",
              "matched_estimate_95"):
        assert spk.get(k) == loc.get(k), k
    assert spk["a_sample_fraction"] == f and "b_sample_fraction" not in spk
    assert (spk["a_records"] < 6000) == (f < 1) and loc["matched"] > 0
    if f < 1:
        assert spk["a_records_estimate"] == spk["a_records"] / f
    # I/O: the merge tasks read the chosen blocks of every run once, plus the runs overlapping the
    # chunk that holds a partition boundary (read by both sides; at most two: runs > chunks here)
    from smerge.datasets.archive.manifest import read_manifest

    runs = read_manifest(arch).runs
    want = sum(len(r["blocks"]) if f >= 1 else max(1, math.ceil(len(r["blocks"]) * f - 1e-9)) for r in runs)
    got = spk["a_archive_blocks_read"]
    assert want <= got <= want + 2 * (parts - 1) * max(len(r["blocks"]) for r in runs), (got, want)
    assert "b_archive_blocks_read" not in spk and spk["a_archive_bytes_read"] > 0
    if parts == 1:
        assert got == want


@pytest.mark.parametrize("side", ["a", "b"])
def test_rtm_on_an_archive_sample_equals_local(spark, tmp_path, data, side):
    """A sampled: its row ranges are the tasks' units; B sampled: read by the embedded index
    server on the driver, which sees the request."""
    from smerge.jobs.rtm import RTMJob, prepare_rtm, run_rtm
    from smerge.spark.rtm import run_rtm_spark

    arch, b = data
    a, b = (arch, b) if side == "a" else (b, arch)
    out = {}
    for route in ("local", "spark"):
        s = apply_samples((("--sample-a", "0.5" if side == "a" else None, a),
                           ("--sample-b", "0.5" if side == "b" else None, b)), spark=route == "spark")
        job = RTMJob(a=a, b=b, keys_a=("t",), eps=0.6, window_size=100, with_ids=True,
                     output=str(tmp_path / f"r-{route}.parquet"), unmatched=str(tmp_path / f"r-{route}-un"),
                     sampling=s)
        prep = prepare_rtm(job)
        r = run_rtm(prep) if route == "local" else run_rtm_spark(prep, spark=spark, partitions=3)
        out[route] = sample_stats(r, (("a", a), ("b", b)), s)
    loc, spk = out["local"], out["spark"]
    assert spk["execution"] == "spark" and spk["partitions"] == 3  # A cut into 3 row ranges
    for name in (".parquet", "-un.a.parquet", "-un.b.parquet"):
        assert pq.read_table(tmp_path / f"r-spark{name}").equals(pq.read_table(tmp_path / f"r-local{name}")), name
    for k in ("a_records", "b_records", "matched", f"{side}_sample_fraction", f"{side}_records_estimate_95",
              "matched_estimate"):
        assert spk.get(k) == loc.get(k), k
    assert spk[f"{side}_sample_fraction"] == 0.5 and spk[f"{side}_records"] < 6000 and spk["matched"] > 0


@pytest.mark.parametrize("f", [0.25, 1.0])
def test_wjoin_on_an_archive_sample_equals_local(spark, tmp_path, data, f):
    from smerge.jobs.wjoin import WJoinJob, prepare, run_local
    from smerge.spark.wjoin import run_wjoin_spark

    arch, b = data
    out = {}
    for route in ("local", "spark"):
        s = apply_sample_all(str(f), [arch, b], spark=route == "spark")
        job = WJoinJob(inputs=(arch, b), time=("t",), window="1", with_ids=True, batch_rows=200,
                       output=str(tmp_path / f"w-{route}.parquet"), overwrite=True, sampling=s)
        prep = prepare(job)
        r = run_local(prep) if route == "local" else run_wjoin_spark(prep, spark=spark, partitions=2)
        out[route] = wjoin_sample_stats(r, [arch, b], s)
    loc, spk = out["local"], out["spark"]
    assert spk["execution"] == "spark"
    got, want = pq.read_table(tmp_path / "w-spark.parquet"), pq.read_table(tmp_path / "w-local.parquet")
    assert want.num_rows > 0 and got.equals(want)
    assert spk["sample_fractions"] == loc["sample_fractions"] == [f, None]
    assert spk.get("tuples_estimate_95") == loc.get("tuples_estimate_95")


def test_a_fraction_from_the_environment_reaches_the_tasks(spark, tmp_path, data, monkeypatch):
    """SMERGE_ARCHIVE_SAMPLE set after the session started: the Python workers never see it, so
    the tasks read the sample because the driver pinned it."""
    from smerge.jobs import CGMJob, prepare, run_local
    from smerge.spark.cgm.runner import run_cgm_spark

    arch, b = data
    monkeypatch.setenv("SMERGE_ARCHIVE_SAMPLE", "0.5")
    monkeypatch.setenv("SMERGE_ARCHIVE_SEED", "7")
    res = {}
    for route in ("local", "spark"):
        s = apply_samples((("--sample-a", None, arch), ("--sample-b", None, b)), spark=route == "spark")
        prep = prepare(CGMJob(a=arch, b=b, output=str(tmp_path / f"{route}.parquet"), keys_a=("t",), eps=(0.6,),
                              with_ids=True, overwrite=True, batch_rows=100, sampling=s))
        r = run_local(prep) if route == "local" else run_cgm_spark(prep, spark=spark, partitions=2)
        res[route] = sample_stats(r, (("a", arch), ("b", b)), s)
    assert pq.read_table(tmp_path / "spark.parquet").equals(pq.read_table(tmp_path / "local.parquet"))
    assert res["spark"]["a_sample_fraction"] == res["local"]["a_sample_fraction"] == 0.5
    assert res["spark"]["a_records"] == res["local"]["a_records"] < 6000


def test_a_task_reads_only_the_runs_of_its_range(data):
    """The reader behind the tasks: a row range of the sample reads the runs holding it (their
    chosen blocks) and no other; ranges read one after another give the whole sample."""
    from smerge.datasets import open_input

    arch, _ = data
    src = open_input(arch, keys=("t",), sample=0.5, sample_seed=0)
    whole = pa.Table.from_batches(list(src.batches()))
    assert src.num_rows == whole.num_rows and src.counters["blocks_read"] == 6 * 4  # 6 runs, 4 of 8 blocks each
    src = open_input(arch, keys=("t",), sample=0.5, sample_seed=0)
    first = pa.Table.from_batches(list(src.batches(0, 10)))
    assert first.equals(whole.slice(0, 10)) and src.counters["blocks_read"] == 4  # the first run only
    src = open_input(arch, keys=("t",), sample=0.5, sample_seed=0)
    parts = [b for s in range(0, whole.num_rows, 333) for b in src.batches(s, s + 333)]
    assert pa.Table.from_batches(parts).equals(whole) and src.counters["blocks_read"] == 6 * 4  # each run once


def test_cli_on_spark_equals_local_with_relative_paths(tmp_path, data, spark_cli):
    """The CLI as a user runs it (relative paths, which the Spark route makes absolute after the
    fraction is requested): same output and statistics as --local. (In this process, on the
    shared session.)"""
    import json
    import shutil

    arch, b = data
    shutil.copytree(arch, tmp_path / "arch")
    shutil.copy(b, tmp_path / "b.parquet")
    common = ["cgm", "arch", "b.parquet", "--keys", "t", "--eps", "0.6", "--sample-a", "0.25", "--with-ids"]
    stats = {}
    for route, extra in (("spark", ["--master", "local[2]", "--partitions", "2"]), ("local", ["--local"])):
        rc, _, err = spark_cli(*common, *extra, "-o", f"{route}.parquet", "--stats", f"{route}.json", cwd=tmp_path)
        assert rc == 0, err
        stats[route] = json.load(open(tmp_path / f"{route}.json"))
    assert spark_cli.masters == ["local[2]"]
    assert stats["spark"]["execution"] == "spark" and stats["spark"]["partitions"] == 2
    assert pq.read_table(tmp_path / "spark.parquet").equals(pq.read_table(tmp_path / "local.parquet"))
    for k in ("a_records", "matched", "a_sample_fraction", "a_records_estimate_95", "matched_estimate_95"):
        assert stats["spark"][k] == stats["local"][k], k
    assert stats["spark"]["a_sample_fraction"] == 0.25


@pytest.mark.parametrize("args, needle", [
    (["--sample-a", "auto", "--budget", "5"], "--sample-a auto: auto runs in-process only"),
    (["--sample-a", "0"], "--sample-a is 0.0; it must be in (0, 1]"),
    (["--sample-a", "1.5"], "--sample-a is 1.5; it must be in (0, 1]"),
    (["--sample-b", "0.5"], "is not an archive folder"),
])
def test_auto_and_bad_fractions_on_spark_exit_2_one_line(tmp_path, data, capsys, args, needle):
    arch, b = data
    out = tmp_path / "o.parquet"
    rc = main(["cgm", arch, b, "--keys", "t", "--eps", "0.6", "--master", "local[2]", "-o", str(out), *args])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and needle in err, err
    assert not out.exists() and os.listdir(tmp_path) == []


def test_auto_from_the_environment_on_spark_exit_2(tmp_path, data, capsys, monkeypatch):
    arch, b = data
    monkeypatch.setenv("SMERGE_ARCHIVE_SAMPLE", "auto")
    monkeypatch.setenv("SMERGE_ARCHIVE_BUDGET", "5")
    rc = main(["wjoin", arch, b, "--time", "t", "--window", "1", "--master", "local[2]", "-o",
               str(tmp_path / "o.parquet")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "$SMERGE_ARCHIVE_SAMPLE" in err and "--local" in err, err
    assert os.listdir(tmp_path) == []


def test_an_archive_beside_a_url_input_exits_2_one_line(tmp_path, data, spark_cli):
    """(In this process: the route of Spark's readers starts its session, here the shared one.)"""
    arch, b = data
    rc, _, err = spark_cli("cgm", arch, "file://" + b, "--keys", "t", "--eps", "0.6", "--master", "local[2]",
                           "-o", "o.parquet", cwd=tmp_path)
    assert rc == 2 and err.count("\n") == 1, err
    assert "an archive cannot be read together with a URL input" in err
    assert os.listdir(tmp_path) == []
