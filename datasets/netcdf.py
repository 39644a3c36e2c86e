"""netCDF backend (netCDF4): read in slabs of the outermost dimension, never whole.

A netCDF input is the selected variables (same dimensions) flattened in C order; every record
carries the keys. Default variables: every non-coordinate variable, numeric or text, on exactly
the dimensions of the numeric variable with the most dimensions. Default keys: the coordinate
variables of those dimensions; a dimension without one takes the 1-D variable CF marks as its
coordinate (``lat(latitude)``), else it is keyed by its index (an int64 column named after it).
A grid can be read in another grid's dimension order (``order``), so a transposed B pairs like A.
Keys may also be variables on the same dimensions (point lists: ``time(rec), lat(rec)``).
Fill values, ``scale_factor`` and ``add_offset`` are applied as netCDF4 does; missing values
become nulls.

This module is the backend (``NetCDFBackend.open``: a file's variables, keys and schema); the
grid's default keys and another grid's order are in ``netcdf_grid``, the slab reader in
``netcdf_slabs``, opening a file and the variable kinds in ``netcdf_file``.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np
import pyarrow as pa

from smerge.datasets.base import DEFAULT_BATCH_ROWS, GridInfo, InputSource, register_backend
from smerge.datasets.cf_refs import references
from smerge.datasets.cf_time import CFTime, parse_cf_time
from smerge.datasets.netcdf_file import (_MAGICS, _VALID_ATTRS, FORMAT, NC_LOCK, _group_hint, _is_numeric, _is_string,
                                         _decode_error, _key_error, _open, _read_error, _record_dims)
from smerge.datasets.netcdf_grid import _check_slab_size, _dimension_key, _direction, _locating, _reorder
from smerge.datasets.netcdf_slabs import _SlabPlan, _source
from smerge.errors import InputError, MissingKeyError, UsageError

# A coordinate (or index) of the outer dimension longer than this is read with each slab instead
# of whole (a file may declare a dimension of 2**31 with no data: 16 GB if read whole).
WHOLE_COORDINATE = 1 << 22


class NetCDFBackend:
    name = FORMAT
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
                cands = [n for n, v in allvars.items() if n not in coord_names and n not in referenced
                         and v.ndim > 0 and (_is_numeric(v) or _is_string(v))]
                numeric = [n for n in cands if _is_numeric(allvars[n])]
                if not numeric:
                    raise InputError(f"{path}: no numeric data variable; it has {', '.join(allvars)}{_group_hint(ds)}")
                # the records: the dimensions of the numeric variable with the most; every variable on
                # exactly these (text too: a char variable's string length is not a record dimension)
                dims = max((allvars[n].dimensions for n in numeric), key=len)
                chosen = [n for n in cands if _record_dims(allvars[n]) == dims]
            # variables named in a `coordinates` attribute (CF marks them as coordinates)
            named = {r for v in allvars.values() if "coordinates" in v.ncattrs()
                     for r in str(v.getncattr("coordinates")).split()}
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
            covered = {d for k in key_names for d in (allvars[k].dimensions if k in allvars else (k,))}
            # an index key whose dimension a variable locates (lon(x), given as key x or taken from
            # the other input): never paired by index (``jobs.inputs.check_index_keys``)
            located = {k: "; ".join(f"{n!r} ({', '.join(m)})" for n, m in _locating(allvars, k, named).items())
                       for k in key_names if k not in allvars}
            unkeyed = tuple(d for d in dims if d not in covered)
        key_dims = {k: kd[0] for k, kd in key_dims_of.items()}
        direction = {k: _direction(coords[k]) for k in key_dims
                     if isinstance(coords.get(k), np.ndarray) and coords[k].ndim == 1}
        grid = GridInfo(path=path, dims=tuple(dims), shape=shape, variables=tuple(chosen),
                        coords={d: coords[d] for d in dims if d in coords}, attrs=attrs, key_dims=key_dims,
                        index_keys=tuple(k for k in key_names if k not in allvars_names),
                        stored_dims=stored_dims, key_direction=direction, reordered=perm is not None,
                        unkeyed_dims=unkeyed, index_located={k: w for k, w in located.items() if w})
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
        except TypeError as e:
            raise _decode_error(path, name, e) from None
        return np.ma.getdata(probe).dtype


register_backend(NetCDFBackend())


def is_netcdf_path(path: str) -> bool:
    return os.path.splitext(path)[1].lower() in NetCDFBackend.extensions
