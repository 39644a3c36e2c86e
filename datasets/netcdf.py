"""netCDF backend (netCDF4): read in slabs of the outermost dimension, never whole.

A netCDF input is the selected variables (same dimensions) flattened in C order; every record
carries the keys. Default variables: every numeric non-coordinate variable on the dimensions
of the variable with the most dimensions. Default keys: the coordinate variables of those
dimensions; a dimension without one takes the 1-D variable CF marks as its coordinate
(``lat(latitude)``), else it is keyed by its index (an int64 column named after it). A grid can
be read in another grid's dimension order (``order``), so a transposed B pairs like A.
Keys may also be variables on the same dimensions (point lists: ``time(rec), lat(rec)``).
Fill values, ``scale_factor`` and ``add_offset`` are applied as netCDF4 does; missing values
become nulls.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa

from smerge.datasets.base import DEFAULT_BATCH_ROWS, GridInfo, InputSource, RawKey, register_backend
from smerge.datasets.cf_refs import references
from smerge.datasets.cf_time import GREGORIAN_SWITCH_US, CFTime, parse_cf_time
from smerge.errors import InputError, MissingKeyError, UsageError

# netCDF-C and HDF5 are not thread-safe and netCDF4 releases the GIL during its C calls: two
# background readers (dual buffering) crash or read garbage unless every netCDF4 call holds this.
NC_LOCK = threading.RLock()

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


_LAT_UNITS = {"degrees_north", "degree_north", "degree_n", "degrees_n", "degreen", "degreesn"}
_LON_UNITS = {"degrees_east", "degree_east", "degree_e", "degrees_e", "degreee", "degreese"}
# standard names of coordinates (CF standard name table, the coordinate kinds)
_COORD_STANDARD_NAMES = {
    "latitude", "longitude", "time", "grid_latitude", "grid_longitude", "projection_x_coordinate",
    "projection_y_coordinate", "projection_x_angular_coordinate", "projection_y_angular_coordinate",
    "altitude", "height", "depth", "air_pressure", "model_level_number", "forecast_period",
    "forecast_reference_time", "atmosphere_sigma_coordinate", "atmosphere_hybrid_sigma_pressure_coordinate",
    "atmosphere_hybrid_height_coordinate", "ocean_sigma_coordinate", "ocean_s_coordinate",
    "ocean_double_sigma_coordinate", "ocean_sigma_z_coordinate", "air_potential_temperature",
}


def _coordinate_marks(name: str, var, named: set[str]) -> tuple[str, ...]:
    """What marks the 1-D variable ``var`` as a coordinate of its dimension per CF: its units
    (degrees_north/east, a time since a date), an ``axis``, a ``positive`` direction, a
    coordinate ``standard_name``, or a ``coordinates`` attribute naming it."""
    from smerge.datasets.cf_time import is_cf_time_units

    attrs = {a: var.getncattr(a) for a in var.ncattrs()}
    units = str(attrs.get("units", "")).strip().lower()
    marks = []
    if units in _LAT_UNITS or units in _LON_UNITS:
        marks.append(f"units {attrs['units']}")
    if is_cf_time_units(attrs.get("units")):
        marks.append("time units")
    if str(attrs.get("axis", "")).upper() in ("X", "Y", "Z", "T"):
        marks.append(f"axis {attrs['axis']}")
    if str(attrs.get("positive", "")).lower() in ("up", "down"):
        marks.append("positive")
    if str(attrs.get("standard_name", "")).split(" ")[0] in _COORD_STANDARD_NAMES:
        marks.append(f"standard_name {attrs['standard_name']}")
    if name in named:
        marks.append("named in coordinates")
    return tuple(marks)


def _dimension_key(path: str, allvars, dim: str, named: set[str]) -> str:
    """The default key of dimension ``dim``: its coordinate variable ``dim(dim)``; else the one
    1-D numeric variable on it that CF marks as a coordinate (``lat(latitude)`` with units
    degrees_north, ...); else the dimension itself, keyed by array index (allowed only when the
    other input keys it by index too, with the same size: ``jobs.inputs``). Several candidates
    are exit 2: smerge does not guess between them."""
    v = allvars.get(dim)
    if v is not None and v.dimensions == (dim,):
        return dim
    cands = {n: _coordinate_marks(n, w, named) for n, w in allvars.items()
             if w.dimensions == (dim,) and _is_numeric(w)}
    cands = {n: m for n, m in cands.items() if m}
    if len(cands) > 1:
        which = "; ".join(f"{n}: {', '.join(m)}" for n, m in cands.items())
        raise UsageError(
            f"{path}: dimension {dim!r} has no coordinate variable of its name and several variables mark "
            f"themselves as its coordinate ({which}); "
            "name the keys with --keys")
    return next(iter(cands), dim)


def _reorder(allvars, dims: tuple[str, ...], key_names: Sequence[str],
             order: Sequence[tuple[str, int]] | None) -> tuple[tuple[int, ...] | None, tuple[bool, ...] | None]:
    """How to read a grid in another input's key order: ``(perm, flip)`` (see ``_SlabPlan``), or
    ``(None, None)`` when it is read as stored. It applies when every record dimension is keyed
    by exactly one key of ``order`` on it alone (a coordinate variable, an auxiliary coordinate
    ``lat(latitude)`` or the dimension's index), so the records can be put in that order."""
    if not order or len(dims) < 1:
        return None, None
    dim_of = {}
    for k in key_names:
        v = allvars.get(k)
        if v is None and k in dims:
            dim_of[k] = k
        elif v is not None and len(v.dimensions) == 1 and v.dimensions[0] in dims:
            dim_of[k] = v.dimensions[0]
    names = [k for k, _ in order]
    if len(names) != len(dims) or set(names) != set(key_names) or any(k not in dim_of for k in names) \
            or sorted(dim_of[k] for k in names) != sorted(dims):
        return None, None
    perm = tuple(dims.index(dim_of[k]) for k in names)
    flip = []
    for k, want in order:
        v = allvars.get(k)
        have = 0
        if v is not None and want and v.shape[0] > 1:
            try:
                # direction from the ends (cheap); a non-monotone coordinate is read as stored
                first, last = (float(np.ma.getdata(v[i])) for i in (0, v.shape[0] - 1))
                have = 1 if last > first else -1 if last < first else 0
            except (OSError, RuntimeError, IndexError, ValueError, TypeError):
                have = 0
        flip.append(bool(want and have and have != want))
    if perm == tuple(range(len(dims))) and not any(flip):
        return None, None
    return perm, tuple(flip)


# A coordinate (or index) of the outer dimension longer than this is read with each slab instead
# of whole (a file may declare a dimension of 2**31 with no data: 16 GB if read whole).
WHOLE_COORDINATE = 1 << 22
# Records in one slab of the outer dimension (the product of the other dimensions): smerge reads
# at least one whole slab at a time, so a larger one cannot be read in bounded memory.
MAX_SLAB_RECORDS = 1 << 26


def _check_slab_size(path: str, dims: Sequence[str], shape: Sequence[int]) -> None:
    inner = int(np.prod(shape[1:], dtype=np.float64)) if len(shape) > 1 else 1
    if inner > MAX_SLAB_RECORDS:
        sizes = ", ".join(f"{d}={n:,}" for d, n in zip(dims, shape))
        raise UsageError(
            f"{path}: one slab of its outer dimension {dims[0]!r} holds {inner:,} records ({sizes}); smerge reads "
            f"at least one slab at a time and reads at most {MAX_SLAB_RECORDS:,} records per slab: choose variables "
            "with --vars on fewer dimensions, or split the file along another dimension (ncks -d)")


def _direction(values) -> int:
    """+1 for strictly increasing values, -1 for strictly decreasing, 0 otherwise."""
    v = np.asarray(values, dtype=np.float64)
    if v.size < 2:
        return 0
    d = np.diff(v)
    return 1 if (d > 0).all() else -1 if (d < 0).all() else 0


def _chunk_cache(var, axis: int, n: int, limit: int = 256 << 20) -> None:
    """Let a strided read of ``n`` indices along stored ``axis`` keep the chunks it touches, so
    the next slab does not read them again (netCDF-4 chunked variables; at most ``limit``
    bytes: a larger layer of chunks is read again per slab, slower but in bounded memory)."""
    try:
        chunks = var.chunking()
    except (AttributeError, RuntimeError, OSError):
        return
    if not isinstance(chunks, list):
        return
    layer = np.dtype(var.dtype).itemsize if var.dtype is not str else 8
    for i, (size, c) in enumerate(zip(var.shape, chunks)):
        layer *= c if i == axis else -(-size // c) * c
    size = int(min(max(layer, 1 << 20), limit))
    try:
        var.set_var_chunk_cache(size=size, nelems=max(1009, 4 * size // (1 << 20) + 1))
    except (AttributeError, RuntimeError, OSError):
        pass


class NetCDFBackend:
    name = "netcdf"
    # Zarr stores and GRIB files are read by this backend too, through ``cf_adapter``
    extensions = (".nc", ".cdf", ".nc4", ".netcdf", ".zarr", ".grib", ".grib1", ".grib2", ".grb", ".grb2")

    def guess_can_open(self, path: str, magic: bytes) -> bool:
        from smerge.datasets.base import ZARR_MAGIC

        return magic.startswith(_MAGICS + (ZARR_MAGIC, b"GRIB")) or (
            not magic and path.lower().endswith(self.extensions))

    def open(self, path: str, *, keys: Sequence[str] | None = None, variables: Sequence[str] | None = None,
             batch_rows: int = DEFAULT_BATCH_ROWS, decode_times: bool = True,
             order: Sequence[tuple[str, int]] | None = None) -> InputSource:
        """Open ``path`` (metadata and the 1-D coordinates only). CF time keys are always decoded
        (``datasets.cf_time``); ``decode_times`` is kept for the backend protocol.

        ``order``: ``(key, direction)`` pairs, the order (and, +1/-1, the direction, 0 for any)
        in which another input's grid stores these keys. When this file is a grid whose keys
        are its dimension coordinates, it is read in that order (``_reorder``), so its records
        arrive as the other input's do."""
        for what, names in (("key", keys), ("variable", variables)):
            dup = sorted({n for n in names or () if list(names).count(n) > 1})
            if dup:
                raise UsageError(f"{path}: {what} {', '.join(map(repr, dup))} named twice; name each once")
        with NC_LOCK, _open(path, variables) as ds:
            allvars = ds.variables
            if not allvars:
                hint = _group_hint(ds) or "; the file may be empty or truncated: re-download or regenerate it"
                raise InputError(f"{path}: it has no variables{hint}")
            coord_names = {n for n, v in allvars.items() if v.dimensions == (n,)}
            if variables:
                missing = [v for v in variables if v not in allvars]
                if missing:
                    raise UsageError(
                        f"{path}: no variable {', '.join(map(repr, missing))}; it has {', '.join(allvars)}"
                        f"{_group_hint(ds)}"
                    )
                dims = _record_dims(allvars[variables[0]])
                for v in variables:
                    if _record_dims(allvars[v]) != dims:
                        raise UsageError(
                            f"{path}: variable {v!r} has dimensions {_record_dims(allvars[v])} but "
                            f"{variables[0]!r} has {dims}; choose variables on the same dimensions"
                        )
                chosen = list(variables)
            else:
                # Not data: variables that others name as their bounds, coordinates, grid mapping,
                # cell measures or ancillary variables (lat_bnds, lat2d, crs, cell_area, ...).
                referenced = {r for v in allvars.values() for a in v.ncattrs()
                              for r in references(a, v.getncattr(a))}
                cands = [n for n, v in allvars.items()
                         if n not in coord_names and n not in referenced and v.ndim > 0 and _is_numeric(v)]
                if not cands:
                    raise InputError(f"{path}: no numeric data variable; it has {', '.join(allvars)}{_group_hint(ds)}")
                dims = max((allvars[n].dimensions for n in cands), key=len)
                chosen = [n for n in cands if allvars[n].dimensions == dims]
            if keys:
                missing = [k for k in keys if k not in allvars and k not in dims]
                if missing:
                    raise MissingKeyError(path, missing, list(allvars))
                for k in keys:
                    if k in allvars and _is_string(allvars[k]):
                        raise _key_error(path, k, "is a character or string variable")
                    kd = allvars[k].dimensions if k in allvars else ()
                    if k in allvars and (not set(kd) <= set(dims) or len(set(kd)) != len(kd) or not kd):
                        raise UsageError(
                            f"{path}: key {k!r} has dimensions {kd}; a key must be a variable on some of "
                            f"{dims} (a coordinate, a 2-D latitude of a curvilinear grid, or a variable on all)"
                        )
                key_names = list(keys)
                chosen = [v for v in chosen if v not in key_names]
            else:
                # CF point lists name their keys in the `coordinates` attribute; text labels
                # (station_name) named there too are payload, not keys.
                cf = next((str(allvars[v].getncattr("coordinates")).split() for v in chosen
                           if "coordinates" in allvars[v].ncattrs()), [])
                cf = [c for c in cf if not (c in allvars and _is_string(allvars[c]))]
                if cf and all(c in allvars and allvars[c].dimensions == dims and _is_numeric(allvars[c])
                              for c in cf):
                    key_names = cf
                    chosen = [v for v in chosen if v not in cf]
                else:
                    named = {r for v in allvars.values() if "coordinates" in v.ncattrs()
                             for r in str(v.getncattr("coordinates")).split()}
                    key_names = [_dimension_key(path, allvars, d, named) for d in dims]
                    chosen = [v for v in chosen if v not in key_names]
            for k in key_names:
                if k in allvars and _is_string(allvars[k]):
                    raise _key_error(path, k, "is a character or string variable")
            shape = tuple(len(ds.dimensions[d]) for d in dims)
            if not chosen and not key_names:
                raise InputError(f"{path}: nothing to read")
            stored_dims = tuple(dims)
            perm, flip = _reorder(allvars, dims, key_names, order)
            if perm is not None:
                dims = tuple(dims[i] for i in perm)
                shape = tuple(shape[i] for i in perm)
            _check_slab_size(path, dims, shape)
            # Key columns: broadcast coordinate (1-D on one of dims) or full variables on dims.
            coords: dict[str, np.ndarray] = {}
            key_kind: dict[str, tuple] = {}
            time_decode: dict[str, CFTime] = {}
            attrs: dict[str, dict] = {}
            fields: list[pa.Field] = []
            for k in key_names:
                v = allvars.get(k)
                if v is not None:
                    attrs[k] = {a: v.getncattr(a) for a in v.ncattrs()}
                    ct = parse_cf_time(attrs[k].get("units"), attrs[k].get("calendar"), source=path, name=k)
                    if ct is not None:
                        time_decode[k] = ct
                if v is not None and v.dimensions == dims and (len(dims) > 1 or k not in dims):
                    key_kind[k] = ("full",)
                    ct = time_decode.get(k)
                    typ = ct.field_type() if ct else pa.from_numpy_dtype(self._dtype(ds, path, k))
                else:
                    # A variable on some of the dimensions (a coordinate, lat2d(y, x) of a
                    # curvilinear grid), read whole and broadcast over the others.
                    if v is not None and v.dimensions == dims[:1] and v.size > WHOLE_COORDINATE:
                        # A long coordinate of the outer dimension: read with each slab, never whole
                        key_kind[k] = ("outer",)
                        ct = time_decode.get(k)
                        typ = ct.field_type() if ct else pa.from_numpy_dtype(self._dtype(ds, path, k))
                        fields.append(pa.field(k, typ, metadata=ct.metadata(typ) if ct else None))
                        continue
                    if v is not None and v.ndim > 1 and dims[0] in v.dimensions and v.size > WHOLE_COORDINATE:
                        raise UsageError(
                            f"{path}: key {k!r} on {v.dimensions} has {v.size:,} values, more than smerge reads "
                            f"whole ({WHOLE_COORDINATE:,}) for a key on several dimensions that include the outer "
                            f"one; use keys on one dimension each, or a subset of the file (ncks -d)")
                    if v is not None:
                        vals, typ = self._coordinate(v, path, k, time_decode.get(k))
                        if flip and len(v.dimensions) == 1 and flip[dims.index(v.dimensions[0])]:
                            vals = vals[::-1]
                        axes = [dims.index(d) for d in v.dimensions]
                        if vals.ndim > 1:
                            vals = np.transpose(vals, np.argsort(axes))
                        axes = sorted(axes)
                    else:
                        axes = [dims.index(k)]
                        n = shape[axes[0]]
                        # an index as long as the dimension is never built: a range is sliced per slab
                        vals = np.arange(n, dtype=np.int64) if n <= WHOLE_COORDINATE else range(n)
                        typ = pa.int64()
                    coords[k] = vals
                    key_kind[k] = ("coord", tuple(axes))
                ct = time_decode.get(k)
                fields.append(pa.field(k, typ, metadata=ct.metadata(typ) if ct else None))
            for n in chosen:
                attrs[n] = {a: allvars[n].getncattr(a) for a in allvars[n].ncattrs()}
                typ = pa.string() if _is_string(allvars[n]) else pa.from_numpy_dtype(self._dtype(ds, path, n))
                fields.append(pa.field(n, typ))
            schema = pa.schema(fields)
            valid_masked = tuple(n for n in chosen if any(a in attrs[n] for a in _VALID_ATTRS))
            # What the reads rely on, checked at every open of the file for reading (_SlabPlan.check)
            stored = tuple((n, str(allvars[n].dtype)) for n in (*key_names, *chosen) if n in allvars)
            allvars_names = set(allvars)
            # keys on one dimension: a coordinate (lat(lat), lat(latitude)) or an array index
            key_dims_of = {k: (allvars[k].dimensions if k in allvars else (k,)) for k in key_names
                           if k not in allvars or len(allvars[k].dimensions) == 1}
        key_dims = {k: kd[0] for k, kd in key_dims_of.items()}
        direction = {k: _direction(coords[k]) for k in key_dims
                     if isinstance(coords.get(k), np.ndarray) and coords[k].ndim == 1}
        grid = GridInfo(path=path, dims=tuple(dims), shape=shape, variables=tuple(chosen),
                        coords={d: coords[d] for d in dims if d in coords}, attrs=attrs, key_dims=key_dims,
                        index_keys=tuple(k for k in key_names if k not in allvars_names),
                        stored_dims=stored_dims, key_direction=direction, reordered=perm is not None)
        plan = _SlabPlan(path=path, shape=shape, key_names=tuple(key_names), key_kind=key_kind, coords=coords,
                         time_decode=time_decode, chosen=tuple(chosen), schema=schema, valid_masked=valid_masked,
                         dims=tuple(dims), stored=stored, perm=perm, flip=flip, stored_dims=stored_dims)
        return _source(plan, grid, batch_rows)

    @staticmethod
    def _coordinate(v, path: str, k: str, ct: CFTime | None) -> tuple[np.ndarray, pa.DataType]:
        """A 1-D coordinate key, read whole: its values and Arrow type. Missing values (an integer
        coordinate whose values are its ``_FillValue``) become NaN: keys with missing values."""
        try:
            raw = v[:]
        except (OSError, RuntimeError, IndexError, ValueError) as e:
            raise _read_error(path, f"coordinate {k!r}", e) from None
        if ct is not None:
            us, mask = ct.decode(raw, source=path, name=k)
            valid = us if mask is None else us[~mask]
            typ = ct.field_type(int(valid.min()) if valid.size else None)
            if mask is not None:
                return np.where(mask, np.nan, us.astype(np.float64)), typ
            return us, typ
        if np.ma.isMaskedArray(raw) and np.ma.getmaskarray(raw).any():
            vals = np.ma.getdata(raw).astype(np.float64)
            vals[np.ma.getmaskarray(raw)] = np.nan
            return vals, pa.float64()
        vals = np.asarray(np.ma.getdata(raw))
        return vals, pa.from_numpy_dtype(vals.dtype)

    @staticmethod
    def _dtype(ds, path: str, name: str) -> np.dtype:
        v = ds.variables[name]
        try:
            probe = v[(slice(0, 1),) * v.ndim] if v.ndim else v[...]
        except (OSError, RuntimeError, IndexError) as e:
            raise _read_error(path, f"variable {name!r}", e) from None
        return np.ma.getdata(probe).dtype


@dataclass(frozen=True)
class _SlabPlan:
    """How the records of outer indices ``a:b`` are built from the file (see ``open``)."""

    path: str
    shape: tuple[int, ...]
    key_names: tuple[str, ...]
    key_kind: dict
    coords: dict
    time_decode: dict
    chosen: tuple[str, ...]
    schema: pa.Schema
    valid_masked: tuple[str, ...]
    dims: tuple[str, ...] = ()
    stored: tuple[tuple[str, str], ...] = ()  # (variable, its netCDF dtype) of the keys and variables read
    # B read in another input's key order: record axis i is stored axis perm[i] (None: as
    # stored), and flip[i] reads that axis backwards (after the permutation)
    perm: tuple[int, ...] | None = None
    flip: tuple[bool, ...] | None = None
    stored_dims: tuple[str, ...] = ()

    def check(self, ds) -> None:
        """The file opened for reading still has the dimensions and variables this plan was made
        from (else: it changed since it was opened, or a task reads another copy)."""
        got = tuple(len(ds.dimensions[d]) if d in ds.dimensions else None for d in self.dims)
        changed = [f"dimensions {dict(zip(self.dims, self.shape))} are now {dict(zip(self.dims, got))}"] \
            if got != tuple(self.shape) else []
        for n, dtype in self.stored:
            now = str(ds.variables[n].dtype) if n in ds.variables else None
            if now != dtype:
                changed.append(f"variable {n!r} was {dtype}, is {now or 'gone'}")
        if changed:
            raise InputError(f"{self.path}: the file changed since it was opened ({'; '.join(changed)}); "
                             "run again on files that do not change during the run")

    def slab(self, ds, a: int, b: int) -> tuple[pa.RecordBatch, int]:
        """The batch and the count of values masked by valid_min/valid_max/valid_range."""
        path, shape = self.path, self.shape
        sub = (b - a,) + tuple(shape[1:])
        n = int(np.prod(sub))
        cols = []
        for k, f in zip(self.key_names, self.schema):
            kind = self.key_kind[k]
            if kind[0] == "coord":
                axes = kind[1]
                vals = self.coords[k][a:b] if axes[0] == 0 else self.coords[k]
                if len(axes) == 1:
                    axis = axes[0]
                    rep = int(np.prod(sub[axis + 1:])) if axis + 1 < len(sub) else 1
                    tile = int(np.prod(sub[:axis])) if axis > 0 else 1
                    col = np.tile(np.repeat(vals, rep), tile)
                else:
                    shape_b = [sub[i] if i in axes else 1 for i in range(len(sub))]
                    col = np.broadcast_to(vals.reshape(shape_b), sub).reshape(n)
                if col.dtype.kind == "f" and not pa.types.is_floating(f.type):
                    cols.append(pa.array(np.where(np.isnan(col), 0, col).astype(np.int64), mask=np.isnan(col))
                                .cast(f.type))
                else:
                    cols.append(pa.array(col).cast(f.type))
                continue
            if kind[0] == "outer":
                per = self._full_key(k, self._read_outer(ds, k, a, b))
                inner = n // max(b - a, 1)
                cols.append(per.take(pa.array(np.repeat(np.arange(b - a, dtype=np.int64), inner))))
                continue
            cols.append(self._full_key(k, self._read(ds, k, a, b).reshape(n)))
        masked = 0
        for v, f in zip(self.chosen, list(self.schema)[len(self.key_names):]):
            var = ds.variables[v]
            data = self._read(ds, v, a, b)
            if pa.types.is_string(f.type):
                data = _strings(data)
            if data.size != n:
                raise _read_error(path, f"variable {v!r}", ValueError(f"got {data.size} values, expected {n}"))
            if v in self.valid_masked:
                masked += _range_masked(var, data, lambda: self._read(ds, v, a, b, raw=True))
            cols.append(_arrow(data.reshape(n)).cast(f.type) if not pa.types.is_string(f.type)
                        else pa.array(data.reshape(n), type=pa.string()))
        return pa.RecordBatch.from_arrays(cols, schema=self.schema), masked

    def _read(self, ds, name: str, a: int, b: int, raw: bool = False):
        """Variable ``name`` at outer indices ``a:b``, as netCDF4 gives it (unpacked, masked;
        ``raw``: as stored), in the plan's record order: for a B read in A's order, the slab
        ``a:b`` of the plan's outer dimension wherever the file stores it, its axes put in the
        plan's order (a strided read of one slab: memory is one slab, as for any input)."""
        var = ds.variables[name]
        try:
            with _as_stored(var) if raw else contextlib.nullcontext():
                if self.perm is None:
                    return np.asarray(var[a:b]) if raw else var[a:b]
                return self._read_reordered(var, a, b)
        except (OSError, RuntimeError, IndexError, ValueError) as e:
            raise _read_error(self.path, f"variable {name!r}", e) from None

    def _read_outer(self, ds, name: str, a: int, b: int):
        """The 1-D coordinate ``name`` of the plan's outer dimension at outer indices ``a:b``."""
        var = ds.variables[name]
        n0 = self.shape[0]
        back = bool(self.flip and self.flip[0])
        lo, hi = (n0 - b, n0 - a) if back else (a, b)
        try:
            data = var[lo:hi]
        except (OSError, RuntimeError, IndexError, ValueError) as e:
            raise _read_error(self.path, f"variable {name!r}", e) from None
        return data[::-1] if back else data

    def _read_reordered(self, var, a: int, b: int):
        nrec = len(self.dims)
        outer = self.stored_dims.index(self.dims[0])  # where the plan's outer axis is stored
        n0 = self.shape[0]
        lo, hi = (n0 - b, n0 - a) if self.flip[0] else (a, b)
        index = [slice(None)] * var.ndim
        index[outer] = slice(lo, hi)
        _chunk_cache(var, outer, hi - lo)
        data = var[tuple(index)]
        axes = [self.stored_dims.index(d) for d in self.dims] + list(range(nrec, var.ndim))
        data = data.transpose(axes)
        flips = tuple(slice(None, None, -1) if f else slice(None) for f in self.flip)
        if any(self.flip):
            data = data[flips]
        return data

    def _full_key(self, k: str, col) -> pa.Array:
        """The key column of key variable ``k`` from its values ``col`` (1-D): CF times decoded."""
        f = self.schema.field(k)
        ct = self.time_decode.get(k)
        if ct is None:
            return _arrow(col).cast(f.type)
        us, mask = ct.decode(col, source=self.path, name=k)
        if pa.types.is_timestamp(f.type) and ct.calendar == "standard":
            early = us < GREGORIAN_SWITCH_US if mask is None else (us < GREGORIAN_SWITCH_US) & ~mask
            if early.any():
                raise InputError(f"{self.path}: time variable {k!r} has dates before 1582-10-15 in the standard "
                                 "calendar while its reference date is after; smerge cannot type it as one "
                                 "timestamp: set calendar = \"proleptic_gregorian\" if that is meant")
        return pa.array(us, mask=mask).cast(f.type)

    def raw_key(self, ds, a: int, b: int) -> tuple[np.ndarray, np.ndarray | None]:
        """The leading key (a variable on all dimensions) of outer indices ``a:b`` as stored,
        unpacked but not time-decoded, and its missing values: masked, NaN, and for a CF time
        also infinite (as ``slab`` makes them missing keys). ``smerge.datasets.base.RawKey``."""
        k = self.key_names[0]
        col = self._read(ds, k, a, b)
        data = np.ma.getdata(col).reshape(-1)
        missing = np.ma.getmaskarray(col).reshape(-1) if np.ma.isMaskedArray(col) else None
        if data.dtype.kind == "f":
            bad = ~np.isfinite(data) if k in self.time_decode else np.isnan(data)
            missing = bad if missing is None else missing | bad
        if missing is not None and not missing.any():
            missing = None
        return data, missing

    def key_arrow(self, values: np.ndarray) -> pa.Array:
        """The leading key column of stored values (none missing) as ``slab`` builds it."""
        return self._full_key(self.key_names[0], values)


def _source(plan: "_SlabPlan", grid: GridInfo, batch_rows: int) -> InputSource:
    """The input ``plan`` describes (its metadata already read). ``InputSource.reopen`` gives
    ``reopen`` what it needs to build the same source in another process (a Spark task) without
    reading the metadata again: each read checks that the file still has the dimensions and
    variables the plan was made from."""
    path, shape = plan.path, plan.shape
    outer = shape[0] if shape else 1
    inner = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    counters = {"masked": 0}

    def slabs(start: int, stop: int | None, read) -> Iterator:
        """``read(ds, a, b)`` for the slabs of outer indices ``start:stop``, one open of the file."""
        stop = outer if stop is None else min(stop, outer)
        step = max(1, batch_rows // max(inner, 1))
        with NC_LOCK:
            ds = _open(path, plan.chosen)
            ds.set_always_mask(True)
        try:
            with NC_LOCK:
                plan.check(ds)
            for a in range(start, stop, step):
                b = min(a + step, stop)
                with NC_LOCK:
                    got = read(ds, a, b)
                yield got
        finally:
            with NC_LOCK:
                ds.close()

    def batches(start: int = 0, stop: int | None = None) -> Iterator[pa.RecordBatch]:
        for batch, masked in slabs(start, stop, plan.slab):
            counters["masked"] += masked
            counters["read_here"] = True
            yield batch

    raw_key = None
    if plan.key_names and plan.key_kind[plan.key_names[0]] == ("full",):
        raw_key = RawKey(batches=lambda start=0, stop=None: slabs(start, stop, plan.raw_key), to_arrow=plan.key_arrow)
    return InputSource(path=path, format=NetCDFBackend.name, schema=plan.schema, keys=plan.key_names,
                       num_rows=int(np.prod(shape)) if shape else 1, outer_size=outer, inner_size=inner,
                       open_batches=batches, grid=grid, counters=counters, raw_key=raw_key,
                       reopen=(_source, (plan, grid, batch_rows)))


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


register_backend(NetCDFBackend())


def is_netcdf_path(path: str) -> bool:
    return os.path.splitext(path)[1].lower() in NetCDFBackend.extensions


def masked_values(src: InputSource, *, read_here: bool = True) -> int:
    """Values of ``src`` made missing by valid_min/valid_max/valid_range (docs/data.md, "Values").

    Counted while ``batches()`` streamed in this process (``src.counters``); when it did not
    (the records were read by Spark tasks), the variables that carry such attributes, and only
    those, are read once more here, slab by slab."""
    if src.grid is None:
        return 0
    if read_here and src.counters.get("read_here"):
        return int(src.counters.get("masked", 0))
    g = src.grid
    names = [v for v in g.variables if any(a in g.attrs.get(v, {}) for a in _VALID_ATTRS)]
    if not names:
        return 0
    total = 0
    with NC_LOCK:
        ds = _open(src.path, g.variables)
        ds.set_always_mask(True)

    def raw(var, a, b):
        with _as_stored(var):
            return np.asarray(var[a:b])

    try:
        for n in names:  # in the file's own layout (a count does not depend on the order)
            var = ds.variables[n]
            outer = var.shape[0] if var.ndim else 1
            step = max(1, DEFAULT_BATCH_ROWS // max(int(np.prod(var.shape[1:])), 1))
            for a in range(0, outer, step):
                b = min(a + step, outer)
                with NC_LOCK:
                    total += _range_masked(var, var[a:b], lambda: raw(var, a, b))
    finally:
        with NC_LOCK:
            ds.close()
    return total
