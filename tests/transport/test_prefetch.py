"""Dual buffering: the background reader runs ahead of the consumer, bounded, in order."""

from __future__ import annotations

import threading

import pytest

from smerge.transport import Prefetcher


def test_order_and_completeness():
    assert list(Prefetcher(range(1000), depth=3)) == list(range(1000))


def test_reads_ahead_while_consumer_works():
    produced = threading.Event()

    def source():
        yield 1
        yield 2
        produced.set()  # reached only if the reader runs ahead of the consumer
        yield 3

    it = Prefetcher(source(), depth=2)
    assert next(it) == 1
    # The consumer holds item 1 and has not asked for more: the reader fetched ahead anyway.
    assert produced.wait(60.0)
    assert list(it) == [2, 3]


def test_bounded_queue():
    pulled = []

    def source():
        for i in range(100):
            pulled.append(i)
            yield i

    it = Prefetcher(source(), depth=4)
    first = next(it)
    threading.Event().wait(0.2)
    assert first == 0 and len(pulled) <= 1 + 4 + 1  # consumed + queued + one in hand
    it.close()


def test_errors_reach_the_consumer():
    def source():
        yield 1
        raise ValueError("bad slab")

    it = Prefetcher(source())
    assert next(it) == 1
    with pytest.raises(ValueError, match="bad slab"):
        next(it)


def test_busy_seconds_counts_reader_time():
    import time

    def source():
        for i in range(5):
            time.sleep(0.01)
            yield i

    it = Prefetcher(source())
    assert list(it) == list(range(5))
    assert it.busy_seconds >= 0.04


def test_depth_zero_reads_in_the_callers_thread():
    import time

    seen, closed = [], []

    def source():
        try:
            for i in range(4):
                seen.append(threading.current_thread())
                time.sleep(0.01)
                yield i
            raise ValueError("bad slab")
        finally:
            closed.append(True)

    got = []
    it = Prefetcher(source(), depth=0, on_item=got.append)
    assert [next(it) for _ in range(4)] == [0, 1, 2, 3] == got
    assert seen == [threading.current_thread()] * 4  # no thread: nothing was read ahead
    assert it.busy_seconds >= 0.03
    with pytest.raises(ValueError, match="bad slab"):
        next(it)
    assert list(it) == [] and closed == [True]


def test_depth_zero_close_closes_the_source():
    closed = []

    def source():
        try:
            yield from range(10)
        finally:
            closed.append(True)

    it = Prefetcher(source(), depth=0)
    assert next(it) == 0
    it.close()
    assert closed == [True] and list(it) == []
