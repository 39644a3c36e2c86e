"""W-join on Spark keeps a CF time's units and calendar (field metadata) and --vars, and equals --local."""

from __future__ import annotations

import os
import sys

import pyarrow.parquet as pq
import pytest
from cli_run import run_cli

from smerge.jobs.wjoin import WJoinJob, prepare, run_local
from smerge.spark.wjoin import run_wjoin_spark

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "cli"))
from test_wjoin_time_vars import CASES, families, gridded, oracle, stored_times  # noqa: E402

pytestmark = pytest.mark.slow


def test_master_local2_keeps_calendar_and_vars(tmp_path, spark, capsys):
    """NLW-join in time ranges (P = 2) of two 360_day files with several families of variables."""
    from smerge.jobs.pipeline import RunOptions, execute
    from smerge.jobs.route import Route

    a, b = families(tmp_path / "a.nc"), families(tmp_path / "b.nc", first="T")
    common = ["wjoin", a, b, "--time", "time", "--window", "1d", "--vars", "T", "--with-ids"]
    loc, spk = tmp_path / "local.parquet", tmp_path / "spark.parquet"
    rc, _, err = run_cli(capsys, *common, "-o", loc, "--local")
    assert rc == 0, err
    job = WJoinJob(inputs=(a, b), time=("time",), window="1d", vars=("T",), with_ids=True, output=str(spk))
    stats = execute(job, RunOptions(partitions=2, spark=spark), route=Route(True, "local[2]", "spark"))
    assert stats["execution"] == "spark" and stats["partitioning"] == "time ranges + halo"
    tl, ts = pq.read_table(loc), pq.read_table(spk)
    assert ts.equals(tl, check_metadata=True) and ts.num_rows == 28  # 7 pairs of steps within 1 day x 2 x 2 lats
    assert ts.column_names[:3] == ["S1_time", "S1_lat", "S1_T"]
    want = oracle([0, 1, 2], "days since 2001-02-28", "360_day")
    assert stored_times(ts, "S1_time", "360_day") == [want[r // 2] for r in ts["S1_row"].to_numpy()]


@pytest.mark.parametrize("case", ["standard_pre_gregorian", "julian"])
def test_hash_join_on_spark_keeps_calendar(spark, tmp_path, case):
    cal, units, va, vb = CASES[case]
    a, b = gridded(tmp_path / "a.nc", units, cal, va), gridded(tmp_path / "b.nc", units, cal, vb)
    kw = dict(inputs=(a, b), time=("time",), window="40d", on=("lat",), with_ids=True, overwrite=True, batch_rows=3)
    loc = run_local(prepare(WJoinJob(output=str(tmp_path / "l.parquet"), **kw)))
    spk = run_wjoin_spark(prepare(WJoinJob(output=str(tmp_path / "s.parquet"), **kw)), spark=spark, partitions=2)
    assert spk["method"] == "hash" and spk["partitions"] == 2
    tl, ts = pq.read_table(loc["output"]), pq.read_table(spk["output"])
    assert ts.equals(tl, check_metadata=True) and ts.num_rows == len(va) * len(vb) * 2
    want = oracle(vb, units, cal)
    assert stored_times(ts, "S2_time", cal) == [want[r // 2] for r in ts["S2_row"].to_numpy()]
