"""Reader backends: a registry of formats, each saying whether it can open a file.

Like xarray's backends: every format is a module with a ``Backend`` whose ``guess_can_open``
looks at the magic number first, then at the extension, and whose ``open`` returns an
``InputSource``. The format library is imported inside the backend module only. Backends of
other packages are declared in the ``smerge.backends`` entry-point group (``load_plugins``), as
is smerge's own reader of server streams, which lives above this package (``smerge.transport``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol, Sequence

import pyarrow as pa

from smerge.errors import InputError, param

DEFAULT_BATCH_ROWS = 131072
MAGIC_BYTES = 4096  # enough for magic numbers and to sniff a CSV header line
ZARR_MAGIC = b"smerge-zarr-store\x00"  # what read_magic returns for a Zarr store (a folder)


@dataclass
class GridInfo:
    """Where a netCDF input's records come from: the dimensions flattened in C order."""

    path: str
    dims: tuple[str, ...]
    shape: tuple[int, ...]
    variables: tuple[str, ...]
    coords: dict[str, Any] = field(default_factory=dict)  # dim -> numpy array of coordinate values
    attrs: dict[str, dict] = field(default_factory=dict)  # variable -> its netCDF attributes
    # key -> the one dimension it is on, for keys that are a dimension's coordinate
    # (lat(lat), lat(latitude)) or its array index (then the key is the dimension's name)
    key_dims: dict[str, str] = field(default_factory=dict)
    index_keys: tuple[str, ...] = ()  # keys that are array indices (no variable identifies the dimension)
    stored_dims: tuple[str, ...] = ()  # the dimensions in the file's order (``dims``: in the order read)
    key_direction: dict[str, int] = field(default_factory=dict)  # 1-D key -> +1 increasing, -1 decreasing, 0
    reordered: bool = False  # read in another input's key order (not as stored)
    # record dimensions no key is on: records differing only along them have the same keys
    unkeyed_dims: tuple[str, ...] = ()
    # index key -> the variables that locate its dimension all the same (lon(x) with units degrees_east)
    index_located: dict[str, str] = field(default_factory=dict)

    @property
    def inner_size(self) -> int:
        size = 1
        for s in self.shape[1:]:
            size *= s
        return size


@dataclass(frozen=True)
class RawKey:
    """The leading key of an input read in its stored form, for scans that only need its order
    statistics (the k1 scan of a partitioned run: per chunk the range, the missing values and a
    sample). ``batches(start, stop)`` yields ``(values, missing)`` for the records of outer
    indices ``start`` to ``stop``: the stored values (numpy) and which records have no key (a
    bool array, or None when none); ``to_arrow(values)`` gives the key column of those
    (non-missing) values as ``batches()`` would. The stored-to-key mapping is non-decreasing
    (CF time decoding, a numeric cast), so the key's minimum and maximum are those of the stored
    values, mapped: a scan maps a chunk's few statistics instead of every value."""

    batches: Callable[[int, int | None], Iterator[tuple[Any, Any]]]
    to_arrow: Callable[[Any], pa.Array]


@dataclass
class InputSource:
    """An opened input: its record schema, resolved keys and a way to stream its records.

    ``batches(start, stop)`` yields record batches of at most ``batch_rows`` rows for the
    records of outer index ``start`` (inclusive) to ``stop`` (exclusive): for netCDF the
    outermost dimension's slabs, for tabular files row numbers. The row id of a record is its
    position in the whole stream (docs/semantics.md section 1): ``start * inner_size`` for the first one.
    """

    path: str
    format: str
    schema: pa.Schema
    keys: tuple[str, ...]
    num_rows: int | None
    outer_size: int | None
    inner_size: int
    open_batches: Callable[[int, int | None], Iterator[pa.RecordBatch]]
    grid: GridInfo | None = None
    # Counts the reader keeps while streaming, e.g. "masked": values outside valid_min/valid_max/
    # valid_range made missing (netCDF). Filled as batches() is iterated in this process.
    counters: dict = field(default_factory=dict)
    raw_key: RawKey | None = None  # the leading key in its stored form, when the format allows it
    # (function, args), picklable: ``function(*args)`` is this source again, in another process,
    # without reading the metadata again (netCDF; each read checks the file did not change)
    reopen: tuple | None = None

    def batches(self, start: int = 0, stop: int | None = None) -> Iterator[pa.RecordBatch]:
        return self.open_batches(start, stop)

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


