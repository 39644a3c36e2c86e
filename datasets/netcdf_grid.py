"""The grid a netCDF input describes: the default key of each dimension (its coordinate variable,
or the one 1-D variable CF marks as its coordinate, else its index), reading a grid in another
grid's key order (``_reorder``: a permutation of the dimensions and the axes read backwards),
a key's direction, and the bound on one slab's records. Used by the backend
(``datasets/netcdf.py``) when it opens a file.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from smerge.datasets.netcdf_file import _is_numeric
from smerge.errors import UsageError, param

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
    cands = _locating(allvars, dim, named)
    if len(cands) > 1:
        which = "; ".join(f"{n}: {', '.join(m)}" for n, m in cands.items())
        raise UsageError(
            f"{path}: dimension {dim!r} has no coordinate variable of its name and several variables mark "
            f"themselves as its coordinate ({which}); "
            f"name the keys with {param.keys}")
    return next(iter(cands), dim)


def _locating(allvars, dim: str, named: set[str]) -> dict[str, tuple[str, ...]]:
    """The 1-D numeric variables on ``dim`` that CF marks as its coordinate, with their marks."""
    cands = {n: _coordinate_marks(n, w, named) for n, w in allvars.items()
             if w.dimensions == (dim,) and _is_numeric(w)}
    return {n: m for n, m in cands.items() if m}


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
            f"with {param.vars} on fewer dimensions, or split the file along another dimension (ncks -d)")


def _direction(values) -> int:
    """+1 for strictly increasing values, -1 for strictly decreasing, 0 otherwise."""
    v = np.asarray(values, dtype=np.float64)
    if v.size < 2:
        return 0
    d = np.diff(v)
    return 1 if (d > 0).all() else -1 if (d < 0).all() else 0
