"""GRIB 1 and 2 files (cfgrib and ecCodes) as netCDF-like datasets for the netCDF reader.

cfgrib maps the messages to CF variables and groups them into hypercubes (one per level type,
step type, grid, ...: ``cfgrib.open_datasets``); one hypercube is read, through
``cf_adapter.Dataset``, so every CF rule of the netCDF reader applies (keys, CF times, B in A's
order). A file with several hypercubes is read when ``--vars`` names variables of one of them;
otherwise it is refused listing them (--vars-a, --vars-b). Reads are lazy: a slab reads only its messages. Values
missing in a message (its bitmap) are NaN to cfgrib and missing (null) here (``_FillValue``
NaN). cfgrib writes no index file next to the input (``indexpath=""``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from smerge.datasets import cf_adapter, remote
from smerge.errors import InputError, UsageError, param


def _label(ds) -> str:
    names = list(ds.data_vars)
    first = ds[names[0]].attrs if names else {}
    what = [str(first[k]) for k in ("GRIB_typeOfLevel", "GRIB_stepType", "GRIB_gridType") if k in first]
    dims = ", ".join(f"{d}={n}" for d, n in ds.sizes.items())
    return f"{', '.join(names)} ({'; '.join(what)}; {dims})"


def open_dataset(path: str, variables: Sequence[str] | None = None) -> cf_adapter.Dataset:
    if remote.is_remote(path):
        raise InputError(f"{path}: a GRIB file on an object store: ecCodes reads local files only; copy it to a "
                         "local path first")
    try:
        import cfgrib
    except ImportError as e:
        raise InputError(f"{path}: reading GRIB needs cfgrib and ecCodes ({e}); install them "
                         "(pip install cfgrib eccodes, or smerge's [cloud] extra)") from None
    try:
        cubes = cfgrib.open_datasets(path, backend_kwargs={"indexpath": "", "errors": "raise"}, decode_times=False,
                                     decode_timedelta=False, mask_and_scale=False, cache=False)
    except Exception as e:  # noqa: BLE001 - ecCodes and cfgrib errors alike
        raise InputError(f"{path}: cannot read as GRIB ({type(e).__name__}: {str(e)[:200]}); the file may be "
                         "truncated or corrupt — re-download or regenerate it") from None
    cubes = [c for c in cubes if c.data_vars]
    if not cubes:
        raise InputError(f"{path}: no GRIB message that cfgrib maps to a variable; the file may be empty or corrupt")
    want = [v for v in variables or () if v]
    if want:
        chosen = [c for c in cubes if all(v in c.variables for v in want)]
        if not chosen:
            known = sorted({n for c in cubes for n in c.data_vars})
            missing = [v for v in want if not any(v in c.variables for c in cubes)]
            why = (f"no variable {', '.join(map(repr, missing))}; it has {', '.join(known)}" if missing else
                   f"variables {', '.join(map(repr, want))} are in different hypercubes")
            raise UsageError(f"{path}: {why}; its hypercubes: {'; '.join(map(_label, cubes))}: choose variables "
                             f"of one with {param.vars_a} or {param.vars_b}")
        if len(chosen) > 1:
            raise UsageError(f"{path}: {', '.join(map(repr, want))} is in several hypercubes "
                             f"({'; '.join(map(_label, chosen))}); extract one first, e.g. "
                             "grib_copy -w typeOfLevel=<level type> in.grib out.grib")
        cube = chosen[0]
    elif len(cubes) > 1:
        raise UsageError(f"{path}: its GRIB messages form {len(cubes)} hypercubes: {'; '.join(map(_label, cubes))}; "
                         f"choose one with {param.vars_a} or {param.vars_b} (variables of one hypercube)")
    else:
        cube = cubes[0]
    for c in cubes:
        if c is not cube:
            c.close()
    out = {}
    for name, xv in cube.variables.items():
        attrs = dict(xv.attrs)
        if name in cube.data_vars and xv.dtype.kind == "f" and "_FillValue" not in attrs:
            attrs["_FillValue"] = np.nan  # cfgrib's NaN: a value missing in the message (bitmap)

        def read(key, xv=xv):
            return np.asarray(xv[key].values) if key else np.asarray(xv.values)

        out[name] = cf_adapter.Variable(name, xv.dims, xv.shape, xv.dtype, attrs, read)
    return cf_adapter.Dataset(path, out, dict(cube.attrs), close=cube.close, what="GRIB file")
