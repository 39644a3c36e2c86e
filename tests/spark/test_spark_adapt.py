"""CGM --adapt on Spark: one partition equals --local, K per report window included (spec 7, 10);
with several partitions each task adapts its own K and the statistics still assemble."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
from spark_data import partially_sorted, write_stream

from smerge.jobs import CGMJob, prepare, run_local
from smerge.spark.cgm.runner import run_cgm_spark

pytestmark = pytest.mark.slow


def job(tmp, a, b, name, **kw) -> CGMJob:
    base = dict(a=a, b=b, output=str(tmp / f"{name}.parquet"), keys_a=("k1", "k2"), with_ids=True,
                unmatched=str(tmp / f"{name}-un"), overwrite=True, batch_rows=64, stats=str(tmp / f"{name}.json"),
                window_size=12, least_increment_a=6, least_increment_b=6, eps=0.25, delta=0.1, delta_windows=3,
                adapt=True)
    base.update(kw)
    return CGMJob(**base)


@pytest.fixture
def ab(tmp_path):
    rng = np.random.default_rng(5)
    n = 900
    a = write_stream(tmp_path / "a.parquet", partially_sorted(n, rng), rng.integers(0, 3, n), seed=1)
    b = write_stream(tmp_path / "b.parquet", partially_sorted(n - 41, rng), rng.integers(0, 3, n - 41), seed=2)
    return a, b


def test_one_partition_adapt_equals_local(spark, tmp_path, ab):
    a, b = ab
    local = run_local(prepare(job(tmp_path, a, b, "local")))
    sp = run_cgm_spark(prepare(job(tmp_path, a, b, "spark")), partitions=1, spark=spark)
    assert pq.read_table(tmp_path / "local.parquet").equals(pq.read_table(tmp_path / "spark.parquet"))
    for side in ("a", "b"):
        assert pq.read_table(tmp_path / f"local-un.{side}.parquet").equals(
            pq.read_table(tmp_path / f"spark-un.{side}.parquet"))
    for k in ("matched", "a_unmatched", "b_unmatched", "passes", "report_windows", "kappa_per_window",
              "drop_rate_moving_max", "delta_ok", "k_per_window"):
        assert sp[k] == local[k], k
    assert sp["params"] == local["params"] and sp["params"]["adapt"] is True
    # the K of every report window (the controller's choices, which need not move: K holds while
    # nothing is dropped) are --local's, from the start K min(K, N/32) on
    assert list(local["k_per_window"][0]) == [1, 1]  # min(K = 6, N / 32 = 0.4), at least 1


def test_partitions_adapt_assemble_statistics(spark, tmp_path, ab):
    a, b = ab
    sp = run_cgm_spark(prepare(job(tmp_path, a, b, "spark3")), partitions=3, spark=spark)
    assert len(sp["k_per_window"]) == len(sp["kappa_per_window"]) == sp["report_windows"]
    assert all(1 <= x <= 12 for k in sp["k_per_window"] for x in k)
    assert sp["matched"] + sp["a_unmatched"] == sp["a_records"]
    assert sp["matched"] + sp["b_unmatched"] == sp["b_records"]
