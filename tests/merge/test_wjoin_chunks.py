"""W-join chunks cut at CHUNK_ARRIVALS (or twice a stream's buffer) and output batches of exactly
``output_rows`` tuples: the same tuples in the same order as uncut chunks, and the oracle's."""

from __future__ import annotations

import os
import sys

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from wjoin_oracle import oracle_tuples

import smerge.merge.wjoin as W
from smerge.merge.wjoin_params import WJoinParams
from smerge.merge.wjoin_stats import WJoinStats

sys.path.insert(0, os.path.dirname(__file__))
from test_wjoin import ids, run_batches, wjoin_case  # noqa: E402 (the random streams of the oracle test)


def batches(tables, params, batch, output_rows, stats=None):
    return run_batches(tables, params, batch, stats=stats, output_rows=output_rows)


def table(out):
    return pa.Table.from_batches(out) if out else None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(wjoin_case())
def test_cut_chunks_give_the_same_tuples_in_the_same_order(case):
    tables, windows, kw, (ours, sql, _), method, batch = case
    n = len(tables)
    p = WJoinParams(n, ("t",), where=ours, with_ids=True, method=method, **kw)
    old = W.CHUNK_ARRIVALS
    W.CHUNK_ARRIVALS = 10**9
    try:
        whole = batches(tables, p, batch, 4)
    finally:
        W.CHUNK_ARRIVALS = old
    W.CHUNK_ARRIVALS = 1
    try:
        stats = WJoinStats()
        cut = batches(tables, p, batch, 4, stats)
    finally:
        W.CHUNK_ARRIVALS = old
    assert ids(table(cut), n) == ids(table(whole), n)
    assert sorted(ids(table(cut), n)) == oracle_tuples(tables, "t", windows, sql)
    # every batch holds output_rows tuples but the last, wherever the chunks were cut
    assert [b.num_rows for b in cut] == [b.num_rows for b in whole]
    assert all(b.num_rows == 4 for b in cut[:-1]) and (not cut or 1 <= cut[-1].num_rows <= 4)
    assert stats.records_read == [t.num_rows for t in tables]


def test_many_equal_times_and_a_long_input_are_cut_and_joined_exactly(monkeypatch):
    """A run of equal times longer than a chunk (a cut there would take nothing: that chunk is not
    cut), one stream far longer than the other; the stats count every chunk."""
    rng = np.random.default_rng(7)
    t1 = np.sort(np.concatenate([np.full(50, 0), rng.integers(0, 4000, 300)]))
    t2 = np.sort(np.concatenate([np.full(40, 0), rng.integers(0, 4000, 30)]))
    a = pa.table({"t": pa.array(t1, pa.int64()), "k": pa.array(rng.integers(0, 3, t1.size))})
    b = pa.table({"t": pa.array(t2, pa.int64()), "k": pa.array(rng.integers(0, 3, t2.size))})
    p = WJoinParams(2, ("t",), window=3, on=("k",), with_ids=True)
    monkeypatch.setattr(W, "CHUNK_ARRIVALS", 10**9)
    whole_stats = WJoinStats()
    whole = batches([a, b], p, 1000, 7, whole_stats)
    monkeypatch.setattr(W, "CHUNK_ARRIVALS", 8)
    stats = WJoinStats()
    cut = batches([a, b], p, 1000, 7, stats)
    assert ids(table(cut), 2) == ids(table(whole), 2)
    assert sorted(ids(table(cut), 2)) == oracle_tuples([a, b], "t", {(0, 1): 3}, "s1.k = s2.k")
    assert stats.chunks > 3 * whole_stats.chunks
    assert [r.num_rows for r in cut] == [7] * (len(cut) - 1) + [cut[-1].num_rows]
    assert stats.tuples == whole_stats.tuples == table(cut).num_rows


@pytest.mark.parametrize("output_rows", [1, 3, 65536])
def test_output_batches_do_not_depend_on_the_input_batches(output_rows):
    rng = np.random.default_rng(3)
    tabs = [pa.table({"t": pa.array(np.sort(rng.integers(0, 500, 400)), pa.int64()),
                      "v": pa.array(rng.normal(size=400))}) for _ in range(2)]
    p = WJoinParams(2, ("t",), window=4, where="S1.v > S2.v")
    sizes = {b: [r.num_rows for r in batches(tabs, p, b, output_rows)] for b in (1, 7, 400)}
    assert sizes[1] == sizes[7] == sizes[400]
    total = sum(sizes[1])
    assert sizes[1] == [output_rows] * (total // output_rows) + ([total % output_rows] if total % output_rows else [])


def test_every_stream_brings_about_a_batch_to_each_chunk():
    """Four streams read in batches of 500: each chunk takes about one batch from every stream
    (not a batch divided among them: the streams at the frontier are not the only ones read),
    and a stream holds its buffer plus less than two batches."""
    rng = np.random.default_rng(5)
    n, rows, batch = 4, 20_000, 500
    tabs = [pa.table({"t": pa.array(np.sort(rng.integers(0, 200_000, rows)), pa.int64()),
                      "k": pa.array(rng.integers(0, 20, rows))}) for _ in range(n)]
    p = WJoinParams(n, ("t",), window=20, on=("k",), with_ids=True)
    stats = WJoinStats()
    out = table(batches(tabs, p, batch, 65536, stats))
    assert stats.chunks <= rows // batch + 2 * n
    assert max(stats.peak_held) < max(stats.peak_buffered) + 2 * batch
    whole = table(batches(tabs, p, rows, 65536))
    assert ids(out, n) == ids(whole, n)


@pytest.mark.parametrize("rows, first", [(5, 1 << 20), (7, 1 << 20), (6, 1)])
def test_output_batch_gathers_pieces_with_and_without_nulls(rows, first):
    """Pieces gathered straight into the batch's buffers, a column that meets NULLs (or strings)
    part-way continuing as Arrow pieces, row ids from numpy: the same batch as gathering each piece
    and concatenating (``first`` below the tuples: the buffers grow)."""
    from smerge.merge.wjoin_chunks import OutputBatch

    schema = pa.schema([("x", pa.float64()), ("t", pa.timestamp("us", "UTC")), ("s", pa.string()), ("id", pa.int64())])
    sink = OutputBatch(schema, rows, first)
    pieces = [(pa.array([1.5, 2.5, 3.5]), pa.array([1, 2, 3], pa.timestamp("us", "UTC")), pa.array(["a", "b", "c"]),
               np.array([0, 2])),
              (pa.array([None, 9.0]), pa.array([7, None], pa.timestamp("us", "UTC")), pa.array(["d", None]),
               np.array([1, 0, 1]))]
    want = []
    for x, t, s, idx in pieces:
        ids = np.arange(10, 10 + len(x), dtype=np.int64)
        for c, col in enumerate((x, t, s, ids)):
            sink.put(c, col, idx)
        sink.advance(idx.shape[0])
        want.append(pa.RecordBatch.from_arrays([x.take(pa.array(idx)), t.take(pa.array(idx)), s.take(pa.array(idx)),
                                                pa.array(ids[idx])], schema=schema))
    got = sink.flush()
    assert sink.n == 0 and got.num_rows == 5
    assert got.equals(pa.Table.from_batches(want).combine_chunks().to_batches()[0])
