"""Zarr stores (v2 and v3, consolidated or not) as netCDF-like datasets for the netCDF reader.

zarr-python 3 opens a local directory store or an object-store URL (``FsspecStore``); the root
group's arrays become variables of a ``cf_adapter.Dataset``, so every CF rule of the netCDF
reader applies unchanged. Dimension names come from the v3 ``dimension_names`` or the v2
``_ARRAY_DIMENSIONS`` attribute (as xarray writes them). Missing values follow xarray's rule:
in a v2 store the array's ``fill_value`` is its ``_FillValue`` (missing chunks, read as the
fill value, are then missing); in a v3 store only a ``_FillValue`` attribute masks (xarray
writes a float one base64-encoded), so a missing chunk reads as the array's ``fill_value``,
a value. Reads are by slices: zarr fetches only the chunks a slab touches, concurrently, and
each read of a block of chunks along one axis starts the fetch of the blocks after it
(``_ReadAhead``: the next block while this one is decoded and merged; on an object store the
next few, so that requests overlap), so memory holds a slab plus that prefetch.

Start-up: ``import zarr`` is most of what a Zarr input costs over a netCDF one in a short run.
zarr, numcodecs and fsspec each scan every installed package's entry points when imported;
``_zarr()`` lets them share one scan.
"""

from __future__ import annotations

import base64
import contextlib
import struct
import threading
from concurrent.futures import Future

import numpy as np

from smerge.datasets import cf_adapter, remote
from smerge.errors import InputError


READ_AHEAD_LOCAL = 1  # blocks of chunks read ahead per array: local store
READ_AHEAD_REMOTE = 4  # object store (requests in flight overlap their latency)


def _fill(value, dtype):
    """A v3 ``_FillValue`` attribute as xarray decodes it (floats are base64 of a double)."""
    if isinstance(value, str) and np.dtype(dtype).kind == "f":
        try:
            return struct.unpack("<d", base64.standard_b64decode(value))[0]
        except (ValueError, struct.error):
            return {"NaN": np.nan, "Infinity": np.inf, "-Infinity": -np.inf}.get(value, value)
    return value


@contextlib.contextmanager
def _one_entry_point_scan():
    """``importlib.metadata.entry_points`` answered from one scan of the installed packages
    while the block runs (the modules imported meanwhile keep the cached function: the installed
    packages do not change during a run)."""
    import importlib.metadata as md

    real = md.entry_points
    found: list = []

    def entry_points(**params):
        if not found:
            found.append(real())
        return found[0].select(**params) if params else found[0]

    md.entry_points = entry_points
    try:
        yield
    finally:
        md.entry_points = real


def _zarr():
    """The zarr module, imported with one entry-point scan (see the module doc)."""
    import sys

    if "zarr" not in sys.modules:
        with _one_entry_point_scan():
            import zarr  # noqa: F401
    return sys.modules["zarr"]


class _ReadAhead:
    """``read(key)`` of one array for ``cf_adapter.Variable``. A key that is a range ``lo:hi``
    along one axis (the others whole) is served from the ranges read ahead that it overlaps
    (the rest read at once), and starts, in a background thread, the reads of the ranges after
    the furthest one asked so far up to ``depth`` times its length past ``hi`` (each range as
    long as this one). Ranges behind the read are dropped; anything else is read at once.
    ``close()`` drops every range read ahead."""

    def __init__(self, array, depth: int):
        self._array, self._depth = array, max(0, depth)
        self._ahead: dict[tuple[int, int], Future] = {}  # (lo, hi) along self._axis
        self._axis = None
        self._lock = threading.Lock()

    def _range(self, key):
        """``(axis, lo, hi)`` when ``key`` is a range along one axis, the others whole."""
        shape = self._array.shape
        if self._depth == 0 or not isinstance(key, tuple) or len(key) != len(shape) or not key:
            return None
        part = None
        for i, (k, n) in enumerate(zip(key, shape)):
            if not isinstance(k, slice) or k.step not in (None, 1):
                return None
            lo, hi, _ = k.indices(n)
            if (lo, hi) != (0, n):
                if part is not None or hi <= lo:
                    return None
                part = (i, lo, hi)
        return part

    def _key(self, ax: int, lo: int, hi: int) -> tuple:
        return tuple(slice(lo, hi) if i == ax else slice(None) for i in range(len(self._array.shape)))

    def __call__(self, key):
        r = self._range(key)
        if r is None:
            return self._array[key]
        ax, lo, hi = r
        with self._lock:
            if ax != self._axis:
                self._drop(list(self._ahead))
                self._axis = ax
            self._drop([k for k in self._ahead if k[1] <= lo])
            have = sorted((k, f) for k, f in self._ahead.items() if k[0] < hi)
            for k, _ in have:
                if k[1] <= hi:
                    del self._ahead[k]
            n, step = self._array.shape[ax], hi - lo
            frontier = max([hi, *(k[1] for k in self._ahead)])
            while frontier < min(n, hi + self._depth * step):
                k = (frontier, min(frontier + step, n))
                self._ahead[k] = _pool().submit(self._array.__getitem__, self._key(ax, *k))
                frontier = k[1]
        parts, at = [], lo
        for (a, b), f in have:
            if a > at:
                parts.append(np.asarray(self._array[self._key(ax, at, a)]))
            v = np.asarray(f.result())
            parts.append(v[self._key(ax, max(lo, a) - a, min(hi, b) - a)])
            at = min(hi, b)
        if at < hi:
            parts.append(np.asarray(self._array[self._key(ax, at, hi)]))
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=ax)

    def _drop(self, keys) -> None:
        for k in keys:
            self._ahead.pop(k).cancel()

    def close(self) -> None:
        with self._lock:
            self._drop(list(self._ahead))


