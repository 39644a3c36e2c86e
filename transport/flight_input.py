"""Flight input backend: ``grpc://HOST:PORT/NAME`` (or ``grpc+tls://``) read as an input stream.

The input is the plain stream of dataset NAME served by ``smerge serve`` (the seeds' data-server
streams): B's records in stored order, as Arrow record batches. Default keys are the server's
index keys (its ``info``); ``--keys``/``--vars`` pick columns as for a Parquet file, and only
those columns travel. NAME may be omitted when the server serves one dataset.

Credentials come from the environment (no command-line option, so that every command takes
such inputs unchanged): ``SMERGE_TOKEN_FILE`` names a file holding the bearer token
(``SMERGE_TOKEN`` gives it directly), ``SMERGE_TLS_ROOT_CERT`` a PEM file of trusted
certificates for ``grpc+tls``. ``pyarrow.flight`` is imported only through
``smerge.transport.flight_client``, when such an input is opened.

The readers' registry (``smerge.datasets.base``) imports no transport code: it finds this
backend through the ``smerge.backends`` entry point (setup.cfg), when no built-in reader claims
an input, so any command and ``smerge.datasets.open_input`` read such URLs.

``batches(start, stop)`` re-reads the stream from its first record and skips to ``start`` (the
server's stream has no offset): fine for one pass, O(start) for later row ranges.
"""

from __future__ import annotations

import os
from typing import Iterator, Sequence
from urllib.parse import urlsplit

import pyarrow as pa

from smerge.datasets.base import DEFAULT_BATCH_ROWS, SERVER_SCHEMES, InputSource
from smerge.datasets.tabular import rebatch, resolve_columns, sliced
from smerge.errors import UsageError
from smerge.transport.tokens import read_token_file

TOKEN_FILE_ENV = "SMERGE_TOKEN_FILE"
TOKEN_ENV = "SMERGE_TOKEN"
TLS_ROOT_CERT_ENV = "SMERGE_TLS_ROOT_CERT"


def is_flight_url(path: str) -> bool:
    """Whether ``path`` names a server stream rather than a file."""
    return "://" in path and path.split("://", 1)[0].lower() in SERVER_SCHEMES


def credentials() -> tuple[str | None, bytes | None]:
    """(bearer token, TLS root certificates) from the environment (see the module doc)."""
    token = os.environ.get(TOKEN_ENV) or None
    path = os.environ.get(TOKEN_FILE_ENV)
    if path:
        token = read_token_file(path)
    certs = None
    cert_path = os.environ.get(TLS_ROOT_CERT_ENV)
    if cert_path:
        try:
            with open(cert_path, "rb") as f:
                certs = f.read()
        except OSError as e:
            raise UsageError(f"{TLS_ROOT_CERT_ENV}={cert_path}: cannot be read ({e.strerror})") from None
    return token, certs


class FlightBackend:
    """The reader of a server's plain stream (registered through the ``smerge.backends`` entry point)."""

    name = "flight"
    extensions: tuple[str, ...] = ()

    def guess_can_open(self, path: str, magic: bytes) -> bool:
        return is_flight_url(path)

    def open(self, path: str, *, keys: Sequence[str] | None = None, variables: Sequence[str] | None = None,
             batch_rows: int = DEFAULT_BATCH_ROWS, decode_times: bool = False) -> InputSource:
        from smerge.transport.flight_client import IndexClient

        if urlsplit(path).query or urlsplit(path).fragment:
            raise UsageError(f"{path}: a server stream is grpc://HOST:PORT/NAME, without ?query or #fragment")
        token, certs = credentials()
        client = IndexClient(path, token=token, tls_root_certs=certs)
        try:
            info = client.info()
            file_schema = client.schema()
        except BaseException:
            client.close()
            raise
        if client.dataset is None:
            client.dataset = info["name"]
        schema, columns, key_names = resolve_columns(path, file_schema, keys or tuple(info["keys"]), variables)
        count = int(info["count"])

        def batches(start: int = 0, stop: int | None = None) -> Iterator[pa.RecordBatch]:
            yield from sliced(rebatch(client.stream(columns), batch_rows), start, stop, schema)

        return InputSource(path=path, format=self.name, schema=schema, keys=key_names, num_rows=count,
                           outer_size=count, inner_size=1, open_batches=batches)
