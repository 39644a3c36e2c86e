"""The index server: an Arrow Flight server over one or more ``smerge.index.BIndex``.

- ``do_get(ticket)``: the ticket is a JSON query (``transport.flight_protocol``): ``range`` and
  ``symdiff`` pages (B's columns plus ``__smerge_row``; the next page's token is in the
  schema metadata ``smerge.next_token``), or ``stream`` (B in stored order).
- ``summary`` (a dataset served with ``summaries``): the frequent-item summarised stream of
  ``smerge.counting.summary`` (docs/semantics.md section 9), records in time order; also described
  as the flight ``NAME.summary``.
- ``do_action("info")`` returns JSON (schema, keys, count, bounds); ``"health"`` returns ok.
- ``list_flights`` / ``get_flight_info(path NAME)`` describe the plain streams, so that
  ``grpc://host:port/NAME`` can be read like a file.

Security: binds 127.0.0.1 by default; requires a bearer token when given one, and refuses to
bind a non-loopback address without one (``transport.tokens``); TLS with a certificate and key.
The Flight server itself listens on a Unix socket in a private directory
(``transport.flight_security``); clients reach it through
``transport.flight_gate``, which refuses oversized requests before gRPC buffers them (pyarrow
offers no gRPC receive limit), terminates TLS and can drop every connection at shutdown.
Responses are capped: ``MAX_RESPONSE_BYTES`` per page, ``MAX_LARGE_PAGES`` pages over
``LARGE_PAGE_BYTES`` built or sent at once (others wait up to ``LARGE_PAGE_WAIT`` s, then get
UNAVAILABLE, which clients retry). Malformed, oversized
or unknown requests get a Flight server error whose message is one line saying what is wrong
(``extra_info`` = ``INVALID_ARGUMENT``) and the server keeps serving. Errors never carry a Python
traceback to the client (pyarrow would add one to any other exception): unexpected ones are
logged here at debug level and sent as a one-line internal error.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from typing import Any, Mapping

os.environ.setdefault("GRPC_VERBOSITY", "NONE")  # gRPC's own log lines never reach the CLI's stderr

import pyarrow as pa
import pyarrow.flight as flight

from smerge.errors import SmergeError, UsageError, param
from smerge.index import BIndex
from smerge.merge.range_source import Box
from smerge.transport.flight_gate import Gate
from smerge.transport.flight_protocol import (INVALID_ARGUMENT, MAX_PAGE_ROWS, NEXT_TOKEN_KEY, BadRequest, one_line,
                                              parse_query)
from smerge.transport.flight_security import MAX_UNIX_PATH, AuthFactory, make_workdir, tls_context
from smerge.transport.tokens import bare_host, check_token, is_loopback

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8815
STREAM_BATCH_ROWS = 65536
MAX_RESPONSE_BYTES = 512 * 1024 * 1024  # estimated bytes of one range/symdiff page
LARGE_PAGE_BYTES = 32 * 1024 * 1024  # pages above this take one of MAX_LARGE_PAGES slots
MAX_LARGE_PAGES = 4
LARGE_PAGE_WAIT = 30.0  # seconds a large page waits for a slot before UNAVAILABLE (clients retry)
SHUTDOWN_GRACE = 5.0  # seconds in-flight calls get at shutdown before their connections are dropped
log = logging.getLogger("smerge.serve")


def _flight_errors(method):
    """Send only one-line messages: bad requests as FlightServerError(INVALID_ARGUMENT), other
    failures as FlightInternalError; details go to the server's log (debug level)."""
    import functools

    @functools.wraps(method)
    def wrapper(self, *args):
        try:
            return method(self, *args)
        except flight.FlightError:
            raise
        except (BadRequest, SmergeError) as e:
            self._count(error=True)
            log.debug("%s rejected: %s", method.__name__, e)
            raise flight.FlightServerError(one_line(e), extra_info=INVALID_ARGUMENT) from None
        except Exception as e:  # noqa: BLE001 - a bug or resource error: the client gets one line
            self._count(error=True)
            log.debug("%s failed", method.__name__, exc_info=True)
            raise flight.FlightInternalError(f"internal server error ({type(e).__name__}: {one_line(e)})") from None
    return wrapper


