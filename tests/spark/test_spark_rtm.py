"""RTM on Spark equals RTM in-process (--local) exactly: pairs, unmatched A and B, statistics."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smerge.jobs.rtm import RTMJob, prepare_rtm, run_rtm
from smerge.spark.rtm import plan_ranges

SAME_STATS = ("a_records", "b_records", "matched", "a_unmatched", "b_unmatched", "a_nan_keys", "passes",
              "report_windows", "kappa_min", "drop_rate_moving_max", "kappa_max", "a_windows", "b_windows",
              "b_paired")


def test_plan_ranges_cut_at_multiples_of_lcm_window_slab():
    # tabular (slab 1): boundaries at multiples of N, the last range open
    assert plan_ranges(100, 1, 10, 3) == [(0, 30, 0), (30, 70, 30), (70, None, 70)]
    # gridded: 12 records per slab, N = 8 -> unit lcm = 24 records = 2 slabs
    assert plan_ranges(120, 12, 8, 2) == [(0, 4, 0), (4, None, 48)]
    # more partitions than units: one per unit; unit beyond the records: one partition
    assert plan_ranges(50, 1, 20, 9) == [(0, 20, 0), (20, 40, 20), (40, None, 40)]
    assert plan_ranges(76032, 1188, 5000, 4) == [(0, None, 0)]
    assert plan_ranges(None, 1, 10, 4) == [(0, None, 0)]
    assert plan_ranges(100, 1, 10, 1) == [(0, None, 0)]


def _random_ab(tmp_path, seed):
    rng = np.random.default_rng(seed)
    na, nb = 900, 700
    ka = np.sort(rng.integers(0, 200, na)) * 0.25 + rng.normal(0, 1.5, na)
    kb = np.sort(rng.integers(0, 200, nb)) * 0.25 + rng.normal(0, 1.5, nb)
    a = tmp_path / "a.parquet"
    b = tmp_path / "b.parquet"
    pq.write_table(pa.table({"k": ka, "k2": rng.integers(0, 3, na).astype(np.float64), "x": np.arange(na)}), a,
                   row_group_size=128)
    pq.write_table(pa.table({"k": kb, "k2": rng.integers(0, 3, nb).astype(np.float64), "y": np.arange(nb)}), b)
    return str(a), str(b)


def _run_both(spark, tmp_path, a, b, parts, *, tag, **kw):
    from smerge.spark.rtm import run_rtm_spark

    base = dict(a=a, b=b, with_ids=True, **kw)
    loc = run_rtm(prepare_rtm(RTMJob(output=str(tmp_path / f"{tag}-l.parquet"), unmatched=str(tmp_path / f"{tag}-ul"),
                                     **base)))
    got = []
    for p in parts:
        s = run_rtm_spark(prepare_rtm(RTMJob(output=str(tmp_path / f"{tag}-s{p}.parquet"),
                                             unmatched=str(tmp_path / f"{tag}-us{p}"), **base)),
                          partitions=p, spark=spark)
        assert s["execution"] == "spark"
        for k in SAME_STATS:
            assert s.get(k) == loc.get(k), (p, k, s.get(k), loc.get(k))
        for f, g in ((f"{tag}-s{p}.parquet", f"{tag}-l.parquet"), (f"{tag}-us{p}.a.parquet", f"{tag}-ul.a.parquet"),
                     (f"{tag}-us{p}.b.parquet", f"{tag}-ul.b.parquet")):
            assert pq.read_table(tmp_path / f).equals(pq.read_table(tmp_path / g)), (p, f)
        assert not [x for x in os.listdir(tmp_path) if "smerge-rtm" in x]  # staging removed
        got.append(s)
    return loc, got


@pytest.mark.slow
@pytest.mark.parametrize("refill", ["page", "symdiff"])
def test_spark_equals_local_random(spark, tmp_path, refill):
    a, b = _random_ab(tmp_path, 7)
    loc, got = _run_both(spark, tmp_path, a, b, (1, 2, 3), tag=refill, keys_a=("k", "k2"), eps=(0.3, 0.0),
                         window_size=50, refill=refill, kappa_max=True)
    assert [s["partitions"] for s in got] == [1, 2, 3]
    assert loc["matched"] > 100 and loc["a_unmatched"] > 0 and loc["b_unmatched"] > 0
    assert got[2]["partition_rows"] == [300, 300, 300]


@pytest.mark.slow
@pytest.mark.parametrize("refill", ["page", "symdiff"])
def test_spark_equals_local_ncar_storms(spark, tmp_path, ncar_dir, refill):
    u, v = os.path.join(ncar_dir, "Ustorm.cdf"), os.path.join(ncar_dir, "Vstorm.cdf")
    # N = 1188 = one timestep slab: every partition boundary is a whole slab
    loc, got = _run_both(spark, tmp_path, u, v, (1, 2, 3), tag=refill, window_size=1188, eps=0.01, refill=refill)
    assert [s["partitions"] for s in got] == [1, 2, 3]
    assert got[1]["partition_rows"] == [32 * 1188, 32 * 1188]
    assert loc["matched"] == 76032


@pytest.mark.slow
def test_spark_against_running_server_and_netcdf_output(spark, tmp_path, ncar_dir):
    """--server: the tasks query the user's server (with its token); netCDF output on A's grid."""
    from smerge.index import BIndex
    from smerge.datasets import open_input
    from smerge.spark.rtm import run_rtm_spark
    from smerge.transport.flight_server import IndexServer

    u, v = os.path.join(ncar_dir, "Ustorm.cdf"), os.path.join(ncar_dir, "Vstorm.cdf")
    (tmp_path / "tok").write_text("spark-rtm-token-123")
    srv = IndexServer(BIndex.from_source(open_input(v)), host="127.0.0.1", port=0, token="spark-rtm-token-123")
    srv.start_background()
    try:
        common = dict(a=u, server=srv.url, token_file=str(tmp_path / "tok"), window_size=594)
        loc = run_rtm(prepare_rtm(RTMJob(output=str(tmp_path / "l.nc"), **common)))
        s = run_rtm_spark(prepare_rtm(RTMJob(output=str(tmp_path / "s.nc"), **common)), partitions=2, spark=spark)
    finally:
        srv.shutdown()
    assert s["server"] == srv.url and s["partitions"] == 2 and s["matched"] == loc["matched"] == 76032
    import netCDF4

    with netCDF4.Dataset(tmp_path / "l.nc") as dl, netCDF4.Dataset(tmp_path / "s.nc") as ds:
        assert set(dl.variables) == set(ds.variables)
        for name in dl.variables:
            assert np.array_equal(np.ma.filled(dl[name][:], np.nan), np.ma.filled(ds[name][:], np.nan),
                                  equal_nan=True), name


@pytest.mark.slow
def test_nan_key_error_from_a_task_is_one_line(spark, tmp_path):
    from smerge.errors import InputError
    from smerge.spark.rtm import run_rtm_spark

    pq.write_table(pa.table({"k": [0.0, 1.0, 2.0, np.nan, 4.0, 5.0]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"k": [0.0, 1.0]}), tmp_path / "b.parquet")
    prep = prepare_rtm(RTMJob(a=str(tmp_path / "a.parquet"), b=str(tmp_path / "b.parquet"), keys_a=("k",),
                              window_size=2, output=str(tmp_path / "o.parquet")))
    with pytest.raises(InputError, match="row 3"):
        run_rtm_spark(prep, partitions=3, spark=spark)
    assert sorted(os.listdir(tmp_path)) == ["a.parquet", "b.parquet"]  # no output, no staging left


@pytest.mark.slow
def test_cli_runs_on_spark_by_default_and_equals_local(tmp_path, spark_cli):
    """(The CLI in this process, on the shared session.)"""
    a, b = _random_ab(tmp_path, 3)
    common = ["rtm", a, b, "--keys", "k", "--eps", "0.2", "--window", "100", "--with-ids", "--unmatched"]
    rc, _, err = spark_cli(*common, "us", "-o", "s.parquet", "--master", "local[2]", "--partitions", "3",
                           "--stats", "s.json", cwd=tmp_path)
    assert rc == 0, err
    assert err == ""
    rc, out, err = spark_cli(*common, "ul", "-o", "l.parquet", "--local", "--json")
    assert rc == 0, err
    s, loc = json.load(open(tmp_path / "s.json")), json.loads(out)
    assert s["execution"] == "spark" and s["partitions"] == 3 and loc["execution"] == "local"
    assert spark_cli.masters == ["local[2]"]
    for k in SAME_STATS:
        assert s.get(k) == loc.get(k), k
    for f, g in (("s.parquet", "l.parquet"), ("us.a.parquet", "ul.a.parquet"), ("us.b.parquet", "ul.b.parquet")):
        assert pq.read_table(tmp_path / f).equals(pq.read_table(tmp_path / g)), f
