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


def _gather_threads() -> list:
    import threading

    return [t for t in threading.enumerate() if t.name == "smerge-gather"]


def test_one_gather_thread_for_the_whole_run():
    """Every flush's gather runs in the same thread (a thread per flush faulted fresh pages in
    for every output batch); it ends with the run."""
    import threading

    ta, tb = _streams(3000, seed=5)
    p = dataclasses.replace(CGMParams(keys=MergeKeys(("k",), ("k",)), eps=(0.05,), window_size=32,
                                      least_increment_a=4, least_increment_b=4, with_ids=True), out_batch_rows=40)
    before = set(_gather_threads())
    seen = set()
    orig = cgm.pair_batch

    def spy(*a, **k):
        seen.add(threading.current_thread())
        return orig(*a, **k)

    cgm.pair_batch = spy
    try:
        it = cgm_merge(ta.to_batches(max_chunksize=100), tb.to_batches(max_chunksize=100), p,
                       schema_a=ta.schema, schema_b=tb.schema)
        out = []
        for b in it:
            out.append(b)
            assert len(set(_gather_threads()) - before) == 1
    finally:
        cgm.pair_batch = orig
    assert len(out) > 20 and len(seen) == 1
    (t,) = seen
    assert t.name == "smerge-gather" and t is not threading.current_thread()
    t.join(timeout=60)
    assert not t.is_alive()


@pytest.mark.parametrize("how", ["closed", "error"])
def test_the_gather_thread_ends_when_the_run_stops_early(monkeypatch, how):
    ta, tb = _streams(3000, seed=6)
    p = dataclasses.replace(CGMParams(keys=MergeKeys(("k",), ("k",)), eps=(0.05,), window_size=32,
                                      least_increment_a=4, least_increment_b=4), out_batch_rows=40)
    before = set(_gather_threads())
    it = cgm_merge(ta.to_batches(max_chunksize=100), tb.to_batches(max_chunksize=100), p,
                   schema_a=ta.schema, schema_b=tb.schema)
    next(it)
    (t,) = set(_gather_threads()) - before
    if how == "closed":
        it.close()  # the consumer stops reading (an error in the writer, Ctrl-C)
    else:
        def broken(*a, **k):
            raise RuntimeError("gather failed")

        monkeypatch.setattr(cgm, "pair_batch", broken)
        with pytest.raises(RuntimeError, match="gather failed"):
            list(it)
    t.join(timeout=60)
    assert not t.is_alive()
