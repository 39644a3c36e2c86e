"""W-join engine: worked examples, the DuckDB oracle on random streams, the purge rule."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wjoin_oracle import arrival_order, oracle_tuples, rule_drop_index, shortest_paths

from smerge.errors import InputError, UsageError
from smerge.merge.values import Duration, parse_duration
from smerge.merge.wjoin import wjoin
from smerge.merge.wjoin_params import WJoinParams
from smerge.merge.wjoin_stats import WJoinStats


def run_batches(tables, params, batch=3, trace=None, stats=None, **kw):
    """The W-join's output batches, each input table read in batches of ``batch`` rows."""
    streams = [t.to_batches(max_chunksize=batch) for t in tables]
    return list(wjoin(streams, [t.schema for t in tables], params, stats=stats, trace=trace, **kw))


def run(tables, params, batch=3, trace=None, stats=None, **kw):
    out = run_batches(tables, params, batch, trace, stats, **kw)
    return pa.Table.from_batches(out, schema=None) if out else None


def ids(out, n):
    if out is None:
        return []
    return [tuple(r) for r in zip(*(out[f"S{i + 1}_row"].to_pylist() for i in range(n)))]


# ---- worked examples ------------------------------------------------------------------------

def test_two_streams_worked_example_with_ties_and_order():
    a = pa.table({"t": [0, 1, 1, 5], "v": [10, 11, 12, 13]})
    b = pa.table({"t": [1, 1, 3, 9], "v": [20, 21, 22, 23]})
    p = WJoinParams(2, ("t",), window=1, with_ids=True)
    out = run([a, b], p, batch=1)
    # arrival order: a0(0) a1(1) a2(1) b0(1) b1(1) b2(3) a3(5) b3(9)
    # b0 forms (a0,b0)(a1,b0)(a2,b0); b1 forms (a0,b1)(a1,b1)(a2,b1); b2 nothing within 1 (a: 0,1,1 -> |3-1|=2)
    assert ids(out, 2) == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]
    assert out.column_names == ["S1_t", "S1_v", "S2_t", "S2_v", "S1_row", "S2_row"]
    assert out["S2_v"].to_pylist() == [20, 20, 20, 21, 21, 21]


def test_tuple_formed_when_last_member_arrives_ties_by_stream_number():
    # equal timestamps: S1's record arrives before S2's, so the tuple is formed by S2's record
    a = pa.table({"t": [5]})
    b = pa.table({"t": [5]})
    c = pa.table({"t": [4, 6]})
    p = WJoinParams(3, ("t",), window=1, with_ids=True)
    trace: list = []
    out = run([a, b, c], p, trace=trace)
    # order: c0(4) a0(5) b0(5) c1(6): tuples (a0,b0,c0) formed at b0, (a0,b0,c1) at c1
    assert ids(out, 3) == [(0, 0, 0), (0, 0, 1)]
    seq = [(int(s), int(r)) for tr in trace for s, r in zip(tr[0], tr[1])]
    assert seq == [(2, 0), (0, 0), (1, 0), (2, 1)]


def test_missing_window_uses_the_chain_of_bounds():
    # S1-S2 within 2, S2-S3 within 2, no S1-S3 bound: S1 and S3 may be 4 apart
    a, b, c = (pa.table({"t": [0]}), pa.table({"t": [2]}), pa.table({"t": [4]}))
    p = WJoinParams(3, ("t",), pair_windows=((0, 1, Duration(2)), (1, 2, Duration(2))), with_ids=True)
    assert ids(run([a, b, c], p), 3) == [(0, 0, 0)]
    p2 = WJoinParams(3, ("t",), window=2, with_ids=True)
    assert run([a, b, c], p2) is None


def test_disconnected_constraint_graph_rejected():
    with pytest.raises(UsageError, match="do not connect all streams: S3"):
        WJoinParams(3, ("t",), pair_windows=((0, 1, Duration(2)),))
    with pytest.raises(UsageError, match="do not connect"):
        WJoinParams(4, ("t",), window=3, pair_windows=((0, 3, None), (1, 3, None), (2, 3, None)))
    with pytest.raises(UsageError, match="no window"):
        WJoinParams(2, ("t",))


