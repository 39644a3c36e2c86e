"""The pipeline's statistics on Spark are those of --local, with the session's start inside the
total: every engine, through ``smerge.jobs.pipeline.execute`` (the path every command takes)."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smerge.jobs.pipeline import RunOptions, execute
from smerge.jobs.route import Route

pytestmark = pytest.mark.slow
SPARK = Route(True, "local[2]", "spark (--master local[2])")


def data(tmp_path):
    rng = np.random.default_rng(3)
    k = np.sort(rng.uniform(0, 1000, 4000))
    pq.write_table(pa.table({"k": k, "v": np.arange(k.size)}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"k": k + 0.001, "w": np.arange(k.size)}), tmp_path / "b.parquet")
    return str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")


@pytest.mark.parametrize("engine", ["cgm", "rtm", "wjoin"])
def test_every_engine_reports_the_same_keys_on_both_routes(engine, tmp_path, spark, monkeypatch):
    from smerge.jobs.cgm import CGMJob
    from smerge.jobs.rtm import RTMJob
    from smerge.jobs.wjoin import WJoinJob

    monkeypatch.chdir(tmp_path)
    a, b = data(tmp_path)
    make = {"cgm": lambda o: CGMJob(a=a, b=b, keys_a=("k",), eps=0.01, output=o, stats=o + ".json"),
            "rtm": lambda o: RTMJob(a=a, b=b, keys_a=("k",), eps=0.01, output=o, stats=o + ".json"),
            "wjoin": lambda o: WJoinJob(inputs=(a, b), time=("k",), window="0.01", output=o, stats=o + ".json")}[engine]
    local = execute(make("local.parquet"), RunOptions(local=True))
    on_spark = execute(make("spark.parquet"), RunOptions(partitions=2, spark=spark), route=SPARK)
    for s, route in ((local, "local (--local)"), (on_spark, SPARK.why)):
        assert s["route"] == route
        assert s["total_seconds"] >= s["session_seconds"] >= 0
        assert not os.path.isabs(s["output"])  # as the user named it, on both routes
    assert local["session_seconds"] == 0 and on_spark["execution"] == "spark"
    assert set(local) - set(on_spark) <= {"read_here"}, set(local) - set(on_spark)
    count = "tuples" if engine == "wjoin" else "matched"
    assert local[count] == on_spark[count] > 0
    assert pq.read_table(tmp_path / "spark.parquet").num_rows == local[count]
    import json

    assert json.loads((tmp_path / "spark.parquet.json").read_text())["route"] == SPARK.why


def test_rtm_says_why_it_has_fewer_partitions_than_asked(tmp_path, spark, monkeypatch):
    from smerge.jobs.rtm import RTMJob

    monkeypatch.chdir(tmp_path)
    a, b = data(tmp_path)
    s = execute(RTMJob(a=a, b=b, keys_a=("k",), eps=0.01, output="o.parquet", window_size=3000),
                RunOptions(partitions=3, spark=spark), route=SPARK)
    assert s["partitions"] == 2 and s["partitions_asked"] == 3
    assert "multiples of 3,000 records" in s["partitions_note"]
