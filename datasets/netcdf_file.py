"""netCDF files opened for reading: the one lock every netCDF4 call holds, ``_open`` (a netCDF
file, or a Zarr store / GRIB file / remote netCDF-4 file through ``cf_adapter``), the variable
kinds the reader tells apart (numeric, character, string), values as Arrow arrays, reads as
stored, and the count of values masked by valid_min/valid_max/valid_range. The backend is
``datasets/netcdf.py``.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Sequence

import numpy as np
import pyarrow as pa

from smerge.errors import InputError, UsageError

# netCDF-C and HDF5 are not thread-safe and netCDF4 releases the GIL during its C calls: two
# background readers (dual buffering) crash or read garbage unless every netCDF4 call holds this.
NC_LOCK = threading.RLock()

FORMAT = "netcdf"  # the backend's name (``InputSource.format``)
_MAGICS = (b"CDF\x01", b"CDF\x02", b"CDF\x05", b"\x89HDF\r\n\x1a\n")
_VALID_ATTRS = ("valid_min", "valid_max", "valid_range")


def _netcdf4():
    import netCDF4

    return netCDF4


def _open(path: str, variables: Sequence[str] | None = None):
    """``path`` as a netCDF4.Dataset, or a look-alike with the same CF reads (``cf_adapter``):
    a Zarr store, a GRIB file (``variables`` choose its hypercube), a netCDF-4/HDF5 file on an
    object store (read by byte ranges through h5netcdf)."""
    kind = _store_kind(path)
    if kind == "zarr":
        from smerge.datasets.zarr_store import open_dataset

        return open_dataset(path)
    if kind == "grib":
        from smerge.datasets.grib import open_dataset

        return open_dataset(path, variables)
    if kind == "hdf5":
        from smerge.datasets.hdf5_remote import open_dataset

        return open_dataset(path)
    from smerge.datasets.netcdf_classic import expected_size

    need = expected_size(path)
    if need is not None and os.path.getsize(path) < need:
        raise InputError(
            f"{path}: truncated netCDF file ({os.path.getsize(path):,} bytes, its header needs {need:,}); "
            "re-download or regenerate it"
        )
    try:
        return _netcdf4().Dataset(path, "r")
    except (OSError, RuntimeError, ValueError) as e:
        raise InputError(
            f"{path}: cannot open as netCDF ({e}); the file may be truncated or corrupt — re-download or regenerate it"
        ) from None


def _store_kind(path: str) -> str:
    """``"zarr"``, ``"grib"``, ``"hdf5"`` (a netCDF-4 file on an object store) or ``"netcdf"``."""
    from smerge.datasets import remote
    from smerge.datasets.base import ZARR_MAGIC

    if remote.is_remote(path):
        magic = remote.read_magic(path)
        if magic == ZARR_MAGIC:
            return "zarr"
        if magic.startswith(b"GRIB"):
            return "grib"
        if magic.startswith(b"\x89HDF"):
            return "hdf5"
        if magic.startswith(b"CDF"):
            raise InputError(f"{path}: a netCDF-3 (classic) file on an object store: its layout cannot be read by "
                             "byte ranges here; convert it to netCDF-4 (nccopy -k nc4) or copy it to a local path")
        return "netcdf"
    if os.path.isdir(path):
        return "zarr"
    try:
        with open(path, "rb") as f:
            return "grib" if f.read(4) == b"GRIB" else "netcdf"
    except OSError:
        return "netcdf"


def _read_error(path: str, what: str, e: Exception) -> InputError:
    return InputError(
        f"{path}: cannot read {what} ({e}); the file may be truncated or corrupt — re-download or regenerate it"
    )


def _decode_error(path: str, name: str, e: TypeError) -> InputError:
    """netCDF4-python (1.7) cannot mask an _Unsigned integer variable that has valid_min,
    valid_max or valid_range but no _FillValue (its default fill value does not convert to the
    unsigned type): one line saying what to add; any other TypeError is re-raised as is."""
    if "fill_value" not in str(e):
        raise e
    return InputError(
        f"{path}: variable {name!r} cannot be decoded by netCDF4-python ({e}): an _Unsigned variable with "
        f"valid_min/valid_max/valid_range needs a _FillValue attribute; add one (e.g. ncatted -a _FillValue,{name},c,b,-1) "
        "or leave the variable out of the run")


def _arrow(values: np.ndarray) -> pa.Array:
    if np.ma.isMaskedArray(values):
        mask = np.ma.getmaskarray(values)
        data = np.ma.getdata(values)
        return pa.array(data, mask=mask) if mask.any() else pa.array(data)
    return pa.array(np.asarray(values))


def _is_char(var) -> bool:
    """A character variable whose last dimension is the string length (one string per record)."""
    return var.dtype is not str and np.dtype(var.dtype).kind == "S" and np.dtype(var.dtype).itemsize == 1 \
        and var.ndim >= 1


def _is_string(var) -> bool:
    return var.dtype is str or _is_char(var)


def _is_numeric(var) -> bool:
    return var.dtype is not str and np.dtype(var.dtype).kind in "iuf"


def _record_dims(var) -> tuple[str, ...]:
    """The dimensions a variable has records on: a char variable's string length is not one."""
    return tuple(var.dimensions[:-1]) if _is_char(var) else tuple(var.dimensions)


def _strings(data) -> np.ndarray:
    """Char arrays (..., strlen) -> str arrays (...); NC_STRING and auto-converted arrays as they are."""
    import netCDF4

    arr = np.ma.getdata(data) if np.ma.isMaskedArray(data) else np.asarray(data)
    if arr.dtype.kind == "S" and arr.dtype.itemsize == 1 and arr.ndim >= 1:
        arr = netCDF4.chartostring(arr, encoding="utf-8")
    return arr


def _key_error(path: str, k: str, why: str) -> UsageError:
    return UsageError(f"{path}: key {k!r} {why}; a key must be a numeric or CF time variable")


def _group_hint(ds) -> str:
    groups = list(getattr(ds, "groups", {}) or {})
    if not groups:
        return ""
    return (f"; its variables are in netCDF-4 groups ({', '.join(groups[:5])}{', ...' if len(groups) > 5 else ''}), "
            "which smerge does not read: extract one with `nccopy -G` or xarray's open_dataset(group=...)")


@contextlib.contextmanager
def _as_stored(var):
    """``var`` read as stored (no unpacking, no masks) inside the block."""
    var.set_auto_maskandscale(False)
    try:
        yield var
    finally:
        var.set_auto_maskandscale(True)


def _range_masked(var, data, read_raw) -> int:
    """Values masked by valid_min/valid_max/valid_range (the CF rule netCDF4 applies): masked
    in ``data`` but neither ``_FillValue``, ``missing_value`` nor NaN in the raw values
    (``read_raw()``: the same values as stored, in the same layout)."""
    mask = np.ma.getmaskarray(data)
    if not mask.any():
        return 0
    raw = np.asarray(read_raw())
    other = np.zeros(raw.shape, dtype=bool)
    for attr in ("_FillValue", "missing_value"):
        if attr in var.ncattrs():
            for x in np.atleast_1d(var.getncattr(attr)):
                other |= raw == x
    if "_FillValue" not in var.ncattrs() and raw.dtype.kind in "iuf":
        import netCDF4

        fill = netCDF4.default_fillvals.get(raw.dtype.str[1:])
        if fill is not None and raw.dtype.itemsize > 1:
            other |= raw == np.array(fill).astype(raw.dtype)
    if raw.dtype.kind == "f":
        other |= np.isnan(raw)
    return int((mask & ~other).sum())
