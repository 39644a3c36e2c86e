"""The index server's front door: a TCP (or TLS) listener that forwards HTTP/2 to the Flight
server on a private Unix socket and refuses oversized requests *before* gRPC buffers them.

Why: pyarrow's Flight server lifts gRPC's receive-message limit and offers no way to set it
(no gRPC server options in Python), and gRPC reads a whole request message before the server's
middleware (the token check) runs. So a 512 MB unauthenticated ticket would be buffered in full.
The gate reads only the 9-byte HTTP/2 frame headers of what clients send (no HPACK, no payload
parsing) and closes the connection as soon as one call's request (headers + data) passes
``MAX_CALL_REQUEST_BYTES``, a connection's unfinished requests pass ``MAX_PENDING_BYTES`` or
``MAX_OPEN_REQUESTS``. What the server sends back is forwarded unchanged (its frame headers are
followed to know which calls are being answered), with back-pressure (a client that reads
nothing holds at most a few socket buffers here).

Connections are admitted and kept by these rules (idle connections cannot lock the server out):

- at most ``MAX_CONNECTIONS`` open, at most ``MAX_PER_ADDRESS`` from one client address; a
  connection beyond either limit is closed at once, unless a connection of that address (or,
  at the server's limit, any) has been open ``EVICT_AFTER`` s without finishing a request: the
  oldest such one is closed instead (a real client sends its request as soon as it connects);
- ``FIRST_REQUEST_TIMEOUT``: a connection must finish its first request (headers and body)
  within this many seconds of being accepted (after the TLS handshake, which has
  ``HANDSHAKE_TIMEOUT``), else it is closed;
- ``IDLE_TIMEOUT``: a connection with no call being answered and no bytes either way for this
  many seconds is closed (a gRPC client reconnects on its next call);
- the connection to the Flight server is opened only when the client has sent its first bytes.

It also owns the listening socket: IPv4, IPv6 (``::1``, ``::``, ``[::1]``), the TLS handshake
(Python's ``ssl``, ALPN ``h2``) and, at shutdown, ``abort_all()`` drops every connection, which
makes gRPC cancel the calls still running (a client that stalls cannot hold the server).

All I/O runs on one asyncio event loop in a daemon thread.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading

MAX_CALL_REQUEST_BYTES = 256 * 1024  # HTTP/2 HEADERS + DATA bytes of one call's request
MAX_PENDING_BYTES = 1024 * 1024  # bytes of a connection's requests not finished yet
MAX_OPEN_REQUESTS = 128  # calls of one connection whose request is not finished yet
MAX_CONNECTIONS = 256
MAX_PER_ADDRESS = 64  # open connections from one client address
EVICT_AFTER = 1.0  # seconds without a finished request after which a connection may make room
HANDSHAKE_TIMEOUT = 10.0  # seconds for a TLS handshake
FIRST_REQUEST_TIMEOUT = 5.0  # seconds from accept (after TLS) to the end of the first request
IDLE_TIMEOUT = 60.0  # seconds without a call being answered nor a byte either way
READ_CHUNK = 256 * 1024
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_DATA, _HEADERS, _RST_STREAM, _CONTINUATION = 0x0, 0x1, 0x3, 0x9
_END_STREAM = 0x1


class Refused(Exception):
    """A client broke a transport limit; its connection is closed."""


class Expired(Exception):
    """A connection sent no complete request in time, or stayed idle too long; it is closed."""


class FrameReader:
    """Follows a stream of HTTP/2 frames by their 9-byte headers (payloads are skipped, never
    parsed); ``_frame`` sees each header. ``preface``: bytes the stream must start with."""

    def __init__(self, preface: bytes = b""):
        self._preface = preface
        self._seen = 0
        self._head = b""
        self._skip = 0

    def feed(self, data: bytes) -> None:
        i, n = 0, len(data)
        if self._seen < len(self._preface):
            take = min(len(self._preface) - self._seen, n)
            if data[:take] != self._preface[self._seen:self._seen + take]:
                raise Refused("not an HTTP/2 client")
            i, self._seen = take, self._seen + take
        while i < n:
            if self._skip:
                t = min(self._skip, n - i)
                i += t
                self._skip -= t
                continue
            need = 9 - len(self._head)
            self._head += data[i:i + need]
            i += need
            if len(self._head) < 9:
                return
            head, self._head = self._head, b""
            length = int.from_bytes(head[0:3], "big")
            self._skip = length
            self._frame(head[3], head[4], int.from_bytes(head[5:9], "big") & 0x7FFFFFFF, length)

    def _frame(self, kind: int, flags: int, sid: int, length: int) -> None:
        raise NotImplementedError


class RequestLimiter(FrameReader):
    """Follows the HTTP/2 frames a client sends (headers only) and enforces the request limits.
    ``finished``: requests sent whole; ``answering``: calls whose request is whole and whose
    answer has not ended (``ResponseTracker`` ends them)."""

    def __init__(self, *, max_call: int = MAX_CALL_REQUEST_BYTES, max_pending: int = MAX_PENDING_BYTES,
                 max_open: int = MAX_OPEN_REQUESTS):
        super().__init__(PREFACE)
        self.max_call, self.max_pending, self.max_open = max_call, max_pending, max_open
        self._open: dict[int, int] = {}  # stream id -> request bytes so far
        self._pending = 0
        self._last_headers = 0  # stream of the last HEADERS frame (CONTINUATION follows it)
        self.finished = 0
        self.answering: set[int] = set()
        self.ended_early: set[int] = set()  # answered before their request was whole

    def _frame(self, kind: int, flags: int, sid: int, length: int) -> None:
        if kind == _CONTINUATION:
            sid = self._last_headers
        if kind in (_DATA, _HEADERS, _CONTINUATION):
            if kind == _HEADERS:
                self._last_headers = sid
                if sid not in self._open and len(self._open) >= self.max_open:
                    raise Refused(f"more than {self.max_open} unfinished requests on one connection")
            used = self._open.get(sid, 0) + length
            if used > self.max_call:
                raise Refused(f"a request of more than {self.max_call} bytes")
            self._pending += length
            if self._pending > self.max_pending:
                raise Refused(f"more than {self.max_pending} bytes of unfinished requests")
            self._open[sid] = used
            if kind != _CONTINUATION and flags & _END_STREAM:
                self._pending -= self._open.pop(sid)
                self.finished += 1
                if sid in self.ended_early:
                    self.ended_early.discard(sid)
                else:
                    self.answering.add(sid)
        elif kind == _RST_STREAM:
            self._pending -= self._open.pop(sid, 0)
            self.answering.discard(sid)
            self.ended_early.discard(sid)


class ResponseTracker(FrameReader):
    """Follows the server's frames: a stream it ends (END_STREAM or RST_STREAM) is no longer
    being answered."""

    def __init__(self, requests: RequestLimiter):
        super().__init__()
        self.requests = requests

    def _frame(self, kind: int, flags: int, sid: int, length: int) -> None:
        if sid and (kind == _RST_STREAM or kind in (_DATA, _HEADERS) and flags & _END_STREAM):
            rq = self.requests
            if sid in rq.answering:
                rq.answering.discard(sid)
            elif sid in rq._open and len(rq.ended_early) < rq.max_open:
                rq.ended_early.add(sid)


class _Conn:
    """One client connection's bookkeeping (event-loop thread only)."""

    __slots__ = ("transport", "address", "start", "last", "limiter")

    def __init__(self, transport: asyncio.BaseTransport, address: str, now: float):
        self.transport, self.address, self.start, self.last = transport, address, now, now
        self.limiter = RequestLimiter()


