"""Sampled archive reads (docs/semantics.md section 8): ``--sample auto --budget`` (the r-UDF feedback)
against a simulated clock, the calibration of the 95% intervals by simulation (fixed seeds),
and the uniformity of the sample (chi-square tests that can fail, a per-record inclusion test,
f = 1 gives every record exactly once)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smerge.cli.sampling import estimate, estimate_runs, estimate_spread
from smerge.datasets import open_input
from smerge.datasets.archive.append import AppendParams, append
from smerge.datasets.archive.manifest import read_manifest
from smerge.datasets.archive.read import Budget, auto_batches, run_sample, sample_batches

# chi-square 99% quantiles (df -> value), so no scipy is needed
CHI2_99 = {4: 13.277, 19: 36.191}


def make_archive(tmp_path, n=40_000, run_blocks=8, block_rows=250, seed=3, name="a"):
    """n records, time t = 0, 1, ..., an id, an unevenly filled category; appended in one go."""
    rng = np.random.default_rng(seed)
    table = pa.table({"t": np.arange(n, dtype=np.int64), "id": np.arange(n, dtype=np.int64),
                      "cat": rng.choice(5, n, p=[0.4, 0.3, 0.15, 0.1, 0.05])})
    src_path = tmp_path / f"{name}.parquet"
    pq.write_table(table, src_path)
    src = open_input(str(src_path))
    arch = tmp_path / name
    append(str(arch), str(src_path), src.batches(), src.schema,
           AppendParams(time="t", run_blocks=run_blocks, block_rows=block_rows, seed=seed))
    return str(arch), table


class BlockClock:
    """A simulated clock: ``per_block`` seconds per block read (``counters["blocks_read"]``), times
    ``slow`` once ``slow_after`` blocks were read (a machine that gets loaded halfway)."""

    def __init__(self, counters, per_block, slow=1.0, slow_after=None):
        self.counters, self.per_block, self.slow, self.slow_after = counters, per_block, slow, slow_after

    def __call__(self):
        n = self.counters.get("blocks_read", 0)
        if self.slow_after is None or n <= self.slow_after:
            return n * self.per_block
        return (self.slow_after + (n - self.slow_after) * self.slow) * self.per_block


def read_auto(man, budget_seconds, seed=0, **clock_kw):
    counters: dict = {}
    clock = BlockClock(counters, **clock_kw)
    batches = list(auto_batches(man, Budget(budget_seconds, start=0.0), seed, counters=counters, clock=clock))
    return pa.Table.from_batches(batches, schema=man.schema) if batches else None, counters, clock()


# --------------------------------------------------------------------------------------------
# --sample auto --budget: the feedback


@pytest.mark.parametrize("slow", [1.0, 2.0])
def test_auto_finishes_within_the_budget_on_a_read_that_takes_4_budgets(tmp_path, slow):
    arch, _ = make_archive(tmp_path, run_blocks=16, block_rows=125)  # the least read, a block per run, is B / 4
    man = read_manifest(arch)
    blocks = sum(len(r["blocks"]) for r in man.runs)
    assert len(man.runs) >= 15
    per_block = 0.01
    full = blocks * per_block
    # slow = 2: the read gets twice as slow halfway (load arriving): after an eighth of the blocks
    got, counters, end = read_auto(man, full / 4, per_block=per_block, slow=slow, slow_after=blocks // 8)
    assert end <= 1.2 * full / 4, (end, full)
    assert end >= 0.6 * full / 4, (end, full)  # and it used the budget, not a token read
    fr = counters["run_fractions"]
    assert len(fr) == len(man.runs) and all(0 < f <= 1 for f in fr)
    expected = sum(f * r["count"] for f, r in zip(fr, man.runs)) / man.count
    assert counters["sample_fraction"] == pytest.approx(expected)
    assert 0.1 < expected < 0.3
    assert counters["run_records"] == [int(np.sum(np.isin(got.column("id").to_numpy(), r_ids)))
                                       for r_ids in run_ids(man)]


def run_ids(man):
    return [np.concatenate([run_sample(man, i, 1.0, 0, ["id"], {}).column("id").to_numpy()]) for i in range(len(man.runs))]


def test_auto_with_a_budget_to_spare_reads_every_record_once(tmp_path):
    arch, table = make_archive(tmp_path, n=5_000)
    man = read_manifest(arch)
    got, counters, end = read_auto(man, 1e6, per_block=0.01)
    assert set(counters["run_fractions"]) == {1.0} and counters["sample_fraction"] == 1.0
    assert sorted(got.column("id").to_pylist()) == list(range(5_000))  # each record exactly once
    assert got.column("t").to_pylist() == sorted(got.column("t").to_pylist())  # one sorted source: time order


def test_auto_pilot_of_a_one_run_archive(tmp_path):
    """One run: the pilot reads blocks one by one until one more would pass its share of the budget."""
    arch, _ = make_archive(tmp_path, n=3_000, run_blocks=16, block_rows=1_000)
    man = read_manifest(arch)
    assert len(man.runs) == 1
    _, c_big, _ = read_auto(man, 1e6, per_block=0.01)
    assert c_big["run_fractions"] == [1.0]
    _, c_small, end = read_auto(man, 0.08, per_block=0.01)  # 16 blocks take 0.16 s
    k = round(c_small["run_fractions"][0] * 16)
    assert c_small["blocks_read"] == k and 1 <= k <= 4 and end <= 0.08


def test_auto_run_samples_are_uniform_block_subsets(tmp_path, cached_blocks):
    """Given k, each run's sample is k whole blocks, and over seeds every block is as likely."""
    arch, _ = make_archive(tmp_path, n=4_000, run_blocks=8, block_rows=100)
    man = read_manifest(arch)
    block_ids = [[set(run_sample_block(man, i, b)) for b in range(len(r["blocks"]))] for i, r in enumerate(man.runs)]
    hits = np.zeros(len(man.runs[0]["blocks"]))
    for seed in range(200):
        got, counters, _ = read_auto(man, 0.5 * sum(len(r["blocks"]) for r in man.runs) * 0.01 / 2, seed=seed,
                                     per_block=0.01)
        ids = set(got.column("id").to_pylist())
        for i, (f, blocks) in enumerate(zip(counters["run_fractions"], block_ids)):
            chosen = [b for b, s in enumerate(blocks) if s <= ids]
            assert [b for b, s in enumerate(blocks) if s & ids] == chosen  # whole blocks only
            assert len(chosen) == round(f * len(blocks))
            if i == 0:
                hits[chosen] += 1
    exp = hits.sum() / len(hits)
    assert float(((hits - exp) ** 2 / exp).sum()) < 18.475  # chi-square 99%, 7 df


