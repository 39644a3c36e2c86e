"""CGM on Spark: one partition equals --local; 2-8 partitions keep every invariant (spec 2, 7)."""

from __future__ import annotations

import glob
import os

import numpy as np
import pyarrow.parquet as pq
import pytest
from spark_data import partially_sorted, write_stream
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from smerge.errors import InputError
from smerge.jobs import CGMJob, prepare, run_local
from smerge.spark.cgm.runner import run_cgm_spark
from smerge.spark.cgm.plan import choose_bounds

pytestmark = pytest.mark.slow


def job(tmp, a, b, name, **kw) -> CGMJob:
    base = dict(a=a, b=b, output=str(tmp / f"{name}.parquet"), keys_a=("k1", "k2"), with_ids=True,
                unmatched=str(tmp / f"{name}-un"), overwrite=True, batch_rows=64)
    base.update(kw)
    return CGMJob(**base)


def read(path):
    return pq.read_table(path)


def check_invariants(a, b, out, un_prefix, eps, stats):
    A, B, pairs = read(a), read(b), read(out)
    ar, br = pairs["a_row"].to_numpy(), pairs["b_row"].to_numpy()
    # at most once per record
    assert len(np.unique(ar)) == ar.size
    assert len(np.unique(br)) == br.size
    # eps on every pair, every key
    for k in ("k1", "k2"):
        x, y = A[k].to_numpy()[ar], B[k].to_numpy()[br]
        assert not np.any(x < y - eps) and not np.any(x > y + eps)
    # payload belongs to the rows named by the ids
    assert np.array_equal(pairs["v"].to_numpy(), A["v"].to_numpy()[ar])
    assert np.array_equal(pairs["v_b"].to_numpy(), B["v"].to_numpy()[br])
    # exact accounting, and the unmatched outputs are exactly the complement
    ua, ub = read(f"{un_prefix}.a.parquet"), read(f"{un_prefix}.b.parquet")
    assert stats["matched"] == pairs.num_rows
    assert stats["a_unmatched"] == ua.num_rows and stats["b_unmatched"] == ub.num_rows
    assert stats["matched"] + stats["a_unmatched"] == stats["a_records"] == A.num_rows
    assert stats["matched"] + stats["b_unmatched"] == stats["b_records"] == B.num_rows
    assert np.array_equal(np.sort(np.concatenate([ar, ua["a_row"].to_numpy()])), np.arange(A.num_rows))
    assert np.array_equal(np.sort(np.concatenate([br, ub["b_row"].to_numpy()])), np.arange(B.num_rows))
    assert np.array_equal(ua["v"].to_numpy(), A["v"].to_numpy()[ua["a_row"].to_numpy()])
    assert np.array_equal(ub["v"].to_numpy(), B["v"].to_numpy()[ub["b_row"].to_numpy()])


def test_choose_bounds_in_gaps():
    sample = np.repeat(np.arange(10.0), 5)
    assert choose_bounds(sample, 2) == (4.5,)
    assert choose_bounds(sample, 1) == ()
    assert choose_bounds(np.full(7, 3.0), 4) == ()
    assert choose_bounds(sample, 5) == (1.5, 3.5, 5.5, 7.5)


@pytest.mark.parametrize("window,inc,eps", [(8, 2, 0.25), (40, 40, 0.0), (16, 3, 1.0)])
def test_one_partition_equals_local(spark, tmp_path, window, inc, eps):
    rng = np.random.default_rng(window)
    n = 700
    a = write_stream(tmp_path / "a.parquet", partially_sorted(n, rng), rng.integers(0, 3, n), seed=1)
    b = write_stream(tmp_path / "b.parquet", partially_sorted(n - 37, rng), rng.integers(0, 3, n - 37), seed=2)
    kw = dict(window_size=window, least_increment_a=inc, least_increment_b=inc, eps=eps, delta=0.5)
    local = run_local(prepare(job(tmp_path, a, b, "local", stats=str(tmp_path / "l.json"), **kw)))
    sp = run_cgm_spark(prepare(job(tmp_path, a, b, "spark", stats=str(tmp_path / "s.json"), **kw)), partitions=1,
                       spark=spark)
    assert read(tmp_path / "local.parquet").equals(read(tmp_path / "spark.parquet"))
    for side in ("a", "b"):
        assert read(tmp_path / f"local-un.{side}.parquet").equals(read(tmp_path / f"spark-un.{side}.parquet"))
    for k in ("a_records", "b_records", "matched", "a_unmatched", "b_unmatched", "passes", "report_windows",
              "kappa_min", "drop_rate_moving_max", "delta_ok", "match_pct"):
        assert sp[k] == local[k], k
    assert sp["execution"] == "spark" and local["execution"] == "local"
    assert sp["params"] == local["params"]
    assert os.path.exists(tmp_path / "s.json")
    assert not glob.glob(str(tmp_path / ".*smerge*"))  # no staging or temporary files left


