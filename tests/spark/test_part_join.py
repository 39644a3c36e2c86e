"""Parquet parts joined while the merge job runs (smerge.spark.cgm.assemble.PartJoiner): parts are
appended in order as they appear; a part a retried task attempt wrote again is appended again,
with every part after it."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smerge.datasets.writers import parquet_options
from smerge.spark.cgm.assemble import PartJoiner
from smerge.spark.parquet import PART_WRITE_OPTIONS, ParquetJoin
from smerge.spark.cgm.tasks import part_path

SCHEMA = pa.schema([("x", pa.float64()), ("n", pa.int64())])


def write_part(path: str, n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    t = pa.table({"x": rng.random(n), "n": rng.integers(0, 9, n)}, schema=SCHEMA)
    tmp = f"{path}.tmp"
    w = pq.ParquetWriter(tmp, SCHEMA, **{**parquet_options(SCHEMA), **PART_WRITE_OPTIONS})
    for b in t.to_batches(max_chunksize=300):
        w.write_batch(b)
    w.close()
    os.replace(tmp, path)  # as PartWriter: complete when it appears
    return t


def wait_for(cond, seconds: float = 60.0) -> None:
    end = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < end, "the joiner did not append the parts"
        time.sleep(0.01)


@pytest.fixture
def staging(tmp_path):
    os.makedirs(tmp_path / "pairs")
    return str(tmp_path)


def test_join_truncate_and_append_again(tmp_path):
    paths = [str(tmp_path / f"p{i}.parquet") for i in range(3)]
    tables = [write_part(p, n, i) for i, (p, n) in enumerate(zip(paths, [1000, 10, 777]))]
    out = str(tmp_path / "out.parquet")
    join = ParquetJoin(out, take_first=True)
    for p in paths:
        join.add(p)
    join.truncate(1)
    tables[1] = write_part(paths[1], 50, 9)
    join.add(paths[1])
    join.add(paths[2])
    assert join.finish(SCHEMA) == 1000 + 50 + 777
    assert pq.read_table(out).equals(pa.concat_tables(tables))
    # one part moved in place is the output as written (no footer rewritten)
    raw = open(paths[2], "rb").read()
    one = ParquetJoin(str(tmp_path / "one.parquet"), take_first=True)
    one.add(paths[2])
    assert one.finish(SCHEMA) == 777 and open(tmp_path / "one.parquet", "rb").read() == raw


@pytest.mark.parametrize("rewritten", [0, 2])
def test_joiner_appends_during_the_job_and_again_after_a_retry(staging, rewritten):
    plan = SimpleNamespace(staging=staging, parts=4)
    joiner = PartJoiner(plan, ("pairs",))
    try:
        tables = [write_part(part_path(staging, "pairs", p, "parquet"), 400 + p, p) for p in range(3)]
        wait_for(lambda: len(joiner.joins["pairs"]) == 3)  # appended while the "job" runs
        # a retried attempt writes a part again (other bytes here, to see which one is used)
        tables[rewritten] = write_part(part_path(staging, "pairs", rewritten, "parquet"), 123, 42)
        tables.append(write_part(part_path(staging, "pairs", 3, "parquet"), 5, 3))
        tables.append(write_part(part_path(staging, "pairs", 4, "parquet"), 7, 4))  # the driver's part (P)
        out = joiner.finish("pairs", SCHEMA)
    finally:
        joiner.close()
    assert pq.read_table(out).equals(pa.concat_tables(tables))


def test_joiner_without_parts_gives_an_empty_file(staging):
    joiner = PartJoiner(SimpleNamespace(staging=staging, parts=2), ("pairs",))
    out = joiner.finish("pairs", SCHEMA)
    joiner.close()
    assert pq.read_table(out).num_rows == 0 and pq.read_schema(out).equals(SCHEMA)
