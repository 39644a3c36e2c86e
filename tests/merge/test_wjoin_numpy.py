"""The W-join's numpy paths (merge/wjoin_numpy.py) give what Arrow's kernels give: predicates,
gathers, time columns and equality hashes; where they cannot, they step aside (None) and the
Arrow path runs. A numeric W-join then never calls an Arrow kernel."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from smerge.errors import InputError
from smerge.merge import expr as X
from smerge.merge import wjoin_numpy as N
from smerge.merge.wjoin_hashing import hash_column

SCHEMAS = [pa.schema([("i", pa.int64()), ("f", pa.float64())]), pa.schema([("i", pa.int64()), ("f", pa.float64())])]
INTS = st.one_of(st.integers(-5, 5), st.sampled_from([2**62, -(2**63), 2**63 - 1, 2**31]))
FLOATS = st.one_of(st.floats(-5, 5), st.sampled_from([float("nan"), float("inf"), -float("inf"), -0.0, 1e300]))


def tree(depth: int):
    """Predicates over S1/S2 columns i (int64) and f (float64): comparisons of arithmetic,
    and/or/not, abs and unary minus, integer and float literals."""
    num = st.one_of(st.sampled_from([X.Col(s, c, "num") for s in (0, 1) for c in ("i", "f")]),
                    st.integers(-3, 3).map(lambda v: X.Lit(v, "num")),
                    st.sampled_from([X.Lit(2.5, "num"), X.Lit(-0.0, "num"), X.Lit(2**62, "num")]))
    if depth > 0:
        sub = st.deferred(lambda: tree_num(depth - 1))
        num = st.one_of(num, st.builds(X.Neg, sub), st.builds(X.Abs, sub),
                        st.builds(X.Arith, st.sampled_from("+-*"), sub, sub))
    cmp = st.builds(X.Cmp, st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), num, num)
    if depth == 0:
        return cmp
    sub = st.deferred(lambda: tree(depth - 1))
    return st.one_of(cmp, st.builds(X.Not, sub),
                     st.builds(lambda op, a, b: X.BoolOp(op, (a, b)), st.sampled_from(["and", "or"]), sub, sub))


def tree_num(depth: int):
    leaf = st.one_of(st.sampled_from([X.Col(s, c, "num") for s in (0, 1) for c in ("i", "f")]),
                     st.integers(-3, 3).map(lambda v: X.Lit(v, "num")))
    if depth == 0:
        return leaf
    sub = st.deferred(lambda: tree_num(depth - 1))
    return st.one_of(leaf, st.builds(X.Neg, sub), st.builds(X.Arith, st.sampled_from("+-*"), sub, sub))


def arrays(n):
    return st.tuples(st.lists(INTS, min_size=n, max_size=n), st.lists(FLOATS, min_size=n, max_size=n))


@settings(max_examples=300, deadline=None)
@given(tree(2), st.integers(1, 8).flatmap(lambda n: st.tuples(arrays(n), arrays(n))))
def test_numpy_predicates_equal_arrows(node, cols):
    tabs = [pa.table({"i": pa.array(i, pa.int64()), "f": pa.array(f, pa.float64())}) for i, f in cols]
    n = tabs[0].num_rows
    try:
        arrow = X.mask(node, lambda s, c: tabs[s].column(c), n)
    except pa.ArrowInvalid:  # Arrow refuses int64 beyond 2^53 beside a float64; numpy rounds, as SQL does
        assume(False)
    numpy = N.mask_numpy(node, lambda s, c: N.values(tabs[s].column(c)), n)
    assert numpy is not None
    assert numpy.tolist() == arrow.tolist()


@pytest.mark.parametrize("text", ["S1.f / S2.f > 1", "S1.i > S2.i or S1.s = 'a'", "S1.b", "S1.d > S2.d",
                                  "S1.k > S2.k", "S1.i > 1"])
def test_numpy_steps_aside_for_division_nulls_and_other_types(text):
    sch = pa.schema([("i", pa.int64()), ("f", pa.float64()), ("s", pa.string()), ("b", pa.bool_()),
                     ("d", pa.timestamp("us")), ("k", pa.int32())])
    tab = pa.table({"i": pa.array([1, None], pa.int64()), "f": [1.0, 2.0], "s": ["a", "b"], "b": [True, False],
                    "d": pa.array([1, 2], pa.timestamp("us")), "k": pa.array([1, 2], pa.int32())}, schema=sch)
    node = X.parse_expr(text, ("S1", "S2"), [sch, sch])
    assert N.mask_numpy(node, lambda s, c: N.values(tab.column(c)), 2) is None
    X.mask(node, lambda s, c: tab.column(c), 2)  # the Arrow path takes it


@pytest.mark.parametrize("arr", [
    pa.array([3, -1, 7, 0], pa.int32()), pa.array([1.5, -0.0, float("nan"), 2.0], pa.float32()),
    pa.array([1, 2, 3, 4], pa.timestamp("us", "UTC")), pa.array([1, 2, 3, 4], pa.date32()),
    pa.array([5, 6, 7, 8], pa.duration("ms")), pa.array([1, 2, 3, 4], pa.uint64()),
    pa.chunked_array([pa.array([1.0, 2.0]), pa.array([3.0, 4.0])]),
    pa.array([1, None, 3, 4], pa.int64()), pa.array([True, False, True, None]), pa.array(["a", "b", "c", "d"]),
])
def test_take_equals_arrows(arr):
    idx = np.array([3, 0, 0, 2], np.int64)
    got = N.take(arr, idx)
    want = X.call("take", arr, X.from_numpy(idx))
    want = want.combine_chunks() if isinstance(want, pa.ChunkedArray) else want
    assert isinstance(got, pa.Array) and got.type == arr.type
    assert got.to_string() == want.to_string()  # NaN as NaN (equals() finds NaN unequal)
    assert (N.values(arr) is None) == (arr.null_count > 0 or arr.type in (pa.bool_(), pa.string()))


class _S:
    name, time_col, rows_read = "S1", "t", 0


@pytest.mark.parametrize("typ, kind", [
    (pa.timestamp("s"), "datetime"), (pa.timestamp("ms"), "datetime_us"), (pa.timestamp("us", "UTC"), "datetime"),
    (pa.timestamp("ns"), "datetime"), (pa.timestamp("us"), "datetime_us@us"), (pa.int32(), "int"),
    (pa.int64(), "cf:noleap"), (pa.float32(), "float"), (pa.int16(), "float"),
])
def test_times_equal_arrows_cast(typ, kind):
    col = pa.chunked_array([pa.array([-5, 0, 7, 30_000], typ)])
    got = N.times(col, kind, _S())
    assert N._times_numpy(col, kind, _S()) is not None  # the numpy path answered
    want = N._times_arrow(col, kind, _S())
    assert got.dtype == want.dtype and got.tolist() == want.tolist()


@pytest.mark.parametrize("v", [2**62, -(2**62)])
def test_times_outside_the_nanosecond_range_are_refused_as_by_arrow(v):
    col = pa.array([0, v], pa.timestamp("us"))
    with pytest.raises(InputError, match="outside 1678-2262"):
        N.times(col, "datetime", _S())
    with pytest.raises(InputError, match="outside 1678-2262"):
        N._times_arrow(col, "datetime", _S())


def test_times_nan_is_an_input_error():
    with pytest.raises(InputError, match="NaN at row 1"):
        N.times(pa.array([1.0, float("nan")]), "float", _S())


@pytest.mark.parametrize("arr, kind", [
    (pa.array([1, -3, 2**53, 0], pa.int64()), "num"), (pa.array([1.5, -0.0, 0.0, float("nan")]), "num"),
    (pa.array([7, 8, 9, 10], pa.uint8()), "num"), (pa.array([1, 2, 3, -4], pa.timestamp("ms")), "time"),
    (pa.array([10**9, 0, -1, 5], pa.timestamp("ns", "UTC")), "time"),
])
def test_hashes_equal_the_arrow_paths(arr, kind):
    """Hashed from numpy values, as from Arrow's casts: a numpy-hashed stream still meets an
    Arrow-hashed one (a column with NULLs) on equal values."""
    with_null = pa.concat_arrays([arr, pa.nulls(1, arr.type)])  # takes the Arrow path
    assert N.values(arr) is not None and N.values(with_null) is None
    assert hash_column(arr, kind).tolist() == hash_column(with_null, kind)[:len(arr)].tolist()


def test_a_numeric_wjoin_loads_neither_arrow_kernels_nor_pandas():
    """In a fresh process (as a Spark task or a library caller runs it, without the command line's
    guard against pandas), a W-join of numeric columns without NULLs imports neither Arrow's
    compute kernels (~9 MB, ~10 ms) nor pandas (~50 MB, ~0.5 s: ``Schema.empty_table`` imported it)."""
    import subprocess
    import sys

    code = """
