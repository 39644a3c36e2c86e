"""The index server: an Arrow Flight server over one or more ``smerge.index.BIndex``.

- ``do_get(ticket)``: the ticket is a JSON query (``transport.flight_protocol``): ``range`` and
  ``symdiff`` pages (B's columns plus ``__smerge_row``; the next page's token is in the
  schema metadata ``smerge.next_token``), or ``stream`` (B in stored order).
- ``do_action("info")`` returns JSON (schema, keys, count, bounds); ``"health"`` returns ok.
- ``list_flights`` / ``get_flight_info(path NAME)`` describe the plain streams, so that
  ``grpc://host:port/NAME`` can be read like a file.

Security: binds 127.0.0.1 by default; requires a bearer token when given one, and refuses to
bind a non-loopback address without one; TLS with a certificate and key. Malformed, oversized
or unknown requests get a Flight server error whose message is one line saying what is wrong
(``extra_info`` = ``INVALID_ARGUMENT``) and the server keeps serving. Errors never carry a Python
traceback to the client (pyarrow would add one to any other exception): unexpected ones are
logged here at debug level and sent as a one-line internal error.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import secrets
import threading
from typing import Mapping

import pyarrow as pa
import pyarrow.flight as flight

from smerge.errors import SmergeError, UsageError
from smerge.index import BIndex, Box
from smerge.transport.flight_protocol import (INVALID_ARGUMENT, MAX_PAGE_ROWS, NEXT_TOKEN_KEY, BadRequest,
                                              parse_query)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8815
STREAM_BATCH_ROWS = 65536
log = logging.getLogger("smerge.serve")


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


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
            raise flight.FlightServerError(_one_line(e), extra_info=INVALID_ARGUMENT) from None
        except Exception as e:  # noqa: BLE001 - a bug or resource error: the client gets one line
            self._count(error=True)
            log.debug("%s failed", method.__name__, exc_info=True)
            raise flight.FlightInternalError(f"internal server error ({type(e).__name__}: {_one_line(e)})") from None
    return wrapper


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def new_token() -> str:
    return secrets.token_urlsafe(32)


class _AuthFactory(flight.ServerMiddlewareFactory):
    """Checks ``authorization: Bearer <token>`` on every call (constant-time comparison)."""

    def __init__(self, token: str):
        self._expected = f"Bearer {token}".encode()

    def start_call(self, info, headers):
        for v in headers.get("authorization", []):
            got = v.encode() if isinstance(v, str) else bytes(v)
            if hmac.compare_digest(got, self._expected):
                return None
        raise flight.FlightUnauthenticatedError("missing or wrong bearer token; give the server's token "
                                                "(--token-file)")


class IndexServer(flight.FlightServerBase):
    """Serves ``indexes`` (name -> BIndex). It starts listening on construction; ``serve()`` blocks."""

    def __init__(self, indexes: Mapping[str, BIndex] | BIndex, *, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                 token: str | None = None, tls_cert: bytes | None = None, tls_key: bytes | None = None,
                 max_page: int = MAX_PAGE_ROWS):
        if isinstance(indexes, BIndex):
            indexes = {indexes.name: indexes}
        if not indexes:
            raise UsageError("the server needs at least one dataset")
        if not is_loopback(host) and not token:
            raise UsageError(f"binding {host} (not a loopback address) requires a token: pass --token-file")
        if (tls_cert is None) != (tls_key is None):
            raise UsageError("TLS needs both a certificate and a key (--tls-cert and --tls-key)")
        self.indexes = dict(indexes)
        self.token = token
        self.max_page = int(max_page)
        self.tls = tls_cert is not None
        scheme = "grpc+tls" if self.tls else "grpc+tcp"
        middleware = {"auth": _AuthFactory(token)} if token else None
        try:
            super().__init__(f"{scheme}://{host}:{port}", middleware=middleware,
                             tls_certificates=[(tls_cert, tls_key)] if self.tls else None)
        except (OSError, pa.ArrowException) as e:
            raise UsageError(f"cannot listen on {host}:{port} ({str(e).splitlines()[0]}); "
                             "choose another --port or --host") from None
        connect = "127.0.0.1" if host in ("0.0.0.0", "", "localhost") else host
        connect = "[::1]" if host == "::" else connect
        self.url = f"{scheme}://{connect}:{self.port}"
        self.requests = 0
        self.errors = 0
        self._count_lock = threading.Lock()

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
            missing = [c for c in cols if c not in idx.table.schema.names]
            if missing:
                raise BadRequest(f"unknown column(s) {', '.join(missing)}; columns: {', '.join(idx.table.schema.names)}")
        if q.op == "stream":
            table = idx.table if cols is None else idx.table.select(cols)
            self._count()
            return flight.RecordBatchStream(table.to_reader(max_chunksize=STREAM_BATCH_ROWS))
        boxes = [Box(lo, hi) for lo, hi in q.boxes]
        if q.op == "range":
            page = idx.range_query(boxes[0], limit=q.limit, token=q.token)
        else:
            page = idx.symdiff_query(boxes[0], boxes[1], limit=q.limit, token=q.token)
        table = idx.take(page.rows, cols)
        meta = {NEXT_TOKEN_KEY: (page.next_token or "").encode()}
        table = table.replace_schema_metadata(meta)
        self._count()
        return flight.RecordBatchStream(table)

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

    @_flight_errors
    def get_flight_info(self, context, descriptor):
        if descriptor.descriptor_type != flight.DescriptorType.PATH or len(descriptor.path) != 1:
            raise BadRequest("describe a dataset by its path NAME")
        name = descriptor.path[0].decode()
        return self._flight_info(name, self._index(name))

    def start_background(self) -> threading.Thread:
        """Serve in a daemon thread (the server already listens); stop with ``shutdown()``."""
        t = threading.Thread(target=self.serve, name="smerge-index-server", daemon=True)
        t.start()
        return t


def read_token_file(path: str) -> str:
    try:
        with open(path) as f:
            token = f.read().strip()
    except OSError as e:
        raise UsageError(f"--token-file {path}: cannot be read ({e.strerror})") from None
    if len(token) < 8:
        raise UsageError(f"--token-file {path}: the token must be at least 8 characters")
    return token
