"""netCDF-4/HDF5 files on object stores, read by byte ranges: h5netcdf (h5py) over an fsspec
file, given to the netCDF reader as a ``cf_adapter.Dataset`` (the CF rules of local netCDF)."""

from __future__ import annotations

import numpy as np

from smerge.datasets import cf_adapter, remote
from smerge.errors import InputError

BLOCK = 2 << 20  # bytes per range request (HDF5 reads metadata in small pieces: cached by block)


def open_dataset(path: str) -> cf_adapter.Dataset:
    try:
        import h5netcdf
    except ImportError as e:
        raise InputError(f"{path}: reading netCDF-4 on an object store needs h5netcdf ({e}); install it "
                         "(pip install h5netcdf, or smerge's [cloud] extra)") from None
    f = remote.open_file(path, block_size=BLOCK)
    try:
        h = h5netcdf.File(f, "r", phony_dims="sort")
    except Exception as e:  # noqa: BLE001 - h5py's OSError, or a client error during a read
        f.close()
        if isinstance(e, OSError) and not isinstance(e, (FileNotFoundError, PermissionError)):
            raise InputError(f"{path}: cannot open as netCDF-4/HDF5 ({e}); the file may be truncated or corrupt"
                             " — re-upload or regenerate it") from None
        raise remote.error(path, e) from None
    variables = {}
    for name, v in h.variables.items():
        dtype = v.dtype if isinstance(v.dtype, np.dtype) and v.dtype.kind not in "OU" else str
        attrs = {a: v.attrs[a] for a in v.attrs}
        variables[name] = cf_adapter.Variable(name, v.dimensions, v.shape, dtype, attrs, v.__getitem__,
                                              chunks=v.chunks)

    def close():
        try:
            h.close()
        finally:
            f.close()

    return cf_adapter.Dataset(path, variables, {a: h.attrs[a] for a in h.attrs}, groups=list(h.groups),
                              close=close, what="netCDF-4 file")
