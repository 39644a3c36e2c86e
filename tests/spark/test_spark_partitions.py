"""P > 1 finds what --local finds (issue 15 item 2): partitions run windows thinned to their
share of the arrival order (smerge.spark.cgm.windows), and the run reports the pairs an in-process
run is expected to find beside the pairs it found."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smerge.jobs import CGMJob, prepare, run_local
from smerge.merge import CGMParams
from smerge.merge.params import MergeKeys
from smerge.spark.cgm import windows as pwin
from smerge.spark.cgm.runner import run_cgm_spark
from smerge.spark.cgm.tasks import SideSpec

EPS = 0.01


def station_stream(path, lat0, lon0, steps, q, seed, jitter=0.002) -> str:
    """Station reports: every time step each station reports with probability q, in random order
    (the arrival order is time, not lat); keys (lat, lon) carry a little noise."""
    rng = np.random.default_rng(seed)
    cols = {"lat": [], "lon": [], "t": []}
    for t in range(steps):
        idx = rng.permutation(np.flatnonzero(rng.random(lat0.size) < q))
        cols["lat"].append(lat0[idx] + rng.uniform(-jitter, jitter, idx.size))
        cols["lon"].append(lon0[idx] + rng.uniform(-jitter, jitter, idx.size))
        cols["t"].append(np.full(idx.size, float(t)))
    table = pa.table({k: np.concatenate(v) for k, v in cols.items()})
    table = table.append_column("v", pa.array(rng.random(table.num_rows).astype(np.float32)))
    pq.write_table(table, path, row_group_size=4096)
    return str(path)


@pytest.fixture(scope="module")
def stations(tmp_path_factory):
    """About 14,000 + 12,500 reports of 600 stations over 30 steps (the issue's kind of data)."""
    d = tmp_path_factory.mktemp("stations")
    rng = np.random.default_rng(7)
    lat0, lon0 = np.round(rng.uniform(-60, 60, 600), 3), np.round(rng.uniform(-180, 180, 600), 3)
    return (station_stream(d / "a.parquet", lat0, lon0, 30, 0.8, 1),
            station_stream(d / "b.parquet", lat0, lon0, 30, 0.7, 2))


def job(tmp, a, b, name, **kw) -> CGMJob:
    base = dict(a=a, b=b, output=str(tmp / f"{name}.parquet"), keys_a=("lat", "lon"), eps=EPS, with_ids=True,
                unmatched=str(tmp / f"{name}-un"), overwrite=True, window_size=5000, least_increment_a=1000,
                least_increment_b=1000)
    base.update(kw)
    return CGMJob(**base)


def check_invariants(a, b, tmp, name, stats):
    A, B, pairs = pq.read_table(a), pq.read_table(b), pq.read_table(tmp / f"{name}.parquet")
    ar, br = pairs["a_row"].to_numpy(), pairs["b_row"].to_numpy()
    assert np.unique(ar).size == ar.size and np.unique(br).size == br.size  # at most once per record
    for k in ("lat", "lon"):  # eps on every key of every pair
        assert np.all(np.abs(A[k].to_numpy()[ar] - B[k].to_numpy()[br]) <= EPS)
    assert np.array_equal(pairs["v"].to_numpy(), A["v"].to_numpy()[ar])
    assert np.array_equal(pairs["v_b"].to_numpy(), B["v"].to_numpy()[br])
    ua, ub = pq.read_table(tmp / f"{name}-un.a.parquet"), pq.read_table(tmp / f"{name}-un.b.parquet")
    assert stats["matched"] == pairs.num_rows
    assert np.array_equal(np.sort(np.concatenate([ar, ua["a_row"].to_numpy()])), np.arange(A.num_rows))
    assert np.array_equal(np.sort(np.concatenate([br, ub["b_row"].to_numpy()])), np.arange(B.num_rows))
    # report windows closed at N records of A in every partition, as --local's (without the
    # regrouping a partition would close one every N_p ~ N / P records)
    assert stats["report_windows"] <= A.num_rows // 5000 + stats["partitions"]


def test_station_data_partitions_find_local_pairs(spark, tmp_path, stations):
    a, b = stations
    local = run_local(prepare(job(tmp_path, a, b, "local")))
    conf = {"smerge.partition.min_records": "1000"}
    # Before: every partition ran the job's N and K, and lost most pairs (the failure).
    fixed = run_cgm_spark(prepare(job(tmp_path, a, b, "fixed")), partitions=3, spark=spark,
                          conf={**conf, "smerge.partition.windows": "fixed"})
    assert fixed["matched"] < 0.6 * local["matched"]
    assert fixed["partition_windows"] is None
    assert fixed["pairs_expected"] == local["matched"]  # small inputs: the engine over the whole keys
    assert fixed["pairs_check"].startswith("below 99%")
    for P in (2, 3, 5):
        s = run_cgm_spark(prepare(job(tmp_path, a, b, f"p{P}")), partitions=P, spark=spark, conf=conf)
        assert s["partitions"] == P
        assert s["matched"] >= 0.99 * local["matched"], (P, s["matched"], local["matched"])
        # arrival order is time, so each partition is about 1/P of every stretch: windows thinned
        assert all(0.5 / P < d < 2.0 / P for side in ("a", "b") for d in s["arrival_density"][side])
        assert all(n < 5000 and ka <= n and kb <= n for n, ka, kb in s["partition_windows"])
        assert s["pairs_expected"] == local["matched"] and s["pairs_check"] == "ok"
        assert s["pairs_found_share"] == round(s["matched"] / local["matched"], 4)
        check_invariants(a, b, tmp_path, f"p{P}", s)


def test_sorted_leading_key_keeps_local_windows(spark, tmp_path):
    """Benchmark-like data (time first, 5% of records displaced): a partition's records are
    contiguous in arrival order, so its windows stay N, K."""
    from smerge.datasets.gen import GenParams, generate

    tables = []
    for seed in (1, 2):
        t = pa.Table.from_batches(list(generate(GenParams(records=60_000, randomize=5, seed=seed, nlat=20, nlon=50))))
        path = tmp_path / f"g{seed}.parquet"
        pq.write_table(t, path)
        tables.append(str(path))
    a, b = tables
    kw = dict(keys_a=("time", "lat", "lon"), eps=0.0, window_size=2000, least_increment_a=500, least_increment_b=500)
    local = run_local(prepare(job(tmp_path, a, b, "local", **kw)))
    s = run_cgm_spark(prepare(job(tmp_path, a, b, "p4", **kw)), partitions=4, spark=spark,
                      conf={"smerge.partition.min_records": "1000"})
    assert s["matched"] >= 0.99 * local["matched"]
    assert all(d > 0.9 for side in ("a", "b") for d in s["arrival_density"][side])
    assert all(n >= 1800 for n, _, _ in s["partition_windows"])


def test_one_partition_has_no_windows_or_estimate(spark, tmp_path, stations):
    a, b = stations
    s = run_cgm_spark(prepare(job(tmp_path, a, b, "one")), partitions=1, spark=spark)
    assert s["partitions"] == 1 and "partition_windows" not in s and "pairs_expected" not in s


def test_bad_window_mode_is_exit_2(tmp_path, stations, spark_cli):
    """A bad smerge.partition.windows is one line, exit 2, and no output (the CLI in this process,
    on the shared session)."""
    a, b = stations
    out = tmp_path / "x.parquet"
    rc, _, err = spark_cli("cgm", a, b, "--keys", "lat,lon", "--eps", "0.01", "--master", "local[1]",
                           "--partitions", "2", "--conf", "smerge.partition.windows=wide",
                           "--conf", "smerge.partition.min_records=1000", "-o", str(out))
    assert rc == 2, err
    assert "smerge.partition.windows" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_summary_says_when_pairs_are_below_expected(tmp_path, stations, spark_cli):
    """(The CLI in this process, on the shared session.)"""
    a, b = stations
    rc, out, err = spark_cli("cgm", a, b, "--keys", "lat,lon", "--eps", "0.01", "--master", "local[1]",
                             "--partitions", "3", "--conf", "smerge.partition.min_records=1000", "--overwrite",
                             "-o", str(tmp_path / "f.parquet"), "--conf", "smerge.partition.windows=fixed",
                             "--stats", str(tmp_path / "f.json"))
    assert rc == 0, err
    stats = json.loads((tmp_path / "f.json").read_text())
    assert stats["execution"] == "spark" and spark_cli.masters == ["local[1]"]
    assert stats["pairs_check"].startswith("below 99%")
    assert "expected" in out and f"{stats['pairs_expected']:,}" in out and "below 99%" in out


# ---------------------------------------------------------------------------------------------
# The rule's parts, without Spark


def test_arrival_density_sorted_vs_interleaved():
    k_sorted = np.linspace(0, 100, 40_000)
    rng = np.random.default_rng(0)
    k_mixed = rng.uniform(0, 100, 40_000)
    bounds = (25.0, 50.0, 75.0)
    seg = lambda k: [(10.0, k[::10])]  # noqa: E731 - one sample value per 10 records
    d_sorted = pwin.arrival_density(seg(k_sorted), bounds, 1000)
    d_mixed = pwin.arrival_density(seg(k_mixed), bounds, 1000)
    assert np.all(d_sorted > 0.9)
    assert np.all(np.abs(d_mixed - 0.25) < 0.03)
    # time-major blocks of 4,000 records sorted by k1 inside each block: windows of 1,000 see
    # contiguous runs (density ~1); windows of 20,000 see all partitions (~1/4)
    k_blocks = np.concatenate([np.sort(rng.uniform(0, 100, 4000)) for _ in range(10)])
    assert np.all(pwin.arrival_density(seg(k_blocks), bounds, 200) > 0.8)
    assert np.all(pwin.arrival_density(seg(k_blocks), bounds, 20_000) < 0.35)


def test_partition_windows_rule():
    params = CGMParams(keys=MergeKeys(("k",), ("k",)), eps=(0.0,), window_size=5000, least_increment_a=1000,
                       least_increment_b=800)
    w = pwin.partition_windows(params, np.array([0.25, 1.0, 0.0001]), np.array([0.5, 1.0, 0.0001]))
    # N_p = min(N, 1.1 N max(dA, dB)), K_p = 0.97 K d (a contiguous partition, N_p = N: K d)
    assert w == ((2750, 242, 388), (5000, 1000, 800), (1, 1, 1))
    assert pwin.partition_windows(params, np.array([0.95]), np.array([0.9])) == ((5000, 950, 720),)
    assert pwin.task_params(params, w, 0).window_size == 2750
    assert pwin.task_params(params, w, 1) is params
    assert pwin.task_params(params, None, 0) is params


def test_regroup_windows_to_n():
    counts = [(1, 2), (2, 2), (0, 2), (3, 3), (1, 1)]
    groups, ks = pwin.regroup_windows(counts, ["k0", "k1", "k2", "k3", "k4"], 4)
    assert groups == [[3, 4], [4, 6]] and ks == ["k0", "k2"]
    assert sum(g[0] for g in groups) == 7 and sum(g[1] for g in groups) == 10
    assert pwin.regroup_windows([(1, 3)], [], 4) == ([[1, 3]], [])


def test_estimate_whole_and_stretches(tmp_path, monkeypatch, stations):
    """Whole inputs: exactly --local's pairs. Stretches (forced small here): within 25% with these
    tiny windows (N = 50: a stretch starts A and B aligned, while --local's windows drift apart
    over the whole run; docs/spark.md says the stretch estimate is a rough one)."""
    a, b = stations
    j = job(tmp_path, a, b, "local", window_size=50, least_increment_a=10, least_increment_b=10)
    prep = prepare(j)
    local = run_local(prep)
    prep = prepare(job(tmp_path, a, b, "x", window_size=50, least_increment_a=10, least_increment_b=10))
    specs = {}
    for side, src in (("a", prep.src_a), ("b", prep.src_b)):
        specs[side] = SideSpec(path=src.path, keys=tuple(src.keys), variables=None, batch_rows=4096,
                               schema=src.schema, step=4096, inner=1, outer=src.outer_size)
    n_a, n_b = prep.src_a.num_rows, prep.src_b.num_rows
    whole = pwin.estimate_local_pairs(specs["a"], specs["b"], prep.params, n_a, n_b)
    assert whole["pairs_expected"] == local["matched"]
    monkeypatch.setattr(pwin, "ESTIMATE_MIN_STRETCH", 2000)
    part = pwin.estimate_local_pairs(specs["a"], specs["b"], prep.params, n_a, n_b)
    assert "4 stretches" in part["pairs_expected_from"] and part["estimate_records"] < 0.7 * (n_a + n_b)
    assert abs(part["pairs_expected"] - local["matched"]) <= 0.25 * local["matched"]
    assert pwin.check(990, {"pairs_expected": 1000})["pairs_check"] == "ok"
    assert pwin.check(989, {"pairs_expected": 1000})["pairs_check"].startswith("below 99%")
    assert pwin.check(5, None, "why")["pairs_check"] == "not estimated: why"
