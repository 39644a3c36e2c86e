"""netCDF backend (netCDF4): read in slabs of the outermost dimension, never whole.

A netCDF input is the selected variables (same dimensions) flattened in C order; every record
carries the keys. Default variables: every numeric non-coordinate variable on the dimensions
of the variable with the most dimensions. Default keys: the coordinate variables of those
dimensions (a dimension without one is keyed by its index, an int64 column named after it).
Keys may also be variables on the same dimensions (point lists: ``time(rec), lat(rec)``).
Fill values, ``scale_factor`` and ``add_offset`` are applied as netCDF4 does; missing values
become nulls.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa

from smerge.datasets.base import DEFAULT_BATCH_ROWS, GridInfo, InputSource, register_backend
from smerge.errors import InputError, UsageError

# netCDF-C and HDF5 are not thread-safe and netCDF4 releases the GIL during its C calls: two
# background readers (dual buffering) crash or read garbage unless every netCDF4 call holds this.
NC_LOCK = threading.RLock()

_MAGICS = (b"CDF\x01", b"CDF\x02", b"CDF\x05", b"\x89HDF\r\n\x1a\n")
_TIME_UNITS = re.compile(r"^\s*(\w+)\s+since\s+(.+?)\s*$")
_UNIT_NS = {
    "nanoseconds": 1, "microseconds": 10**3, "milliseconds": 10**6,
    "seconds": 10**9, "second": 10**9, "secs": 10**9, "sec": 10**9, "s": 10**9,
    "minutes": 60 * 10**9, "minute": 60 * 10**9, "mins": 60 * 10**9, "min": 60 * 10**9,
    "hours": 3600 * 10**9, "hour": 3600 * 10**9, "hrs": 3600 * 10**9, "hr": 3600 * 10**9, "h": 3600 * 10**9,
    "days": 86400 * 10**9, "day": 86400 * 10**9, "d": 86400 * 10**9,
}


def _netcdf4():
    import netCDF4

    return netCDF4


def _open(path: str):
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


def _read_error(path: str, what: str, e: Exception) -> InputError:
    return InputError(
        f"{path}: cannot read {what} ({e}); the file may be truncated or corrupt — re-download or regenerate it"
    )


def decode_time_units(units: str) -> tuple[np.datetime64, int] | None:
    """``"hours since 1990-01-01 00:00"`` -> (reference datetime64[ns], ns per unit), or None."""
    m = _TIME_UNITS.match(units or "")
    if not m or m.group(1).lower() not in _UNIT_NS:
        return None
    ref = m.group(2).replace("T", " ").strip()
    ref = re.sub(r"\s*(UTC|Z|\+00:?00)$", "", ref)
    parts = ref.split()
    try:
        date = np.datetime64(parts[0], "ns")
        if len(parts) > 1:
            hms = parts[1].split(":")
            secs = float(hms[0]) * 3600 + (float(hms[1]) * 60 if len(hms) > 1 else 0) + (float(hms[2]) if len(hms) > 2 else 0)
            date = date + np.timedelta64(int(round(secs * 1e9)), "ns")
    except ValueError:
        return None
    return date, _UNIT_NS[m.group(1).lower()]


def _arrow(values: np.ndarray) -> pa.Array:
    if np.ma.isMaskedArray(values):
        mask = np.ma.getmaskarray(values)
        data = np.ma.getdata(values)
        return pa.array(data, mask=mask) if mask.any() else pa.array(data)
    return pa.array(np.asarray(values))


def _is_numeric(var) -> bool:
    return var.dtype is not str and np.dtype(var.dtype).kind in "iuf"


class NetCDFBackend:
    name = "netcdf"
    extensions = (".nc", ".cdf", ".nc4", ".netcdf")

    def guess_can_open(self, path: str, magic: bytes) -> bool:
        return magic.startswith(_MAGICS) or (not magic and path.lower().endswith(self.extensions))

    def open(self, path: str, *, keys: Sequence[str] | None = None, variables: Sequence[str] | None = None,
             batch_rows: int = DEFAULT_BATCH_ROWS, decode_times: bool = False) -> InputSource:
        with NC_LOCK, _open(path) as ds:
            allvars = ds.variables
            coord_names = {n for n, v in allvars.items() if v.dimensions == (n,)}
            if variables:
                missing = [v for v in variables if v not in allvars]
                if missing:
                    raise UsageError(
                        f"{path}: no variable {', '.join(map(repr, missing))}; it has {', '.join(allvars)}"
                    )
                dims = allvars[variables[0]].dimensions
                for v in variables:
                    if allvars[v].dimensions != dims:
                        raise UsageError(
                            f"{path}: variable {v!r} has dimensions {allvars[v].dimensions} but "
                            f"{variables[0]!r} has {dims}; choose variables on the same dimensions"
                        )
                chosen = list(variables)
            else:
                cands = [n for n, v in allvars.items() if n not in coord_names and v.ndim > 0 and _is_numeric(v)]
                if not cands:
                    raise InputError(f"{path}: no numeric data variable; it has {', '.join(allvars) or 'no variables'}")
                dims = max((allvars[n].dimensions for n in cands), key=len)
                chosen = [n for n in cands if allvars[n].dimensions == dims]
            if keys:
                missing = [k for k in keys if k not in allvars and k not in dims]
                if missing:
                    raise UsageError(
                        f"{path}: no variable {', '.join(map(repr, missing))} to use as a key; "
                        f"it has {', '.join(allvars)}"
                    )
                for k in keys:
                    if k in allvars and allvars[k].dimensions not in ((k,), dims) and not (
                            allvars[k].ndim == 1 and allvars[k].dimensions[0] in dims):
                        raise UsageError(
                            f"{path}: key {k!r} has dimensions {allvars[k].dimensions}; a key must be a "
                            f"coordinate of one of {dims} or a variable on {dims}"
                        )
                key_names = list(keys)
                chosen = [v for v in chosen if v not in key_names]
            else:
                # CF point lists name their keys in the `coordinates` attribute.
                cf = next((str(allvars[v].getncattr("coordinates")).split() for v in chosen
                           if "coordinates" in allvars[v].ncattrs()), [])
                if cf and all(c in allvars and allvars[c].dimensions == dims for c in cf):
                    key_names = cf
                    chosen = [v for v in chosen if v not in cf]
                else:
                    key_names = list(dims)
            shape = tuple(len(ds.dimensions[d]) for d in dims)
            if not chosen and not key_names:
                raise InputError(f"{path}: nothing to read")
            # Key columns: broadcast coordinate (1-D on one of dims) or full variables on dims.
            coords: dict[str, np.ndarray] = {}
            key_kind: dict[str, tuple] = {}
            time_decode: dict[str, tuple[np.datetime64, int]] = {}
            attrs: dict[str, dict] = {}
            for k in key_names:
                if k in allvars and allvars[k].dimensions == dims and (len(dims) > 1 or k not in dims):
                    key_kind[k] = ("full",)
                    v = allvars[k]
                else:
                    dim = k if k in dims else allvars[k].dimensions[0]
                    axis = dims.index(dim)
                    if k in allvars:
                        v = allvars[k]
                        try:
                            vals = np.ma.filled(v[:], np.nan) if np.ma.isMaskedArray(v[:]) else np.asarray(v[:])
                        except (OSError, RuntimeError, IndexError) as e:
                            raise _read_error(path, f"coordinate {k!r}", e) from None
                    else:
                        v = None
                        vals = np.arange(shape[axis], dtype=np.int64)
                    coords[k] = vals
                    key_kind[k] = ("coord", axis)
                if v is not None:
                    attrs[k] = {a: v.getncattr(a) for a in v.ncattrs()}
                    if decode_times:
                        dec = decode_time_units(str(attrs[k].get("units", "")))
                        if dec is not None:
                            time_decode[k] = dec
            for n in chosen:
                attrs[n] = {a: allvars[n].getncattr(a) for a in allvars[n].ncattrs()}
            # Schema from a tiny read of each column (dtype after scale/offset).
            fields = []
            for k in key_names:
                if k in time_decode:
                    fields.append(pa.field(k, pa.timestamp("ns")))
                elif key_kind[k][0] == "coord":
                    fields.append(pa.field(k, pa.from_numpy_dtype(coords[k].dtype)))
                else:
                    fields.append(pa.field(k, pa.from_numpy_dtype(self._dtype(ds, path, k))))
            for n in chosen:
                fields.append(pa.field(n, pa.from_numpy_dtype(self._dtype(ds, path, n))))
            schema = pa.schema(fields)
        grid = GridInfo(path=path, dims=tuple(dims), shape=shape, variables=tuple(chosen),
                        coords={d: coords[d] for d in dims if d in coords}, attrs=attrs)
        outer = shape[0] if shape else 1
        inner = int(np.prod(shape[1:])) if len(shape) > 1 else 1

        def batches(start: int = 0, stop: int | None = None) -> Iterator[pa.RecordBatch]:
            stop = outer if stop is None else min(stop, outer)
            step = max(1, batch_rows // max(inner, 1))
            with NC_LOCK:
                ds = _open(path)
                ds.set_always_mask(True)
            try:
                for a in range(start, stop, step):
                    b = min(a + step, stop)
                    with NC_LOCK:
                        batch = self._slab(ds, path, a, b, shape, key_names, key_kind, coords, time_decode, chosen,
                                           schema)
                    yield batch
            finally:
                with NC_LOCK:
                    ds.close()

        return InputSource(path=path, format=self.name, schema=schema, keys=tuple(key_names),
                           num_rows=int(np.prod(shape)) if shape else 1, outer_size=outer, inner_size=inner,
                           open_batches=batches, grid=grid)

    @staticmethod
    def _dtype(ds, path: str, name: str) -> np.dtype:
        v = ds.variables[name]
        try:
            probe = v[(slice(0, 1),) * v.ndim] if v.ndim else v[...]
        except (OSError, RuntimeError, IndexError) as e:
            raise _read_error(path, f"variable {name!r}", e) from None
        return np.ma.getdata(probe).dtype

    @staticmethod
    def _slab(ds, path, a, b, shape, key_names, key_kind, coords, time_decode, chosen, schema) -> pa.RecordBatch:
        sub = (b - a,) + tuple(shape[1:])
        n = int(np.prod(sub))
        cols = []
        for k in key_names:
            kind = key_kind[k]
            if kind[0] == "coord":
                axis = kind[1]
                vals = coords[k][a:b] if axis == 0 else coords[k]
                rep = int(np.prod(sub[axis + 1:])) if axis + 1 < len(sub) else 1
                tile = int(np.prod(sub[:axis])) if axis > 0 else 1
                col = np.tile(np.repeat(vals, rep), tile)
            else:
                try:
                    col = ds.variables[k][a:b].reshape(n)
                except (OSError, RuntimeError, IndexError, ValueError) as e:
                    raise _read_error(path, f"variable {k!r}", e) from None
            if k in time_decode:
                ref, ns = time_decode[k]
                raw = np.ma.filled(col, np.nan) if np.ma.isMaskedArray(col) else col
                col = ref + (np.asarray(raw, dtype=np.float64) * ns).astype("timedelta64[ns]")
            cols.append(_arrow(col))
        for v in chosen:
            try:
                data = ds.variables[v][a:b]
            except (OSError, RuntimeError, IndexError, ValueError) as e:
                raise _read_error(path, f"variable {v!r}", e) from None
            if data.size != n:
                raise _read_error(path, f"variable {v!r}", ValueError(f"got {data.size} values, expected {n}"))
            cols.append(_arrow(data.reshape(n)))
        return pa.RecordBatch.from_arrays([c.cast(f.type) if c.type != f.type else c for c, f in zip(cols, schema)],
                                          schema=schema)


register_backend(NetCDFBackend())


def is_netcdf_path(path: str) -> bool:
    return os.path.splitext(path)[1].lower() in NetCDFBackend.extensions
