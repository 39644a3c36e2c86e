"""The partition row map (smerge.spark.cgm.rows.Rows) equals the explicit array it replaces."""

import numpy as np

from smerge.spark.cgm.rows import Rows


def test_rows_runs_and_explicit_values_match_an_explicit_array():
    rng = np.random.default_rng(7)
    ids, flags = Rows(), Rows(np.bool_)
    ref_ids: list = []
    ref_flags: list = []
    row = 0
    for _ in range(200):
        n = int(rng.integers(0, 50))
        kind = rng.integers(0, 3)
        if kind == 0:  # a whole batch: consecutive row ids, one flag
            ids.extend_run(row, n)
            ref_ids.extend(range(row, row + n))
            f = bool(rng.integers(0, 2))
            flags.extend_run(int(f), n, 0)
            ref_flags.extend([f] * n)
        else:  # a filtered batch: explicit values
            mask = rng.random(n) < 0.5
            vals = row + np.flatnonzero(mask)
            ids.extend(vals)
            ref_ids.extend(vals.tolist())
            fl = rng.random(vals.size) < 0.5
            flags.extend(fl)
            ref_flags.extend(fl.tolist())
        row += n + int(rng.integers(0, 3))  # gaps between batches (other partitions' records)
        if ref_ids:
            local = rng.integers(0, len(ref_ids), 64)
            assert np.array_equal(ids.take(local), np.asarray(ref_ids, np.int64)[local])
            assert np.array_equal(flags.take(local), np.asarray(ref_flags, np.bool_)[local])
            assert ids.take(local).dtype == np.int64 and flags.take(local).dtype == np.bool_
    assert ids.n == len(ref_ids) and flags.n == len(ref_flags)
    everything = np.arange(len(ref_ids))
    assert np.array_equal(ids.take(everything), np.asarray(ref_ids, np.int64))
    assert ids.take(np.empty(0, np.int64)).size == 0


def test_one_run_is_one_segment():
    r = Rows()
    for start in range(0, 1000, 100):
        r.extend_run(start + 5, 100)
    assert len(r._starts) == 1
    assert np.array_equal(r.take(np.array([0, 999, 500])), np.array([5, 1004, 505]))