class IndexServer(flight.FlightServerBase):
    """Serves ``indexes`` (name -> BIndex). It starts listening on construction; ``serve()`` blocks."""

    def __init__(self, indexes: Mapping[str, BIndex] | BIndex, *, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                 token: str | None = None, tls_cert: bytes | None = None, tls_key: bytes | None = None,
                 max_page: int = MAX_PAGE_ROWS, max_response_bytes: int = MAX_RESPONSE_BYTES,
                 summaries: Mapping[str, Any] | None = None):
        if isinstance(indexes, BIndex):
            indexes = {indexes.name: indexes}
        if not indexes:
            raise UsageError("the server needs at least one dataset")
        self._summaries = _prepare_summaries(indexes, summaries or {})
        self._summary_cache: dict[str, list] = {}
        self._summary_lock = threading.Lock()
        if token is not None:
            check_token(token)
        if not is_loopback(host) and not token:
            raise UsageError(f"binding {host} (not a loopback address) requires a token: pass {param.token_file}")
        if (tls_cert is None) != (tls_key is None):
            raise UsageError(f"TLS needs both a certificate and a key ({param.tls_cert} and {param.tls_key})")
        if not 0 <= int(port) <= 65535:
            raise UsageError(f"port {port} is not a port number (0-65535)")
        self.indexes = dict(indexes)
        self.token = token
        self.max_page = int(max_page)
        self.max_response_bytes = int(max_response_bytes)
        self.tls = tls_cert is not None
        self._workdir = make_workdir()  # 0700: only this user reaches the socket
        self._gate: Gate | None = None
        try:
            ctx = tls_context(tls_cert, tls_key, self._workdir) if self.tls else None
            sock = os.path.join(self._workdir, "sock")
            if len(os.fsencode(sock)) > MAX_UNIX_PATH:
                raise UsageError(f"the temporary directory {tempfile.gettempdir()} has too long a path for the "
                                 f"server's Unix socket ({len(os.fsencode(sock))} bytes, at most {MAX_UNIX_PATH}); "
                                 "set TMPDIR to a shorter directory")
            middleware = {"auth": AuthFactory(token)}
            try:
                super().__init__(flight.Location.for_grpc_unix(sock), middleware=middleware)
            except (OSError, pa.ArrowException) as e:
                raise UsageError(f"cannot start the Flight server ({one_line(e)})") from None
            host = bare_host(host)
            try:
                self._gate = Gate(host, int(port), sock, ssl_context=ctx)
            except OSError as e:
                super().shutdown()
                reason = e.strerror or one_line(e)
                if isinstance(e, socket.gaierror):
                    raise UsageError(f"cannot listen on {host}: unknown host ({reason}); "
                                     f"give an address or host name of this machine with {param.host}") from None
                raise UsageError(f"cannot listen on {host}:{port} ({reason}); "
                                 f"choose another {param.port} or {param.host}") from None
        except BaseException:
            shutil.rmtree(self._workdir, ignore_errors=True)
            raise
        scheme = "grpc+tls" if self.tls else "grpc+tcp"
        connect = "127.0.0.1" if host in ("0.0.0.0", "", "localhost") else host
        connect = "::1" if connect == "::" else connect
        connect = f"[{connect}]" if ":" in connect else connect
        self.url = f"{scheme}://{connect}:{self._gate.port}"
        self.requests = 0
        self.errors = 0
        self._count_lock = threading.Lock()
        self._large_pages = threading.BoundedSemaphore(MAX_LARGE_PAGES)
        self._closed = False
        self.stopped_cleanly = False

    @property
    def port(self) -> int:
        """The TCP port clients connect to."""
        return self._gate.port

    @property
    def refused_connections(self) -> int:
        """Connections dropped by the gate for breaking a transport limit."""
        return self._gate.refused

    def shutdown(self, grace: float | None = None) -> int:
        """Stop: no new connections or calls; in-flight calls get ``grace`` seconds (default
        ``SHUTDOWN_GRACE``) to finish, then their connections are dropped (the calls are
        cancelled). Returns how many connections were dropped. Idempotent."""
        if self._closed:
            return 0
        self._closed = True
        grace = SHUTDOWN_GRACE if grace is None else grace
        self._gate.stop_listening()
        done = threading.Event()

        def stop():
            try:
                flight.FlightServerBase.shutdown(self)
            finally:
                done.set()

        threading.Thread(target=stop, name="smerge-serve-shutdown", daemon=True).start()
        dropped = 0
        if not done.wait(max(0.0, grace)):
            dropped = self._gate.abort_all()
            log.info("dropped %d connection(s) still busy after %.1f s", dropped, grace)
            deadline = time.monotonic() + 10
            while not done.wait(0.2) and time.monotonic() < deadline:
                self._gate.abort_all()  # calls that raced in
        self.stopped_cleanly = done.is_set()
        self._gate.close()
        shutil.rmtree(self._workdir, ignore_errors=True)
        return dropped

    # -- helpers ----------------------------------------------------------------------------------

    def _index(self, name: str | None) -> BIndex:
        if name is None:
            if len(self.indexes) == 1:
                return next(iter(self.indexes.values()))
            raise BadRequest(f"several datasets are served ({', '.join(self.indexes)}); name one in \"dataset\"")
        try:
            return self.indexes[name]
        except KeyError:
            raise BadRequest(f"unknown dataset {name!r}; served: {', '.join(self.indexes)}") from None

    def _count(self, error: bool = False) -> None:
        with self._count_lock:
            self.requests += 1
            self.errors += int(error)

    # -- Flight methods -----------------------------------------------------------------------------

    @_flight_errors
    def do_get(self, context, ticket):
        q = parse_query(ticket.ticket, max_page=self.max_page)
        idx = self._index(q.dataset)
        cols = list(q.columns) if q.columns is not None else None
        if cols is not None:
            names = set(idx.table.schema.names)
            missing = [c for c in cols if c not in names]
            if missing:
                more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
                raise BadRequest(f"unknown column(s) {', '.join(missing[:5])}{more}; "
                                 f"columns: {', '.join(idx.table.schema.names[:50])}")
        if q.op == "summary":
            return self._summary_stream(q.dataset)
        if q.op == "stream":
            table = idx.table if cols is None else idx.table.select(cols)
            self._count()
            return flight.RecordBatchStream(table.to_reader(max_chunksize=STREAM_BATCH_ROWS))
        row_bytes = _row_bytes(idx, cols)
        if q.limit * row_bytes > self.max_response_bytes:
            most = max(1, self.max_response_bytes // row_bytes)
            raise BadRequest(f"a page of {q.limit:,} records of {row_bytes:,} bytes could reach "
                             f"{q.limit * row_bytes / 2**20:,.0f} MiB, over the {self.max_response_bytes / 2**20:,.0f} "
                             f"MiB limit of one response; ask for at most {most:,} records or fewer columns")
        large = q.limit * row_bytes > LARGE_PAGE_BYTES
        if large and not self._large_pages.acquire(timeout=LARGE_PAGE_WAIT):
            self._count(error=True)
            raise flight.FlightUnavailableError(f"server busy: {MAX_LARGE_PAGES} large pages in progress; retry")
        try:
            boxes = [Box(lo, hi) for lo, hi in q.boxes]
            if q.op == "range":
                page = idx.range_query(boxes[0], limit=q.limit, token=q.token)
            else:
                page = idx.symdiff_query(boxes[0], boxes[1], limit=q.limit, token=q.token)
            table = idx.take(page.rows, cols)
            meta = {NEXT_TOKEN_KEY: (page.next_token or "").encode()}
            table = table.replace_schema_metadata(meta)
        except BaseException:
            if large:
                self._large_pages.release()
            raise
        self._count()
        if not large:
            return flight.RecordBatchStream(table)
        return flight.GeneratorStream(table.schema, _release_after(table, self._large_pages))

    @_flight_errors
    def do_action(self, context, action):
        kind = action.type
        body = action.body.to_pybytes() if action.body is not None else b""
        if len(body) > 64 * 1024:
            raise BadRequest("action body too large")
        if kind == "health":
            self._count()
            return [b"ok"]
        if kind == "info":
            name = None
            if body.strip():
                try:
                    req = json.loads(body)
                except json.JSONDecodeError as e:
                    raise BadRequest(f"info body is not valid JSON ({e})") from None
                if not isinstance(req, dict) or set(req) - {"dataset"}:
                    raise BadRequest("info body must be {} or {\"dataset\": NAME}")
                name = req.get("dataset")
            idx = self._index(name)
            info = idx.info()
            info["max_page"] = self.max_page
            summary = self._summaries.get(name if name is not None else next(iter(self.indexes)))
            if summary is not None:
                info["summary"] = summary[0].describe(summary[1])
            self._count()
            return [json.dumps(info).encode()]
        raise BadRequest(f"unknown action {kind!r}; use info or health")

    def list_actions(self, context):
        return [("info", "schema, keys, count and bounds of a dataset (JSON)"), ("health", "liveness")]

    def _flight_info(self, name: str, idx: BIndex) -> flight.FlightInfo:
        ticket = flight.Ticket(json.dumps({"op": "stream", "dataset": name}).encode())
        desc = flight.FlightDescriptor.for_path(name)
        ep = flight.FlightEndpoint(ticket, [])
        return flight.FlightInfo(idx.table.schema, desc, [ep], idx.num_rows, -1)

    def list_flights(self, context, criteria):
        for name, idx in self.indexes.items():
            yield self._flight_info(name, idx)
            if name in self._summaries:
                yield self._summary_info(name)

    @_flight_errors
    def get_flight_info(self, context, descriptor):
        if descriptor.descriptor_type != flight.DescriptorType.PATH or len(descriptor.path) != 1:
            raise BadRequest("describe a dataset by its path NAME")
        name = descriptor.path[0].decode()
        if name not in self.indexes and name.endswith(SUMMARY_SUFFIX) and name[:-len(SUMMARY_SUFFIX)] in self._summaries:
            return self._summary_info(name[:-len(SUMMARY_SUFFIX)])
        return self._flight_info(name, self._index(name))

    # -- the summarised streams ----------------------------------------------------------------------
    # ``summaries`` holds smerge.counting.summary.SummaryParams: they resolve the columns, describe the
    # stream and produce it (``smerge serve`` passes them in; this layer imports no counting code).

    def _summary_entry(self, name: str | None):
        idx = self._index(name)
        name = next(n for n, i in self.indexes.items() if i is idx) if name is None else name
        entry = self._summaries.get(name)
        if entry is None:
            raise BadRequest(f"dataset {name!r} is not served summarised; start the server with {param.summarize} COL "
                             f"{param.time} COL {param.lifetime} DUR")
        return name, entry

    def _summary_stream(self, name: str | None) -> flight.GeneratorStream:
        name, (params, length, table) = self._summary_entry(name)
        self._count()
        with self._summary_lock:  # a served dataset does not change: summarise it once, at the first request
            messages = self._summary_cache.get(name)
            if messages is None:
                messages = list(params.summarize(table.to_batches(max_chunksize=STREAM_BATCH_ROWS), table.schema))
                self._summary_cache[name] = messages
        return flight.GeneratorStream(params.summary_schema(table.schema, length), _with_metadata(messages))

    def _summary_info(self, name: str) -> flight.FlightInfo:
        params, length, table = self._summaries[name]
        ticket = flight.Ticket(json.dumps({"op": "summary", "dataset": name}).encode())
        desc = flight.FlightDescriptor.for_path(name + SUMMARY_SUFFIX)
        return flight.FlightInfo(params.summary_schema(table.schema, length), desc,
                                 [flight.FlightEndpoint(ticket, [])], -1, -1)

    def start_background(self) -> threading.Thread:
        """Serve in a daemon thread (the server already listens); stop with ``shutdown()``."""
        t = threading.Thread(target=self.serve, name="smerge-index-server", daemon=True)
        t.start()
        return t


SUMMARY_SUFFIX = ".summary"


def _prepare_summaries(indexes: Mapping[str, BIndex], summaries: Mapping) -> dict:
    """name -> (params, lifetime length in ticks, the item and time columns sorted by time)."""
    out = {}
    for name, params in summaries.items():
        if name not in indexes:
            raise UsageError(f"{param.summarize}: no dataset {name!r}; served: {', '.join(indexes)}")
        table = indexes[name].table
        length = params.resolve(table.schema, name)
        cols = table.select([params.item, params.time])
        _check_lifetime_count(cols.column(params.time), length, params.lifetime)
        out[name] = (params, length, cols.sort_by(params.time))  # Arrow's sort is stable
    return out


MAX_LIFETIME_ID = 2**62  # lifetime numbers v = floor(t / L) are int64


def _check_lifetime_count(times: pa.ChunkedArray, length: int | float, text) -> None:
    """Every time's lifetime number must be an int64: a lifetime far shorter than the times'
    magnitude (``--lifetime 1e-300`` on float times) is refused here, not found by numpy later."""
    if not isinstance(length, float) or len(times) == 0:
        return
    import pyarrow.compute as pc

    lo, hi = pc.min_max(times).values()
    top = max(abs(lo.as_py() or 0.0), abs(hi.as_py() or 0.0))
    if top / length >= MAX_LIFETIME_ID:
        raise UsageError(f"{param.lifetime} {text}: too short for times up to {top:g} (more than 2^62 lifetimes); give a "
                         f"lifetime of at least {top / MAX_LIFETIME_ID:.3g} in the time column's unit")


def _with_metadata(messages):
    """(batch, app-metadata bytes or None) -> what GeneratorStream sends."""
    for batch, meta in messages:
        yield batch if meta is None else (batch, pa.py_buffer(meta))


def _row_bytes(idx: BIndex, cols: list[str] | None) -> int:
    """Average bytes of one page row (the chosen columns + the row id), from B's buffers."""
    t = idx.table if cols is None else idx.table.select(cols)
    n = max(1, t.num_rows)
    return 8 + max(1, -(-t.nbytes // n))


def _release_after(table: pa.Table, slot: threading.BoundedSemaphore):
    """Yield ``table``'s batches, then free its large-page slot (also when the client goes away)."""
    try:
        yield from table.to_batches(max_chunksize=STREAM_BATCH_ROWS)
    finally:
        slot.release()