_POOL = None
_POOL_LOCK = threading.Lock()


def _pool():
    """Threads that wait on zarr's reads ahead, one per block in flight (zarr fetches and decodes
    in its own event loop and threads)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            from concurrent.futures import ThreadPoolExecutor

            _POOL = ThreadPoolExecutor(max_workers=READ_AHEAD_REMOTE, thread_name_prefix="smerge-zarr-ahead")
        return _POOL


_STORES: dict = {}  # remote URL -> its FsspecStore (one client per process; see _store)


def _store(path: str):
    """The store at ``path``. A remote store is made once per process and URL: fsspec makes an
    asynchronous filesystem (a new S3 client, its service model parsed again: most of a second)
    per thread, and the reader thread opens the store again; every open still reads the
    metadata, only the client is shared (zarr runs all its reads in its one event loop)."""
    zarr = _zarr()

    if remote.is_remote(path):
        key = (path, tuple(sorted(map(repr, remote.storage_options(path).items()))))
        with _POOL_LOCK:
            if key not in _STORES:
                _STORES[key] = zarr.storage.FsspecStore.from_url(path, storage_options=remote.storage_options(path),
                                                                 read_only=True)
            return _STORES[key]
    return zarr.storage.LocalStore(path, read_only=True)


def open_dataset(path: str) -> cf_adapter.Dataset:
    zarr = _zarr()
    depth = READ_AHEAD_REMOTE if remote.is_remote(path) else READ_AHEAD_LOCAL
    try:
        group = zarr.open_group(_store(path), mode="r")
        # a store has no order of its arrays, and zarr lists them as its (asynchronous) reads
        # finish: sorted by name, every process sees the same variables in the same order
        members = sorted(group.members(), key=lambda m: m[0])
    except InputError:
        raise
    except Exception as e:  # noqa: BLE001 - zarr, json and store errors alike
        if remote.is_remote(path) and not isinstance(e, (ValueError, KeyError, TypeError)):
            raise remote.error(path, e) from None
        raise InputError(f"{path}: cannot open as a Zarr store ({type(e).__name__}: {str(e)[:200]}); its metadata "
                         "may be missing or inconsistent: rewrite the store") from None
    fmt = group.metadata.zarr_format
    variables = {}
    groups = []
    readers = []
    for name, node in members:
        if not isinstance(node, zarr.Array):
            groups.append(name)
            continue
        attrs = dict(node.attrs)
        dims = getattr(node.metadata, "dimension_names", None) if fmt == 3 else None
        dims = dims or attrs.pop("_ARRAY_DIMENSIONS", None)
        attrs.pop("_ARRAY_DIMENSIONS", None)
        if dims is None and node.ndim == 0:
            dims = ()
        if dims is None or len(dims) != node.ndim or any(d is None for d in dims):
            raise InputError(f"{path}: array {name!r} has no dimension names (zarr v3 dimension_names or the "
                             "_ARRAY_DIMENSIONS attribute xarray writes); smerge needs them to find its keys: "
                             "write the store with xarray, or set the dimension names")
        dtype = node.dtype
        dtype = np.dtype(dtype) if isinstance(dtype, np.dtype) else dtype
        if not isinstance(dtype, np.dtype) or dtype.kind in "OUT":
            dtype = str
        if fmt == 2:
            if "_FillValue" not in attrs and node.fill_value is not None and dtype is not str:
                attrs["_FillValue"] = node.fill_value
        elif "_FillValue" in attrs and dtype is not str:
            attrs["_FillValue"] = _fill(attrs["_FillValue"], dtype)
        read = _ReadAhead(node, depth if node.ndim else 0)
        readers.append(read)
        variables[name] = cf_adapter.Variable(name, dims, node.shape, dtype, attrs, read, chunks=node.chunks)

    def close():
        for r in readers:
            r.close()

    return cf_adapter.Dataset(path, variables, dict(group.attrs), groups=groups, close=close, what="Zarr store")
