"""Who may reach an index server: bearer tokens, token files and loopback addresses.

A token travels in every request's headers: printable ASCII without spaces, 8 to
``MAX_TOKEN_CHARS`` characters. A token file is read with a size cap and refused when every user
of the machine may read it and the server listens beyond loopback. No Flight import here: the
clients (``grpc://`` inputs, ``smerge rtm --server``) read their token here too.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import stat

from smerge.errors import UsageError, param, render
from smerge.transport.flight_protocol import MAX_TOKEN_CHARS

MAX_TOKEN_FILE_BYTES = MAX_TOKEN_CHARS + 256  # the token and white space around it


def new_token() -> str:
    """A fresh random token (43 URL-safe characters)."""
    return secrets.token_urlsafe(32)


def bare_host(host: str) -> str:
    """``[::1]`` -> ``::1`` (IPv6 literals may come bracketed)."""
    h = host.strip()
    return h[1:-1] if h.startswith("[") and h.endswith("]") else h


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback interface (a token is optional there)."""
    host = bare_host(host)
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_token(token: str, where: str = "the token") -> str:
    """A bearer token must travel in an HTTP header: printable ASCII, no spaces, 8 to
    ``MAX_TOKEN_CHARS`` characters (a client's request headers must stay under the gate's limit)."""
    if len(token) < 8:
        raise UsageError(f"{where}: the token must be at least 8 characters")
    if len(token) > MAX_TOKEN_CHARS:
        raise UsageError(f"{where}: the token has {len(token):,} characters; use at most {MAX_TOKEN_CHARS:,} "
                         "(a client could not send a longer one)")
    bad = next((c for c in token if not 0x21 <= ord(c) <= 0x7E), None)
    if bad is not None:
        raise UsageError(f"{where}: the token has the character {bad!r}; use printable ASCII without spaces "
                         "(a client could not send it)")
    return token




def read_token_file(path: str, what: str = param.token_file) -> str:
    """The token in ``path`` (surrounding white space removed). At most ``MAX_TOKEN_FILE_BYTES``
    are read: a longer file is refused, never read whole."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_TOKEN_FILE_BYTES + 1)
    except OSError as e:
        raise UsageError(f"{what} {path}: cannot be read ({e.strerror})") from None
    if len(raw) > MAX_TOKEN_FILE_BYTES:
        raise UsageError(f"{what} {path}: longer than {MAX_TOKEN_FILE_BYTES:,} bytes; a token is at most "
                         f"{MAX_TOKEN_CHARS:,} characters")
    try:
        token = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise UsageError(f"{what} {path}: not text; the token must be printable ASCII") from None
    return check_token(token, f"{what} {path}")


def token_file_exposure(path: str, host: str) -> str | None:
    """The rule for a token file every user of this machine may read: refused (``UsageError``)
    when serving beyond loopback, else a one-line warning to print (None: the file is private)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if not mode & stat.S_IROTH:
        return None
    if not is_loopback(host):
        raise UsageError(f"{param.token_file} {path} is readable by every user of this machine and {param.host} {host} "
                         f"is not a loopback address; run chmod 600 {path}")
    return render(f"smerge serve: warning: {param.token_file} {path} is readable by every user of this machine; "
                  f"run chmod 600 {path}")
