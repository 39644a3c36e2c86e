"""The CGM engine reads pending keys as a key matrix or as the batch's key columns
(``merge.keys.key_columns``, what ``smerge cgm --local``'s readers hand it: no copy into a
matrix): both give the reference's pairs, the same unmatched records and statistics, with NaN
keys, time keys, integer keys and batches of any size."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cgm_reference import cgm_reference
from smerge.errors import KeyNaNError
from smerge.merge import CGMParams, MergeKeys, MergeStats, cgm_merge
from smerge.merge import _kernel
from smerge.merge.keys import KeyedBatch, key_columns, key_matrix, with_keys

KEYS = ("t", "x")


def _run(ta, tb, form, batch, n=6, ka=2, kb=3, eps=(1.0, 0.5), nan_keys="error"):
    p = CGMParams(keys=MergeKeys(KEYS, KEYS), eps=eps, window_size=n, least_increment_a=ka,
                  least_increment_b=kb, with_ids=True, nan_keys=nan_keys)

    def feed(t):
        batches = t.to_batches(max_chunksize=batch)
        if form == "plain":
            return batches
        return list(with_keys(batches, KEYS, columns=form == "columns"))

    stats, un = MergeStats("cgm"), {"a": [], "b": []}
    out = list(cgm_merge(feed(ta), feed(tb), p, schema_a=ta.schema, schema_b=tb.schema, stats=stats,
                         unmatched=lambda s, b: un[s].extend(b.column(f"{s}_row").to_pylist())))
    pairs = [(x, y) for b in out for x, y in zip(b["a_row"].to_pylist(), b["b_row"].to_pylist())]
    return pairs, sorted(un["a"]), sorted(un["b"]), stats


@st.composite
def streams(draw):
    def one(size):
        t = sorted(draw(st.lists(st.integers(0, 40), min_size=size, max_size=size)))
        x = draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, np.nan]), min_size=size, max_size=size))
        for _ in range(draw(st.integers(0, size // 4))):
            i, j = draw(st.integers(0, size - 1)), draw(st.integers(0, size - 1))
            t[i], t[j] = t[j], t[i]
        return t, x
    na, nb = draw(st.integers(1, 60)), draw(st.integers(1, 60))
    return one(na), one(nb), draw(st.integers(1, 9))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams())
def test_matrix_columns_and_plain_batches_agree_with_the_reference(case):
    (ta_t, ta_x), (tb_t, tb_x), batch = case
    ta = pa.table({"t": pa.array(ta_t, pa.int64()), "x": ta_x})  # integer key: converted, not a view
    tb = pa.table({"t": np.asarray(tb_t, np.float64), "x": tb_x})
    got = [_run(ta, tb, form, batch, nan_keys="unmatched") for form in ("matrix", "columns", "plain")]
    for g in got[1:]:
        assert g[:3] == got[0][:3]
        assert (g[3].matched, g[3].a_unmatched, g[3].b_unmatched, g[3].passes, g[3].a_nan_keys, g[3].b_nan_keys) == \
            (got[0][3].matched, got[0][3].a_unmatched, got[0][3].b_unmatched, got[0][3].passes,
             got[0][3].a_nan_keys, got[0][3].b_nan_keys)
    # the reference, on the records without a NaN key (those are unmatched, never in a window)
    ok_a = [i for i, x in enumerate(ta_x) if not np.isnan(x)]
    ok_b = [i for i, x in enumerate(tb_x) if not np.isnan(x)]
    ref_pairs, ref_ua, ref_ub, _ = cgm_reference([(ta_t[i], ta_x[i]) for i in ok_a], [(tb_t[i], tb_x[i]) for i in ok_b],
                                                 6, 2, 3, (1.0, 0.5))
    assert got[0][0] == [(ok_a[x], ok_b[y]) for x, y in ref_pairs]
    nan_a = sorted(set(range(len(ta_x))) - set(ok_a))
    assert got[0][1] == sorted([ok_a[x] for x in ref_ua] + nan_a)


def test_a_nan_key_is_named_from_columns_too():
    ta = pa.table({"t": [1.0, 2.0, 3.0], "x": [0.0, np.nan, 0.0]})
    tb = pa.table({"t": [1.0, 2.0, 3.0], "x": [0.0, 0.0, 0.0]})
    for form in ("matrix", "columns", "plain"):
        with pytest.raises(KeyNaNError) as e:
            _run(ta, tb, form, batch=2)
        assert "'x'" in str(e.value) and "row 1" in str(e.value)


def test_time_keys_as_columns_equal_the_matrix():
    ts = pa.array(np.arange(0, 50, dtype=np.int64) * 1_000_000_000, pa.timestamp("ns"))
    ta = pa.table({"t": ts, "x": np.zeros(50)})
    tb = pa.table({"t": pa.array(np.arange(0, 50, 2, dtype=np.int64) * 1000, pa.timestamp("ms")), "x": np.zeros(25)})
    cols = key_columns(ta.to_batches()[0], KEYS)
    assert np.array_equal(np.column_stack(cols), key_matrix(ta.to_batches()[0], KEYS))
    got = [_run(ta, tb, form, batch=7, eps=(1e6, 0.5)) for form in ("matrix", "columns")]
    assert got[0][:3] == got[1][:3] and len(got[0][0]) == 25


def test_float_key_columns_are_views_of_the_batch():
    b = pa.record_batch({"t": np.arange(10.0), "x": np.ones(10)})
    cols = key_columns(b, KEYS)
    assert all(np.shares_memory(c, np.frombuffer(b.column(j).buffers()[1], np.float64)) for j, c in enumerate(cols))
    assert isinstance(next(with_keys([b], KEYS, columns=True)), KeyedBatch)


def test_pending_keys_addresses_and_steps():
    m = np.arange(12.0).reshape(4, 3)
    addr, step, n, keep = _kernel.pending_keys(m, 3)
    assert (step, n) == (3, 4) and list(addr) == [m.ctypes.data + 8 * c for c in range(3)]
    cols = (np.arange(4.0), np.arange(4.0) + 10, np.arange(4.0) + 20)
    addr, step, n, keep = _kernel.pending_keys(cols, 3)
    assert (step, n) == (1, 4) and list(addr) == [c.ctypes.data for c in cols]
    # columns with different steps (or not float64) are read as a matrix of their values
    mixed = (m[:, 0], np.arange(4.0), np.arange(4, dtype=np.int64))
    addr, step, n, keep = _kernel.pending_keys(mixed, 3)
    assert (step, n) == (3, 4) and np.array_equal(keep, np.column_stack(mixed).astype(np.float64))
    with pytest.raises(ValueError):
        _kernel.pending_keys(cols[:2], 3)
