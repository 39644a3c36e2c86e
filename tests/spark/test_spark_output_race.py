"""A Spark run that loses the race for its output (another run, or a user, puts something at the
path while it runs) fails with exit 2 and writes nothing: the name is claimed atomically when the
driver puts the outputs in place, and outputs it claimed before are taken back."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from spark_data import partially_sorted, write_stream

import smerge.spark.cgm.assemble as assemble
from smerge.errors import OutputError
from smerge.jobs import CGMJob, prepare
from smerge.spark.cgm.runner import run_cgm_spark


@pytest.mark.slow
@pytest.mark.parametrize("out, taken", [("o.parquet", "u.b.parquet"), ("ds/", "ds")])
def test_spark_run_losing_the_race_writes_nothing(spark, tmp_path, monkeypatch, out, taken):
    rng = np.random.default_rng(5)
    n = 2000
    a = write_stream(tmp_path / "a.parquet", partially_sorted(n, rng), seed=1)
    b = write_stream(tmp_path / "b.parquet", partially_sorted(n, rng), seed=2)
    real = assemble._finish_targets

    def finish_then_someone_writes(*args):
        real(*args)  # every output is complete in the staging folder; now another run commits first
        if taken == "ds":
            os.mkdir(tmp_path / "ds")
            pq.write_table(pa.table({"x": [1]}), tmp_path / "ds" / "theirs.parquet")
        else:
            (tmp_path / taken).write_text("theirs")

    monkeypatch.setattr(assemble, "_finish_targets", finish_then_someone_writes)
    job = CGMJob(a=a, b=b, keys_a=("k1",), eps=0.25, window_size=60, least_increment_a=10,
                 least_increment_b=10, output=str(tmp_path / out),
                 unmatched=str(tmp_path / "u"), stats=str(tmp_path / "s.json"))
    with pytest.raises(OutputError, match="created by another run or program") as e:
        run_cgm_spark(prepare(job), partitions=2, spark=spark)
    assert e.value.exit_code == 2
    left = sorted(os.listdir(tmp_path))
    assert left == sorted(["a.parquet", "b.parquet", taken]), left  # nothing of ours, no temporary names
    if taken == "ds":
        assert os.listdir(tmp_path / "ds") == ["theirs.parquet"]
    else:
        assert (tmp_path / taken).read_text() == "theirs"
