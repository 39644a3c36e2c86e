"""The runner skeleton (smerge.spark.runner) the cgm, rtm and wjoin runners share: staging folders
are removed however the run ends, a given session is not stopped.

These tests need no JVM: the session is a stand-in (the runners reach it only for
``defaultParallelism`` and ``master`` before their first Spark job), and the interruption (what
the CLI turns SIGTERM into) arrives right after the staging folder is created -- where the rtm
and wjoin runners used to leave it behind.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smerge.errors import UsageError
from smerge.spark.runner import run_on_spark


class FakeContext:
    defaultParallelism = 2
    master = "local[2]"


class FakeSession:
    sparkContext = FakeContext()
    stopped = False

    def stop(self):
        self.stopped = True


def _left(folder) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.startswith("."))


@pytest.mark.parametrize("ending", ["return", "error", "interrupt"])
def test_staging_removed_however_the_body_ends(tmp_path, ending):
    session = FakeSession()
    seen = {}

    def body(run):
        a = run.staging(str(tmp_path / "out.parquet"), "spark", ("pairs", "ua"))
        b = run.staging(str(tmp_path / "out.parquet"), "rtm")
        seen.update(a=a, b=b, dirs=sorted(os.listdir(a)), stats=run.stats(x=1), own=run.own)
        assert os.path.isdir(a) and os.path.isdir(b)
        if ending == "error":
            raise UsageError("boom")
        if ending == "interrupt":
            raise KeyboardInterrupt
        return "done"

    conf = {"smerge.partition.min_records": "5", "spark.sql.shuffle.partitions": "3"}
    if ending == "return":
        assert run_on_spark(body, master=None, partitions=None, conf=conf, verbose=False, spark=session) == "done"
    else:
        with pytest.raises(UsageError if ending == "error" else KeyboardInterrupt):
            run_on_spark(body, master=None, partitions=None, conf=conf, verbose=False, spark=session)
    assert seen["dirs"] == ["pairs", "ua"]
    assert seen["own"] == {"smerge.partition.min_records": "5"}  # smerge's settings only
    assert seen["stats"]["execution"] == "spark" and seen["stats"]["master"] == "local[2]" and seen["stats"]["x"] == 1
    assert not os.path.exists(seen["a"]) and not os.path.exists(seen["b"])
    assert _left(tmp_path) == []
    assert not session.stopped  # a session given by the caller is the caller's


def test_bad_partitions_fail_before_anything(tmp_path):
    calls = []
    with pytest.raises(UsageError, match="^partitions is 0"):
        run_on_spark(calls.append, master=None, partitions=0, conf=None, verbose=False, spark=FakeSession())
    assert calls == [] and os.listdir(tmp_path) == []


def _ab(tmp_path):
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    pq.write_table(pa.table({"k": np.arange(40, dtype=np.float64), "x": np.arange(40)}), a)
    pq.write_table(pa.table({"k": np.arange(30, dtype=np.float64), "y": np.arange(30)}), b)
    return str(a), str(b)


def _interrupt(*_a, **_k):
    raise KeyboardInterrupt  # as the CLI's SIGTERM handler does, just after the staging folder exists


def _cgm(tmp_path, a, b):
    import smerge.spark.cgm.runner as mod
    from smerge.jobs import CGMJob, prepare

    prep = prepare(CGMJob(a=a, b=b, output=str(tmp_path / "o.parquet"), keys_a=("k",), eps=0.5))
    return mod, "MergePlan", lambda spark: mod.run_cgm_spark(prep, partitions=1, spark=spark)


def _rtm(tmp_path, a, b):
    import smerge.spark.rtm as mod
    from smerge.jobs.rtm import RTMJob, prepare_rtm

    prep = prepare_rtm(RTMJob(a=a, b=b, output=str(tmp_path / "o.parquet"), keys_a=("k",), eps=0.5, window_size=8))
    return mod, "RTMSparkPlan", lambda spark: mod.run_rtm_spark(prep, partitions=2, spark=spark)


def _wjoin(tmp_path, a, b):
    import smerge.spark.wjoin as mod
    from smerge.jobs.wjoin import WJoinJob, prepare

    prep = prepare(WJoinJob(inputs=(a, b), output=str(tmp_path / "o.parquet"), time=("k",), window="2"))
    return mod, "WSparkPlan", lambda spark: mod.run_wjoin_spark(prep, partitions=2, spark=spark)


@pytest.mark.parametrize("engine", [_cgm, _rtm, _wjoin], ids=["cgm", "rtm", "wjoin"])
def test_interrupted_after_staging_leaves_nothing(tmp_path, monkeypatch, engine):
    a, b = _ab(tmp_path)
    mod, plan_class, run = engine(tmp_path, a, b)
    monkeypatch.setattr(mod, plan_class, _interrupt)  # the plan is built right after the staging folder
    with pytest.raises(KeyboardInterrupt):
        run(FakeSession())
    assert sorted(os.listdir(tmp_path)) == ["a.parquet", "b.parquet"]