class Backend(Protocol):
    name: str
    extensions: tuple[str, ...]

    def guess_can_open(self, path: str, magic: bytes) -> bool: ...

    def open(self, path: str, *, keys: Sequence[str] | None, variables: Sequence[str] | None,
             batch_rows: int, decode_times: bool) -> InputSource: ...


_REGISTRY: dict[str, Backend] = {}


def register_backend(backend: Backend) -> Backend:
    _REGISTRY[backend.name] = backend
    return backend


def backends() -> dict[str, Backend]:
    """The registered backends: the built-in ones (they register on import), those registered by
    ``register_backend`` and, once loaded (``load_plugins``), those of the entry points."""
    from smerge.datasets import arrow_ipc, csv, netcdf, parquet  # noqa: F401
    from smerge.datasets.archive import read  # noqa: F401

    return dict(_REGISTRY)


PLUGIN_GROUP = "smerge.backends"
_plugins_loaded = False


def load_plugins() -> list[Backend]:
    """Register the backends that installed packages declare in the ``smerge.backends``
    entry-point group (each names a backend class or instance), once; returns the new ones.
    smerge's own reader of server streams (``grpc://``, in ``smerge.transport``, which this
    package does not import) is one. ``guess_backend`` loads them only when no built-in backend
    claims an input, so reading a file costs no entry-point scan."""
    global _plugins_loaded
    if _plugins_loaded:
        return []
    _plugins_loaded = True
    from importlib.metadata import entry_points

    new = []
    for ep in entry_points(group=PLUGIN_GROUP):
        obj = ep.load()
        new.append(register_backend(obj() if isinstance(obj, type) else obj))
    return new


SERVER_SCHEMES = ("grpc", "grpc+tcp", "grpc+tls", "grpcs")
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def is_spark_url(path: str) -> bool:
    """A URL for Spark's readers (hdfs://, s3a://, file://, ...), not a server stream nor an
    object-store or HTTP URL that smerge reads itself (s3://, gs://, az://, https://:
    ``datasets.remote``)."""
    from smerge.datasets.remote import REMOTE_SCHEMES

    m = _URL.match(path)
    return bool(m) and m.group(1).lower() not in SERVER_SCHEMES + REMOTE_SCHEMES


def local_path(path: str) -> str:
    """``file:///x`` is the local path ``/x``; other paths are returned unchanged."""
    return path[len("file://"):] if path.lower().startswith("file://") else path


