"""Client of the index server (``transport.flight_server``): info, range/symdiff pages, streams.

Transient failures (server unavailable, timeouts, a dropped stream) are retried with backoff;
because continuation tokens are stateless (a sort position, not a server cursor), a retried
page is exactly the page that was asked for: nothing lost, nothing duplicated. Server-side
errors become ``smerge.errors`` exceptions with the server's message.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import threading
import time
from concurrent.futures import Future
from typing import Iterator, Sequence
from urllib.parse import urlsplit

import numpy as np
import pyarrow as pa

os.environ.setdefault("GRPC_VERBOSITY", "NONE")  # gRPC's own log lines never reach the CLI's stderr
import pyarrow.flight as flight  # noqa: E402

from smerge.errors import InputError, UsageError, param
from smerge.merge.range_source import Box
from smerge.transport.flight_protocol import INVALID_ARGUMENT, MAX_TOKEN_CHARS, NEXT_TOKEN_KEY, Query

DEFAULT_TIMEOUT = 120.0
DEFAULT_RETRIES = 4
RETRY_SECONDS = 8.0  # a server refusing connections (its limits) is retried this long; see flight_gate
MAX_PREFETCHED = 4  # announced range requests kept in flight or waiting to be collected
_TRANSIENT = (flight.FlightUnavailableError, flight.FlightTimedOutError, flight.FlightCancelledError)


def split_url(url: str) -> tuple[str, str | None]:
    """``grpc://host:port/NAME`` -> (Flight location, dataset NAME or None)."""
    shape = "must look like grpc://HOST:PORT (or grpc+tls://HOST:PORT), optionally followed by /NAME"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # a port that is not a number or out of 0-65535
        raise UsageError(f"server URL {url!r}: the port is not a number in 1-65535; it {shape}") from None
    scheme = {"grpc": "grpc+tcp", "grpc+tcp": "grpc+tcp", "grpc+tls": "grpc+tls", "grpcs": "grpc+tls"}.get(parts.scheme)
    if scheme is None or not parts.hostname or port is None:
        raise UsageError(f"server URL {url!r} {shape}")
    if port == 0:
        raise UsageError(f"server URL {url!r}: port 0 is not a server's port; it {shape}")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    name = parts.path.strip("/") or None
    return f"{scheme}://{host}:{port}", name


