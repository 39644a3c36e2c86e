"""W-join on Spark equals --local exactly (same rows, same order): HW-join for any P, NLW-join, storm grids."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smerge.errors import InputError
from smerge.spark.wjoin import merge_parts
from smerge.jobs.wjoin import WJoinJob, prepare, run_local
from smerge.spark.wjoin import run_wjoin_spark

pytestmark = pytest.mark.slow


def streams(tmp, n, rows, keys, seed, *, floats=False, row_group=50):
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(n):
        t = np.sort(rng.integers(0, rows // 2, rows))  # many ties in time
        tab = pa.table({"t": (t / 4.0) if floats else t, "k": rng.integers(0, keys, rows),
                        "g": rng.integers(0, 3, rows).astype(np.int32), "v": rng.normal(size=rows)})
        p = str(tmp / f"s{seed}_{i + 1}.parquet")
        pq.write_table(tab, p, row_group_size=row_group)
        paths.append(p)
    return paths


def both(spark, tmp, name, partitions=None, **kw):
    """(local output table, spark output table, local stats, spark stats) for one job."""
    base = dict(output=str(tmp / f"{name}-local.parquet"), overwrite=True, batch_rows=64)
    base.update(kw)
    loc = run_local(prepare(WJoinJob(**base)))
    base["output"] = str(tmp / f"{name}-spark.parquet")
    spk = run_wjoin_spark(prepare(WJoinJob(**base)), spark=spark, partitions=partitions)
    return pq.read_table(loc["output"]), pq.read_table(spk["output"]), loc, spk


@pytest.mark.parametrize("P", [1, 2, 3, 5])
def test_hw_join_equals_local_exactly_for_any_partitions(spark, tmp_path, P):
    paths = streams(tmp_path, 3, 400, 6, seed=P)
    a, b, ls, ss = both(spark, tmp_path, f"hw{P}", P, inputs=tuple(paths), time=("t",), window="5",
                        pair_windows=("1,3=3",), on=("k",), where="S1.v < S3.v + 1", with_ids=True)
    assert ss["method"] == "hash" and ss["partitions"] == P and ss["execution"] == "spark"
    assert a.num_rows > 100 and a.equals(b)  # same rows, same order, same schema
    assert ss["tuples"] == ls["tuples"] == a.num_rows
    assert ss["records_read"] == ls["records_read"] == {"S1": 400, "S2": 400, "S3": 400}
    assert sum(ss["partition_tuples"]) == a.num_rows and len(ss["partition_tuples"]) == P
    if P > 1:
        assert sum(1 for x in ss["partition_tuples"] if x) > 1  # the work really was split
    # per-partition buffers never exceed the whole-stream buffers
    assert all(ss["peak_buffered"][s] <= ls["peak_buffered"][s] for s in ("S1", "S2", "S3"))
    assert not [f for f in os.listdir(tmp_path) if "smerge-wjoin" in f]  # staging removed


def test_hw_join_float_times_two_way_without_ids_and_multi_key(spark, tmp_path):
    paths = streams(tmp_path, 2, 300, 4, seed=11, floats=True)
    a, b, ls, ss = both(spark, tmp_path, "hwf", 4, inputs=tuple(paths), time=("t",), window="2.5",
                        on=("k", "g"), aliases=("north", "south"))
    assert a.column_names[0] == "north_t" and "north_row" not in a.column_names
    assert a.num_rows > 50 and a.equals(b)


@pytest.mark.parametrize("P", [1, 3])
def test_nlw_join_on_spark_equals_local(spark, tmp_path, P):
    paths = streams(tmp_path, 3, 250, 5, seed=21)
    a, b, ls, ss = both(spark, tmp_path, f"nlw{P}", P, inputs=tuple(paths), time=("t",), window="3",
                        where="S1.k < S2.k and S2.v > S3.v", with_ids=True)
    assert ss["method"] == "nested-loop" and ss["partitions"] == P
    assert ss["partitioning"] == ("one partition" if P == 1 else "time ranges + halo")
    assert a.num_rows > 100 and a.equals(b)
    if P == 1:
        assert ss["peak_buffered"] == ls["peak_buffered"]
    else:
        assert sum(1 for x in ss["partition_tuples"] if x) == P  # every range formed tuples, none twice
        assert sum(ss["partition_tuples"]) == a.num_rows


def test_nlw_time_ranges_float_times_chain_of_bounds(spark, tmp_path):
    # S1-S2 and S2-S3 bounded, S1-S3 not: the halo must be the shortest path 2.5 + 1.5 = 4
    paths = streams(tmp_path, 3, 300, 5, seed=23, floats=True)
    a, b, ls, ss = both(spark, tmp_path, "nlwf", 4, inputs=tuple(paths), time=("t",), window="2.5",
                        pair_windows=("2,3=1.5", "1,3=none"), where="S1.v + S3.v > S2.v", with_ids=True)
    assert ss["partitions"] == 4 and ss["partitioning"] == "time ranges + halo"
    assert a.num_rows > 100 and a.equals(b)


def test_storm_grids_on_spark_equal_local(spark, tmp_path, ncar_dir):
    files = tuple(os.path.join(ncar_dir, f"{v}storm.cdf") for v in "PTU")
    a, b, ls, ss = both(spark, tmp_path, "storm", 3, inputs=files, time=("timestep",), window="6",
                        on=("lat", "lon"), where="S1.p > 100000 and S2.t < 290 and abs(S3.u) > 5",
                        with_ids=True, batch_rows=20000)
    assert ss["records_read"] == {"S1": 76032, "S2": 76032, "S3": 76032}
    assert a.num_rows > 1000 and a.equals(b)


def test_unsorted_input_at_a_chunk_seam_is_reported_like_local(spark, tmp_path):
    good = str(tmp_path / "g.parquet")
    pq.write_table(pa.table({"t": np.arange(100), "k": np.zeros(100, np.int64)}), good)
    t = np.arange(100)
    t[50] = 10  # the second chunk starts below the first chunk's last time
    bad = str(tmp_path / "b.parquet")
    pq.write_table(pa.table({"t": t, "k": np.zeros(100, np.int64)}), bad)
    job = WJoinJob(inputs=(good, bad), time=("t",), window="2", on=("k",), output=str(tmp_path / "o.parquet"))
    with pytest.raises(InputError) as loc:
        run_local(prepare(job))
    with pytest.raises(InputError) as spk:
        run_wjoin_spark(prepare(job), spark=spark, partitions=2)
    assert str(spk.value) == str(loc.value) and "decreases at row 50" in str(spk.value)
    assert not (tmp_path / "o.parquet").exists() and not [f for f in os.listdir(tmp_path) if "smerge-wjoin" in f]


def test_merge_parts_restores_the_completion_order(tmp_path):
    rng = np.random.default_rng(5)
    keys = np.unique(rng.integers(0, 50, (300, 3)), axis=0)  # distinct (t, s, r), sorted
    owner = rng.integers(0, 3, keys.shape[0])
    paths = []
    for q in range(3):
        k = keys[owner == q]
        tab = pa.table({"x": k[:, 0] * 10_000 + k[:, 1] * 100 + k[:, 2], "__ord_t": k[:, 0], "__ord_s": k[:, 1],
                        "__ord_r": k[:, 2]})
        p = str(tmp_path / f"p{q}.arrow")
        with pa.OSFile(p, "wb") as f, pa.ipc.new_file(f, tab.schema) as w:
            for b in tab.to_batches(max_chunksize=7):
                w.write(b)
        paths.append(p)
    got = np.concatenate([b.column("x").to_numpy() for b in merge_parts(paths)])
    assert np.array_equal(got, keys[:, 0] * 10_000 + keys[:, 1] * 100 + keys[:, 2])


def test_cli_runs_on_spark_by_default_and_equals_local(tmp_path, spark_cli):
    """(The CLI in this process, on the shared session.)"""
    paths = streams(tmp_path, 2, 200, 3, seed=31)
    common = ["wjoin", *paths, "--time", "t", "--window", "4", "--on", "k", "--with-ids"]
    rc, out, err = spark_cli(*common, "-o", "s.parquet", "--master", "local[2]", "--partitions", "3", "--json",
                             cwd=tmp_path)
    assert rc == 0, err
    assert err == ""
    stats = json.loads(out)
    assert stats["execution"] == "spark" and stats["partitions"] == 3 and spark_cli.masters == ["local[2]"]
    rc, _, err = spark_cli(*common, "-o", "l.parquet", "--local")
    assert rc == 0, err
    assert pq.read_table(tmp_path / "s.parquet").equals(pq.read_table(tmp_path / "l.parquet"))
