"""A netCDF4.Dataset look-alike over other array stores (Zarr, GRIB, HDF5 over byte ranges).

The netCDF reader (``datasets/netcdf.py`` with ``netcdf_file``, ``netcdf_grid`` and
``netcdf_slabs``) implements every CF rule once, against the small
part of netCDF4-python's surface it uses. Other formats give it this adapter: named variables
on named dimensions with attributes, whose reads are masked and unpacked as netCDF4 does with
``set_auto_maskandscale(True)`` and ``set_always_mask(True)``:

- ``missing_value`` and ``_FillValue`` mask the values equal to them (NaN: the NaN values);
- ``valid_min``, ``valid_max``, ``valid_range`` mask the values outside them (on the stored
  values, before unpacking);
- ``scale_factor`` and ``add_offset`` unpack (``stored * scale_factor + add_offset``) when they
  are not 1 and 0;
- unlike netCDF4, no default fill value is assumed for a variable without ``_FillValue``
  (as xarray reads Zarr and HDF5 files).

Reads are by slices; a read of a range along one axis (the others whole) is widened to the
chunks it touches and that block is kept, so the next slab of the same chunks is not read
again: one block of chunks per variable at most (``BLOCK_LIMIT`` bytes), never the variable.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

BLOCK_LIMIT = 256 << 20  # the widest block of chunks kept per variable


class Dimension:
    def __init__(self, name: str, size: int):
        self.name, self.size = name, int(size)

    def __len__(self) -> int:
        return self.size

    def isunlimited(self) -> bool:
        return False


class Variable:
    """One variable: ``read(index)`` gives the stored values of a tuple of slices/ints (numpy).

    ``dtype`` is the stored numpy dtype, or ``str`` for variable-length strings."""

    def __init__(self, name: str, dimensions: Sequence[str], shape: Sequence[int], dtype: Any,
                 attrs: dict, read: Callable[[tuple], np.ndarray], chunks: Sequence[int] | None = None):
        self.name = name
        self.dimensions = tuple(dimensions)
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype
        self._attrs = dict(attrs)
        self._read = read
        self._chunks = None if chunks is None else [int(c) for c in chunks]
        self._auto = True
        self._block: tuple[int, int, int, np.ndarray] | None = None  # (axis, lo, hi, values)

    # netCDF4.Variable's surface -------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    def ncattrs(self) -> list[str]:
        return list(self._attrs)

    def getncattr(self, name: str):
        return self._attrs[name]

    def __getattr__(self, name: str):
        attrs = self.__dict__.get("_attrs", {})
        if name in attrs:
            return attrs[name]
        raise AttributeError(name)

    def chunking(self):
        return list(self._chunks) if self._chunks else "contiguous"

    def set_var_chunk_cache(self, *args, **kwargs) -> None:
        pass  # the block of chunks kept per variable plays that part (see the module doc)

    def set_auto_maskandscale(self, on: bool) -> None:
        self._auto = bool(on)

    def set_always_mask(self, on: bool) -> None:
        pass  # always masked arrays, as the netCDF reader asks

    def set_auto_chartostring(self, on: bool) -> None:
        pass  # strings are read as strings

    def getValue(self):
        """A scalar variable's value (as ``__getitem__(())``)."""
        return self[()]

    def __getitem__(self, key):
        raw = self._stored(key)
        return self._decode(raw) if self._auto else raw

    # reads ----------------------------------------------------------------------------------
    def _normal(self, key) -> tuple:
        if not isinstance(key, tuple):
            key = (key,)
        if any(k is Ellipsis for k in key):
            i = next(i for i, k in enumerate(key) if k is Ellipsis)
            key = key[:i] + (slice(None),) * (self.ndim - len(key) + 1) + key[i + 1:]
        return key + (slice(None),) * (self.ndim - len(key))

    def _stored(self, key) -> np.ndarray:
        key = self._normal(key)
        if self.ndim == 0:
            return np.asarray(self._read(()))
        ranges = [k.indices(n) if isinstance(k, slice) else None for k, n in zip(key, self.shape)]
        partial = [i for i, (r, n) in enumerate(zip(ranges, self.shape)) if r is None or r != (0, n, 1)]
        if (self._chunks and len(partial) == 1 and ranges[partial[0]] is not None
                and ranges[partial[0]][2] == 1):
            ax = partial[0]
            lo, hi, _ = ranges[ax]
            if hi <= lo:
                return np.asarray(self._read(key))
            b = self._block
            if b is None or b[0] != ax or lo < b[1] or hi > b[2]:
                c = self._chunks[ax]
                blo, bhi = lo // c * c, min(-(-hi // c) * c, self.shape[ax])
                item = 1 if self.dtype is str else np.dtype(self.dtype).itemsize
                layer = (bhi - blo) * item * int(np.prod([n for i, n in enumerate(self.shape) if i != ax]))
                if layer > BLOCK_LIMIT:
                    self._block = None
                    return np.asarray(self._read(key))
                index = tuple(slice(blo, bhi) if i == ax else slice(None) for i in range(self.ndim))
                self._block = b = (ax, blo, bhi, np.asarray(self._read(index)))
            take = tuple(slice(lo - b[1], hi - b[1]) if i == ax else slice(None) for i in range(self.ndim))
            return b[3][take]
        return np.asarray(self._read(key))

    def _decode(self, raw: np.ndarray):
        """Mask and unpack stored values as netCDF4 does (see the module doc)."""
        data = np.asarray(raw)
        if self.dtype is str or data.dtype.kind not in "iufb":
            return np.ma.masked_array(data, mask=np.zeros(data.shape, dtype=bool))
        mask = np.zeros(data.shape, dtype=bool)
        for attr in ("missing_value", "_FillValue"):
            if attr in self._attrs:
                for x in np.atleast_1d(np.asarray(self._attrs[attr])):
                    x = _number(x)
                    if x is None:
                        continue
                    if isinstance(x, float) and np.isnan(x):
                        if data.dtype.kind == "f":
                            mask |= np.isnan(data)
                    else:
                        mask |= data == np.asarray(x).astype(data.dtype) if _fits(x, data.dtype) else False
        lo, hi = _valid_range(self._attrs)
        if lo is not None:
            mask |= data < lo
        if hi is not None:
            mask |= data > hi
        sf, ao = _number(self._attrs.get("scale_factor")), _number(self._attrs.get("add_offset"))
        out = data
        if sf is not None and sf != 1.0:
            out = out * np.asarray(self._attrs["scale_factor"])[()]
        if ao is not None and ao != 0.0:
            out = out + np.asarray(self._attrs["add_offset"])[()]
        return np.ma.masked_array(out, mask=mask)