class IndexClient:
    """A connection to an index server. Thread-safe for concurrent calls (one gRPC channel)."""

    def __init__(self, url: str, *, token: str | None = None, dataset: str | None = None,
                 tls_root_certs: bytes | None = None, timeout: float = DEFAULT_TIMEOUT,
                 retries: int = DEFAULT_RETRIES):
        self.location, name = split_url(url)
        if token is not None and len(token) > MAX_TOKEN_CHARS:
            raise UsageError(f"{url}: the token has {len(token):,} characters; a server takes at most "
                             f"{MAX_TOKEN_CHARS:,}")
        self.url = url
        self.dataset = dataset if dataset is not None else name
        kw = {}
        if tls_root_certs is not None:
            kw["tls_root_certs"] = tls_root_certs
        self._client = flight.FlightClient(self.location, **kw)
        headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
        self._options = flight.FlightCallOptions(headers=headers, timeout=timeout)
        self.retries = retries
        self.retried = 0
        self._info: dict | None = None
        self._pool: "_DaemonWorker | None" = None
        self._prefetched: dict[tuple, Future] = {}
        self._prefetch_lock = threading.Lock()
        self._abandoned = False  # a call was left running when a signal interrupted the wait for it
        self._caller: _DaemonWorker | None = None  # runs the main thread's calls (see _in_flight)
        _cancel_streams_on_signals()

    # -- plumbing -----------------------------------------------------------------------------------

    def _call(self, fn):
        delay, attempt, t0 = 0.05, 0, time.monotonic()
        while True:
            try:
                return self._in_flight(fn)
            except flight.FlightUnauthenticatedError as e:
                raise UsageError(f"{self.url}: the server rejected the token ({_first_line(e)}); "
                                 "set SMERGE_TOKEN_FILE to the file holding the server's token (or SMERGE_TOKEN to "
                                 "the token itself)") from None
            except _TRANSIENT as e:
                tls = _tls_problem(e)
                if tls:
                    raise InputError(f"{self.url}: TLS handshake failed: {tls}") from None
                # a server that refuses connections only for a while (its connection limits) is
                # retried for RETRY_SECONDS; nothing listening there, for `retries` times only
                if attempt >= self.retries and (_nothing_listening(e) or time.monotonic() - t0 > RETRY_SECONDS):
                    raise InputError(f"{self.url}: server unavailable after {attempt + 1} attempts "
                                     f"({_first_line(e)}); is `smerge serve` running there?") from None
                attempt += 1
                self.retried += 1
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
            except pa.ArrowInvalid as e:
                raise UsageError(f"{self.url}: {_server_message(e)}") from None
            except flight.FlightServerError as e:
                if getattr(e, "extra_info", b"") == INVALID_ARGUMENT:  # the server rejected the request
                    raise UsageError(f"{self.url}: {_server_message(e)}") from None
                raise InputError(f"{self.url}: server error: {_first_line(e)}") from None
            except flight.FlightError as e:
                raise InputError(f"{self.url}: server error: {_first_line(e)}") from None

    def _in_flight(self, fn, cancel=None):
        """``fn()`` (a gRPC call). In the main thread the call runs in the client's daemon helper
        thread while the main thread waits: a signal (SIGTERM, Ctrl-C) then interrupts the wait at once
        (pyarrow's calls would hold it until they return), ``cancel`` is called and the
        interruption goes on (the helper's call is abandoned). Other threads call ``fn`` directly."""
        if threading.current_thread() is not threading.main_thread():
            return fn()
        if self._caller is None:
            self._caller = _DaemonWorker("smerge-flight-call")  # one per client: cheaper than a thread per call
        fut = self._caller.submit(fn)
        try:
            return fut.result()
        except BaseException:
            if not fut.done():  # interrupted while waiting (not the call's own error)
                self._abandoned = True
                self._caller.stop()
                self._caller = None  # the next call gets a fresh thread
                if cancel is not None:
                    try:
                        cancel()
                    except Exception:  # noqa: BLE001 - best effort: the call is abandoned anyway
                        pass
            raise

    def _get_table(self, body: bytes) -> pa.Table:
        def once():
            reader = self._client.do_get(flight.Ticket(body), self._options)
            _track(reader, True)
            try:
                return _read_all(reader)
            finally:
                _track(reader, False)
        return self._call(once)

    # -- API ------------------------------------------------------------------------------------------

    def info(self) -> dict:
        if self._info is None:
            body = json.dumps({"dataset": self.dataset} if self.dataset else {}).encode()
            res = self._call(lambda: list(self._client.do_action(flight.Action("info", body), self._options)))
            self._info = json.loads(res[0].body.to_pybytes())
        return self._info

    def health(self) -> bool:
        res = self._call(lambda: list(self._client.do_action(flight.Action("health", b""), self._options)))
        return res[0].body.to_pybytes() == b"ok"

    def _page(self, op: str, boxes: Sequence[Box], limit: int, token: str | None,
              columns: Sequence[str] | None) -> tuple[pa.Table, str | None]:
        q = Query(op=op, dataset=self.dataset, boxes=tuple((b.lo, b.hi) for b in boxes), limit=int(limit),
                  token=token, columns=tuple(columns) if columns is not None else None)
        table = self._get_table(q.to_json())
        meta = table.schema.metadata or {}
        nxt = meta.get(NEXT_TOKEN_KEY, b"").decode() or None
        return table.replace_schema_metadata(None), nxt

    def range_query(self, box: Box, *, limit: int, token: str | None = None,
                    columns: Sequence[str] | None = None) -> tuple[pa.Table, str | None]:
        """One page of range(box): a table (B's columns + ``__smerge_row``) and the next token.

        A page announced with ``prefetch`` (same arguments) is collected instead of asked again."""
        key = ("range", box, int(limit), token, tuple(columns) if columns is not None else None)
        with self._prefetch_lock:
            fut = self._prefetched.pop(key, None)
        if fut is not None:
            return self._in_flight(fut.result)
        return self._page("range", [box], limit, token, columns)

    def prefetch(self, box: Box, *, limit: int, token: str | None = None,
                 columns: Sequence[str] | None = None) -> None:
        """Start the range request in a background thread (one per client); ``range_query`` with
        the same arguments collects it. At most ``MAX_PREFETCHED`` are kept (the oldest dropped)."""
        key = ("range", box, int(limit), token, tuple(columns) if columns is not None else None)
        with self._prefetch_lock:
            if key in self._prefetched:
                return
            if self._pool is None:
                self._pool = _DaemonWorker("smerge-flight-prefetch")
            while len(self._prefetched) >= MAX_PREFETCHED:
                self._prefetched.pop(next(iter(self._prefetched))).cancel()
            self._prefetched[key] = self._pool.submit(self._page, "range", [box], limit, token, columns)

    def symdiff_query(self, box1: Box, box2: Box, *, limit: int, token: str | None = None,
                      columns: Sequence[str] | None = None) -> tuple[pa.Table, str | None]:
        return self._page("symdiff", [box1, box2], limit, token, columns)

    def stream(self, columns: Sequence[str] | None = None) -> Iterator[pa.RecordBatch]:
        """B in stored order, batch by batch (a dropped stream is an error, not retried mid-way)."""
        q = Query(op="stream", dataset=self.dataset, boxes=(), limit=1, token=None,
                  columns=tuple(columns) if columns is not None else None)
        for chunk in self._chunks(self._do_get(q)):
            yield chunk.data

    def _do_get(self, q: Query):
        return self._call(lambda: self._client.do_get(flight.Ticket(q.to_json()), self._options))

    def _chunks(self, reader) -> Iterator:
        """The chunks of one ``do_get`` reader; a dropped stream is an InputError; the reader is
        cancelled when the caller stops early."""
        _track(reader, True)
        try:
            while True:
                try:
                    chunk = self._in_flight(reader.read_chunk, reader.cancel)
                except StopIteration:
                    return
                except flight.FlightError as e:
                    raise InputError(f"{self.url}: stream broken ({_first_line(e)})") from None
                yield chunk
        finally:
            _track(reader, False)
            try:
                reader.cancel()
            except Exception:  # noqa: BLE001 - best effort on an already closed stream
                pass

    def summary(self) -> tuple[pa.Schema, Iterator[tuple[pa.RecordBatch, bytes | None]]]:
        """The summarised stream (``smerge.counting.summary``): its schema and (batch, app-metadata)
        messages. A dropped stream is an error, not retried mid-way."""
        q = Query(op="summary", dataset=self.dataset, boxes=(), limit=1, token=None, columns=None)
        reader = self._do_get(q)

        def messages():
            for chunk in self._chunks(reader):
                meta = chunk.app_metadata
                yield chunk.data, (meta.to_pybytes() if meta is not None else None)
        return reader.schema, messages()

    def schema(self) -> pa.Schema:
        """B's schema (without the row id column), from the Flight info of the plain stream."""
        name = self.dataset or self.info()["name"]
        fi = self._call(lambda: self._client.get_flight_info(flight.FlightDescriptor.for_path(name), self._options))
        return fi.schema

    def close(self) -> None:
        with self._prefetch_lock:
            pending, self._prefetched = list(self._prefetched.values()), {}
        for fut in pending:
            fut.cancel()
        for worker in (self._pool, self._caller):
            if worker is not None:
                worker.stop()  # a call still in flight is abandoned, not waited for
        self._pool = self._caller = None
        if not self._abandoned:  # (closing a client whose call is stuck could wait for that call)
            self._client.close()

    def __enter__(self) -> "IndexClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _DaemonWorker:
    """One daemon thread running submitted calls in order (a ThreadPoolExecutor's threads are
    joined at interpreter exit: a call stuck in gRPC would hold the process)."""

    def __init__(self, name: str):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def submit(self, fn, *args) -> Future:
        fut: Future = Future()
        self._queue.put((fut, fn, args))
        return fut

    def stop(self) -> None:
        self._queue.put(None)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fut, fn, args = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                fut.set_exception(e)


