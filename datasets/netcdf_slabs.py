"""The netCDF slab reader: how the records of a slab of the outer dimension are built from the
file (``_SlabPlan``, made by the backend's ``open`` in ``datasets/netcdf.py``), the input
source that streams them (``_source``, also rebuilt in Spark tasks from the plan without
reading the metadata again), and ``masked_values``, the count of values made missing by
valid_min/valid_max/valid_range.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa

from smerge.datasets.base import DEFAULT_BATCH_ROWS, GridInfo, InputSource, RawKey
from smerge.datasets.cf_time import GREGORIAN_SWITCH_US
from smerge.datasets.netcdf_file import (_VALID_ATTRS, FORMAT, NC_LOCK, _arrow, _as_stored, _decode_error, _open,
                                         _range_masked, _read_error, _strings)
from smerge.errors import InputError

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
        except TypeError as e:
            raise _decode_error(self.path, name, e) from None

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
    return InputSource(path=path, format=FORMAT, schema=plan.schema, keys=plan.key_names,
                       num_rows=int(np.prod(shape)) if shape else 1, outer_size=outer, inner_size=inner,
                       open_batches=batches, grid=grid, counters=counters, raw_key=raw_key,
                       reopen=(_source, (plan, grid, batch_rows)))


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