def _number(x):
    try:
        v = np.asarray(x)
        if v.dtype.kind not in "iufb" or v.size != 1:
            return None
        return v.reshape(()).item()
    except (TypeError, ValueError):
        return None


def _fits(x, dtype: np.dtype) -> bool:
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return float(x) == int(x) and info.min <= int(x) <= info.max if not isinstance(x, bool) else True
    return True


def _valid_range(attrs: dict) -> tuple:
    lo = _number(attrs.get("valid_min")) if "valid_min" in attrs else None
    hi = _number(attrs.get("valid_max")) if "valid_max" in attrs else None
    if "valid_range" in attrs:
        r = np.atleast_1d(np.asarray(attrs["valid_range"]))
        if r.size == 2 and r.dtype.kind in "iuf":
            lo, hi = r[0].item(), r[1].item()
    return lo, hi


class Dataset:
    """A netCDF4.Dataset look-alike: ``variables``, ``dimensions``, global attributes, ``groups``
    (names of groups not read). Dimension sizes must agree between the variables (else
    ``InputError``: inconsistent metadata)."""

    def __init__(self, path: str, variables: dict[str, Variable], attrs: dict | None = None,
                 groups: Sequence[str] = (), close: Callable[[], None] | None = None, what: str = "store"):
        from smerge.errors import InputError

        self.path = path
        self.variables = dict(variables)
        self._attrs = dict(attrs or {})
        self.groups = {g: None for g in groups}
        self._close = close
        dims: dict[str, int] = {}
        for v in self.variables.values():
            if len(set(v.dimensions)) != len(v.dimensions):
                raise InputError(f"{path}: variable {v.name!r} names a dimension twice {v.dimensions}; "
                                 f"the {what}'s metadata is inconsistent: rewrite it")
            for d, n in zip(v.dimensions, v.shape):
                if dims.setdefault(d, n) != n:
                    others = [w.name for w in self.variables.values() if d in w.dimensions
                              and w.shape[w.dimensions.index(d)] == dims[d]]
                    raise InputError(f"{path}: dimension {d!r} has size {n} in variable {v.name!r} but {dims[d]} "
                                     f"in {others[0]!r}; the {what}'s metadata is inconsistent: rewrite it")
        self.dimensions = {d: Dimension(d, n) for d, n in dims.items()}

    def ncattrs(self) -> list[str]:
        return list(self._attrs)

    def getncattr(self, name: str):
        return self._attrs[name]

    def set_always_mask(self, on: bool) -> None:
        pass

    def set_auto_maskandscale(self, on: bool) -> None:
        for v in self.variables.values():
            v.set_auto_maskandscale(on)

    def close(self) -> None:
        for v in self.variables.values():
            v._block = None
        if self._close is not None:
            self._close()
            self._close = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
