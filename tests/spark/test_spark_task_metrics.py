"""Task metrics for the parallelism figures (issue 15 item 3): each merge task's Python CPU time
in the stats, and bench/bench_spark.py's reading of Spark's event log."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from spark_data import partially_sorted, write_stream

from smerge.jobs import CGMJob, prepare
from smerge.spark.cgm import run_cgm_spark

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
