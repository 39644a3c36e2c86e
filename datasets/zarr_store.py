"""Zarr stores (v2 and v3, consolidated or not) as netCDF-like datasets for the netCDF reader.

zarr-python 3 opens a local directory store or an object-store URL (``FsspecStore``); the root
group's arrays become variables of a ``cf_adapter.Dataset``, so every CF rule of the netCDF
reader applies unchanged. Dimension names come from the v3 ``dimension_names`` or the v2
``_ARRAY_DIMENSIONS`` attribute (as xarray writes them). Missing values follow xarray's rule:
in a v2 store the array's ``fill_value`` is its ``_FillValue`` (missing chunks, read as the
fill value, are then missing); in a v3 store only a ``_FillValue`` attribute masks (xarray
writes a float one base64-encoded), so a missing chunk reads as the array's ``fill_value``,
a value. Reads are by slices: zarr fetches only the chunks a slab touches, concurrently.
"""

from __future__ import annotations

import base64
import struct

import numpy as np

from smerge.datasets import cf_adapter, remote
from smerge.errors import InputError


def _fill(value, dtype):
    """A v3 ``_FillValue`` attribute as xarray decodes it (floats are base64 of a double)."""
    if isinstance(value, str) and np.dtype(dtype).kind == "f":
        try:
            return struct.unpack("<d", base64.standard_b64decode(value))[0]
        except (ValueError, struct.error):
            return {"NaN": np.nan, "Infinity": np.inf, "-Infinity": -np.inf}.get(value, value)
    return value


def _store(path: str):
    import zarr.storage

    if remote.is_remote(path):
        return zarr.storage.FsspecStore.from_url(path, storage_options=remote.storage_options(path), read_only=True)
    return zarr.storage.LocalStore(path, read_only=True)


def open_dataset(path: str) -> cf_adapter.Dataset:
    import zarr

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
        variables[name] = cf_adapter.Variable(name, dims, node.shape, dtype, attrs, node.__getitem__,
                                              chunks=node.chunks)
    return cf_adapter.Dataset(path, variables, dict(group.attrs), groups=groups, what="Zarr store")