_readers: set = set()  # the do_get streams being read, in any thread (cancelled on SIGTERM / Ctrl-C)
_readers_lock = threading.Lock()
_signals_chained = False


def _track(reader, add: bool) -> None:
    with _readers_lock:
        (_readers.add if add else _readers.discard)(reader)


def _cancel_streams_on_signals() -> None:
    """Put a step in front of the process's SIGTERM and SIGINT handlers (once, from the main
    thread): cancel every stream being read, so that a thread blocked reading one (a prefetch
    thread, which no signal reaches) ends at once; then the previous handler runs as before."""
    global _signals_chained
    if _signals_chained or threading.current_thread() is not threading.main_thread():
        return
    _signals_chained = True
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)
        if previous in (signal.SIG_IGN, signal.SIG_DFL, None):
            continue  # the process ends (or ignores the signal) without Python: nothing to unwind

        def handler(signum, frame, previous=previous):
            with _readers_lock:
                readers = list(_readers)
            for r in readers:
                try:
                    r.cancel()
                except Exception:  # noqa: BLE001 - best effort on a finished stream
                    pass
            previous(signum, frame)

        signal.signal(sig, handler)


def _read_all(reader) -> pa.Table:
    """``reader.read_all()`` without pyarrow's signal plumbing: a read_all cancelled in any
    thread makes pyarrow simulate a Ctrl-C in the main thread (a second interruption, which
    could land in the clean-up of the first)."""
    batches = []
    while True:
        try:
            batches.append(reader.read_chunk().data)
        except StopIteration:
            return pa.Table.from_batches(batches, schema=reader.schema)


