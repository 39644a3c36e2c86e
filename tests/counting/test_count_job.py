"""The count job through the one pipeline (smerge.jobs.pipeline): the engine's row, its fixed
in-process route, the answer against a pandas oracle, the statistics every route reports and the
job's own checks."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smerge.errors import SmergeError, UsageError
from smerge.jobs.count import CountJob
from smerge.jobs.pipeline import RunOptions, engine_for, execute, route_for


@pytest.fixture
def source(tmp_path):
    rng = np.random.default_rng(3)
    t = np.sort(rng.uniform(0, 1000, 3000))
    item = rng.choice(["a", "b", "c", "d"], 3000, p=[0.5, 0.3, 0.15, 0.05])
    path = tmp_path / "s.parquet"
    pq.write_table(pa.table({"t": t, "item": item}), path)
    return str(path), pd.DataFrame({"t": t, "item": item})


def test_count_is_an_engine_that_never_goes_to_spark(source, monkeypatch):
    job = CountJob(source=source[0], item="item", time="t", every="100")
    assert engine_for(job).name == "count" and engine_for(job).run_spark is None
    monkeypatch.setenv("SMERGE_AUTO_MAX_BYTES", "0")  # would send any other engine's run to Spark
    for options in (RunOptions(), RunOptions(master="local[2]"), RunOptions(local=True)):
        route = route_for(job, options)
        assert not route.spark and route.why == "local (count runs in-process; it has no Spark route)"


def test_execute_counts_like_pandas_and_reports_like_every_route(source, tmp_path):
    path, df = source
    answers = []
    stats_path = tmp_path / "s.json"
    result = execute(CountJob(source=path, item="item", time="t", every="100", stats=str(stats_path),
                              answer=answers.append))
    (table,) = answers
    want = df.assign(start=(df.t // 100) * 100).groupby(["start", "item"]).size()
    got = {(r["start"], r["item"]): r["count"] for r in table.to_pylist()}
    assert got == {k: float(v) for k, v in want.items()}
    assert table.column("exact").to_pylist() == [True] * table.num_rows
    assert result["answers"] == len(want) and result["records_received"] == 3000
    assert result["execution"] == "local" and result["session_seconds"] == 0.0
    assert result["route"] == "local (count runs in-process; it has no Spark route)"
    assert result["total_seconds"] >= result["seconds"] > 0
    # the --stats file is the pipeline's final statistics (route and total included)
    assert json.loads(stats_path.read_text()) == json.loads(json.dumps(result))


def test_range_query_and_output(source, tmp_path):
    path, df = source
    out = tmp_path / "o.parquet"
    result = execute(CountJob(source=path, item="item", time="t", start="250", stop="750", output=str(out)))
    got = pq.read_table(out).to_pandas().set_index("item")["count"].to_dict()
    want = df[(df.t >= 250) & (df.t < 750)].groupby("item").size().to_dict()
    assert got == {k: float(v) for k, v in want.items()}
    assert result["output"] == str(out)


@pytest.mark.parametrize("kw, message", [
    ({}, "give either every DUR or both start T and stop T"),
    ({"start": "1"}, "give either every DUR or both start T and stop T"),
    ({"every": "1", "start": "0", "stop": "2"}, "give either every DUR or both start T and stop T"),
    ({"every": "1", "time": "item"}, "item and time both name 'item'"),
])
def test_the_job_checks_its_query(kw, message):
    args = {"source": "x.parquet", "item": "item", "time": "t", **kw}
    with pytest.raises(UsageError, match=re.escape(message)):
        CountJob(**args)


def test_outputs_checked_before_anything_is_read(source, tmp_path):
    path, _ = source
    (tmp_path / "taken.json").write_text("{}")
    answers = []
    with pytest.raises(SmergeError, match="already exists"):
        execute(CountJob(source=path, item="item", time="t", every="100", stats=str(tmp_path / "taken.json"),
                         answer=answers.append))
    assert answers == [] and (tmp_path / "taken.json").read_text() == "{}"
