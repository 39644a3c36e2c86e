"""What keeps an index server private: its folder, TLS and the bearer-token check.

The Flight server listens on a Unix socket inside a private folder (mode 0700, named after its
owner as temporary outputs are: ``smerge-serve-<host>-<pid>-<random>``), so only this user
reaches it directly; clients come through the gate (``transport.flight_gate``), which terminates
TLS with the context built here. Every call is checked for the bearer token (constant-time) by
the middleware here, which also refuses the Flight methods the server does not offer.
"""

from __future__ import annotations

import hmac
import os
import re
import shutil
import ssl
import tempfile

import pyarrow.flight as flight

from smerge.errors import OutputError, UsageError, param
from smerge.transport.flight_protocol import INVALID_ARGUMENT, one_line
from smerge.transport.tokens import check_token

WORKDIR_PREFIX = "smerge-serve-"
MAX_UNIX_PATH = 107  # bytes of a Unix socket's path (sun_path holds 108 with the final NUL)
_WORKDIR_RE = re.compile(r"^smerge-serve-(?P<host>[0-9a-f]{10})-(?P<pid>\d+)-[A-Za-z0-9_]+$")


def make_workdir() -> str:
    """The server's private folder (mode 0700) in the temporary directory, named after its owner
    (``smerge-serve-<host>-<pid>-<random>``, the owner tag of ``datasets.output_staging``), after
    removing the folders of servers that were killed (owner provably gone)."""
    from smerge.datasets.output_staging import host_tag

    sweep_workdirs()
    try:
        return tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{host_tag()}-{os.getpid()}-")
    except OSError as e:
        raise OutputError(f"cannot create the server's folder in {tempfile.gettempdir()} "
                          f"({e.strerror or one_line(e)}); free space there or set TMPDIR to another "
                          "directory") from None


def sweep_workdirs(directory: str | None = None) -> list[str]:
    """Remove this user's server folders in ``directory`` (default: the temporary directory)
    whose server provably no longer runs; returns their paths. Best effort."""
    from smerge.datasets.output_staging import owner_pid_gone

    directory = directory or tempfile.gettempdir()
    removed = []
    try:
        entries = [e for e in os.scandir(directory) if e.name.startswith(WORKDIR_PREFIX)]
    except OSError:
        return removed
    for e in entries:
        m = _WORKDIR_RE.match(e.name)
        try:
            if (not m or not e.is_dir(follow_symlinks=False) or e.stat(follow_symlinks=False).st_uid != os.getuid()
                    or not owner_pid_gone(m.group("host"), int(m.group("pid")))):
                continue
            shutil.rmtree(e.path)
            removed.append(e.path)
        except OSError:
            pass
    return removed


def tls_context(cert: bytes, key: bytes, workdir: str) -> ssl.SSLContext:
    """A server TLS context (ALPN h2) from PEM bytes; one line saying what is wrong otherwise."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["h2"])
    cert_path, key_path = os.path.join(workdir, "cert.pem"), os.path.join(workdir, "key.pem")
    try:
        for path, data in ((cert_path, cert), (key_path, key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
    except OSError as e:
        raise OutputError(f"TLS: cannot write the certificate into the server's folder {workdir} "
                          f"({e.strerror or one_line(e)}); free space there or set TMPDIR") from None
    try:
        try:
            ctx.load_cert_chain(cert_path, key_path)
        except ssl.SSLError as e:
            reason = (e.reason or str(e)).replace("_", " ").lower()
            if "key values mismatch" in reason:
                what = "the key does not belong to the certificate"
            elif "no start line" in reason or "pem lib" in reason or "bad base64" in reason:
                what = "the certificate or the key is not a PEM file"
            else:
                what = reason
            raise UsageError(f"TLS: {what} ({e.reason or 'invalid'}); pass a PEM certificate with {param.tls_cert} "
                             f"and its private key with {param.tls_key}") from None
    finally:
        for path in (cert_path, key_path):
            try:
                os.unlink(path)
            except OSError:
                pass
    return ctx



_UNSUPPORTED = {flight.FlightMethod.GET_SCHEMA: "get_schema", flight.FlightMethod.DO_PUT: "do_put",
                flight.FlightMethod.DO_EXCHANGE: "do_exchange"}


class AuthFactory(flight.ServerMiddlewareFactory):
    """Checks ``authorization: Bearer <token>`` on every call (constant-time comparison) when
    given a token, then refuses the Flight methods the server does not offer in one line (here,
    before the handler: pyarrow would append a Python traceback to a get_schema error)."""

    def __init__(self, token: str | None):
        self._expected = f"Bearer {check_token(token)}".encode() if token is not None else None

    def start_call(self, info, headers):
        if self._expected is not None:
            ok = False
            for v in headers.get("authorization", []):
                got = v.encode() if isinstance(v, str) else bytes(v)
                ok |= hmac.compare_digest(got, self._expected)
            if not ok:
                # plain words: the message crosses the wire, where a parameter reference (param.X)
                # would reach the client unrendered
                raise flight.FlightUnauthenticatedError("missing or wrong bearer token; give the client the "
                                                        "server's token")
        name = _UNSUPPORTED.get(info.method)
        if name is not None:
            raise flight.FlightServerError(f"{name} is not supported by the smerge index server; use do_get, "
                                           "do_action (info, health) or get_flight_info", extra_info=INVALID_ARGUMENT)
        return None