def test_durations_and_datetime_times():
    assert parse_duration("90s") == Duration(90, "s") and parse_duration("1.5h") == Duration(1.5, "h")
    assert parse_duration("7") == Duration(7.0, None)
    with pytest.raises(UsageError, match="not a duration"):
        parse_duration("6 parsecs")
    base = np.datetime64("2024-01-01T00:00:00", "ns")
    a = pa.table({"t": pa.array(base + np.array([0, 3600, 7200], "timedelta64[s]"))})
    b = pa.table({"t": pa.array(base + np.array([1800, 5400 + 1, 9000], "timedelta64[s]"))})
    p = WJoinParams(2, ("t",), window="30min", with_ids=True)
    got = sorted(ids(run([a, b], p), 2))
    assert got == oracle_tuples([a, b], "t", {(0, 1): 1800 * 10**9}, datetime=True) == [(0, 0), (1, 0), (2, 1), (2, 2)]
    with pytest.raises(UsageError, match="has a unit but the time column is a plain number"):
        run([pa.table({"t": [1]}), pa.table({"t": [1]})], WJoinParams(2, ("t",), window="6h"))


def test_unsorted_or_missing_time_is_an_input_error():
    p = WJoinParams(2, ("t",), window=1)
    with pytest.raises(InputError, match="decreases at row 2"):
        run([pa.table({"t": [1, 2, 1]}), pa.table({"t": [1]})], p, batch=2)
    with pytest.raises(InputError, match="missing at row 1"):
        run([pa.table({"t": pa.array([1, None], pa.int64())}), pa.table({"t": [1]})], p)
    with pytest.raises(UsageError, match="no time column"):
        run([pa.table({"x": [1]}), pa.table({"t": [1]})], p)


def test_hash_method_needs_equalities_covering_all_streams():
    t = pa.table({"t": [1], "k": [1]})
    with pytest.raises(UsageError, match="needs equalities"):
        run([t, t, t], WJoinParams(3, ("t",), window=1, where="S1.k == S2.k", method="hash"))
    stats = WJoinStats()
    run([t, t, t], WJoinParams(3, ("t",), window=1, on=("k",)), stats=stats)
    assert stats.method == "hash" and stats.tuples == 1


def test_empty_stream_gives_no_tuples_and_reads_everything():
    a = pa.table({"t": np.arange(100)})
    e = pa.table({"t": pa.array([], pa.int64())})
    stats = WJoinStats()
    assert run([a, e], WJoinParams(2, ("t",), window=5), stats=stats) is None
    assert stats.records_read == [100, 0] and stats.tuples == 0


def test_float_times_match_oracle_at_the_boundary():
    a = pa.table({"t": [0.1, 0.2, 0.30000000000000004, 1.0]})
    b = pa.table({"t": [0.3, 0.4, 1.1]})
    p = WJoinParams(2, ("t",), window=0.1, with_ids=True)
    assert sorted(ids(run([a, b], p), 2)) == oracle_tuples([a, b], "t", {(0, 1): 0.1})


# ---- random streams against the DuckDB oracle -----------------------------------------------

PREDICATES = [  # (ours, SQL over s1..sn, minimum number of streams)
    (None, None, 2),
    ("S1.k == S2.k", "s1.k = s2.k", 2),
    ("S1.v < S2.v", "s1.v < s2.v", 2),
    ("S1.k = S2.k AND abs(S1.v - S2.v) <= 2", "s1.k = s2.k AND abs(s1.v - s2.v) <= 2", 2),
    ("not (S1.v > S2.v) or S2.k == 1", "NOT (s1.v > s2.v) OR s2.k = 1", 2),
    ("S1.k == S2.k and S2.k == S3.k", "s1.k = s2.k AND s2.k = s3.k", 3),
    ("S1.v + S3.v > S2.v * 2 and S1.k != S3.k", "s1.v + s3.v > s2.v * 2 AND s1.k <> s3.k", 3),
    ("S1.v / S2.v > 0.5", "CAST(s1.v AS DOUBLE) / NULLIF(CAST(s2.v AS DOUBLE), 0) > 0.5", 2),
    # equalities that do not cover every stream: pairwise hash probes, bands, 3-stream conjuncts
    ("S1.k == S2.k and S2.v == S3.v and S1.v > S3.v + 1", "s1.k = s2.k AND s2.v = s3.v AND s1.v > s3.v + 1", 3),
    ("S3.k == S1.k and S1.v + S2.v > S3.v", "s3.k = s1.k AND s1.v + s2.v > s3.v", 3),
    ("S2.k == S1.k and S3.k == S4.k and S1.v < S4.v", "s2.k = s1.k AND s3.k = s4.k AND s1.v < s4.v", 4),
    ("S1.v == S2.k and S2.v == S3.v and S3.k == S4.v and S4.k == S5.k",
     "s1.v = s2.k AND s2.v = s3.v AND s3.k = s4.v AND s4.k = s5.k", 5),
    ("S1.v == S2.k", "s1.v = s2.k", 2),
]


