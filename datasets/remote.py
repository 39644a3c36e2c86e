"""Inputs on object stores and HTTP (``s3://``, ``gs://``, ``az://``, ``https://``) through fsspec.

Read in this process by byte ranges (Parquet row groups, HDF5 chunks, Zarr chunks), never
copied whole. Spark's own URLs (``s3a://``, ``hdfs://``) stay with Spark's readers.

Outputs (see the section "Outputs on object stores" below) are written locally and uploaded
when complete.

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

from smerge.errors import InputError, param

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


def _share_botocore_loader() -> None:
    """Let every botocore session of this process share one loader of the service models.

    s3fs makes a session per filesystem, and fsspec a filesystem per thread for asynchronous
    use (Zarr's store) beside the synchronous one: each session parsed the S3 model again when
    making its client (half a second on a loaded machine). The models are read-only data;
    credentials stay per session."""
    import botocore.session

    if not getattr(botocore.session.create_loader, "_smerge_shared", False):
        botocore.session.create_loader = lru_cache(maxsize=8)(botocore.session.create_loader)
        botocore.session.create_loader._smerge_shared = True


def filesystem(path: str):
    """``(fs, path_in_fs)`` for a remote URL."""
    import fsspec

    try:
        if scheme(path) == "s3":
            _share_botocore_loader()
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
        # a name ending in .zarr (or /) is looked up as a store first: one request, not the
        # two of asking whether it is an object (a HEAD, then a listing of the prefix)
        if p.rstrip("/").lower().endswith(".zarr") or p.endswith("/"):
            if fs.exists(p.rstrip("/") + "/zarr.json"):
                return "zarr", ZARR_MAGIC
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


# --------------------------------------------------------------------------------------------
# Outputs on object stores. The output is written to a local temporary file (or staging
# folder) as any other output, then uploaded at the commit; nothing appears under the final
# key before. The output rule holds as for local outputs: an existing key is replaced only with
# ``--overwrite``, a "folder" (key prefix) only when smerge wrote it (its marker object) and it
# holds no object but those the marker lists (``output_staging.first_foreign``).
# Without ``--overwrite`` the key is checked before the run, and claimed at the commit by a
# conditional put (S3 ``If-None-Match: *``: of two runs racing for one key exactly one wins);
# stores without conditional puts (gs://, az://) are checked again just before the upload, and
# a key written by someone else between that check and the upload is replaced. A folder's
# objects are uploaded one by one, its marker last; a reader listing the prefix meanwhile may
# see some of them.


def _output_error(path: str, e: BaseException, opt: str):
    from smerge.errors import OutputError

    err = error(path, e)
    text = str(err).replace("cannot read (", "cannot write (").replace("or read a public bucket with SMERGE_ANON=1",
                                                                       "writing needs credentials")
    return OutputError(f"{_label(opt)} {text}")


def _label(opt: str) -> str:
    return "output" if opt == "-o" else opt


def _keys(fs, p: str) -> list[str]:
    """Every object below the prefix ``p`` (a "folder"); [] when there is none."""
    prefix = p.rstrip("/") + "/"
    try:
        return [k for k in fs.find(prefix) if k.startswith(prefix)]  # find() of an object gives the object
    except FileNotFoundError:
        return []


def check_output(path: str, *, overwrite: bool, folder: bool, opt: str = "-o", during: bool = False) -> list[str]:
    """The output rule for an object-store output, before anything is written: the bucket exists
    and answers (credentials, endpoint), the key is absent (or ``overwrite``), a folder output
    replaces only a prefix smerge wrote (its marker object) holding no object but those its
    marker lists (``output_staging.first_foreign``), a file output is not a prefix.
    ``OutputError`` (one line, exit 2) otherwise; ``during``: checked at the commit. Returns
    the objects of the prefix checked (those a folder output may remove)."""
    from smerge.datasets.output_staging import MARKER, first_foreign, foreign_error, parse_marker
    from smerge.errors import OutputError

    label = _label(opt)
    fs, p = filesystem(path)
    p = p.rstrip("/")
    bucket = p.split("/", 1)[0]
    if "/" not in p:
        raise OutputError(f"{label} {path!r} names a bucket, not an object; give a key (s3://{bucket}/name.parquet)")
    try:
        if not fs.exists(bucket):
            raise OutputError(f"{label} {path!r}: no bucket {bucket!r} at {endpoint() or scheme(path) + '://'}; "
                              "create it first or check the URL")
        keys = _keys(fs, p)
        is_file = not keys and fs.isfile(p)
    except OutputError:
        raise
    except Exception as e:  # noqa: BLE001 - every client error becomes one line
        raise _output_error(path, e, opt) from None
    if folder:
        if is_file:
            raise OutputError(f"{label} {path!r} is an object, not a dataset folder; choose another {opt}")
        if keys and not overwrite:
            raise OutputError(f"{label} {path!r} already exists ({len(keys)} objects); pass {param.overwrite} to replace it "
                              f"or choose another {opt}")
        if keys and f"{p}/{MARKER}" not in keys:
            raise OutputError(f"{label} {path!r} is a folder smerge did not write (no {MARKER} marker object in it); "
                              f"{param.overwrite} replaces only smerge's own dataset folders: remove it yourself or choose "
                              f"another {opt}")
        if keys:
            rels = sorted(k[len(p) + 1:] for k in keys)
            try:
                text = fs.cat_file(f"{p}/{MARKER}").decode(errors="replace")
            except Exception:  # noqa: BLE001 - unreadable: an older marker's rule, the stricter
                text = ""
            entry = first_foreign(((r, "f") for r in rels), parse_marker(text), rels.__contains__)
            if entry is not None:
                raise foreign_error(opt, path, entry, during=during)
        return keys
    if keys:
        raise OutputError(f"{label} {path!r} is a folder (objects below it); name an object")
    if is_file and not overwrite:
        raise OutputError(f"{label} {path!r} already exists; pass {param.overwrite} to replace it or choose another {opt}")
    return keys


def _taken(path: str, opt: str):
    from smerge.errors import OutputError

    return OutputError(f"{_label(opt)} {path!r} was created by another run or program while this one was writing; "
                       f"it is kept and nothing was written: pass {param.overwrite} to replace it or choose another {opt}")


def _put(fs, local: str, p: str, *, create: bool) -> None:
    """Upload one file; ``create``: only when the key is absent (``FileExistsError`` otherwise)."""
    if create and type(fs).__module__.startswith("s3fs"):
        fs.put_file(local, p, mode="create")  # If-None-Match: * (also on the multipart completion)
        return
    if create and fs.exists(p):
        raise FileExistsError(p)
    fs.put_file(local, p)


def upload_file(local: str, path: str, *, overwrite: bool, opt: str = "-o") -> None:
    """Put the finished local file ``local`` at ``path`` (see the section's doc); ``local`` is
    removed either way."""
    fs, p = filesystem(path)
    try:
        _put(fs, local, p, create=not overwrite)
    except FileExistsError:
        raise _taken(path, opt) from None
    except Exception as e:  # noqa: BLE001
        if "PreconditionFailed" in str(e) or "pre-conditions" in str(e):
            raise _taken(path, opt) from None
        raise _output_error(path, e, opt) from None
    finally:
        with _suppress():
            os.unlink(local)


def upload_dir(local: str, path: str, *, overwrite: bool, opt: str = "-o") -> None:
    """Put the finished local folder ``local`` (which holds smerge's marker) at the prefix
    ``path``: every file, the marker last; with ``overwrite`` the objects of the previous output
    that the new one does not hold are removed after. The folder rule is checked again first,
    and only the objects it checked may be removed."""
    import shutil

    from smerge.datasets.output_staging import MARKER

    fs, p = filesystem(path)
    p = p.rstrip("/")
    done: list[str] = []
    try:
        # the previous output's objects as checked: one put there since is never removed
        checked = check_output(path, overwrite=overwrite, folder=True, opt=opt, during=True)
        old = set(checked) if overwrite else set()
        files = []
        for root, _, names in os.walk(local):
            for n in names:
                rel = os.path.relpath(os.path.join(root, n), local).replace(os.sep, "/")
                files.append(rel)
        files.sort(key=lambda r: (r == MARKER, r))
        for rel in files:
            _put(fs, os.path.join(local, rel), f"{p}/{rel}", create=not overwrite)
            done.append(f"{p}/{rel}")
        stale = sorted(old - set(done))
        if stale:
            fs.rm(stale)
    except BaseException as e:
        if not overwrite and done:
            with _suppress():
                fs.rm(done)
        if isinstance(e, FileExistsError) or "pre-conditions" in str(e) or "PreconditionFailed" in str(e):
            raise _taken(path, opt) from None
        from smerge.errors import SmergeError

        if isinstance(e, (SmergeError, KeyboardInterrupt, SystemExit)) or not isinstance(e, Exception):
            raise
        raise _output_error(path, e, opt) from None
    finally:
        shutil.rmtree(local, ignore_errors=True)


def _etag(fs, p: str):
    try:
        return fs.info(p).get("ETag")
    except Exception:  # noqa: BLE001 - only to recognise our own object later
        return None


def identity(path: str) -> tuple | None:
    """What was just put at ``path``: the object and its ETag, or the objects below a prefix."""
    with _suppress():
        fs, p = filesystem(path)
        p = p.rstrip("/")
        keys = _keys(fs, p)
        if keys:
            return ("remote-dir", path, tuple(keys))
        return ("remote", path, _etag(fs, p))
    return None


def retract(ident: tuple) -> None:
    """Remove what ``upload_file``/``upload_dir`` put in place (``ident``, from ``identity``)
    when a later output of the run failed: the objects, or the object when its ETag is unchanged."""
    kind, path, what = ident
    fs, p = filesystem(path)
    with _suppress():
        if kind == "remote-dir":
            fs.rm(list(what))
        elif what is None or _etag(fs, p) == what:
            fs.rm(p)


def write_bytes(path: str, data: bytes, *, overwrite: bool, opt: str = "-o") -> None:
    """Put ``data`` at ``path`` in one request (the statistics JSON), with the output rule."""
    import tempfile

    fd, local = tempfile.mkstemp(prefix=".smerge-upload-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    upload_file(local, path, overwrite=overwrite, opt=opt)


def _suppress():
    import contextlib

    return contextlib.suppress(Exception)
