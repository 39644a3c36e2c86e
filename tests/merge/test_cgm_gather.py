"""CGM's output gathered in a thread while the engine runs on, and its reused pending buffers:
every pair's payload is the payload of its row ids in the inputs, across many flushes, store
compactions and batches left over in part; an error while gathering reaches the caller."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pytest

from smerge.merge import CGMParams, MergeKeys, MergeStats, cgm, cgm_merge


def _streams(n: int, seed: int):
    rng = np.random.default_rng(seed)
    base = np.arange(n, dtype=np.float64) + rng.uniform(-0.1, 0.1, n)
    # partially sorted: 5% of the records moved up to 40 positions; 10% of B has no partner
    def shuffled(x):
        key = np.arange(n, dtype=np.float64)
        moved = rng.choice(n, n // 20, replace=False)
        key[moved] += rng.integers(1, 41, moved.size) + 0.5
        return x[np.argsort(key, kind="stable")]
    b = base + rng.uniform(-0.01, 0.01, n)
    b[rng.random(n) < 0.1] += 0.5
    ta = pa.table({"k": shuffled(base), "va": rng.normal(size=n), "sa": pa.array([f"a{i}" for i in range(n)])})
    tb = pa.table({"k": shuffled(b), "vb": rng.normal(size=n).astype("f4")})
    return ta, tb


@pytest.mark.parametrize("batch, out_rows, window", [(7, 5, 16), (100, 64, 64), (1000, 3, 32)])
def test_every_pair_carries_its_rows_payload(batch, out_rows, window):
    ta, tb = _streams(3000, seed=batch)
    p = CGMParams(keys=MergeKeys(("k",), ("k",)), eps=(0.05,), window_size=window, least_increment_a=4,
                  least_increment_b=4, with_ids=True)
    p = dataclasses.replace(p, out_batch_rows=out_rows)
    stats = MergeStats("cgm")
    out = list(cgm_merge(ta.to_batches(max_chunksize=batch), tb.to_batches(max_chunksize=batch), p,
                         schema_a=ta.schema, schema_b=tb.schema, stats=stats))
    res = pa.Table.from_batches(out)
    assert len(out) > 10  # many flushes, each yielded after the next one started
    assert res.num_rows == stats.matched > 2000
    ra, rb = res["a_row"].to_numpy(), res["b_row"].to_numpy()
    assert res["va"].to_numpy().tolist() == ta["va"].to_numpy()[ra].tolist()
    assert res["sa"].to_pylist() == [ta["sa"][int(i)].as_py() for i in ra]
    assert res["k"].to_numpy().tolist() == ta["k"].to_numpy()[ra].tolist()
    assert res["vb"].to_numpy().tolist() == tb["vb"].to_numpy()[rb].tolist()
    assert res["k_b"].to_numpy().tolist() == tb["k"].to_numpy()[rb].tolist()
    assert np.all(np.abs(res["k"].to_numpy() - res["k_b"].to_numpy()) <= 0.05)


def test_an_error_while_gathering_reaches_the_caller(monkeypatch):
    ta, tb = _streams(500, seed=1)
    p = CGMParams(keys=MergeKeys(("k",), ("k",)), eps=(0.05,), window_size=16, least_increment_a=4,
                  least_increment_b=4)

    def broken(*a, **k):
        raise RuntimeError("gather failed")

    monkeypatch.setattr(cgm, "pair_batch", broken)
    with pytest.raises(RuntimeError, match="gather failed"):
        list(cgm_merge(ta.to_batches(max_chunksize=50), tb.to_batches(max_chunksize=50), p))
