"""netCDF output: a CF-style file on A's grid with A's variables and B's matched variables.

What xarray users ask for when two grids differ by float noise: the result has A's
dimensions and coordinates, A's variables as they are in A, and each B variable on A's grid,
missing (NaN, ``_FillValue``) where the A record found no pair. The pairs must carry
``a_row`` (the flat C-order index in A's grid). B's values are spilled to Arrow IPC files in a
staging folder beside the output, one per bucket of whole outer slabs of A's grid, and put on
the grid bucket by bucket at ``close()``: memory holds one bucket (about 2^18 grid cells, or
1/512 of the grid), not the grid; A's variables are copied slab by slab.

Geolocation is kept (docs/data.md, "Outputs"): besides A's chosen variables, the file holds
A's dimension coordinates, every key that is a variable of A (point lists' ``lat(station)``,
curvilinear ``lat2d(y, x)``), and, transitively, every variable A's copied variables name in
``coordinates``, ``bounds``, ``grid_mapping``, ``cell_measures``, ... (``datasets.cf_refs``),
each copied as stored in A (type, packing, ``_FillValue``, units and calendar). A name A does
not hold is dropped from the attribute. B's variables are on A's grid, so they get A's
coordinates, grid mapping and cell measures; B's own references are kept only where they
name a variable of the output (a B key becomes A's key of the same position).
"""

from __future__ import annotations

import datetime as _dt
import os
import shutil
from typing import Sequence

import numpy as np
import pyarrow as pa

from smerge.datasets.base import InputSource
from smerge.datasets.cf_refs import REFERENCE_ATTRS, references, rename_references
from smerge.errors import UsageError
from smerge.merge.keys import column_f64

# B attributes that describe B's stored values, not the decoded values written here.
_PACKING_ATTRS = ("_FillValue", "scale_factor", "add_offset", "missing_value", "_Unsigned",
                  "valid_min", "valid_max", "valid_range")
# A decoded CF time column (datasets.cf_time): microseconds since 1970 in its calendar.
_TIME_BASE_UNITS = "microseconds since 1970-01-01 00:00:00"
_META_SOURCE_UNITS, _META_CALENDAR = b"smerge.cf_units", b"calendar"
_COPY_CELLS = 1 << 20  # values per slab when copying a variable
MAX_BUCKETS = 512  # spill files of B's values at most (open at once while pairs arrive)
BUCKET_CELLS = 1 << 18  # grid cells per spill bucket (whole outer slabs; at least one slab)