@st.composite
def wjoin_case(draw):
    n = draw(st.integers(2, 5))
    cap = {2: 30, 3: 22, 4: 14, 5: 9}[n]
    tables = []
    for _ in range(n):
        m = draw(st.integers(0, cap))
        t = sorted(draw(st.lists(st.integers(0, 40), min_size=m, max_size=m)))
        k = draw(st.lists(st.integers(0, 2), min_size=m, max_size=m))
        v = draw(st.lists(st.one_of(st.none(), st.integers(-3, 5)), min_size=m, max_size=m))
        tables.append(pa.table({"t": pa.array(t, pa.int64()), "k": pa.array(k, pa.int64()),
                                "v": pa.array(v, pa.int64())}))
    mode = draw(st.sampled_from(["uniform", "per-pair", "missing"]))
    pairs = list(itertools.combinations(range(n), 2))
    if mode == "uniform":
        w = draw(st.integers(0, 8))
        windows = {p: w for p in pairs}
        params = dict(window=w)
    else:
        if mode == "per-pair":
            chosen = pairs
        else:  # a random spanning tree plus some extra edges
            perm = draw(st.permutations(range(n)))
            chosen = {tuple(sorted((perm[i], perm[draw(st.integers(0, i - 1))]))) for i in range(1, n)}
            chosen |= {p for p in pairs if draw(st.booleans()) and draw(st.booleans())}
        windows = {p: draw(st.integers(0, 8)) for p in sorted(chosen)}
        params = dict(pair_windows=tuple((i, j, Duration(w)) for (i, j), w in windows.items()))
    pred = draw(st.sampled_from([p for p in PREDICATES if p[2] <= n]))
    method = draw(st.sampled_from(["auto", "nested-loop"]))
    batch = draw(st.integers(1, 12))
    return tables, windows, params, pred, method, batch


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(wjoin_case())
def test_equals_duckdb_oracle_on_random_streams(case):
    tables, windows, kw, (ours, sql, _), method, batch = case
    n = len(tables)
    p = WJoinParams(n, ("t",), where=ours, with_ids=True, method=method, **kw)
    stats = WJoinStats()
    got = ids(run(tables, p, batch=batch, stats=stats), n)
    expected = oracle_tuples(tables, "t", windows, sql)
    assert sorted(got) == expected  # every tuple exactly once
    assert stats.tuples == len(expected)
    assert stats.records_read == [t.num_rows for t in tables]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(wjoin_case())
def test_purge_is_safe_and_as_eager_as_the_rule(case):
    """Per record: dropped no later than the rule of docs/semantics.md section 6 allows, never before the last tuple using it."""
    tables, windows, kw, (ours, sql, _), method, batch = case
    n = len(tables)
    p = WJoinParams(n, ("t",), where=ours, with_ids=True, method=method, **kw)
    trace: list = []
    stats = WJoinStats()
    out = run(tables, p, batch=batch, trace=trace, stats=stats)
    times = [t["t"].to_pylist() for t in tables]
    order = arrival_order(times)
    # the engine consumed the records in arrival order
    seq = [(int(s), int(r)) for tr in trace for s, r in zip(tr[0], tr[1])]
    assert seq == order
    g_of = {rec: g for g, rec in enumerate(order)}
    # engine drop events, as global arrival indices
    drop = {}
    offset = 0
    for arr_s, _, dropped in trace:
        for j, (rows, at) in enumerate(dropped):
            for r, a in zip(rows, at):
                drop[(j, int(r))] = offset + int(a)
        offset += len(arr_s)
    dist = shortest_paths(n, windows)
    rule = rule_drop_index(times, dist, exhaustion=False)
    eager = rule_drop_index(times, dist, exhaustion=True)
    for rec in g_of:
        if rec in rule:  # the rule allows dropping it: the engine did, no later
            assert rec in drop and drop[rec] <= rule[rec], rec
        if rec in drop:  # never earlier than even the exhaustion-aware rule allows
            assert rec in eager and drop[rec] >= eager[rec], rec
    # no record is dropped before a tuple that needs it is formed
    for tup in ids(out, n):
        formed = max(g_of[(j, r)] for j, r in enumerate(tup))
        for j, r in enumerate(tup):
            assert drop.get((j, r), math.inf) >= formed
    # peak buffered == the largest buffer the engine held, and never above the rule's buffers
    size = [0] * n
    rule_peak = [0] * n
    dropped_at: dict[int, list[int]] = {}
    for rec, g in drop.items():
        dropped_at.setdefault(g, []).append(rec[0])
    rule_at: dict[int, list[int]] = {}
    for rec, g in rule.items():
        rule_at.setdefault(g, []).append(rec[0])
    engine_peak = [0] * n
    for g, (s, _) in enumerate(order):
        size[s] += 1
        rule_peak[s] += 1
        for j in dropped_at.get(g, []):
            size[j] -= 1
        for j in rule_at.get(g, []):
            rule_peak[j] -= 1
        for j in range(n):
            engine_peak[j] = max(engine_peak[j], size[j])
            assert size[j] <= rule_peak[j]
    assert stats.peak_buffered == engine_peak