@settings(max_examples=18, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10**6), parts=st.integers(2, 8), eps=st.sampled_from([0.0, 0.25, 0.5, 1.0]),
       window=st.integers(1, 12), na=st.integers(0, 150), nb=st.integers(0, 150), forced=st.booleans())
def test_partitions_keep_invariants(spark, tmp_path_factory, seed, parts, eps, window, na, nb, forced):
    tmp = tmp_path_factory.mktemp("inv")
    rng = np.random.default_rng(seed)
    ka, kb = partially_sorted(na, rng, spread=10), partially_sorted(nb, rng, spread=10)
    a = write_stream(tmp / "a.parquet", ka, rng.integers(0, 2, na) * 0.5, seed=seed)
    b = write_stream(tmp / "b.parquet", kb, rng.integers(0, 2, nb) * 0.5, seed=seed + 1)
    conf = {}
    if forced and (na or nb):
        # boundaries exactly on key values: records on a boundary and within eps of it
        vals = np.unique(np.concatenate([ka, kb]))
        conf["smerge.bounds"] = ",".join(str(v) for v in rng.choice(vals, size=min(parts - 1, vals.size), replace=False))
    inc = max(1, window // 3)
    j = job(tmp, a, b, "out", window_size=window, least_increment_a=inc, least_increment_b=inc, eps=eps)
    stats = run_cgm_spark(prepare(j), partitions=parts, conf=conf, spark=spark)
    check_invariants(a, b, tmp / "out.parquet", tmp / "out-un", eps, stats)


def test_shared_boundary_records_pair_once(spark, tmp_path):
    # B records sit exactly on the forced boundary 5.0 and within eps of it, visible to both
    # partitions; A records on both sides want them.
    ka = np.array([4.6, 4.8, 5.0, 5.2, 5.4, 4.9, 5.1])
    kb = np.array([5.0, 4.95, 5.05, 5.0])
    a = write_stream(tmp_path / "a.parquet", ka, np.zeros(ka.size))
    b = write_stream(tmp_path / "b.parquet", kb, np.zeros(kb.size))
    j = job(tmp_path, a, b, "o", eps=0.5, window_size=4, least_increment_a=1, least_increment_b=1)
    stats = run_cgm_spark(prepare(j), partitions=2, conf={"smerge.bounds": "5.0"}, spark=spark)
    assert stats["partitions"] == 2 and stats["b_shared"] == 4
    # every pair has a shared B record: all are seam pairs, and some had to be dropped
    assert stats["seam_pairs"] - stats["seam_pairs_dropped"] == stats["matched"]
    assert stats["seam_pairs_dropped"] > 0
    check_invariants(a, b, tmp_path / "o.parquet", tmp_path / "o-un", 0.5, stats)
    assert stats["matched"] == 4  # every B record pairs once, with an A record on either side
    # report windows count matches after seam resolution: 7 A records retired, only 4 matched
    assert stats["report_windows"] == 2 and stats["kappa_min"] < 1.0


def test_report_kappas_take_dropped_seam_pairs_off_their_window():
    from smerge.spark.cgm.seams import report_kappas

    results = [{"p": 0, "windows": [(3, 4), (2, 4), (1, 1)]}, {"p": 1, "windows": []},
               {"p": 2, "windows": [(4, 4)]}]
    # partition 0 emitted 6 pairs: ordinals 0-2 in window 0, 3-4 in window 1, 5 in window 2
    got = report_kappas(results, {0: np.array([2, 3, 5]), 2: np.array([0])})
    assert got == [2 / 4, 1 / 4, 0 / 1, 3 / 4]
    assert report_kappas(results, {}) == [3 / 4, 2 / 4, 1 / 1, 4 / 4]


def test_deterministic_and_retried_task_identical(spark, tmp_path):
    rng = np.random.default_rng(7)
    n = 3000
    a = write_stream(tmp_path / "a.parquet", partially_sorted(n, rng), rng.integers(0, 3, n), seed=3)
    b = write_stream(tmp_path / "b.parquet", partially_sorted(n, rng), rng.integers(0, 3, n), seed=4)
    kw = dict(window_size=50, least_increment_a=10, least_increment_b=10, eps=0.25)
    runs = {}
    for name, conf in (("x", {}), ("y", {}), ("killed", {"smerge.test.kill_once_partition": f"1:{tmp_path / 'killed.marker'}"})):
        runs[name] = run_cgm_spark(prepare(job(tmp_path, a, b, name, **kw)), partitions=3, conf=conf, spark=spark)
    x = read(tmp_path / "x.parquet")
    assert runs["x"]["partitions"] == 3 and x.num_rows > 0
    for name in ("y", "killed"):
        assert read(tmp_path / f"{name}.parquet").equals(x)
        for side in ("a", "b"):
            assert read(tmp_path / f"{name}-un.{side}.parquet").equals(read(tmp_path / f"x-un.{side}.parquet"))
        assert runs[name]["matched"] == runs["x"]["matched"]
    # the kill really happened (the first attempt of partition 1 exited its Python worker)
    assert os.path.exists(tmp_path / "killed.marker")
    check_invariants(a, b, tmp_path / "killed.parquet", tmp_path / "killed-un", 0.25, runs["killed"])


def test_storms_spark_equals_local(spark, tmp_path, ncar_dir):
    a, b = os.path.join(ncar_dir, "Pstorm.cdf"), os.path.join(ncar_dir, "Tstorm.cdf")
    base = dict(a=a, b=b, with_ids=True, overwrite=True, eps=0.01, window_size=2000, least_increment_a=500,
                least_increment_b=500)
    local = run_local(prepare(CGMJob(output=str(tmp_path / "l.parquet"), **base)))
    want = read(tmp_path / "l.parquet")
    assert local["matched"] == 76032
    for parts in (1, 2, 4):
        sp = run_cgm_spark(prepare(CGMJob(output=str(tmp_path / f"s{parts}.parquet"), **base)), partitions=parts,
                           spark=spark)
        got = read(tmp_path / f"s{parts}.parquet")
        assert sp["partitions"] == parts and sp["seam_pairs"] == 0
        assert got.equals(want), parts
        assert sp["matched"] == local["matched"]


def test_nan_key_is_input_error_and_nothing_written(spark, tmp_path):
    ka = np.array([1.0, 2.0, np.nan, 4.0])
    a = write_stream(tmp_path / "a.parquet", ka, np.zeros(4))
    b = write_stream(tmp_path / "b.parquet", np.array([1.0, 2.0]), np.zeros(2))
    with pytest.raises(InputError, match="row 2"):
        run_cgm_spark(prepare(job(tmp_path, a, b, "o")), partitions=2, spark=spark)
    assert not os.path.exists(tmp_path / "o.parquet")
    assert sorted(os.listdir(tmp_path)) == ["a.parquet", "b.parquet"]
    # with --nan-keys unmatched the NaN record is counted as unmatched
    stats = run_cgm_spark(prepare(job(tmp_path, a, b, "o", nan_keys="unmatched")), partitions=2, spark=spark)
    assert stats["a_nan_keys"] == 1 and stats["matched"] == 2 and stats["a_unmatched"] == 2
    assert 2 in read(tmp_path / "o-un.a.parquet")["a_row"].to_pylist()