def check_regular(path: str) -> None:
    """Refuse an input that is not a regular file (a FIFO, a pipe such as /dev/stdin, a device,
    a socket) before opening it: smerge opens an input several times (the format probe, its
    metadata, each read), and a pipe gives its bytes once, while a second open of a FIFO whose
    writer has gone blocks forever."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # missing or unreadable: said by the caller
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return
    kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode)
            else "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a file")
    raise InputError(f"{path}: is {kind}, not a regular file; smerge reads an input more than once, so write the "
                     "stream to a file first (e.g. cat > in.parquet) and name that file")


def read_magic(path: str) -> bytes:
    if path.split("://", 1)[0].lower() in SERVER_SCHEMES and "://" in path:
        return b""  # a server stream, not a file: transport/flight_input.py opens it
    if is_spark_url(path):
        raise InputError(f"{path}: a URL that only Spark's readers open (Parquet or CSV): `smerge cgm` reads it "
                         f"on Spark (without {param.local}); for other commands copy the file to a local path, or "
                         "name it s3://, gs://, az:// or https:// to read it through fsspec")
    from smerge.datasets import remote

    if remote.is_remote(path):
        return remote.read_magic(path)
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file; check the path")
    if os.path.isdir(path):
        if any(os.path.isfile(os.path.join(path, m)) for m in ("zarr.json", ".zgroup")):
            return ZARR_MAGIC  # a Zarr store: datasets/zarr_store.py opens it (netCDF backend)
        from smerge.datasets.archive.probe import is_archive

        if is_archive(path):  # a folder with an archive manifest: datasets/archive/read.py opens it
            from smerge.datasets.archive.read import ARCHIVE_MAGIC

            return ARCHIVE_MAGIC
        raise InputError(f"{path}: is a directory, not a data file nor a Zarr store (no zarr.json or .zgroup); "
                         "name a file or a store")
    check_regular(path)
    try:
        with open(path, "rb") as f:
            return f.read(MAGIC_BYTES)
    except OSError as e:
        raise InputError(f"{path}: cannot be read ({e.strerror}); check its permissions") from None


_FORMAT_NAMES = {"netcdf": "netCDF", "parquet": "Parquet", "arrow": "Arrow IPC", "csv": "CSV"}


def _is_text(magic: bytes) -> bool:
    import codecs

    if b"\x00" in magic:
        return False
    try:
        codecs.getincrementaldecoder("utf-8")().decode(magic, final=False)  # a cut character at the end is fine
    except UnicodeDecodeError:
        return False
    return True


# Built-in formats whose magic number no other built-in backend claims: such a file is opened
# by importing its backend alone (the netCDF and archive modules cost tens of ms of a process
# that reads Parquet). "flight" (the server streams' plugin) claims only grpc:// URLs.
_UNIQUE_MAGIC = ((b"PAR1", "parquet", "parquet"), (b"ARROW1", "arrow", "arrow_ipc"))
_BUILTIN = {"archive", "arrow", "csv", "flight", "netcdf", "parquet"}


def _claim(ordered: Sequence[Backend], path: str, magic: bytes) -> Backend | None:
    """The first of ``ordered`` that claims the input: by content alone first (with no path, a
    backend has no extension to go by), then by extension or URL scheme."""
    if magic:
        for b in ordered:
            if b.guess_can_open("", magic):
                return b
    for b in ordered:
        if b.guess_can_open(path, magic):
            return b
    return None


def guess_backend(path: str, fmt: str | None = None) -> Backend:
    """The backend for ``path``: the one named by ``fmt``, else by content (magic number, then
    CSV sniffing), else by extension. A file whose extension names a format its content does
    not match is refused as not readable in that format (corrupt, truncated, or misnamed)."""
    magic = None
    if fmt is None and set(_REGISTRY) <= _BUILTIN:  # no third-party backend could claim the file first
        magic = read_magic(path)
        for prefix, name, module in _UNIQUE_MAGIC:
            if magic.startswith(prefix):
                import importlib

                importlib.import_module(f"smerge.datasets.{module}")
                return _REGISTRY[name]
    regs = backends()
    if fmt is not None:
        if fmt not in regs:
            load_plugins()
            regs = backends()
        if fmt not in regs:
            raise InputError(f"unknown input format {fmt!r}; use one of {', '.join(sorted(regs))}")
        return regs[fmt]
    if magic is None:
        magic = read_magic(path)
    # Formats with a magic number first; CSV (which can only be sniffed) last.
    ordered = sorted(regs.values(), key=lambda b: b.name == "csv")
    found = _claim(ordered, path, magic) or _claim(load_plugins(), path, magic)
    if found is not None:
        return found
    if "://" in path and path.split("://", 1)[0].lower() in SERVER_SCHEMES:
        raise InputError(f"{path}: a server stream, but no installed reader takes {path.split('://', 1)[0]}:// "
                         f"URLs (the {PLUGIN_GROUP!r} entry point of smerge's metadata is missing); reinstall "
                         "smerge (pip install .)")
    low = path.lower()
    named = [b for b in ordered if low.endswith(tuple(getattr(b, "extensions", ())))]
    if named:
        what = _FORMAT_NAMES.get(named[0].name, named[0].name)
        if low.endswith(".zarr"):
            what = "Zarr"
        elif low.endswith((".grib", ".grib1", ".grib2", ".grb", ".grb2")):
            what = "GRIB"
        raise InputError(f"{path}: not readable as {what}: its first bytes are not a {what} header, so the file "
                         f"is corrupt or truncated, or not {what} despite its extension")
    if _is_text(magic):
        raise InputError(f"{path}: not a supported format (netCDF, Zarr, GRIB, Parquet, Arrow IPC, or CSV with a comma or tab "
                         "in its header line); if it is a one-column CSV file, name it .csv")
    raise InputError(f"{path}: not a supported format: its first bytes match none of netCDF, GRIB, Parquet or Arrow IPC, "
                     "and it is not text (CSV); convert it, or check that it is not compressed or corrupt")