def test_peak_buffered_is_bounded_by_the_window_not_the_stream():
    rng = np.random.default_rng(7)
    tables = [pa.table({"t": np.sort(rng.integers(0, 100_000, 20_000)), "k": rng.integers(0, 50, 20_000)})
              for _ in range(3)]
    stats = WJoinStats()
    p = WJoinParams(3, ("t",), window=50, on=("k",), with_ids=True)
    out = run(tables, p, batch=4096, stats=stats)
    # about 0.2 records per time unit: the rule keeps ~ (50 + gap) * 0.2 records per stream
    assert max(stats.peak_buffered) < 40
    assert max(stats.peak_held) <= 2 * 4096 + 40
    assert sorted(ids(out, 3)) == oracle_tuples(tables, "t", {(0, 1): 50, (0, 2): 50, (1, 2): 50},
                                               "s1.k = s2.k AND s1.k = s3.k")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(wjoin_case())
def test_arrival_blocks_do_not_change_the_result(case):
    """Blocks of arrivals halved down to single arrivals (as when a level would hold too many
    partial tuples) give exactly the oracle's tuples, in the same order as one block."""
    import smerge.merge.wjoin as W

    tables, windows, kw, (ours, sql, _), method, batch = case
    n = len(tables)
    p = WJoinParams(n, ("t",), where=ours, with_ids=True, method=method, **kw)
    whole = ids(run(tables, p, batch=batch), n)
    old = W.SPLIT_TUPLES
    W.SPLIT_TUPLES = 0
    try:
        got = ids(run(tables, p, batch=batch), n)
    finally:
        W.SPLIT_TUPLES = old
    assert got == whole
    assert sorted(got) == oracle_tuples(tables, "t", windows, sql)


def test_too_many_partial_tuples_is_a_usage_error_naming_the_window(monkeypatch):
    import smerge.merge.wjoin as W

    monkeypatch.setattr(W, "MAX_PARTIAL_TUPLES", 15)
    monkeypatch.setattr(W, "SPLIT_TUPLES", 10)
    t = pa.table({"t": pa.array(np.zeros(20, np.int64)), "k": pa.array(np.arange(20))})
    with pytest.raises(UsageError, match=r"stream S1 would give 20 partial tuples for one S2 arrival.*S2,S1 <= 5.*add an equality"):
        list(wjoin([iter(t.to_batches()), iter(t.to_batches())], [t.schema, t.schema],
                   WJoinParams(2, ("t",), window=Duration(5), method="nested-loop")))
    # With an equality the same join is a hash probe and fits.
    out = list(wjoin([iter(t.to_batches()), iter(t.to_batches())], [t.schema, t.schema],
                     WJoinParams(2, ("t",), window=Duration(5), where="S1.k == S2.k", method="nested-loop")))
    assert sum(b.num_rows for b in out) == 20


def test_plain_number_window_is_in_the_timestamps_own_unit():
    """timestamp[s] columns: --window 1 is one second (it was read as 1 us / 1 ns)."""
    t1 = pa.table({"t": pa.array([0, 1, 5], pa.timestamp("s"))})
    t2 = pa.table({"t": pa.array([1, 3], pa.timestamp("s"))})
    out = list(wjoin([iter(t1.to_batches()), iter(t2.to_batches())], [t1.schema, t2.schema],
                     WJoinParams(2, ("t",), window=Duration(1), with_ids=True)))
    assert sorted(ids(pa.Table.from_batches(out), 2)) == [(0, 0), (1, 0)]
    # Streams in different units: a plain number is ambiguous.
    t3 = pa.table({"t": pa.array([1000], pa.timestamp("ms"))})
    with pytest.raises(UsageError, match="different units"):
        list(wjoin([iter(t1.to_batches()), iter(t3.to_batches())], [t1.schema, t3.schema],
                   WJoinParams(2, ("t",), window=Duration(1))))


