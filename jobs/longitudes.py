"""Longitude conventions of A and B, checked before a merge.

Keys are compared as numbers: smerge does not wrap longitudes. A longitude key of one input in
-180..180 against the other's in 0..360 pairs only where the two conventions agree (0..180);
every record west of Greenwich (or east of 180) would go unmatched, with exit 0. When both
inputs' ranges of such a key are known before the run (a grid's coordinate values, a Parquet
file's column statistics) and show the two conventions (one side more than a degree below 0,
the other more than a degree above 180), the run is exit 2 with how to bring one input to the other's convention. Where a range is
not known before reading (CSV, Arrow IPC, a Parquet file without statistics, an index server),
nothing is checked: the statistics' unmatched counts show such a loss.

A key pair is a longitude when either input marks its key so per CF (units ``degrees_east``,
``standard_name`` longitude) or both are named ``lon`` or ``longitude``.
"""

from __future__ import annotations

import math

import numpy as np

from smerge.datasets import InputSource
from smerge.datasets.netcdf_grid import _LON_UNITS  # CF's spellings of degrees_east, as the netCDF reader knows them
from smerge.errors import UsageError

LON_NAMES = {"lon", "longitude"}
# Degrees past 0 or 180 that count as the other convention: a grid offset by float noise or half
# a cell (-0.01, 180.5 beside 0..360) is not -180..180; a station at -0.1 still pairs with 0.0
# within a tolerance.
MARGIN = 1.0


def _marked(src: InputSource, key: str) -> bool:
    """``key`` of ``src`` is a longitude by its CF attributes (a grid's variable, or the field
    metadata a netCDF-derived column carries)."""
    attrs = dict(src.grid.attrs.get(key, {})) if src.grid is not None else {}
    if key in src.schema.names:
        md = src.schema.field(key).metadata or {}
        attrs.update({k.decode(errors="replace"): v.decode(errors="replace") for k, v in md.items()})
    units = str(attrs.get("units", "")).strip().lower()
    return units in _LON_UNITS or str(attrs.get("standard_name", "")).strip() == "longitude"


def key_range(src: InputSource, key: str) -> tuple[float, float] | None:
    """(min, max) of ``key``'s values when known without reading the records: a grid's 1-D
    coordinate, or a local Parquet file's statistics (every row group must have them)."""
    g = src.grid
    if g is not None:
        dim = g.key_dims.get(key)
        vals = g.coords.get(dim) if dim is not None else None
        if vals is None:
            return None
        try:
            v = np.asarray(np.ma.filled(np.ma.asarray(vals, dtype=np.float64), np.nan)).ravel()
        except (TypeError, ValueError):
            return None
        v = v[np.isfinite(v)]
        return (float(v.min()), float(v.max())) if v.size else None
    if src.format != "parquet" or "://" in src.path:
        return None
    from smerge.datasets.parquet_io import parquet_file

    try:
        md = parquet_file(src.path).metadata
        col = next((j for j in range(md.num_columns) if md.schema.column(j).path == key), None)
        if col is None or md.num_row_groups == 0:
            return None
        lo, hi = math.inf, -math.inf
        for i in range(md.num_row_groups):
            st = md.row_group(i).column(col).statistics
            if st is None or not st.has_min_max:
                return None
            lo, hi = min(lo, float(st.min)), max(hi, float(st.max))
    except (OSError, TypeError, ValueError):  # unreadable statistics: the run reads the file itself
        return None
    return (lo, hi) if math.isfinite(lo) and math.isfinite(hi) else None


def check_longitudes(src_a: InputSource, src_b: InputSource) -> None:
    """Exit 2 when a longitude key of A and B is known to use -180..180 on one side and 0..360
    on the other (see the module doc)."""
    for ka, kb in zip(src_a.keys, src_b.keys):
        named = ka.lower() in LON_NAMES and kb.lower() in LON_NAMES
        if not (named or _marked(src_a, ka) or _marked(src_b, kb)):
            continue
        ra, rb = key_range(src_a, ka), key_range(src_b, kb)
        if ra is None or rb is None:
            continue
        if (ra[0] < -MARGIN and rb[1] > 180 + MARGIN) or (rb[0] < -MARGIN and ra[1] > 180 + MARGIN):
            west, east = ("A", "B") if ra[0] < -MARGIN else ("B", "A")
            raise UsageError(
                f"longitude key {ka!r} of A ({src_a.path}) runs {ra[0]:g} to {ra[1]:g} and {kb!r} of B "
                f"({src_b.path}) runs {rb[0]:g} to {rb[1]:g}: {west} counts longitudes from -180 to 180 and {east} "
                f"from 0 to 360, and keys are compared as numbers, so records of {west} west of 0 could never pair; "
                "bring one input to the other's convention first (e.g. lon = (lon + 180) % 360 - 180, or cdo "
                "sellonlatbox,-180,180,-90,90)")
