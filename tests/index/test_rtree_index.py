"""R-tree index over B (docs/semantics.md section 5): range and symdiff equal a brute-force numpy filter,
sorted by (key, row id), with paging; persistence; NaN keys; tokens."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from smerge.errors import InputError, KeyNaNError, OutputError, UsageError
from smerge.index import BIndex, build_index
from smerge.merge.range_source import Box
from smerge.datasets import open_input


def brute(k: np.ndarray, boxes, op: str) -> list[int]:
    def inside(b):
        return ((k >= np.asarray(b.lo)) & (k <= np.asarray(b.hi))).all(axis=1)
    sel = inside(boxes[0]) if op == "range" else inside(boxes[0]) ^ inside(boxes[1])
    rows = np.nonzero(sel)[0].tolist()
    return sorted(rows, key=lambda r: (tuple(k[r]), r))


def all_pages(idx: BIndex, op: str, boxes, limit: int) -> list[int]:
    out, token, pages = [], None, 0
    while True:
        page = idx.range_query(boxes[0], limit=limit, token=token) if op == "range" else \
            idx.symdiff_query(boxes[0], boxes[1], limit=limit, token=token)
        assert page.rows.size <= limit
        out += page.rows.tolist()
        pages += 1
        token = page.next_token
        if token is None:
            return out
        assert page.rows.size == limit  # only full pages have a successor
        assert pages < 10_000


coord = st.integers(-2, 12).map(float)


@st.composite
def box(draw, d):
    lo = [draw(coord) for _ in range(d)]
    kind = draw(st.sampled_from(["normal", "degenerate", "empty", "unbounded"]))
    if kind == "degenerate":
        hi = list(lo)
    elif kind == "empty":
        hi = [x - 1 for x in lo]
    else:
        hi = [x + draw(st.integers(0, 8)) for x in lo]
    if kind == "unbounded":
        lo[0], hi[-1] = float("-inf"), float("inf")
    return Box.from_arrays(lo, hi)


@st.composite
def case(draw):
    d = draw(st.integers(1, 3))
    n = draw(st.integers(0, 120))
    k = np.array(draw(st.lists(st.lists(st.integers(0, 10).map(float), min_size=d, max_size=d),
                               min_size=n, max_size=n)), float).reshape(n, d)
    b1 = draw(box(d))
    rel = draw(st.sampled_from(["any", "nested", "touching", "same", "disjoint"]))
    if rel == "nested" and not b1.empty:
        b2 = Box.from_arrays([l + (h - l) / 4 if np.isfinite(h - l) else l for l, h in zip(b1.lo, b1.hi)], b1.hi)
    elif rel == "touching" and all(np.isfinite(b1.hi)):
        b2 = Box.from_arrays(b1.hi, [h + 3 for h in b1.hi])
    elif rel == "same":
        b2 = b1
    elif rel == "disjoint" and all(np.isfinite(b1.hi)):
        b2 = Box.from_arrays([h + 1 for h in b1.hi], [h + 4 for h in b1.hi])
    else:
        b2 = draw(box(d))
    return k, b1, b2, draw(st.integers(1, 50))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case())
def test_range_and_symdiff_equal_brute_force_with_paging(c):
    k, b1, b2, limit = c
    names = [f"k{j}" for j in range(k.shape[1])]
    idx = BIndex.build(pa.table({nm: k[:, j] for j, nm in enumerate(names)}), names)
    for scan_max_rows in (1 << 20, 0, 7):  # the sort-order scan, the R-tree, and a mix by run length
        idx.scan_max_rows = scan_max_rows
        assert all_pages(idx, "range", [b1], limit) == brute(k, [b1], "range")
        assert all_pages(idx, "symdiff", [b1, b2], limit) == brute(k, [b1, b2], "symdiff")


def test_four_dimensions_and_duplicates_sorted_by_row():
    rng = np.random.default_rng(0)
    k = rng.integers(0, 3, (400, 4)).astype(float)
    names = list("abcd")
    idx = BIndex.build(pa.table({nm: k[:, j] for j, nm in enumerate(names)}), names, tree="background")
    b1, b2 = Box.from_arrays([0, 1, 0, 0], [2, 2, 1, 2]), Box.from_arrays([1, 0, 0, 1], [2, 2, 2, 1])
    for scan_max_rows in (1 << 20, 0):
        idx.scan_max_rows = scan_max_rows
        assert all_pages(idx, "range", [b1], 17) == brute(k, [b1], "range")
        assert all_pages(idx, "symdiff", [b1, b2], 17) == brute(k, [b1, b2], "symdiff")
    info = idx.info()
    assert info["count"] == 400 and info["keys"] == names
    assert info["bounds"] == {"lo": [0.0] * 4, "hi": [2.0] * 4}


def test_take_returns_columns_and_row_ids():
    t = pa.table({"k": [3.0, 1.0, 2.0], "v": ["c", "a", "b"]})
    idx = BIndex.build(t, ["k"])
    page = idx.range_query(Box((0.0,), (9.0,)), limit=10)
    got = idx.take(page.rows)
    assert got.column("v").to_pylist() == ["a", "b", "c"]
    assert got.column("__smerge_row").to_pylist() == [1, 2, 0]


def test_token_belongs_to_its_query():
    idx = BIndex.build(pa.table({"k": np.arange(10.0)}), ["k"])
    page = idx.range_query(Box((0.0,), (9.0,)), limit=3)
    with pytest.raises(UsageError, match="does not belong"):
        idx.range_query(Box((0.0,), (8.0,)), limit=3, token=page.next_token)
    with pytest.raises(UsageError, match="does not belong"):
        idx.range_query(Box((0.0,), (9.0,)), limit=3, token="garbage")
    with pytest.raises(UsageError, match="bounds per side"):
        idx.range_query(Box((0.0, 1.0), (9.0, 2.0)), limit=3)
    with pytest.raises(UsageError, match="limit"):
        idx.range_query(Box((0.0,), (9.0,)), limit=0)


def test_nan_keys():
    t = pa.table({"k": [1.0, None, 3.0]})
    with pytest.raises(KeyNaNError, match="row 1"):
        BIndex.build(t, ["k"])
    idx = BIndex.build(t, ["k"], nan_keys="unmatched")
    assert idx.info()["nan_keys"] == 1 and idx.info()["indexed"] == 2
    assert idx.range_query(Box((-1e300,), (1e300,)), limit=10).rows.tolist() == [0, 2]


def test_persisted_index_answers_identically_and_resumes_tokens(tmp_path):
    import pyarrow.parquet as pq

    rng = np.random.default_rng(5)
    k = rng.integers(0, 20, (3000, 3)).astype(float)
    t = pa.table({"t": k[:, 0], "y": k[:, 1], "x": k[:, 2], "v": rng.random(3000)})
    pq.write_table(t, tmp_path / "b.parquet")
    src = open_input(str(tmp_path / "b.parquet"), keys=["t", "y", "x"])
    built = build_index(src, str(tmp_path / "idx"))
    mem = BIndex.build(t, ["t", "y", "x"])
    b = Box.from_arrays([2, 0, 5], [9, 15, 12])
    p1 = built.range_query(b, limit=100)
    loaded = BIndex.load(str(tmp_path / "idx"))
    assert loaded.name == "b" and loaded.info() == built.info()
    p2 = loaded.range_query(b, limit=100, token=p1.next_token)  # token from before the "restart"
    assert p1.rows.tolist() + p2.rows.tolist() == brute(k, [b], "range")[:200]
    assert all_pages(loaded, "range", [b], 77) == all_pages(mem, "range", [b], 77)
    assert loaded.take(p2.rows).equals(mem.take(p2.rows))
    with pytest.raises(OutputError, match="already exists"):
        build_index(src, str(tmp_path / "idx"))
    with pytest.raises(InputError, match="not an smerge index"):
        BIndex.load(str(tmp_path))


def test_tree_modes_and_tokens_shared_by_both_access_paths():
    rng = np.random.default_rng(3)
    k = rng.integers(0, 30, (5000, 2)).astype(float)
    t = pa.table({"y": k[:, 0], "x": k[:, 1]})
    b = Box.from_arrays([3, 4], [20, 9])
    expect = brute(k, [b], "range")
    for mode in ("lazy", "background", "eager"):
        idx = BIndex.build(t, ["y", "x"], tree=mode)
        assert (idx.tree is not None) == (mode == "eager") or mode == "background"
        idx.scan_max_rows = 0
        first = idx.range_query(b, limit=100)
        assert idx.tree is not None  # the R-tree answered, so it exists now
        idx.scan_max_rows = 1 << 20  # the rest through the scan, resuming the R-tree's token
        rest, token = [], first.next_token
        while token is not None:
            page = idx.range_query(b, limit=333, token=token)
            rest += page.rows.tolist()
            token = page.next_token
        assert first.rows.tolist() + rest == expect
        idx.close()
    with pytest.raises(UsageError, match="tree is"):
        BIndex.build(t, ["y", "x"], tree="later")


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.integers(0, 300), st.integers(0, 300), st.integers(0, 2**31))
def test_sort_order_adaptive_and_lexsort_agree(d, n, swaps, seed):
    """B's rank order is the stable lexicographic order whichever sort path is taken."""
    from smerge.index.tree import sort_order

    rng = np.random.default_rng(seed)
    k = np.sort(rng.integers(0, 6, (n, d)).astype(float), axis=0)
    k = k[np.lexsort(tuple(k[:, j] for j in range(d - 1, -1, -1)))]
    for _ in range(swaps if n > 1 else 0):  # displace some records: from sorted to random
        i, j = rng.integers(0, n, 2)
        k[[i, j]] = k[[j, i]]
    expect = np.lexsort(tuple(k[:, j] for j in range(d - 1, -1, -1)))
    assert sort_order(k).tolist() == expect.tolist()
