"""Dual buffering (Mazzucco et al. (SC2002), section 5, Figure 3): read ahead in background threads.

``Prefetcher(iterable, depth)`` runs the iterable in a daemon thread that fills a bounded
queue while the consumer (the merge engine) works on earlier batches, so the total time
approaches max(fetch, merge) rather than their sum. ``busy_seconds`` is the time the reader
spent producing batches (the fetch time). Errors in the reader are re-raised in the consumer.
Memory: at most ``depth`` batches wait in the queue. ``depth=0`` reads in the consumer's thread
instead (same interface): for small inputs, where a reader thread's memory arena (~1 MB per
thread) costs more than the overlap it buys.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Generic, Iterable, Iterator, TypeVar

T = TypeVar("T")
_END = object()


class Prefetcher(Iterator[T]):
    def __init__(self, iterable: Iterable[T], depth: int = 4, name: str = "smerge-prefetch",
                 on_item: Callable[[T], None] | None = None):
        self.busy_seconds = 0.0
        self._on_item = on_item
        self._done = False
        self._inline = iter(iterable) if depth <= 0 else None
        if self._inline is not None:
            return
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(iterable,), name=name, daemon=True)
        self._thread.start()

    def _run(self, iterable: Iterable[T]) -> None:
        try:
            it = iter(iterable)
            while not self._stop.is_set():
                t0 = time.perf_counter()
                try:
                    item = next(it)
                except StopIteration:
                    break
                finally:
                    self.busy_seconds += time.perf_counter() - t0
                if self._on_item is not None:
                    self._on_item(item)
                while not self._stop.is_set():
                    try:
                        self._q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
            self._put_final(_END)
        except BaseException as e:  # re-raised in the consumer
            self._put_final(e)

    def _put_final(self, item) -> None:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        if self._inline is not None:
            return self._next_inline()
        item = self._q.get()
        if item is _END:
            self._done = True
            raise StopIteration
        if isinstance(item, BaseException):
            self._done = True
            raise item
        return item

    def _next_inline(self) -> T:
        t0 = time.perf_counter()
        try:
            item = next(self._inline)
        except BaseException:
            self._done = True
            raise
        finally:
            self.busy_seconds += time.perf_counter() - t0
        if self._on_item is not None:
            self._on_item(item)
        return item

    def close(self) -> None:
        """Stop the reader (it finishes its current batch) and drop what is queued."""
        self._done = True
        if self._inline is not None:
            getattr(self._inline, "close", lambda: None)()  # a generator's files close now
            return
        self._stop.set()
        try:
            while True:
                self._q.get_nowait()
        except queue.Empty:
            pass
        self._thread.join(timeout=5)

    def __enter__(self) -> "Prefetcher[T]":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class BackgroundWriter(Generic[T]):
    """The output half of dual buffering: ``write(item)`` runs in a daemon thread.

    ``put`` queues an item (blocks while ``depth`` items wait), so the engine computes the next
    output batch while the previous one is encoded and written (pyarrow's writers release the
    GIL). Items are written in ``put`` order. An error in ``write`` is re-raised by the next
    ``put`` or by ``close``; after an error the remaining items are dropped. ``busy_seconds``
    is the time spent in ``write``.
    """

    def __init__(self, write: Callable[[T], None], depth: int = 4, name: str = "smerge-write"):
        self._write = write
        self._q: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._error: BaseException | None = None
        self._cancel = False
        self._closed = False
        self.busy_seconds = 0.0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is _END:
                return
            if self._error is not None or self._cancel:
                continue
            t0 = time.perf_counter()
            try:
                self._write(item)
            except BaseException as e:  # re-raised in the producer
                self._error = e
            finally:
                self.busy_seconds += time.perf_counter() - t0

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def put(self, item: T) -> None:
        self._raise()
        self._q.put(item)

    def close(self) -> None:
        """Wait until every queued item is written; re-raise a write error."""
        if not self._closed:
            self._closed = True
            self._q.put(_END)
            self._thread.join()
        self._raise()

    def cancel(self) -> None:
        """Drop what is still queued and stop the thread (for error paths); never raises."""
        self._cancel = True
        if not self._closed:
            self._closed = True
            self._q.put(_END)
            self._thread.join()