def run_sample_block(man, run_index, block_index):
    from smerge.datasets.archive.manifest import read_block

    return read_block(man, man.runs[run_index]["blocks"][block_index], ["id"]).column("id").to_pylist()


def test_auto_is_reproducible_for_a_seed_and_clock(tmp_path):
    arch, _ = make_archive(tmp_path, n=10_000)
    man = read_manifest(arch)
    blocks = sum(len(r["blocks"]) for r in man.runs)
    a = read_auto(man, blocks * 0.01 / 3, seed=4, per_block=0.01)
    b = read_auto(man, blocks * 0.01 / 3, seed=4, per_block=0.01)
    c = read_auto(man, blocks * 0.01 / 3, seed=5, per_block=0.01)
    assert a[0].equals(b[0]) and a[1]["run_fractions"] == b[1]["run_fractions"] and not a[0].equals(c[0])


# --------------------------------------------------------------------------------------------
# Calibration of the 95% intervals, by simulation (200 seeded samples each)


@pytest.fixture
def cached_blocks(monkeypatch):
    """Each block parsed once (the calibration reads an archive hundreds of times; what is tested
    is which blocks and records the reader chooses, not the I/O)."""
    import smerge.datasets.archive.read as ar

    cache, real = {}, ar.read_block

    def read_block(man, block, columns=None):
        key = (man.directory, block["file"], block.get("offset"), tuple(columns or ()))
        if key not in cache:
            cache[key] = real(man, block, columns)
        return cache[key]

    monkeypatch.setattr(ar, "read_block", read_block)


def _coverage(intervals, truth):
    return sum(lo <= truth <= hi for lo, hi in intervals) / len(intervals)