class GridWriter:
    """A's grid filled with B's values bucket by bucket, into the storage ``_create`` opens
    (netCDF-4 here; ``zarr_writer.ZarrGridWriter`` a Zarr store): everything but the storage
    is shared. The storage needs the small part of netCDF4-python's writing surface used below
    (``createDimension``, ``createVariable``, ``setncatts``, ``variables``, slab assignment)."""

    storage = "netCDF"

    def __init__(self, path: str, schema: pa.Schema, *, template: InputSource | None = None,
                 template_b: InputSource | None = None, b_columns: Sequence[str] = (),
                 b_sources: Sequence[str] = (), history: str = ""):
        if template is None or template.grid is None:
            raise UsageError(f"{self.storage} output needs A to be a gridded file (the output is on A's grid); "
                             "write .parquet, .csv or .arrow instead")
        if "a_row" not in schema.names:
            raise UsageError(f"{self.storage} output needs the a_row column of the pairs")
        self.path, self.grid = path, template.grid
        self.keys_a = tuple(template.keys)
        self.keys_b = tuple(template_b.keys) if template_b is not None else ()
        self.b_columns = list(b_columns)
        self.b_sources = list(b_sources) or list(b_columns)
        self.template_b = template_b
        self.history = history
        self._kind: dict[str, type] = {}  # column -> numpy dtype of its output variable (object: text)
        self._b_time: dict[str, str] = {}  # column -> calendar, for decoded CF times
        for c in self.b_columns:
            f = schema.field(c)
            t = f.type
            if pa.types.is_string(t) or pa.types.is_large_string(t):
                self._kind[c] = object
                continue
            md = f.metadata or {}
            if pa.types.is_timestamp(t) or pa.types.is_date(t) or _META_SOURCE_UNITS in md:
                self._b_time[c] = (md.get(_META_CALENDAR) or b"standard").decode()
            small = t in (pa.float32(), pa.float16(), pa.int8(), pa.int16(), pa.uint8(), pa.uint16())
            self._kind[c] = np.float32 if small else np.float64
        # B's values are spilled to disk in buckets of whole outer slabs of A's grid (Arrow IPC
        # files in a staging folder beside the output) and put on the grid bucket by bucket at
        # close(): memory holds one bucket, not the grid (at most MAX_BUCKETS buckets).
        outer = self.grid.shape[0] if self.grid.shape else 1
        inner = max(self.grid.inner_size, 1)
        step = max(1, BUCKET_CELLS // inner)
        step = max(step, -(-outer // MAX_BUCKETS))
        self._step, self._bucket_cells = step, step * inner
        self._spill_schema = pa.schema([pa.field("a_row", pa.int64())] + [
            pa.field(c, pa.string() if k is object else pa.from_numpy_dtype(k)) for c, k in self._kind.items()])
        self._spill_dir: str | None = None
        self._spill: dict[int, tuple] = {}

    def _bucket_writer(self, k: int):
        if k not in self._spill:
            if self._spill_dir is None:
                from smerge.datasets.output_staging import make_staging

                self._spill_dir = make_staging(self.path, "tmp")
            sink = pa.OSFile(os.path.join(self._spill_dir, f"b{k:05d}.arrows"), "wb")
            self._spill[k] = (sink, pa.ipc.new_stream(sink, self._spill_schema))
        return self._spill[k][1]

    def write(self, batch: pa.RecordBatch) -> None:
        if not batch.num_rows:
            return
        rows = batch.column("a_row").to_numpy()
        cols = [pa.array(rows)]
        for c, k in self._kind.items():
            col = batch.column(c)
            if k is object:
                cols.append(col.cast(pa.string()))
                continue
            if pa.types.is_timestamp(col.type) or pa.types.is_date(col.type):
                # any unit or zone -> microseconds since 1970 UTC (the variable's units)
                cols.append(pa.array(column_f64(col)).cast(pa.from_numpy_dtype(k), safe=False))
                continue
            if pa.types.is_duration(col.type):
                col = col.cast(pa.int64())
            cols.append(col.cast(pa.float64()).fill_null(np.nan).cast(pa.from_numpy_dtype(k), safe=False))
        spill = pa.RecordBatch.from_arrays(cols, schema=self._spill_schema)
        bucket = rows // self._bucket_cells
        if bucket.size and bucket[0] == bucket[-1] and (bucket == bucket[0]).all():
            self._bucket_writer(int(bucket[0])).write_batch(spill)
            return
        order = np.argsort(bucket, kind="stable")
        ks, starts = np.unique(bucket[order], return_index=True)
        spill = spill.take(pa.array(order))
        for k, a, b in zip(ks, starts, list(starts[1:]) + [len(order)]):
            self._bucket_writer(int(k)).write_batch(spill.slice(int(a), int(b - a)))

    def _bucket(self, k: int) -> pa.Table | None:
        """The spilled pairs of bucket ``k`` (None when it has none)."""
        if k not in self._spill:
            return None
        sink, w = self._spill.pop(k)
        w.close()
        sink.close()
        path = os.path.join(self._spill_dir, f"b{k:05d}.arrows")
        with pa.OSFile(path, "rb") as f:
            table = pa.ipc.open_stream(f).read_all()
        os.unlink(path)
        return table

    def abort(self) -> None:
        """Drop the spilled values without writing the file (a failed run)."""
        self._discard_spill()

    def _discard_spill(self) -> None:
        for sink, w in self._spill.values():
            try:
                w.close()
                sink.close()
            except Exception:  # noqa: BLE001 - cleaning up
                pass
        self._spill.clear()
        if self._spill_dir is not None:
            shutil.rmtree(self._spill_dir, ignore_errors=True)
            self._spill_dir = None

    def close(self) -> None:
        try:
            self._close()
        except RuntimeError as e:  # HDF5 loses the errno: "NetCDF: HDF error" on a full disk
            from smerge.datasets.output_space import space_errno

            err = space_errno(e, self.path)
            if err is None:
                raise
            raise OSError(err, f"{os.strerror(err)} (netCDF: {e})", self.path) from None
        finally:
            self._discard_spill()

    def _create(self):
        """The storage written at ``close()``: a netCDF-4 file at ``self.path``."""
        import netCDF4

        return netCDF4.Dataset(self.path, "w", format="NETCDF4")

    def _close(self) -> None:
        from smerge.datasets.netcdf_file import NC_LOCK, _open

        g = self.grid
        # A as the reader opens it: a local netCDF file, or a Zarr store, GRIB or remote netCDF-4
        # through the reader's adapter (``cf_adapter``)
        with NC_LOCK, _open(g.path, list(g.variables)) as src, self._create() as dst:
            stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            history = f"{stamp}: {self.history}".strip() + (
                "\n" + str(src.getncattr("history")) if "history" in src.ncattrs() else "")
            dst.setncatts({**{k: src.getncattr(k) for k in src.ncattrs()}, "Conventions": "CF-1.8",
                           "history": history})
            copied = _a_variables(src, g.dims, self.keys_a, g.variables)
            for d, n in zip(g.dims, g.shape):
                dst.createDimension(d, n)
            for d in src.dimensions:
                if d not in g.dims and any(d in src.variables[v].dimensions for v in copied):
                    dst.createDimension(d, len(src.dimensions[d]))
            names_b = _free_names(self.b_columns, set(copied) | set(dst.dimensions))
            out_vars = set(copied) | set(names_b)
            in_a = lambda n: n if n in copied else None  # noqa: E731
            aux_keys = [k for k in self.keys_a if k in copied and src.variables[k].dimensions != (k,)]
            for n in copied:
                attrs = _rewritten({a: src.variables[n].getncattr(a) for a in src.variables[n].ncattrs()}, in_a)
                if n in g.variables and aux_keys:
                    attrs["coordinates"] = _joined(attrs.get("coordinates"), aux_keys)
                _copy_var(src, dst, n, attrs)
            # B's values sit on A's grid: A's coordinates, grid mapping and cell measures describe them.
            grid_refs = _grid_references(dst, g.variables, aux_keys)
            to_out = {**dict(zip(self.keys_b, self.keys_a)), **dict(zip(self.b_sources, names_b))}
            b_ref = lambda n: to_out.get(n) if to_out.get(n) in out_vars else None  # noqa: E731
            b_attrs = self.template_b.grid.attrs if self.template_b is not None and self.template_b.grid else {}
            b_vars = []
            for c, out, name in zip(self.b_columns, names_b, self.b_sources):
                kind = self._kind[c]
                if kind is object:
                    var = dst.createVariable(out, str, g.dims)
                else:
                    var = dst.createVariable(out, kind, g.dims, fill_value=np.dtype(kind).type(np.nan), zlib=True)
                attrs = {k: v for k, v in b_attrs.get(name, {}).items() if k not in _PACKING_ATTRS}
                attrs = _rewritten(attrs, b_ref)
                if grid_refs.get("coordinates") or attrs.get("coordinates"):
                    attrs["coordinates"] = _joined(grid_refs.get("coordinates"), (attrs.get("coordinates") or "").split())
                for a in ("grid_mapping", "cell_measures"):
                    if a in grid_refs:
                        attrs[a] = grid_refs[a]
                if c in self._b_time:
                    attrs.update(units=_TIME_BASE_UNITS, calendar=self._b_time[c])
                attrs["comment"] = f"from B ({name}); missing where no pair was found"
                var.setncatts(attrs)
                b_vars.append((c, var))
            try:
                outer = g.shape[0] if g.shape else 1
                for k, a in enumerate(range(0, outer, self._step)):
                    b = min(a + self._step, outer)
                    cells = (b - a) * g.inner_size
                    pairs = self._bucket(k)
                    local = None if pairs is None else pairs.column("a_row").to_numpy() - a * g.inner_size
                    for c, var in b_vars:
                        kind = self._kind[c]
                        arr = np.full(cells, "", dtype=object) if kind is object else np.full(cells, np.nan, kind)
                        if pairs is not None:
                            col = pairs.column(c)
                            arr[local] = (np.asarray(col.to_pylist(), dtype=object) if kind is object
                                          else col.to_numpy())
                        var[a:b] = arr.reshape((b - a,) + tuple(g.shape[1:]))
            finally:
                self._discard_spill()


def _a_variables(src, dims: Sequence[str], keys: Sequence[str], chosen: Sequence[str]) -> list[str]:
    """A's variables the output holds, in order: the dimension coordinates of ``dims``, the keys
    that are variables, the chosen variables, then everything these reference (transitively)
    and the coordinate variables of any further dimension they use."""
    allvars = src.variables
    start = [d for d in dims if d in allvars and allvars[d].dimensions == (d,)]
    start += [k for k in keys if k in allvars] + list(chosen)
    out: list[str] = []
    queue = list(dict.fromkeys(start))
    while queue:
        n = queue.pop(0)
        if n in out:
            continue
        out.append(n)
        v = allvars[n]
        for a in v.ncattrs():
            if a in REFERENCE_ATTRS:
                queue += [r for r in references(a, v.getncattr(a)) if r in allvars and r not in out]
        queue += [d for d in v.dimensions if d in allvars and allvars[d].dimensions == (d,) and d not in out]
    return out


def _free_names(names: Sequence[str], taken: set[str]) -> list[str]:
    """B's variable names in the file: ``_b`` appended while a name is taken (merge.output's rule)."""
    taken = set(taken)
    out = []
    for n in names:
        while n in taken:
            n = n + "_b"
        taken.add(n)
        out.append(n)
    return out


def _rewritten(attrs: dict, rename) -> dict:
    """``attrs`` with the references renamed, and those ``rename`` maps to None dropped."""
    out = {}
    for k, v in attrs.items():
        if k in REFERENCE_ATTRS:
            v = rename_references(k, v, rename)
            if v is None:
                continue
        out[k] = v
    return out


def _joined(value: str | None, more: Sequence[str]) -> str:
    names = (value or "").split()
    return " ".join(names + [m for m in more if m not in names])


def _grid_references(dst, chosen: Sequence[str], aux_keys: Sequence[str]) -> dict[str, str]:
    """What A's chosen variables (as written) say about the grid: the union of their
    ``coordinates`` (with the auxiliary keys), and the first ``grid_mapping``/``cell_measures``."""
    coords: list[str] = list(aux_keys)
    refs: dict[str, str] = {}
    for n in chosen:
        v = dst.variables[n]
        if "coordinates" in v.ncattrs():
            coords = _joined(" ".join(coords), str(v.getncattr("coordinates")).split()).split()
        for a in ("grid_mapping", "cell_measures"):
            if a in v.ncattrs() and a not in refs:
                refs[a] = v.getncattr(a)
    if coords:
        refs["coordinates"] = " ".join(coords)
    return refs


def _copy_var(src, dst, name: str, attrs: dict) -> None:
    """Copy A's variable ``name`` as stored (raw values, same type) with ``attrs``, slab by slab."""
    s = src.variables[name]
    numeric = s.dtype is not str and np.dtype(s.dtype).kind in "iufc"
    fill = s.getncattr("_FillValue") if "_FillValue" in s.ncattrs() else None
    v = dst.createVariable(name, s.dtype, s.dimensions, fill_value=fill, zlib=numeric and s.ndim > 1)
    v.setncatts({k: val for k, val in attrs.items() if k != "_FillValue"})
    for var in (s, v):
        var.set_auto_maskandscale(False)
        var.set_auto_chartostring(False)
    if s.ndim == 0:
        v.assignValue(s.getValue())
        return
    n0 = s.shape[0]
    inner = int(np.prod(s.shape[1:])) if s.ndim > 1 else 1
    step = max(1, _COPY_CELLS // max(inner, 1))
    for a in range(0, n0, step):
        v[a:a + step] = s[a:a + step]
