"""A fixed-fraction read of an archive by row ranges (what Spark tasks do): the sample's size is
known before any block is read, and any cut of it into ranges gives the whole read, record for
record, for both layouts; a range reads only the runs holding it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smerge.cli.main import main
from smerge.datasets import open_input


@pytest.fixture(scope="module", params=["rts", "eager"])
def arch(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    n = 5000
    rng = np.random.default_rng(4)
    pq.write_table(pa.table({"t": np.sort(rng.integers(0, 2000, n)), "v": rng.normal(size=n)}), tmp / "s.parquet")
    extra = ["--copies", "0.3,0.6"] if request.param == "eager" else []
    assert main(["archive", "append", str(tmp / "a"), str(tmp / "s.parquet"), "--time", "t", "--run-blocks", "6",
                 "--block-rows", "200", "--seed", "9", *extra]) == 0
    return str(tmp / "a")


@pytest.mark.parametrize("f", [0.1, 0.3, 0.55, 1.0])
def test_ranges_give_the_whole_read(arch, f):
    src = open_input(arch, sample=f, sample_seed=3)
    n = src.num_rows  # before any block is read
    assert "blocks_read" not in src.counters
    whole = pa.Table.from_batches(list(src.batches()))
    total_blocks = src.counters["blocks_read"]
    assert whole.num_rows == n and (n == 5000) == (f == 1.0)
    rng = np.random.default_rng(int(f * 100))
    cuts = np.unique(np.concatenate([[0, n], rng.integers(0, n + 1, 7)]))
    src = open_input(arch, sample=f, sample_seed=3)
    parts = [b for a, z in zip(cuts[:-1], cuts[1:]) for b in src.batches(int(a), int(z))]
    got = pa.Table.from_batches(parts, schema=whole.schema)
    assert got.equals(whole)
    assert src.counters["blocks_read"] == total_blocks  # each run once, however the ranges cut it
    # a range at the end reads the last run only (several runs here)
    src = open_input(arch, sample=f, sample_seed=3)
    tail = pa.Table.from_batches(list(src.batches(n - 5, None)), schema=whole.schema)
    assert tail.equals(whole.slice(n - 5)) and 0 < src.counters["blocks_read"] < total_blocks / 2