@pytest.mark.parametrize("on", [("k",), ()])
def test_nanosecond_times_beyond_2_53_bound_the_window_exactly(on):
    """Times in ns since 1970 (~1.7e18, beyond float64's exact integers): the window's bounds are
    int64, not rounded to float64's 256 ns steps (a pair 1,118 ns apart joined with a 1 us window)."""
    base = 1_700_000_000_000_000_000
    offs = list(range(-1300, 1301, 7))
    a = pa.table({"t": pa.array([base, base + 3], pa.timestamp("ns")), "k": [1, 1]})
    b = pa.table({"t": pa.array([base + o for o in offs], pa.timestamp("ns")), "k": [1] * len(offs)})
    out = run([a, b], WJoinParams(2, ("t",), window=Duration(1, "us"), on=on), batch=50)
    got = sorted(zip(out.column("S1_t").cast(pa.int64()).to_pylist(), out.column("S2_t").cast(pa.int64()).to_pylist()))
    want = sorted((ta, base + o) for ta in (base, base + 3) for o in offs if abs(base + o - ta) <= 1000)
    assert got == want


@pytest.mark.parametrize("on", [("k",), ()])
def test_int_times_near_the_int64_range_saturate_the_window(on):
    """Window bounds and purge cuts past int64's range bound nothing there (no wrap-around: a cut
    wrapped to the top of the range would purge records still inside the window)."""
    w = 2**61 - 1
    t1 = [-(2**63) + 5, -(2**62), 0, 2**62, 2**63 - 2]
    t2 = [-(2**63) + 1, -(2**63) + w, -(2**62) + 1, 1, 2**62 + 1, 2**63 - 1 - w + 3, 2**63 - 1]
    a = pa.table({"t": pa.array(t1, pa.int64()), "k": [1] * len(t1)})
    b = pa.table({"t": pa.array(t2, pa.int64()), "k": [1] * len(t2)})
    out = run([a, b], WJoinParams(2, ("t",), window=w, on=on), batch=2)
    got = sorted(zip(out.column("S1_t").to_pylist(), out.column("S2_t").to_pylist()))
    want = sorted((x, y) for x in t1 for y in t2 if abs(x - y) <= w)
    assert len(want) == 7  # two of them with a bound past the range
    assert got == want


def test_a_window_beyond_2_61_ticks_is_refused():
    """Bounds are added to times in int64 by the probes and purges; a window past 2^61 ticks
    (about 73 years in nanoseconds) was taken as 2^61, silently missing tuples further apart."""
    from smerge.errors import UsageError
    from smerge.merge.wjoin_plan import make_plan

    t = pa.table({"t": pa.array(np.array([0, 10**18, 3 * 10**18], "datetime64[ns]")), "k": [1, 1, 1]})
    with pytest.raises(UsageError, match=r"window S1,S2 is 3,153,600,000,000,000,000 nanoseconds, beyond the "
                                         r"2,305,843,009,213,693,951 this join can bound"):
        make_plan([t.schema, t.schema], WJoinParams(2, ("t",), window="36500d", on=("k",)))
    # two windows of 50 years each imply 100 years between S1 and S3 (the probes use that bound too)
    with pytest.raises(UsageError, match=r"window S1,S3 \(implied by the windows through the other streams\) is "
                                         r"3,153,600,000,000,000,000 nanoseconds, beyond the"):
        make_plan([t.schema] * 3, WJoinParams(3, ("t",), pair_windows=((0, 1, "18250d"), (1, 2, "18250d"))))
    p = WJoinParams(2, ("t",), window="3650d", on=("k",), with_ids=True)  # ~10 years: 3 tuples (0-0, 1-1, 2-2)
    out = pa.Table.from_batches(list(wjoin([t.to_batches(), t.to_batches()], [t.schema, t.schema], p)))
    assert sorted(zip(out["S1_row"].to_pylist(), out["S2_row"].to_pylist())) == [(0, 0), (1, 1), (2, 2)]
