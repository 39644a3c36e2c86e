"""Task metrics for the parallelism figures (issue 15 item 3): each merge task's Python CPU time
in the stats, bench/bench_spark.py's reading of Spark's event log, and the tasks' shortcut for
batches wholly inside their key range (the cost of partitioning)."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from spark_data import partially_sorted, write_stream

from smerge.jobs import CGMJob, prepare
from smerge.spark.cgm.runner import run_cgm_spark
from smerge.spark.cgm.tasks import inside_range, owner, visibility

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import bench_spark  # noqa: E402


def test_task_cpu_seconds_per_partition(spark, tmp_path):
    rng = np.random.default_rng(5)
    n = 3000
    a = write_stream(tmp_path / "a.parquet", partially_sorted(n, rng), seed=1)
    b = write_stream(tmp_path / "b.parquet", partially_sorted(n, rng), seed=2)
    st_ = run_cgm_spark(prepare(CGMJob(a=a, b=b, keys_a=("k1",), output=str(tmp_path / "o.parquet"), overwrite=True)),
                        partitions=3, conf={"smerge.task.prefetch": "false"}, spark=spark)
    cpu = st_["task_cpu_seconds"]
    assert st_["partitions"] == 3 and len(cpu) == len(st_["task_seconds"]) == 3
    assert all(isinstance(c, float) and c > 0 for c in cpu)


@given(st.lists(st.tuples(st.integers(0, 40), st.integers(1, 10)), max_size=12))
def test_union_seconds_equals_the_covered_length(spans):
    intervals = [(float(s), float(s + d)) for s, d in spans]
    covered = {t for s, d in spans for t in range(s, s + d)}  # unit cells [t, t + 1) under some interval
    assert bench_spark.union_seconds(intervals) == len(covered)


def test_union_seconds_examples():
    assert bench_spark.union_seconds([]) == 0
    assert bench_spark.union_seconds([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)]) == 4.0
    assert bench_spark.union_seconds([(1.0, 9.0), (2.0, 3.0)]) == 8.0


def _task_end(stage: int, launch: int, finish: int, run_ms: int, *, shuffle_read: int = 0, reason: str = "Success"):
    return {"Event": "SparkListenerTaskEnd", "Stage ID": stage, "Task End Reason": {"Reason": reason},
            "Task Info": {"Launch Time": launch, "Finish Time": finish},
            "Task Metrics": {"Executor Run Time": run_ms, "Executor CPU Time": 5_000_000,
                             "Executor Deserialize Time": 7, "Result Size": 1000,
                             "Input Metrics": {"Bytes Read": 0, "Records Read": 0},
                             "Shuffle Read Metrics": {"Local Bytes Read": shuffle_read, "Remote Bytes Read": 1},
                             "Shuffle Write Metrics": {"Shuffle Bytes Written": 3}}}


def _job_start(job: int, stages: list[int], group: str | None):
    props = {"spark.jobGroup.id": group} if group else {}
    return {"Event": "SparkListenerJobStart", "Job ID": job, "Properties": props,
            "Stage Infos": [{"Stage ID": s} for s in stages]}


def test_task_metrics_keep_only_smerge_job_groups(tmp_path):
    events = [
        {"Event": "SparkListenerApplicationStart", "App Name": "smerge"},
        _job_start(0, [0], None),  # the session's worker warm-up
        _task_end(0, 1000, 9000, 7900),
        _job_start(1, [1], "smerge-scan"),
        _task_end(1, 10_000, 10_500, 450),
        _job_start(2, [2, 3], "smerge-merge"),
        _task_end(3, 11_000, 13_000, 1900, shuffle_read=100),
        _task_end(3, 11_500, 12_000, 400, reason="ExceptionFailure"),
    ]
    (tmp_path / "local-1").write_text("\n".join(json.dumps(e) for e in events) + "\n")
    (tmp_path / ".local-1.crc").write_text("x")
    tasks = bench_spark.task_metrics(str(tmp_path))
    assert [(t["job"], t["launch"], t["finish"], t["run"], t["ok"]) for t in tasks] == [
        (1, 10.0, 10.5, 0.45, True), (2, 11.0, 13.0, 1.9, True), (2, 11.5, 12.0, 0.4, False)]
    assert [t["shuffle_read_bytes"] for t in tasks] == [1, 101, 1]
    assert all(t["jvm_cpu"] == 0.005 and t["shuffle_write_bytes"] == 3 and t["deserialize"] == 0.007 for t in tasks)
    assert bench_spark.union_seconds([(t["launch"], t["finish"]) for t in tasks]) == 2.5


_k1 = st.one_of(st.sampled_from([0.0, 0.5, 1.0, 2.0, -np.inf, np.inf, np.nan]), st.floats(-3, 3, width=64))


@given(bounds=st.lists(st.sampled_from([-1.0, 0.0, 0.5, 1.0, 1.5, 2.0]), max_size=4).map(sorted),
       k1=st.lists(_k1, min_size=1, max_size=20), k2=st.lists(st.sampled_from([0.0, np.nan]), min_size=20, max_size=20),
       eps1=st.sampled_from([0.0, 0.25, 0.5, 1e-9]), p=st.integers(0, 4))
def test_inside_range_agrees_with_the_ownership_rule(bounds, k1, k2, eps1, p):
    """When a batch is taken as wholly inside partition p, the per-record rule owns every record
    in p and shows it to p alone (a NaN in another key included)."""
    b = np.asarray(bounds, dtype=np.float64)
    p = min(p, b.size)
    k = np.column_stack([np.asarray(k1), np.asarray(k2[: len(k1)])])
    lo_edge = b[p - 1] if p > 0 else -np.inf
    hi_edge = b[p] if p < b.size else np.inf
    if inside_range(k[:, 0], lo_edge, hi_edge, 0.0):
        assert (owner(b, k[:, 0]) == p).all()
    if inside_range(k[:, 0], lo_edge, hi_edge, eps1):
        own, lo, hi = visibility(b, k, eps1)
        assert (own == p).all() and (lo == p).all() and (hi == p).all()


def test_inside_range_examples():
    b = np.array([1.0, 2.0])
    assert inside_range(np.array([1.0, 1.5, 1.9]), 1.0, 2.0, 0.0)
    assert not inside_range(np.array([1.0, 1.5, 1.9]), 1.0, 2.0, 0.25)  # within eps1 of a boundary: shared
    assert inside_range(np.array([1.25, 1.5]), 1.0, 2.0, 0.25)
    assert not inside_range(np.array([1.25, np.nan]), 1.0, 2.0, 0.0)  # NaN k1: the per-record rule
    assert not inside_range(np.array([1.5, 2.0]), 1.0, 2.0, 0.0)  # 2.0 belongs to the next partition
    assert not inside_range(np.empty(0), -np.inf, np.inf, 0.0)
    assert (owner(b, np.array([1.0, 1.5, 1.9])) == 1).all()