import sys, numpy as np, pyarrow as pa
from smerge.merge import expr as X
from smerge.merge.wjoin import wjoin
from smerge.merge.wjoin_params import WJoinParams
f64 = lambda a: pa.Array.from_buffers(pa.float64(), len(a), [None, pa.py_buffer(np.ascontiguousarray(a, np.float64))])
rng = np.random.default_rng(1)
t = [pa.Table.from_arrays([X.from_numpy(np.arange(300)), X.from_numpy(np.arange(300) % 5), f64(rng.random(300))],
                          names=["t", "k", "v"]) for _ in range(3)]
p = WJoinParams(3, ("t",), window=6, on=("k",), where="S1.v > S2.v + 0.1 and abs(S2.v - S3.v) < 0.5", with_ids=True)
n = sum(b.num_rows for b in wjoin([x.to_batches(max_chunksize=64) for x in t], [x.schema for x in t], p))
assert n > 0, n
print(sorted(m for m in sys.modules if m.startswith(("pandas", "pyarrow._compute", "pyarrow.compute"))))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_string_hashes_are_equal_for_equal_strings_and_spread_otherwise():
    """Equal strings hash equal whatever holds them (string or large_string, a slice, chunks);
    distinct strings (short, empty, permuted, non-ASCII) do not collide on a sample; the values do
    not depend on the process (no per-process seed: a Spark task's split agrees with the driver's)."""
    import subprocess
    import sys

    words = ["", "a", "ab", "ba", "abc", "acb", "é", "e\u0301", "station 1", "station 10", "x" * 300]
    rng = np.random.default_rng(4)
    words += ["".join(rng.choice(list("abcdefgh"), rng.integers(0, 12))) for _ in range(5000)]
    words = list(dict.fromkeys(words))
    h = hash_column(pa.array(words), "str")
    assert len(set(h.tolist())) == len(words)
    big = pa.array(["pad"] + words[::-1], pa.large_string()).slice(1)
    assert hash_column(big, "str").tolist() == h[::-1].tolist()
    chunked = pa.chunked_array([pa.array(words[:7]), pa.array(words[7:])])
    assert hash_column(chunked, "str").tolist() == h.tolist()
    code = ("import pyarrow as pa; from smerge.merge.wjoin_hashing import hash_column; "
            "print(hash_column(pa.array(['a', 'station 10', '']), 'str').tolist())")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert other.strip() == str([int(h[words.index(w)]) for w in ("a", "station 10", "")])


