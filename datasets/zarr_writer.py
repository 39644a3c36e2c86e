"""Zarr output (``-o out.zarr``, ``--format zarr``): the netCDF output's grid in a Zarr v3 store.

``ZarrGridWriter`` is the netCDF writer (``netcdf_writer.GridWriter``: A's grid, A's variables
and geolocation copied as stored, B's variables on A's grid from the spilled buckets, times in
A's units and calendar for A, microseconds since 1970 in B's calendar for B) with a Zarr store
for its storage: ``ZarrStore`` offers the few netCDF4-python calls the writer makes. Arrays are
chunked along the outer dimension (the grid's arrays by the writer's buckets of whole outer
slabs, about 2^18 values; others ``CHUNK_CELLS`` values per chunk; the other dimensions whole) and written slab by slab, as the netCDF file is. The store is what xarray writes and
reads back: ``dimension_names``, attributes as JSON, ``_FillValue`` as an attribute (a float one
base64 of a double, as xarray encodes it) and as the array's ``fill_value``, consolidated
metadata. The store is written into the output's staging folder and renamed into place whole
(``writers.ZarrOutput``).
"""

from __future__ import annotations

import base64
import struct
import warnings

import numpy as np

from smerge.datasets.netcdf_writer import GridWriter

CHUNK_CELLS = 1 << 20  # values per chunk (the outer dimension cut, the others whole)


def encode_fill(value, dtype):
    """A ``_FillValue`` attribute as xarray writes it in a Zarr store (inverse of
    ``zarr_store._fill``): floats base64 of a little-endian double, integers as integers."""
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return base64.standard_b64encode(struct.pack("<d", float(value))).decode()
    if dt.kind in "iu":
        return int(value)
    if dt.kind == "b":
        return bool(value)
    return value


def _json(value):
    """An attribute value as JSON: numpy scalars and arrays to Python numbers and lists."""
    if isinstance(value, np.ndarray):
        return value.tolist() if value.ndim else value.item()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, (list, tuple)):
        return [_json(v) for v in value]
    return value


class _Array:
    """One array of the store with netCDF4.Variable's writing calls."""

    def __init__(self, array, attrs: dict):
        self._a = array
        self._attrs = attrs

    def setncatts(self, attrs: dict) -> None:
        self._attrs.update({k: _json(v) for k, v in attrs.items()})
        self._a.attrs.update(self._attrs)

    def ncattrs(self) -> list[str]:
        return list(self._attrs)

    def getncattr(self, name: str):
        return self._attrs[name]

    def set_auto_maskandscale(self, on: bool) -> None:
        pass  # values are written as given (stored values)

    def set_auto_chartostring(self, on: bool) -> None:
        pass

    def assignValue(self, value) -> None:
        self._a[()] = np.asarray(value)

    def __setitem__(self, key, value) -> None:
        value = np.ma.getdata(value) if np.ma.isMaskedArray(value) else value
        self._a[key] = np.asarray(value)


class ZarrStore:
    """A Zarr v3 group at ``path`` (a local folder) with netCDF4.Dataset's writing calls."""

    def __init__(self, path: str, *, outer: tuple[str, int] | None = None):
        import zarr

        self.path = path
        self._outer = outer  # (dimension, rows per chunk): chunks aligned with the writer's slabs
        self._g = zarr.open_group(zarr.storage.LocalStore(path), mode="a", zarr_format=3)  # keeps the marker
        self.dimensions: dict[str, int] = {}
        self.variables: dict[str, _Array] = {}
        self._attrs: dict = {}

    def setncatts(self, attrs: dict) -> None:
        self._attrs.update({k: _json(v) for k, v in attrs.items()})
        self._g.attrs.update(self._attrs)

    def ncattrs(self) -> list[str]:
        return list(self._attrs)

    def createDimension(self, name: str, size: int) -> None:
        self.dimensions[name] = int(size)

    def createVariable(self, name: str, dtype, dims, fill_value=None, zlib: bool = False, **_) -> _Array:
        shape = tuple(self.dimensions[d] for d in dims)
        text = dtype is str or np.dtype(dtype).kind in "OU"  # variable-length text (char arrays stay S1)
        inner = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
        rows = CHUNK_CELLS // max(inner, 1)
        if self._outer is not None and dims and dims[0] == self._outer[0]:
            rows = self._outer[1]
        chunks = ((max(1, min(shape[0], rows)),) + shape[1:]) if shape else ()
        chunks = tuple(max(1, c) for c in chunks)
        attrs: dict = {}
        if text:
            zdtype, zfill = str, ""
        else:
            zdtype = np.dtype(dtype)
            zfill = fill_value if fill_value is not None else {"f": np.nan, "S": b""}.get(zdtype.kind, 0)
            if fill_value is not None:
                attrs["_FillValue"] = encode_fill(fill_value, zdtype)
        with warnings.catch_warnings():  # zarr: fixed-length bytes (netCDF char arrays) not yet in the v3 spec
            warnings.simplefilter("ignore")
            arr = self._g.create_array(name, shape=shape, dtype=zdtype, chunks=chunks, fill_value=zfill,
                                       dimension_names=list(dims), attributes=attrs)
        var = _Array(arr, attrs)
        self.variables[name] = var
        return var

    def close(self) -> None:
        import zarr

        with warnings.catch_warnings():  # zarr's note that v3 consolidated metadata is not in the spec yet
            warnings.simplefilter("ignore")
            zarr.consolidate_metadata(self._g.store)

    def __enter__(self) -> "ZarrStore":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()


class ZarrGridWriter(GridWriter):
    """The netCDF output's grid written as a Zarr v3 store at ``path`` (a staging folder)."""

    storage = "Zarr"

    def _create(self) -> ZarrStore:
        g = self.grid
        return ZarrStore(self.path, outer=(g.dims[0], self._step) if g.dims else None)


__all__ = ["ZarrGridWriter", "ZarrStore", "encode_fill", "CHUNK_CELLS"]