def _nothing_listening(e: BaseException) -> bool:
    """The connection was refused by the host (no server on that port), not closed by a server."""
    return "Connection refused" in str(e)


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    s = s.splitlines()[0] if s else type(e).__name__
    return s.split(". Detail:")[0]


def _tls_problem(e: BaseException) -> str | None:
    """What is wrong with the server's certificate, if a connection failed on it (not retried)."""
    s = str(e)
    if "CERTIFICATE_VERIFY_FAILED" in s or "certificate verify failed" in s.lower():
        return ("the server's certificate is not trusted; pass the certificate (or its CA) with "
                f"{param.tls_root_cert} / SMERGE_TLS_ROOT_CERT")
    if "Hostname" in s and "mismatch" in s or "hostname" in s and "does not match" in s:
        return "the server's certificate does not name this host; connect with a host name it lists"
    if "WRONG_VERSION_NUMBER" in s or "wrong version number" in s:
        return "the server does not speak TLS; use grpc:// instead of grpc+tls://"
    if "Ssl handshake failed" in s or "SSL_ERROR" in s or "handshake" in s.lower() and "ssl" in s.lower():
        line = next((part.strip() for part in s.split(":") if "SSL" in part or "ssl" in part), "")
        return f"the server's certificate was refused ({line[:120] or 'handshake error'})"
    return None


def _server_message(e: BaseException) -> str:
    """The server's own message out of a gRPC error string."""
    s = _first_line(e)
    for prefix in ("Invalid: ",):
        if s.startswith(prefix):
            s = s[len(prefix):]
    return s.split(". Detail:")[0]


def rows_of(table: pa.Table) -> np.ndarray:
    from smerge.merge.range_source import ROW_ID_COLUMN

    return table.column(ROW_ID_COLUMN).to_numpy().astype(np.int64, copy=False)