def test_interval_calibration_fixed_fraction(tmp_path, cached_blocks):
    """``matched_estimate`` = matched / f with the binomial interval. Stand-in for the matched
    pairs: the records with t % 6 == 0 (what cgm matches in tests/cli/test_archive_sampling_cli.py,
    which checks cgm's matched equals this count on the same samples). Over 200 seeds of one
    archive the interval covers the full count in about 95% of them."""
    arch, table = make_archive(tmp_path)
    man = read_manifest(arch)
    truth = int(np.sum(table.column("t").to_numpy() % 6 == 0))
    for f in (0.25, 0.5):
        ivs, recs = [], []
        for seed in range(200):
            got = pa.Table.from_batches(list(sample_batches(man, f, seed, columns=["t"])), schema=pa.schema([("t", pa.int64())]))
            m = int(np.sum(got.column("t").to_numpy() % 6 == 0))
            ivs.append(estimate(m, f)[1])
            recs.append(estimate(got.num_rows, f)[1])
        cov = _coverage(ivs, truth)
        assert 0.90 <= cov <= 0.99, (f, cov)
        # the records count (a_records_estimate): measured 0.91 at f = 0.25 and 0.5
        assert 0.85 <= _coverage(recs, man.count), (f, _coverage(recs, man.count))


def test_interval_calibration_auto(tmp_path, cached_blocks):
    """With --sample auto the runs have different fractions: Horvitz-Thompson over runs
    (``estimate_runs``, per-run counts known) and over the records' spread (``estimate_spread``,
    only the total known: matched_estimate, tuples_estimate). 200 seeds, simulated clock;
    coverage about 95%."""
    arch, table = make_archive(tmp_path)
    man = read_manifest(arch)
    truth = int(np.sum(table.column("cat").to_numpy() == 1))
    blocks = sum(len(r["blocks"]) for r in man.runs)
    run_of = {}
    for i in range(len(man.runs)):
        for x in run_sample(man, i, 1.0, 0, ["id"], {}).column("id").to_pylist():
            run_of[x] = i
    ivs, spread, fr_seen = [], [], set()
    cat = table.column("cat").to_numpy()
    for seed in range(200):
        got, counters, _ = read_auto(man, blocks * 0.01 / 3, seed=seed, per_block=0.01, slow=2.0,
                                     slow_after=blocks // 5)
        fr = counters["run_fractions"]
        fr_seen.update(fr)
        per_run = np.zeros(len(man.runs), np.int64)
        for x in got.column("id").to_numpy()[cat[got.column("id").to_numpy()] == 1]:
            per_run[run_of[int(x)]] += 1
        ivs.append(estimate_runs(per_run.tolist(), fr)[1])
        # matched_estimate / tuples_estimate under auto: only the total count is known
        spread.append(estimate_spread(int(per_run.sum()), counters)[1])
    assert len(fr_seen) > 1  # the fraction did vary over runs
    cov = _coverage(ivs, truth)
    assert 0.90 <= cov <= 0.99, cov
    cov = _coverage(spread, truth)
    assert 0.90 <= cov <= 0.99, cov


# --------------------------------------------------------------------------------------------
# Uniformity


def test_uniform_over_time_buckets_and_a_category(tmp_path, cached_blocks):
    """Chi-square over 20 time buckets and over the 5 categories, 10 seeds x 3 fractions: the
    test at 1% rejects at most 2 of the 60 (each rejects with probability 1% under uniformity)."""
    arch, table = make_archive(tmp_path)
    man = read_manifest(arch)
    n = man.count
    t, cat = table.column("t").to_numpy(), table.column("cat").to_numpy()
    edges = np.quantile(t, np.linspace(0, 1, 21)[1:-1])
    full_t, full_c = np.bincount(np.searchsorted(edges, t, "right"), minlength=20), np.bincount(cat, minlength=5)
    rejected = tests = 0
    for f in (0.1, 0.25, 0.5):
        for seed in range(10):
            got = pa.Table.from_batches(list(sample_batches(man, f, seed, columns=["t", "cat"])))
            st = np.bincount(np.searchsorted(edges, got.column("t").to_numpy(), "right"), minlength=20)
            sc = np.bincount(got.column("cat").to_numpy(), minlength=5)
            for obs, full, df in ((st, full_t, 19), (sc, full_c, 4)):
                exp = full * (obs.sum() / n)
                rejected += float(((obs - exp) ** 2 / exp).sum()) >= CHI2_99[df]
                tests += 1
    assert tests == 60 and rejected <= 2, rejected


def test_each_record_is_in_the_sample_with_probability_f(tmp_path, cached_blocks):
    """Per block, over 300 seeds: how often its records were read is Binomial(300, f) (a block's
    records are read together at f = k/R: keep is 1), tested by chi-square at 1% over the
    archive's blocks. A reader that always reads the same blocks fails the same test (checked
    below), so the test can fail."""
    from smerge.datasets.archive.manifest import read_block

    arch, _ = make_archive(tmp_path, n=8_000, run_blocks=8, block_rows=250)
    man = read_manifest(arch)
    blocks = [(i, b) for i, r in enumerate(man.runs) for b in range(len(r["blocks"]))]
    ids = [read_block(man, man.runs[i]["blocks"][b], ["id"]).column("id").to_numpy() for i, b in blocks]
    df = len(blocks)
    chi2_99 = df + 2.326 * np.sqrt(2 * df)  # normal approximation of the 99% quantile

    def statistic(sampler, f, seeds):
        hits = np.zeros(man.count, np.int64)
        for seed in range(seeds):
            hits[sampler(f, seed)] += 1
        per_block = [hits[x] for x in ids]
        assert all(np.all(h == h[0]) for h in per_block)  # whole blocks
        h = np.array([h[0] for h in per_block], float)
        return float(((h - seeds * f) ** 2 / (seeds * f * (1 - f))).sum())

    def reader(f, seed):
        return np.concatenate([b.column("id").to_numpy() for b in sample_batches(man, f, seed, columns=["id"])])

    def fixed_blocks(f, seed):  # a biased reader: always the first ceil(R f) blocks of each run
        return np.concatenate([x for (i, b), x in zip(blocks, ids)
                               if b < max(1, int(np.ceil(len(man.runs[i]["blocks"]) * f)))])

    for f in (0.25, 0.5):
        assert statistic(reader, f, 300) < chi2_99, f
        assert statistic(fixed_blocks, f, 300) > chi2_99, f


def test_fraction_one_returns_every_record_exactly_once(tmp_path):
    arch, _ = make_archive(tmp_path, n=12_345, run_blocks=7, block_rows=300)
    for sample in (1.0, None):
        src = open_input(arch, sample=sample)
        ids = np.concatenate([b.column("id").to_numpy() for b in src.batches()])
        assert len(ids) == 12_345 and np.array_equal(np.sort(ids), np.arange(12_345))


# --------------------------------------------------------------------------------------------
# Eager archives (copies at fixed reduction levels)


def make_eager(tmp_path, n=20_000):
    table = pa.table({"t": np.arange(n, dtype=np.int64), "id": np.arange(n, dtype=np.int64)})
    pq.write_table(table, tmp_path / "e.parquet")
    src = open_input(str(tmp_path / "e.parquet"))
    arch = str(tmp_path / "eager")
    append(arch, str(tmp_path / "e.parquet"), src.batches(), src.schema,
           AppendParams(time="t", run_blocks=8, block_rows=250, seed=2, copies=(0.2, 0.4, 0.6, 0.8)))
    return read_manifest(arch)


def test_eager_fixed_fraction_reads_the_smallest_copy_keeping_f(tmp_path):
    man = make_eager(tmp_path)
    full_bytes = sum(b["bytes"] for r in man.runs for b in r["blocks"])
    for f, copy in ((0.15, 0.2), (0.5, 0.6), (1.0, 1.0)):
        counters: dict = {}
        ids = np.concatenate([b.column("id").to_numpy() for b in sample_batches(man, f, 1, counters=counters)])
        assert len(set(ids.tolist())) == len(ids)  # no record twice
        assert abs(len(ids) / man.count - f) < 4 * np.sqrt(f * (1 - f) / man.count) + 1e-9, (f, len(ids))
        assert counters["bytes_read"] <= 1.1 * copy * full_bytes + 2_000 * len(man.runs)  # the copy's I/O, not the primary's


def test_eager_auto_picks_copies_within_the_budget(tmp_path):
    man = make_eager(tmp_path)
    full = sum(len(r["blocks"]) for r in man.runs) * 0.01  # the primary copy read whole
    got, counters, end = read_auto(man, full / 4, per_block=0.01)
    assert {round(f, 9) for f in counters["run_fractions"]} <= {0.2, 0.4, 0.6, 0.8, 1.0}
    assert counters["run_fractions"][0] == pytest.approx(0.2)  # the pilot: the smallest copy
    _, more, end_more = read_auto(man, full * 0.7, per_block=0.01)
    assert max(more["run_fractions"]) >= 0.6 and end_more <= 1.2 * full * 0.7  # more time: larger copies
    assert end <= 1.2 * full / 4, (end, full)
    assert counters["run_records"] == [int(np.sum((got.column("t").to_numpy() >= r_lo) & (got.column("t").to_numpy() <= r_hi)))
                                       for r_lo, r_hi in ((r["t_min"], r["t_max"]) for r in man.runs)]
