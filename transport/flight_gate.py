"""The index server's front door: a TCP (or TLS) listener that forwards HTTP/2 to the Flight
server on a private Unix socket and refuses oversized requests *before* gRPC buffers them.

Why: pyarrow's Flight server lifts gRPC's receive-message limit and offers no way to set it
(no gRPC server options in Python), and gRPC reads a whole request message before the server's
middleware (the token check) runs. So a 512 MB unauthenticated ticket would be buffered in full.
The gate reads only the 9-byte HTTP/2 frame headers of what clients send (no HPACK, no payload
parsing) and closes the connection as soon as one call's request (headers + data) passes
``MAX_CALL_REQUEST_BYTES``, a connection's unfinished requests pass ``MAX_PENDING_BYTES`` or
``MAX_OPEN_REQUESTS``, or more than ``MAX_CONNECTIONS`` are open. What the server sends back is
forwarded unchanged, with back-pressure (a client that reads nothing holds at most a few socket
buffers here).

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
HANDSHAKE_TIMEOUT = 10.0  # seconds for a TLS handshake
READ_CHUNK = 256 * 1024
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_DATA, _HEADERS, _RST_STREAM, _CONTINUATION = 0x0, 0x1, 0x3, 0x9
_END_STREAM = 0x1


class Refused(Exception):
    """A client broke a transport limit; its connection is closed."""


class RequestLimiter:
    """Follows the HTTP/2 frames a client sends (headers only) and enforces the request limits."""

    def __init__(self, *, max_call: int = MAX_CALL_REQUEST_BYTES, max_pending: int = MAX_PENDING_BYTES,
                 max_open: int = MAX_OPEN_REQUESTS):
        self.max_call, self.max_pending, self.max_open = max_call, max_pending, max_open
        self._preface = len(PREFACE)
        self._head = b""
        self._skip = 0
        self._open: dict[int, int] = {}  # stream id -> request bytes so far
        self._pending = 0
        self._last_headers = 0  # stream of the last HEADERS frame (CONTINUATION follows it)

    def feed(self, data: bytes) -> None:
        """Account for ``data`` (the next bytes from the client); raise ``Refused`` on a breach."""
        i, n = 0, len(data)
        if self._preface:
            take = min(self._preface, n)
            start = len(PREFACE) - self._preface
            if data[:take] != PREFACE[start:start + take]:
                raise Refused("not an HTTP/2 client")
            i, self._preface = take, self._preface - take
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
        elif kind == _RST_STREAM:
            self._pending -= self._open.pop(sid, 0)


def _bind_address(host: str) -> str:
    h = host.strip()
    if h.startswith("[") and h.endswith("]"):
        h = h[1:-1]
    return h


class Gate:
    """Listens on ``host:port`` and forwards each connection to the Unix socket ``upstream``."""

    def __init__(self, host: str, port: int, upstream: str, *, ssl_context: ssl.SSLContext | None = None):
        self.upstream = upstream
        self.ssl_context = ssl_context
        self.refused = 0
        self._conns: set[asyncio.Transport] = set()
        self._clients: set[asyncio.Transport] = set()
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
                                          reuse_address=True, limit=READ_CHUNK, **kw)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        transport = writer.transport
        if len(self._clients) >= MAX_CONNECTIONS:
            transport.abort()
            return
        self._conns.add(transport)
        self._clients.add(transport)
        up_writer = None
        try:
            try:
                up_reader, up_writer = await asyncio.open_unix_connection(self.upstream, limit=READ_CHUNK)
            except OSError:
                return
            self._conns.add(up_writer.transport)
            limiter = RequestLimiter()

            async def client_to_server():
                while True:
                    data = await reader.read(READ_CHUNK)
                    if not data:
                        break
                    limiter.feed(data)
                    up_writer.write(data)
                    await up_writer.drain()
                if up_writer.can_write_eof():
                    up_writer.write_eof()

            async def server_to_client():
                while True:
                    data = await up_reader.read(READ_CHUNK)
                    if not data:
                        break
                    writer.write(data)
                    await writer.drain()

            to_server = asyncio.ensure_future(client_to_server())
            to_client = asyncio.ensure_future(server_to_client())
            try:
                done, _ = await asyncio.wait([to_server, to_client], return_when=asyncio.FIRST_COMPLETED)
                if to_server in done:
                    to_server.result()  # the client half-closed: let the server finish its answers
                    await to_client
                to_client.result()
            except Refused:
                self.refused += 1
            except (OSError, ssl.SSLError, asyncio.IncompleteReadError):
                pass
            finally:
                to_server.cancel()
                to_client.cancel()
        except asyncio.CancelledError:
            pass  # the gate is closing: end quietly (asyncio would log a cancelled handler as an error)
        finally:
            transport.abort()
            self._conns.discard(transport)
            self._clients.discard(transport)
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
