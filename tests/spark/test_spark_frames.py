"""Inputs at URLs, read by Spark's own Parquet/CSV readers (smerge.spark.frames).

The oracle for the shuffle plan is slab pairing: with the same boundaries both plans hand the
same records, in the same order, to the same engine task, so the outputs must be identical.
Spark is made to cut the files into many small splits, packed out of order, so that the row
ids really come from the split offsets.
"""

from __future__ import annotations

import contextlib
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from spark_data import partially_sorted, write_stream

from smerge.datasets import open_input
from smerge.errors import InputError, UsageError
from smerge.jobs import CGMJob, needs_spark_readers, prepare, run_local
from smerge.spark.cgm.runner import run_cgm_spark
from smerge.spark.frames import frame_format

pytestmark = pytest.mark.slow


def url(path) -> str:
    return "file://" + os.path.abspath(str(path))


@contextlib.contextmanager
def small_splits(spark, nbytes=1500):
    """Many file splits (Spark packs them into partitions by size, not in file order)."""
    keys = ("spark.sql.files.maxPartitionBytes", "spark.sql.files.openCostInBytes")
    old = {k: spark.conf.get(k) for k in keys}
    spark.conf.set(keys[0], str(nbytes))
    spark.conf.set(keys[1], "1")
    try:
        yield
    finally:
        for k, v in old.items():
            spark.conf.set(k, v)


def job(tmp, a, b, name, **kw) -> CGMJob:
    base = dict(a=a, b=b, output=str(tmp / f"{name}.parquet"), keys_a=("k1", "k2"), with_ids=True,
                unmatched=str(tmp / f"{name}-un"), overwrite=True, batch_rows=64)
    base.update(kw)
    return CGMJob(**base)


def outputs(tmp, name):
    return [pq.read_table(tmp / f) for f in (f"{name}.parquet", f"{name}-un.a.parquet", f"{name}-un.b.parquet")]


SAME = ("a_records", "b_records", "matched", "a_unmatched", "b_unmatched", "passes", "report_windows", "kappa_min",
        "drop_rate_moving_max", "b_shared", "seam_pairs",
        "seam_pairs_dropped", "partition_pairs", "bounds")


def test_which_inputs_go_to_spark_readers():
    assert frame_format("hdfs://nn:8020/data/obs.parquet") == "parquet"
    assert frame_format("s3a://bucket/obs/") == "parquet"  # a dataset folder
    assert frame_format("s3a://bucket/obs") == "parquet"
    assert frame_format("file:///x/y.csv.gz") == "csv"
    assert frame_format("gs://b/y.TSV") == "csv"
    with pytest.raises(InputError, match="Parquet .* or CSV"):
        frame_format("hdfs://nn/x.nc")
    j = CGMJob(a="hdfs://nn/a.parquet", b="b.nc")
    assert needs_spark_readers(j) and needs_spark_readers(CGMJob(a="a.csv", b="b.nc"), {"smerge.reader": "spark"})
    assert not needs_spark_readers(CGMJob(a="a.csv", b="grpc://h:1/b"))
    assert not needs_spark_readers(j, {"smerge.reader": "smerge"})
    with pytest.raises(UsageError, match="smerge.reader"):
        needs_spark_readers(j, {"smerge.reader": "jvm"})


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10**6), parts=st.integers(1, 4), eps=st.sampled_from([0.0, 0.25, 1.0]),
       window=st.integers(2, 12), csv_b=st.booleans())