def _bind_address(host: str) -> str:
    h = host.strip()
    if h.startswith("[") and h.endswith("]"):
        h = h[1:-1]
    return h


class Gate:
    """Listens on ``host:port`` and forwards each connection to the Unix socket ``upstream``."""

    def __init__(self, host: str, port: int, upstream: str, *, ssl_context: ssl.SSLContext | None = None,
                 max_connections: int | None = None, max_per_address: int | None = None,
                 first_request_timeout: float | None = None, idle_timeout: float | None = None,
                 evict_after: float | None = None):
        """Limits left out take the module's constants (read now, so that tests may change them)."""
        pick = lambda v, d: d if v is None else v  # noqa: E731
        self.upstream = upstream
        self.ssl_context = ssl_context
        self.max_connections = pick(max_connections, MAX_CONNECTIONS)
        self.max_per_address = pick(max_per_address, MAX_PER_ADDRESS)
        self.first_request_timeout = pick(first_request_timeout, FIRST_REQUEST_TIMEOUT)
        self.idle_timeout = pick(idle_timeout, IDLE_TIMEOUT)
        self.evict_after = pick(evict_after, EVICT_AFTER)
        self.refused = 0  # connections closed for breaking a request or connection limit
        self.expired = 0  # connections closed by the first-request deadline or the idle timeout
        self._conns: set[asyncio.BaseTransport] = set()
        self._clients: dict[asyncio.BaseTransport, _Conn] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="smerge-serve-gate", daemon=True)
        self._thread.start()
        try:
            self._server = asyncio.run_coroutine_threadsafe(self._listen(_bind_address(host), port),
                                                            self._loop).result()
        except BaseException:
            self._stop_loop()
            raise
        self.port = self._server.sockets[0].getsockname()[1]

    async def _listen(self, host: str, port: int):
        family = socket.AF_INET6 if ":" in host else socket.AF_UNSPEC
        kw = {"ssl_handshake_timeout": HANDSHAKE_TIMEOUT} if self.ssl_context is not None else {}
        return await asyncio.start_server(self._handle, host or None, port, family=family, ssl=self.ssl_context,
                                          reuse_address=True, limit=READ_CHUNK, backlog=512, **kw)

    def _admit(self, conn: _Conn) -> bool:
        """Room for ``conn`` under the connection limits (see the module doc), making room by
        closing the oldest connection that has sent no whole request for ``evict_after`` s."""
        same = [c for c in self._clients.values() if c.address == conn.address]
        if len(same) >= self.max_per_address:
            pool = same
        elif len(self._clients) >= self.max_connections:
            pool = list(self._clients.values())
        else:
            return True
        stale = [c for c in pool if not c.limiter.finished and conn.start - c.start >= self.evict_after]
        if not stale:
            return False
        victim = min(stale, key=lambda c: c.start)
        self._clients.pop(victim.transport, None)
        victim.transport.abort()
        self.expired += 1
        return True

    async def _watch(self, conn: _Conn) -> None:
        """Raise ``Expired`` when the connection misses its first-request deadline or idles."""
        while True:
            now = self._loop.time()
            if not conn.limiter.finished:
                wait = conn.start + self.first_request_timeout - now
                why = f"no whole request within {self.first_request_timeout:g} s"
            elif not conn.limiter.answering:
                wait = conn.last + self.idle_timeout - now
                why = f"idle for {self.idle_timeout:g} s"
            else:
                wait = self.idle_timeout
            if wait <= 0:
                raise Expired(why)
            await asyncio.sleep(wait)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        transport = writer.transport
        peer = writer.get_extra_info("peername")
        conn = _Conn(transport, str(peer[0]) if isinstance(peer, tuple) and peer else "?", self._loop.time())
        if not self._admit(conn):
            self.refused += 1
            transport.abort()
            return
        self._conns.add(transport)
        self._clients[transport] = conn
        limiter = conn.limiter
        tracker = ResponseTracker(limiter)
        up_writer = None
        watch = asyncio.ensure_future(self._watch(conn))
        try:
            async def client_to_server():
                nonlocal up_writer
                data = await reader.read(READ_CHUNK)  # the Flight server is reached once the client speaks
                if not data:
                    return
                conn.last = self._loop.time()
                limiter.feed(data)
                try:
                    up_reader, up_writer = await asyncio.open_unix_connection(self.upstream, limit=READ_CHUNK)
                except OSError:
                    return
                self._conns.add(up_writer.transport)
                to_client = asyncio.ensure_future(server_to_client(up_reader))
                try:
                    while data:
                        up_writer.write(data)
                        await up_writer.drain()
                        data = await reader.read(READ_CHUNK)
                        conn.last = self._loop.time()
                        limiter.feed(data)
                    if up_writer.can_write_eof():
                        up_writer.write_eof()
                    await to_client  # the client half-closed: let the server finish its answers
                finally:
                    to_client.cancel()

            async def server_to_client(up_reader):
                while True:
                    data = await up_reader.read(READ_CHUNK)
                    if not data:
                        break
                    conn.last = self._loop.time()
                    tracker.feed(data)
                    writer.write(data)
                    await writer.drain()
                transport.abort()  # the server closed: so does the client's connection

            pump = asyncio.ensure_future(client_to_server())
            try:
                done, _ = await asyncio.wait([pump, watch], return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    t.result()
            except Refused:
                self.refused += 1
            except Expired:
                self.expired += 1
            except (OSError, ssl.SSLError, asyncio.IncompleteReadError):
                pass
            finally:
                pump.cancel()
        except asyncio.CancelledError:
            pass  # the gate is closing: end quietly (asyncio would log a cancelled handler as an error)
        finally:
            watch.cancel()
            transport.abort()
            self._conns.discard(transport)
            if self._clients.get(transport) is conn:
                del self._clients[transport]
            if up_writer is not None:
                up_writer.transport.abort()
                self._conns.discard(up_writer.transport)

    # -- control (from any thread) ----------------------------------------------------------------

    def stop_listening(self) -> None:
        """Accept no new connections (open ones go on)."""
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._server.close)

    def abort_all(self) -> int:
        """Drop every open connection (the server cancels their calls); returns how many."""
        if not self._loop.is_running():
            return 0
        done = threading.Event()
        count = [0]

        def abort():
            conns = list(self._conns)
            count[0] = len(self._clients)
            for c in conns:
                c.abort()
            done.set()

        self._loop.call_soon_threadsafe(abort)
        done.wait(5)
        return count[0]

    def close(self) -> None:
        self.stop_listening()
        self.abort_all()
        self._stop_loop()

    async def _cancel_tasks(self) -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _stop_loop(self) -> None:
        if self._loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(self._cancel_tasks(), self._loop).result(5)
            except Exception:  # noqa: BLE001 - best effort: the loop stops anyway
                pass
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
        if not self._loop.is_running() and not self._loop.is_closed():
            self._loop.close()
