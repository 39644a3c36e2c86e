"""Inputs on object stores and HTTP (``s3://``, ``gs://``, ``az://``, ``https://``) through fsspec.

Read in this process by byte ranges (Parquet row groups, HDF5 chunks, Zarr chunks), never
copied whole. Spark's own URLs (``s3a://``, ``hdfs://``) stay with Spark's readers.

Credentials are found where each client looks for them: for S3 (s3fs/botocore) the environment
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_PROFILE``),
``~/.aws/credentials`` and ``~/.aws/config``, then the instance's role; ``AWS_ENDPOINT_URL``
(or ``AWS_ENDPOINT_URL_S3``) names an S3-compatible server. GCS (gcsfs) uses the application
default credentials, Azure (adlfs) ``AZURE_STORAGE_*``. ``SMERGE_ANON=1`` reads public buckets
without credentials. Every request has a connect and read timeout (``SMERGE_REMOTE_TIMEOUT``
seconds, default 20) and few retries, so an unreachable endpoint is an error, not a hang.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache

from smerge.errors import InputError

REMOTE_SCHEMES = ("s3", "gs", "gcs", "az", "abfs", "abfss", "http", "https")
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_EXTRA = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs", "abfss": "adlfs",
          "http": "aiohttp", "https": "aiohttp"}


def scheme(path: str) -> str | None:
    m = _URL.match(path)
    return m.group(1).lower() if m else None


def is_remote(path: str) -> bool:
    """A URL read in this process through fsspec (not Spark's s3a://, hdfs://, ...)."""
    return scheme(path) in REMOTE_SCHEMES


def anonymous() -> bool:
    return os.environ.get("SMERGE_ANON", "").strip().lower() in ("1", "true", "yes", "on")


def timeout() -> float:
    try:
        return max(1.0, float(os.environ.get("SMERGE_REMOTE_TIMEOUT", "20")))
    except ValueError:
        return 20.0


def endpoint() -> str | None:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def storage_options(path: str) -> dict:
    """The fsspec options for ``path``: anonymous access, an S3-compatible endpoint, timeouts."""
    s = scheme(path)
    t = timeout()
    if s == "s3":
        opts: dict = {"anon": anonymous(),
                      "config_kwargs": {"connect_timeout": t, "read_timeout": t,
                                        "retries": {"max_attempts": 2, "mode": "standard"}}}
        if endpoint():
            opts["client_kwargs"] = {"endpoint_url": endpoint()}
        return opts
    if s in ("gs", "gcs"):
        return {"token": "anon"} if anonymous() else {}
    if s in ("az", "abfs", "abfss"):
        return {"anon": True} if anonymous() else {}
    return {}


def filesystem(path: str):
    """``(fs, path_in_fs)`` for a remote URL."""
    import fsspec

    try:
        return fsspec.core.url_to_fs(path, **storage_options(path))
    except ImportError as e:
        pkg = _EXTRA.get(scheme(path) or "", "fsspec")
        raise InputError(f"{path}: reading {scheme(path)}:// needs the Python package {pkg} ({e}); "
                         f"install it (pip install {pkg}, or smerge's [cloud] extra)") from None


def where_credentials() -> str:
    return ("AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, ~/.aws/credentials, ~/.aws/config and the "
            "instance role" + (f", endpoint {endpoint()}" if endpoint() else ""))


def error(path: str, e: BaseException) -> InputError:
    """One line for a failed remote read: credentials, bucket, key or endpoint."""
    names = {c.__name__ for c in type(e).__mro__}
    text = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
    bucket = path.split("://", 1)[-1].split("/", 1)[0]
    s = scheme(path)
    if names & {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"}:
        return InputError(f"{path}: no credentials for bucket {bucket!r} (looked in {where_credentials()}); "
                          "set them, or read a public bucket with SMERGE_ANON=1")
    if names & {"EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError",
                "ClientConnectorError", "ServerTimeoutError", "TimeoutError", "ConnectionError"} \
            or "Could not connect" in text or "timed out" in text.lower():
        where = endpoint() if s == "s3" and endpoint() else f"the {s}:// service"
        return InputError(f"{path}: cannot reach {where} within {timeout():.0f} s ({text}); check the endpoint "
                          "(AWS_ENDPOINT_URL) and the network, or raise SMERGE_REMOTE_TIMEOUT")
    if isinstance(e, PermissionError) or names & {"ClientError"} and ("AccessDenied" in text or "Forbidden" in text
                                                                      or "InvalidAccessKeyId" in text
                                                                      or "SignatureDoesNotMatch" in text):
        return InputError(f"{path}: access to bucket {bucket!r} denied ({text}); check the credentials (looked in "
                          f"{where_credentials()}), or read a public bucket with SMERGE_ANON=1")
    if isinstance(e, FileNotFoundError) or "NoSuchBucket" in text or "NoSuchKey" in text:
        if "NoSuchBucket" in text or "bucket does not exist" in text.lower() or not bucket_exists(path):
            return InputError(f"{path}: no bucket {bucket!r} at {endpoint() or s + '://'}; check the URL")
        return InputError(f"{path}: no such key in bucket {bucket!r}; check the path")
    return InputError(f"{path}: cannot read ({text}); check the URL and the credentials")


def bucket_exists(path: str) -> bool:
    fs, p = filesystem(path)
    bucket = p.split("/", 1)[0]
    try:
        return bool(fs.exists(bucket))
    except Exception:  # noqa: BLE001 - asked only to word an error
        return True


def open_file(path: str, mode: str = "rb", *, block_size: int = 4 << 20):
    """A file object for ``path`` (local: the built-in ``open``), for byte-range reads."""
    if not is_remote(path):
        return open(path, mode)
    fs, p = filesystem(path)
    try:
        return fs.open(p, mode, block_size=block_size)
    except Exception as e:  # noqa: BLE001 - every client error becomes one line
        raise error(path, e) from None


def source(path: str):
    """What pyarrow's readers take: a local path, or a seekable file over byte ranges."""
    return open_file(path) if is_remote(path) else path


@lru_cache(maxsize=256)
def _kind(path: str) -> tuple[str, bytes]:
    from smerge.datasets.base import MAGIC_BYTES, ZARR_MAGIC

    fs, p = filesystem(path)
    try:
        if fs.isfile(p):
            with fs.open(p, "rb") as f:
                return "file", f.read(MAGIC_BYTES)
        p = p.rstrip("/")
        if fs.exists(p + "/zarr.json") or fs.exists(p + "/.zgroup"):
            return "zarr", ZARR_MAGIC
        if fs.isdir(p):
            return "dir", b""
    except InputError:
        raise
    except Exception as e:  # noqa: BLE001
        raise error(path, e) from None
    raise error(path, FileNotFoundError(path))


def read_magic(path: str) -> bytes:
    """The first bytes of a remote file, ``ZARR_MAGIC`` for a Zarr store; errors are one line."""
    kind, magic = _kind(path)
    if kind == "dir":
        raise InputError(f"{path}: is a folder without Zarr metadata (zarr.json or .zgroup), not a data file; "
                         "name a file or a Zarr store")
    return magic