def test_spark_readers_equal_slab_pairing(spark, tmp_path_factory, seed, parts, eps, window, csv_b):
    tmp = tmp_path_factory.mktemp("frames")
    rng = np.random.default_rng(seed)
    na, nb = int(rng.integers(50, 400)), int(rng.integers(50, 400))
    a = write_stream(tmp / "a.parquet", partially_sorted(na, rng, spread=10), rng.integers(0, 2, na) * 0.5, seed=seed)
    b = write_stream(tmp / "b.parquet", partially_sorted(nb, rng, spread=10), rng.integers(0, 2, nb) * 0.5,
                     seed=seed + 1)
    if csv_b:  # B as CSV: Spark parses it (doubles stay doubles; v is written as float)
        t = pq.read_table(b)
        t = t.set_column(2, "v", t["v"].cast(pa.float64()))
        pcsv.write_csv(t, tmp / "b.csv")
        b = str(tmp / "b.csv")
    vals = np.unique(pq.read_table(a)["k1"].to_numpy())
    bounds = ",".join(str(v) for v in np.sort(rng.choice(vals, size=min(parts - 1, vals.size), replace=False)))
    conf = {"smerge.bounds": bounds} if bounds else {}
    inc = max(1, window // 3)
    kw = dict(window_size=window, least_increment_a=inc, least_increment_b=inc, eps=eps, kappa_max=True)
    slab = run_cgm_spark(prepare(job(tmp, a, b, "slab", **kw)), partitions=parts, conf=conf, spark=spark)
    with small_splits(spark):
        fr = run_cgm_spark(job(tmp, url(a), url(b), "frames", **kw), partitions=parts, conf=conf, spark=spark)
    assert fr["plan"] == {"a": "spark-scan", "b": "spark-scan"} and slab["plan"] != fr["plan"]
    for x, y in zip(outputs(tmp, "slab"), outputs(tmp, "frames")):
        assert y.cast(x.schema).equals(x)
    for k in SAME:
        assert fr[k] == slab[k], k
    assert fr["kappa_max"] == pytest.approx(slab["kappa_max"])


def test_parquet_folder_url_is_read_in_file_name_order(spark, tmp_path):
    rng = np.random.default_rng(5)
    n = 900
    whole = write_stream(tmp_path / "whole.parquet", partially_sorted(n, rng), rng.integers(0, 3, n), seed=3)
    b = write_stream(tmp_path / "b.parquet", partially_sorted(n, rng), rng.integers(0, 3, n), seed=4)
    t = pq.read_table(whole)
    os.mkdir(tmp_path / "a")
    # sizes 100, 700, 100: Spark packs the big file's splits first
    for i, (lo, hi) in enumerate([(0, 100), (100, 800), (800, 900)]):
        pq.write_table(t.slice(lo, hi - lo), tmp_path / "a" / f"part-{i}.parquet", row_group_size=50)
    kw = dict(eps=0.25, window_size=20, least_increment_a=5, least_increment_b=5)
    local = run_local(prepare(job(tmp_path, whole, b, "local", **kw)))
    with small_splits(spark, 3000):
        one = run_cgm_spark(job(tmp_path, url(tmp_path / "a") + "/", url(b), "one", **kw), partitions=1, spark=spark)
    for x, y in zip(outputs(tmp_path, "local"), outputs(tmp_path, "one")):
        assert y.equals(x)
    for k in ("matched", "a_records", "b_records", "passes", "report_windows"):
        assert one[k] == local[k], k


def test_local_netcdf_with_a_parquet_url(spark, tmp_path, ncar_dir):
    # A: the NCAR grid through the smerge_netcdf data source; B: the same storm as Parquet at a URL
    p, tcdf = os.path.join(ncar_dir, "Pstorm.cdf"), os.path.join(ncar_dir, "Tstorm.cdf")
    src = open_input(tcdf)
    pq.write_table(pa.Table.from_batches(list(src.batches()), schema=src.schema), tmp_path / "t.parquet",
                   row_group_size=5000)
    keys = tuple(src.keys)
    kw = dict(keys_a=keys, eps=0.01, window_size=500, least_increment_a=100, least_increment_b=100)
    local = run_local(prepare(job(tmp_path, p, str(tmp_path / "t.parquet"), "local", **kw)))
    fr = run_cgm_spark(job(tmp_path, p, url(tmp_path / "t.parquet"), "frames", **kw), partitions=1, spark=spark)
    assert local["matched"] == fr["matched"] == 76032
    for x, y in zip(outputs(tmp_path, "local"), outputs(tmp_path, "frames")):
        assert y.cast(x.schema).equals(x)
    two = run_cgm_spark(job(tmp_path, p, url(tmp_path / "t.parquet"), "two", **kw), partitions=2, spark=spark)
    assert two["partitions"] == 2 and two["matched"] == 76032 and two["b_shared"] == 0


def test_url_input_errors(spark, tmp_path):
    a = write_stream(tmp_path / "a.parquet", np.arange(50.0), np.zeros(50))
    with pytest.raises(InputError, match="only Spark's readers"):
        prepare(job(tmp_path, "hdfs://namenode:8020/a.parquet", a, "x"))
    with pytest.raises(InputError, match="Spark cannot read it"):
        run_cgm_spark(job(tmp_path, url(tmp_path / "missing.parquet"), a, "x"), spark=spark)
    with pytest.raises(InputError, match="Parquet .* or CSV"):
        run_cgm_spark(job(tmp_path, url(tmp_path / "a.dat"), a, "x"), spark=spark)
    ipc = tmp_path / "b.arrow"
    with pa.OSFile(str(ipc), "wb") as f, pa.ipc.new_file(f, pq.read_table(a).schema) as w:
        w.write_table(pq.read_table(a))
    with pytest.raises(UsageError, match="convert it to Parquet"):
        run_cgm_spark(job(tmp_path, url(a), str(ipc), "x"), spark=spark)
    with pytest.raises(UsageError, match="no key 'k9'"):
        run_cgm_spark(job(tmp_path, url(a), url(a), "x", keys_a=("k9",)), spark=spark)
    # a NaN (empty) leading key in a CSV at a URL: reported with its row before the merge job
    (tmp_path / "nan.csv").write_text("k1,k2,v\n1,0,0.5\n2,0,0.5\n,0,0.5\n4,0,0.5\n")
    with pytest.raises(InputError, match=r"row 2\b"):
        run_cgm_spark(job(tmp_path, url(tmp_path / "nan.csv"), url(a), "x"), partitions=2, spark=spark)
    assert not list(tmp_path.glob("x*")) and not list(tmp_path.glob(".*smerge*"))


def test_cli_url_inputs(tmp_path, spark_cli):
    """(In this process, on the shared session.)"""
    a = write_stream(tmp_path / "a.parquet", np.arange(200.0), np.zeros(200))
    b = write_stream(tmp_path / "b.parquet", np.arange(200.0) + 0.1, np.zeros(200))
    cmd = ["cgm", "--keys", "k1,k2", "--eps", "0.2", "--partitions", "2", "--json"]
    rc, out, err = spark_cli(*cmd, url(a), url(b), "-o", "o.parquet", cwd=tmp_path)
    assert rc == 0, err
    assert err == ""
    assert json.loads(out)["plan"] == {"a": "spark-scan", "b": "spark-scan"}
    assert pq.read_table(tmp_path / "o.parquet").num_rows == 200
    rc, out, err = spark_cli(*cmd, "--local", "s3a://bucket/a.parquet", b, "-o", "p.parquet")
    assert rc == 2 and err.count("\n") == 1 and "without --local" in err
    assert not (tmp_path / "p.parquet").exists()


def test_a_failed_python_task_is_one_line_naming_its_error():
    from smerge.spark.actions import task_failure as _task_failure

    text = ("[PYTHON_EXCEPTION] An exception was thrown from the Python worker: Traceback (most recent call last):\n"
            "  File \"x.py\", line 1, in f\n    g()\nValueError: bad split\n\nJVM stacktrace:\n"
            "org.apache.spark.SparkException: Job aborted\n\tat org.apache.Foo")
    err = _task_failure(Exception(text), "a.csv")
    assert isinstance(err, InputError) and "\n" not in str(err)
    assert str(err).startswith("a.csv: Spark failed (ValueError: bad split)")
    err = _task_failure(Exception("boom\nsmerge.errors.InputError: b.csv: row 7 is short"), "x")
    assert isinstance(err, InputError) and str(err) == "b.csv: row 7 is short"


def test_progress_counts_result_tasks_not_shuffle_map_tasks():
    from types import SimpleNamespace as NS

    from smerge.spark.actions import result_tasks_done

    stages = {3: NS(numCompletedTasks=40), 4: NS(numCompletedTasks=35), 5: NS(numCompletedTasks=2),
              6: NS(numCompletedTasks=1)}
    jobs = {1: NS(stageIds=[3, 4, 5]), 2: NS(stageIds=[6]), 7: None}
    tracker = NS(getJobIdsForGroup=lambda g: [1, 2, 7] if g == "g" else [], getJobInfo=jobs.get,
                 getStageInfo=stages.get)
    assert result_tasks_done(tracker, "g") == 3  # the cogroup's 2 partitions + a one-task job
    assert result_tasks_done(tracker, "other") == 0


def test_split_layout_is_pinned_for_the_whole_run(spark, tmp_path, monkeypatch):
    # On a cluster the default parallelism grows as executors register; Spark then cuts the
    # files into more splits. Row ids must not depend on that: the layout is pinned per run.
    import smerge.spark.frames as sf

    rng = np.random.default_rng(4)
    a = write_stream(tmp_path / "a.parquet", partially_sorted(3000, rng, spread=20), np.zeros(3000))
    b = write_stream(tmp_path / "b.parquet", partially_sorted(3000, rng, spread=20), np.zeros(3000))
    for p in (a, b):  # many row groups, so that finer splits really split the files
        pq.write_table(pq.read_table(p), p, row_group_size=100)
    scan = sf.scan_frame

    def growing(src, run):
        spark.conf.set("spark.sql.leafNodeDefaultParallelism", "2")
        try:
            return scan(src, run)
        finally:
            spark.conf.set("spark.sql.leafNodeDefaultParallelism", "8")

    monkeypatch.setattr(sf, "scan_frame", growing)
    kw = dict(keys_a=("k1",), eps=0.25)
    try:
        with small_splits(spark, 100_000):
            fr = run_cgm_spark(job(tmp_path, url(a), url(b), "fr", **kw), partitions=2, conf={"smerge.bounds": "10.1"},
                               spark=spark)
    finally:
        spark.conf.unset("spark.sql.leafNodeDefaultParallelism")
    slab = run_cgm_spark(prepare(job(tmp_path, a, b, "slab", **kw)), partitions=2, conf={"smerge.bounds": "10.1"},
                         spark=spark)
    for x, y in zip(outputs(tmp_path, "slab"), outputs(tmp_path, "fr")):
        assert y.equals(x)
    assert fr["matched"] == slab["matched"]


def test_spark_typed_inputs_timestamps_quotes_tabs_and_file_order(spark, tmp_path):
    # timestamps (key and payload), RFC 4180 quotes, a tab-separated .txt beside a URL
    (tmp_path / "a.csv").write_text('k1,t,s\n1,2024-01-01 00:00:00,"say ""hi"", ok"\n2,2024-01-02 06:00:00,plain\n'
                                    '3,2024-01-03 00:00:00,"a,b"\n')
    (tmp_path / "b.txt").write_text("k1\tt\tw\n1\t2024-01-01 00:00:00\t7\n3\t2024-01-03 00:00:00\t8\n")
    st = run_cgm_spark(job(tmp_path, url(tmp_path / "a.csv"), str(tmp_path / "b.txt"), "ts", keys_a=("k1", "t")),
                       partitions=1, spark=spark)
    out = pq.read_table(tmp_path / "ts.parquet")
    assert st["matched"] == 2 and out.column("s").to_pylist() == ['say "hi", ok', "a,b"]
    assert out.column("w").to_pylist() == [7, 8] and pa.types.is_timestamp(out.schema.field("t").type)
    # a folder is read in path order, not in the percent-encoded order of Spark's file URIs
    os.mkdir(tmp_path / "d")
    pq.write_table(pa.table({"k1": [1.0, 2.0], "v": [1.0, 2.0]}), tmp_path / "d" / "p c.parquet")
    pq.write_table(pa.table({"k1": [3.0], "v": [3.0]}), tmp_path / "d" / "p!c.parquet")
    run_cgm_spark(job(tmp_path, url(tmp_path / "d") + "/", url(tmp_path / "d") + "/", "d", keys_a=("k1",)),
                  partitions=1, spark=spark)
    assert pq.read_table(tmp_path / "d.parquet").column("a_row").to_pylist() == [0, 1, 2]
    assert pq.read_table(tmp_path / "d.parquet").column("v").to_pylist() == [1.0, 2.0, 3.0]


def test_more_url_errors_are_one_line(spark, tmp_path):
    (tmp_path / "bad.csv").write_text("k1,v\n1,2\n2,3,4\n")
    with pytest.raises(InputError, match="Malformed CSV record") as e:
        run_cgm_spark(job(tmp_path, url(tmp_path / "bad.csv"), url(tmp_path / "bad.csv"), "x", keys_a=("k1",)),
                      spark=spark)
    assert "\n" not in str(e.value) and "An error occurred while calling" not in str(e.value)
    pq.write_table(pa.table({"k1": [1.0], "_row": [5]}), tmp_path / "r.parquet")
    with pytest.raises(UsageError, match="'_row' has a name smerge uses"):
        run_cgm_spark(job(tmp_path, url(tmp_path / "r.parquet"), url(tmp_path / "r.parquet"), "x", keys_a=("k1",)),
                      spark=spark)


@pytest.mark.parametrize("key,value", [("smerge.task.prefetch", "maybe"), ("smerge.plan.groups", "abc"),
                                       ("smerge.plan.groups", "0"), ("smerge.partition.min_records", "-5")])
def test_bad_smerge_settings_fail_before_anything_is_written(spark, tmp_path, key, value):
    rng = np.random.default_rng(1)
    a = write_stream(tmp_path / "a.parquet", partially_sorted(300, rng), np.zeros(300))
    os.mkdir(tmp_path / "out")
    j = job(tmp_path, a, a, "out/x", keys_a=("k1",), unmatched=None)
    with pytest.raises(UsageError, match=f"^conf {key}="):
        run_cgm_spark(prepare(j), partitions=None if "min_records" in key else 2, conf={key: value}, spark=spark)
    assert os.listdir(tmp_path / "out") == []