def test_string_equality_keys_join_as_duckdb(tmp_path):
    """A W-join linked by a string column with NULLs and empty strings (hash probes on the
    string hashes) gives DuckDB's tuples; in a fresh process it imports no pandas."""
    import subprocess
    import sys

    import pyarrow.parquet as pq
    from wjoin_oracle import oracle_tuples

    from smerge.merge.wjoin import wjoin
    from smerge.merge.wjoin_params import WJoinParams

    rng = np.random.default_rng(9)
    names = ["st-a", "st-b", "", None, "st-\u00e9", "st-aa"]
    tabs = [pa.table({"t": np.sort(rng.integers(0, 200, 150)), "name": [names[k] for k in rng.integers(0, 6, 150)],
                      "v": rng.normal(size=150)}) for _ in range(3)]
    p = WJoinParams(3, ("t",), window=4, where="S1.name = S2.name and S2.name = S3.name and S1.v > S3.v",
                    with_ids=True)
    got = sorted(tuple(r) for b in wjoin([x.to_batches(max_chunksize=40) for x in tabs], [x.schema for x in tabs], p)
                 for r in zip(*(b.column(f"S{j}_row").to_pylist() for j in (1, 2, 3))))
    want = oracle_tuples(tabs, "t", {(0, 1): 4, (0, 2): 4, (1, 2): 4},
                         "s1.name = s2.name AND s2.name = s3.name AND s1.v > s3.v")
    assert want and got == want
    path = tmp_path / "names.parquet"
    pq.write_table(pa.table({"t": [1, 2, 3], "name": ["a", "b", None]}), path)
    code = f"""
import sys, pyarrow.parquet as pq
from smerge.merge.wjoin import wjoin
from smerge.merge.wjoin_params import WJoinParams
t = pq.ParquetFile({str(path)!r}).read()
p = WJoinParams(2, ("t",), window=1, on=("name",))
assert sum(b.num_rows for b in wjoin([t.to_batches(), t.to_batches()], [t.schema] * 2, p)) == 2
print("pandas" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("how", [dict(on=("id",)), dict(where="S1.id = S2.id")])
@pytest.mark.parametrize("nulls", [False, True])
def test_integer_keys_beyond_two_to_the_53(how, nulls):
    """int64 keys a float64 cannot hold exactly: equal ones pair, ones that round alike do not
    (they hash alike; the equality check tells them apart); a NULL pairs with nothing."""
    from smerge.merge.wjoin import wjoin
    from smerge.merge.wjoin_params import WJoinParams

    big = 2**53
    ids1 = [big + 1, big, None] if nulls else [big + 1, big, -big - 1]
    s1 = pa.table({"t": pa.array([0, 1, 2], pa.int64()), "id": pa.array(ids1, pa.int64())})
    s2 = pa.table({"t": pa.array([0, 1, 2], pa.int64()), "id": pa.array([big + 1, big + 1, big], pa.int64())})
    params = WJoinParams(n_streams=2, time=("t",), window=5, **how)
    out = pa.Table.from_batches(list(wjoin([s1.to_batches(), s2.to_batches()], [s1.schema, s2.schema], params)))
    got = sorted(tuple(r.values()) for r in out.to_pylist())
    assert got == [(0, big + 1, 0, big + 1), (0, big + 1, 1, big + 1), (1, big, 2, big)]


@pytest.mark.parametrize("naive", [False, True])
@pytest.mark.parametrize("op,want", [("=", [(0, 0), (1, 1), (2, 2)]), ("<", [(0, 1), (0, 2), (1, 2)])])
def test_times_of_other_units_and_zones_compare_as_instants(naive, op, want):
    """`S1.ev op S2.ev` with microseconds in UTC (or naive: UTC) against nanoseconds in Tokyo:
    compared as instants (Arrow alone has no kernel when unit and zone both differ)."""
    from smerge.merge.wjoin import wjoin
    from smerge.merge.wjoin_params import WJoinParams

    hours = np.array([0, 1, 2], dtype="datetime64[h]")
    ev1 = pa.array(hours.astype("datetime64[us]"))
    ev1 = ev1 if naive else ev1.cast(pa.timestamp("us", "UTC"))
    ev2 = pa.array(hours.astype("datetime64[ns]")).cast(pa.timestamp("ns", "Asia/Tokyo"))
    t = pa.array([0, 1, 2], pa.int64())
    s1, s2 = pa.table({"t": t, "ev": ev1, "i": [0, 1, 2]}), pa.table({"t": t, "ev": ev2, "j": [0, 1, 2]})
    params = WJoinParams(n_streams=2, time=("t",), window=5, where=f"S1.ev {op} S2.ev")
    out = pa.Table.from_batches(list(wjoin([s1.to_batches(), s2.to_batches()], [s1.schema, s2.schema], params)))
    assert sorted(zip(out.column("S1_i").to_pylist(), out.column("S2_j").to_pylist())) == want


def test_times_beyond_nanoseconds_against_nanoseconds_are_an_input_error():
    from smerge.merge.wjoin import wjoin
    from smerge.merge.wjoin_params import WJoinParams

    t = pa.array([0], pa.int64())
    s1 = pa.table({"t": t, "ev": pa.array(np.array(["3000-01-01"], "datetime64[us]")).cast(pa.timestamp("us", "UTC"))})
    s2 = pa.table({"t": t, "ev": pa.array(np.array([0], "datetime64[ns]")).cast(pa.timestamp("ns", "Asia/Tokyo"))})
    params = WJoinParams(n_streams=2, time=("t",), window=5, where="S1.ev < S2.ev")
    with pytest.raises(InputError, match="cannot compare times"):
        list(wjoin([s1.to_batches(), s2.to_batches()], [s1.schema, s2.schema], params))
