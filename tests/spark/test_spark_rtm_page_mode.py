"""RTM page mode on Spark: the curvilinear self-merge with repeated points pairs every record,
exactly as --local does."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from curvilinear import write_curvilinear
from smerge.jobs.rtm import RTMJob, prepare_rtm, run_rtm


@pytest.mark.slow
def test_spark_curvilinear_self_merge_equals_local(spark, tmp_path):
    from smerge.spark.rtm import run_rtm_spark

    path = str(tmp_path / "curv.nc")
    keys = write_curvilinear(path)
    # N = 600 and a slab of 40 x 60 = 2,400 records: two partitions, one per time step
    base = dict(a=path, b=path, keys_a=("time", "lat2d", "lon2d"), window_size=600, with_ids=True)
    loc = run_rtm(prepare_rtm(RTMJob(output=str(tmp_path / "l.parquet"), **base)))
    got = run_rtm_spark(prepare_rtm(RTMJob(output=str(tmp_path / "s.parquet"), **base)), partitions=2, spark=spark)
    assert got["execution"] == "spark" and got["partitions"] == 2
    assert loc["matched"] == got["matched"] == len(keys) == 4800
    for k in ("a_unmatched", "b_unmatched", "b_paired", "b_windows", "kappa_min"):
        assert got[k] == loc[k], k
    assert pq.read_table(tmp_path / "s.parquet").equals(pq.read_table(tmp_path / "l.parquet"))
