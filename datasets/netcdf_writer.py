"""netCDF output: a CF-style file on A's grid with A's variables and B's matched variables.

What xarray users ask for when two grids differ by float noise: the result has A's
dimensions and coordinates, A's variables as they are in A, and each B variable on A's grid,
missing (NaN, ``_FillValue``) where the A record found no pair. The pairs must carry
``a_row`` (the flat C-order index in A's grid). B's variables are held in memory for the whole
grid until ``close()`` (4-8 bytes x grid points x B variables); A's are copied slab by slab.
"""

from __future__ import annotations

import datetime as _dt
from typing import Sequence

import numpy as np
import pyarrow as pa

from smerge.datasets.base import InputSource
from smerge.errors import UsageError


class GridWriter:
    def __init__(self, path: str, schema: pa.Schema, *, template: InputSource | None = None,
                 template_b: InputSource | None = None, b_columns: Sequence[str] = (),
                 b_sources: Sequence[str] = (), history: str = ""):
        if template is None or template.grid is None:
            raise UsageError("netCDF output needs A to be a netCDF file (the output is on A's grid); "
                             "write .parquet, .csv or .arrow instead")
        if "a_row" not in schema.names:
            raise UsageError("netCDF output needs the a_row column of the pairs")
        self.path, self.grid = path, template.grid
        self.b_columns = list(b_columns)
        self.b_sources = list(b_sources) or list(b_columns)
        self.template_b = template_b
        self.history = history
        size = int(np.prod(self.grid.shape))
        self._b = {}
        for c in self.b_columns:
            t = schema.field(c).type
            dt = np.float32 if t in (pa.float32(), pa.float16(), pa.int8(), pa.int16(), pa.uint8(), pa.uint16()) else np.float64
            self._b[c] = np.full(size, np.nan, dtype=dt)

    def write(self, batch: pa.RecordBatch) -> None:
        rows = batch.column("a_row").to_numpy()
        for c, arr in self._b.items():
            col = batch.column(c)
            if pa.types.is_timestamp(col.type) or pa.types.is_duration(col.type):
                col = col.cast(pa.int64())
            vals = col.cast(pa.float64()).fill_null(np.nan).to_numpy(zero_copy_only=False)
            arr[rows] = vals

    def close(self) -> None:
        import netCDF4

        g = self.grid
        with netCDF4.Dataset(g.path) as src, netCDF4.Dataset(self.path, "w", format="NETCDF4") as dst:
            dst.setncatts({k: src.getncattr(k) for k in src.ncattrs()})
            dst.Conventions = "CF-1.8"
            stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            dst.history = f"{stamp}: {self.history}".strip() + (
                "\n" + src.getncattr("history") if "history" in src.ncattrs() else "")
            for d, n in zip(g.dims, g.shape):
                dst.createDimension(d, n)
            for d in g.dims:
                if d in src.variables and src.variables[d].dimensions == (d,):
                    self._copy_var(src, dst, d)
            for v in g.variables:
                self._copy_var(src, dst, v)
            for c, name in zip(self.b_columns, self.b_sources):
                arr = self._b[c]
                var = dst.createVariable(c, arr.dtype, g.dims, fill_value=arr.dtype.type(np.nan), zlib=True)
                if self.template_b is not None and self.template_b.grid is not None:
                    for k, v in self.template_b.grid.attrs.get(name, {}).items():
                        if k not in ("_FillValue", "scale_factor", "add_offset", "missing_value"):
                            var.setncattr(k, v)
                var.setncattr("comment", f"from B ({name}); missing where no pair was found")
                step = max(1, (1 << 20) // max(g.inner_size, 1))
                for a in range(0, g.shape[0], step):
                    b = min(a + step, g.shape[0])
                    var[a:b] = arr[a * g.inner_size:b * g.inner_size].reshape((b - a,) + tuple(g.shape[1:]))

    @staticmethod
    def _copy_var(src, dst, name: str) -> None:
        s = src.variables[name]
        fill = s.getncattr("_FillValue") if "_FillValue" in s.ncattrs() else None
        v = dst.createVariable(name, s.dtype, s.dimensions, fill_value=fill, zlib=s.ndim > 1)
        v.setncatts({k: s.getncattr(k) for k in s.ncattrs() if k != "_FillValue"})
        s.set_auto_maskandscale(False)
        v.set_auto_maskandscale(False)
        if s.ndim == 0:
            v.assignValue(s.getValue())
            return
        n0 = s.shape[0]
        inner = int(np.prod(s.shape[1:])) if s.ndim > 1 else 1
        step = max(1, (1 << 20) // max(inner, 1))
        for a in range(0, n0, step):
            v[a:a + step] = s[a:a + step]
