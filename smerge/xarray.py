"""The xarray face of smerge: merge and align datasets whose coordinates differ by float noise.

``merge(ds_a, ds_b, eps={"lat": 1e-6, ...})`` returns A (as it is: lazy variables stay lazy)
plus B's variables on A's grid, missing where the A grid point found no B point within eps.
``align(ds_a, ds_b, eps=...)`` returns both on A's coordinates (or on their union with
``join="outer"``). Importing this module registers the accessor ``ds.smerge``.

Keys are dimension coordinates matched by name (docs/data.md, "Keys are matched by name"): A's default keys are
the dimensions of A's data variables, in A's order; B's are the same names (``keys_b`` renames).
A dimension without a coordinate variable is keyed by its index. Times decoded by xarray
(``datetime64``, ``timedelta64``, cftime objects) are compared as float64 microseconds since
1970-01-01 in their calendar, the engine's time base; their tolerance is a duration
(``"1h"``, ``np.timedelta64(30, "m")``, ``datetime.timedelta``).

Memory: A is never read (only its coordinates); B is read slab by slab along the outer key
(``slab_records`` grid points at a time) whether it is in memory, netCDF-backed or dask-backed.
The B variables *on A's grid* are held in memory (4-8 bytes per A grid point and B variable),
as ``-o out.nc`` does.
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
import xarray as xr

from smerge.errors import UsageError
from smerge.merge import CGMParams, MergeKeys, MergeStats, cgm_merge, resolve_eps
from smerge.merge.params import DEFAULT_DELTA_WINDOWS, DEFAULT_WINDOW_SIZE
from smerge.merge.values import parse_duration
from smerge.merge.output import b_output_names

HOWS = ("cgm", "exact-grid")
JOINS = ("left", "outer")
DEFAULT_SLAB_RECORDS = 131072
# Encodings that describe B's stored layout, not the values on A's grid.
_DROP_ENCODING = ("source", "original_shape", "chunksizes", "preferred_chunks", "contiguous")


@dataclass(frozen=True)
class _Axis:
    """One key: the dimension in A and in B, its values as engine floats, its kind."""

    key_a: str
    key_b: str
    a: np.ndarray  # float64, A's order
    b: np.ndarray  # float64, B's order
    kind: str
    eps: float


def _key_floats(ds: xr.Dataset, dim: str, side: str) -> tuple[np.ndarray, str]:
    """A dimension's coordinate as float64 in the engine's unit (microseconds for times)."""
    if dim not in ds.dims:
        raise UsageError(f"key {dim!r} is not a dimension of {side}; its dimensions are {', '.join(map(str, ds.dims))}"
                         + ("; name B's keys with keys_b" if side == "B" else ""))
    if dim not in ds.coords:
        return np.arange(ds.sizes[dim], dtype=np.float64), "index"
    v = ds[dim].values
    if v.dtype.kind in "iuf":
        return v.astype(np.float64), "number"
    if v.dtype.kind == "M":
        return v.astype("datetime64[us]").astype(np.int64).astype(np.float64), "time[standard]"
    if v.dtype.kind == "m":
        return v.astype("timedelta64[us]").astype(np.int64).astype(np.float64), "duration"
    if v.dtype.kind == "O" and v.size and hasattr(v.flat[0], "calendar"):
        import cftime

        cal = v.flat[0].calendar
        us = cftime.date2num(list(v.ravel()), "microseconds since 1970-01-01", calendar=cal)
        return np.asarray(us, dtype=np.float64).reshape(v.shape), f"time[{cal}]"
    raise UsageError(f"key {dim!r} of {side} has type {v.dtype}; keys must be numbers or times")


def _eps_value(key: str, kind: str, value: Any) -> float:
    if kind.startswith("time") or kind == "duration":
        if isinstance(value, str):
            cal = kind[5:-1] if kind.startswith("time") else None
            return parse_duration(value, f"eps {key}=").nanoseconds(cal, f"eps {key}=") / 1e3
        if isinstance(value, datetime.timedelta):
            return value.total_seconds() * 1e6
        if isinstance(value, np.timedelta64):
            return float(value.astype("timedelta64[us]").astype(np.int64))
        if value == 0:
            return 0.0
        raise UsageError(f"eps for the time key {key!r} is {value!r}; give a duration: '1h', np.timedelta64(30, 'm'), "
                         "datetime.timedelta(hours=1)")
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            raise UsageError(f"eps for key {key!r} is {value!r}; {key!r} is not a time, so give a number") from None
    return float(value)


def _axes(ds_a: xr.Dataset, ds_b: xr.Dataset, keys: Sequence[str], keys_b: Sequence[str] | None, eps) -> list[_Axis]:
    keys_b = tuple(keys_b) if keys_b else tuple(keys)
    MergeKeys(tuple(keys), keys_b)  # same number of keys, at least one
    for side, ks in (("A", keys), ("B", keys_b)):
        dup = sorted({k for k in ks if list(ks).count(k) > 1})
        if dup:
            raise UsageError(f"key {', '.join(map(repr, dup))} named twice ({side}); name each key once")
    cols = [(_key_floats(ds_a, ka, "A"), _key_floats(ds_b, kb, "B")) for ka, kb in zip(keys, keys_b)]
    for ka, kb, ((_, ta), (_, tb)) in zip(keys, keys_b, cols):
        if ta != tb and "index" not in (ta, tb):
            raise UsageError(f"key {ka!r} of A is a {ta} but key {kb!r} of B is a {tb}; keys must be of the same kind "
                             "(convert one dataset's coordinate)")
    if isinstance(eps, Mapping):
        unknown = sorted(set(eps) - set(keys))
        if unknown:
            raise UsageError(f"eps names {', '.join(unknown)}, which are not merge keys; the keys are {', '.join(keys)}")
        raw = [eps.get(k, 0.0) for k in keys]
    elif isinstance(eps, (int, float, np.number, str, np.timedelta64, datetime.timedelta)):
        raw = [eps] * len(keys)
    else:
        raw = list(eps)
    values = resolve_eps(tuple(_eps_value(k, c[0][1], e) for k, c, e in zip(keys, cols, raw)), keys) \
        if len(raw) == len(keys) else resolve_eps(tuple(raw), keys)
    return [_Axis(ka, kb, ca[0], cb[0], ca[1], e) for ka, kb, (ca, cb), e in zip(keys, keys_b, cols, values)]


def default_keys(ds_a: xr.Dataset) -> tuple[str, ...]:
    """A's default keys: the dimensions of its data variables, in the order they appear."""
    out: list[str] = []
    for v in ds_a.data_vars.values():
        out += [str(d) for d in v.dims if d not in out]
    if not out:
        raise UsageError("A has no data variable with dimensions; pass keys=(...)")
    return tuple(out)


def _b_variables(ds_b: xr.Dataset, keys_b: Sequence[str], names: Sequence[str] | None) -> list[str]:
    """B's variables to carry: those on exactly the key dimensions (numbers, times, booleans)."""
    chosen = list(names) if names is not None else [str(n) for n in ds_b.data_vars]
    out = []
    for n in chosen:
        if n not in ds_b.data_vars:
            raise UsageError(f"B has no data variable {n!r}; its data variables are {', '.join(map(str, ds_b.data_vars))}")
        v = ds_b[n]
        ok = set(v.dims) == set(keys_b) and v.dtype.kind in "biufMm"
        if not ok and names is not None:
            raise UsageError(f"B variable {n!r} has dimensions {v.dims} and type {v.dtype}; a merged variable must be "
                             f"numeric or a time on exactly the key dimensions {tuple(keys_b)}")
        if ok:
            out.append(n)
    return out


def _indexer(idx: np.ndarray):
    """A slice when ``idx`` is a run (lazy backends read runs best), else the index array."""
    if idx.size > 1 and np.all(np.diff(idx) == 1):
        return slice(int(idx[0]), int(idx[-1]) + 1)
    if idx.size == 1:
        return slice(int(idx[0]), int(idx[0]) + 1)
    return idx


def _missing(dtype: np.dtype) -> tuple[np.dtype, Any]:
    if dtype.kind == "M" or dtype.kind == "m":
        return dtype, np.array("NaT", dtype=dtype)
    if dtype.kind == "f":
        return dtype, np.nan
    return np.dtype(np.float64), np.nan  # integers and booleans become float64 with NaN


class _Timed:
    """Iterator wrapper counting the seconds spent producing items (the fetch time)."""

    def __init__(self, it: Iterator):
        self.it, self.seconds = it, 0.0

    def __iter__(self):
        return self

    def __next__(self):
        t = time.perf_counter()
        try:
            return next(self.it)
        finally:
            self.seconds += time.perf_counter() - t


def _slabs(sizes: Sequence[int], slab_records: int) -> Iterator[tuple[int, int]]:
    inner = int(np.prod(sizes[1:])) if len(sizes) > 1 else 1
    step = max(1, slab_records // max(inner, 1))
    for i in range(0, sizes[0], step):
        yield i, min(i + step, sizes[0])


def _key_batch(names: Sequence[str], values: Sequence[np.ndarray], extra: dict[str, np.ndarray]) -> pa.RecordBatch:
    grids = np.meshgrid(*values, indexing="ij") if len(values) > 1 else [values[0]]
    cols = {n: pa.array(g.ravel()) for n, g in zip(names, grids)}
    cols.update({n: pa.array(v.ravel()) for n, v in extra.items()})
    return pa.RecordBatch.from_pydict(cols)


def _on_a_grid(ds_a, ds_b, axes: list[_Axis], b_vars: list[str], how: str, params: dict, slab_records: int):
    """B's variables on A's key grid (in key order): {name: ndarray}, and the statistics."""
    order_a = [np.argsort(ax.a, kind="stable") for ax in axes]
    shape_a = tuple(ax.a.size for ax in axes)
    out = {}
    for n in b_vars:
        dt, fill = _missing(ds_b[n].dtype)
        out[n] = np.full(shape_a, fill, dtype=dt)
    b_keyed = {n: ds_b[n].transpose(*[ax.key_b for ax in axes]) for n in b_vars}
    t0 = time.perf_counter()
    stats = MergeStats(how)
    b_records = int(np.prod([ax.b.size for ax in axes]))
    if how == "exact-grid":
        match = [_axis_match(ax.a, ax.b, ax.eps) for ax in axes]
        ok = [m >= 0 for m in match]
        t_fetch = 0.0
        for i0, i1 in _slabs(shape_a, slab_records):
            good = [s[s >= 0] for s in [match[0][i0:i1]] + match[1:]]
            if any(g.size == 0 for g in good):
                continue
            dest = np.ix_(*([np.flatnonzero(ok[0][i0:i1]) + i0] + [np.flatnonzero(o) for o in ok[1:]]))
            tf = time.perf_counter()
            for n in b_vars:
                out[n][dest] = b_keyed[n].isel({ax.key_b: _indexer(g) for ax, g in zip(axes, good)}).values
            t_fetch += time.perf_counter() - tf
        matched = int(np.prod([o.sum() for o in ok]))
        used_b = int(np.prod([np.unique(m[m >= 0]).size for m in match]))
        stats.a_records, stats.b_records, stats.matched = int(np.prod(shape_a)), b_records, matched
        stats.a_unmatched, stats.b_unmatched = stats.a_records - matched, b_records - used_b
        stats.fetch_seconds = t_fetch
        stats.total_seconds = time.perf_counter() - t0
        stats.merge_seconds = time.perf_counter() - t0 - t_fetch
        stats.params = {"keys_a": [ax.key_a for ax in axes], "keys_b": [ax.key_b for ax in axes],
                        "eps": {ax.key_a: ax.eps for ax in axes}, "how": how}
        return out, stats
    # CGM: both streams in ascending key order (each axis sorted), B cut to A's box widened by eps.
    order_b = []
    for ax in axes:
        o = np.argsort(ax.b, kind="stable")
        lo, hi = np.nanmin(ax.a) - ax.eps, np.nanmax(ax.a) + ax.eps
        order_b.append(o[(ax.b[o] >= lo) & (ax.b[o] <= hi)])
    shape_b = tuple(o.size for o in order_b)
    names_a = [f"k{j}" for j in range(len(axes))]
    cols_b = {n: f"v{j}" for j, n in enumerate(b_vars)}

    def stream_a() -> Iterator[pa.RecordBatch]:
        for i0, i1 in _slabs(shape_a, slab_records):
            vals = [axes[0].a[order_a[0][i0:i1]]] + [ax.a[o] for ax, o in zip(axes[1:], order_a[1:])]
            yield _key_batch(names_a, vals, {})

    def stream_b() -> Iterator[pa.RecordBatch]:
        if 0 in shape_b:
            return
        for i0, i1 in _slabs(shape_b, slab_records):
            idx = [order_b[0][i0:i1]] + order_b[1:]
            vals = [ax.b[i] for ax, i in zip(axes, idx)]
            payload = {}
            for n in b_vars:
                v = b_keyed[n].isel({ax.key_b: _indexer(i) for ax, i in zip(axes, idx)}).values
                payload[cols_b[n]] = v
            yield _key_batch(names_a, vals, payload)

    row = int(np.prod(shape_a[1:])) if len(shape_a) > 1 else 1
    n_window = int(params.pop("window_size", None) or max(DEFAULT_WINDOW_SIZE, 2 * row))
    k = int(params.pop("least_increment", None) or max(1, n_window // 5))
    cgm = CGMParams(keys=MergeKeys(tuple(names_a), tuple(names_a)), eps=tuple(ax.eps for ax in axes),
                    window_size=n_window, least_increment_a=k, least_increment_b=k, with_ids=True, **params)
    sa, sb = _Timed(stream_a()), _Timed(stream_b())
    schema_a = pa.schema([(n, pa.float64()) for n in names_a])
    schema_b = schema_a
    for n in b_vars:
        schema_b = schema_b.append(pa.field(cols_b[n], pa.from_numpy_dtype(ds_b[n].dtype)))
    for batch in cgm_merge(sa, sb, cgm, schema_a=schema_a, schema_b=schema_b, stats=stats):
        rows = batch.column("a_row").to_numpy()
        mi = np.unravel_index(rows, shape_a)
        dest = tuple(o[i] for o, i in zip(order_a, mi))
        for n in b_vars:
            out[n][dest] = batch.column(cols_b[n]).to_numpy(zero_copy_only=False)
    outside = b_records - int(np.prod(shape_b))
    stats.b_records += outside
    stats.b_unmatched += outside
    stats.fetch_seconds = max(sa.seconds, sb.seconds)
    stats.extra.update({"fetch_a_seconds": sa.seconds, "fetch_b_seconds": sb.seconds, "b_outside_a": outside})
    stats.params = dict(stats.params, keys_a=[ax.key_a for ax in axes], keys_b=[ax.key_b for ax in axes],
                        eps={ax.key_a: ax.eps for ax in axes})
    stats.total_seconds = time.perf_counter() - t0
    return out, stats


def _axis_match(a: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """For each value of ``a``, the index of the nearest value of ``b`` within eps, else -1."""
    if b.size == 0:
        return np.full(a.size, -1, np.int64)
    ob = np.argsort(b, kind="stable")
    bs = b[ob]
    pos = np.searchsorted(bs, a)
    lo, hi = np.clip(pos - 1, 0, bs.size - 1), np.clip(pos, 0, bs.size - 1)
    pick = np.where(np.abs(bs[hi] - a) <= np.abs(a - bs[lo]), hi, lo)
    return np.where(np.abs(bs[pick] - a) <= eps, ob[pick], -1).astype(np.int64)


def _b_on_a(ds_a, ds_b, *, eps, how, keys, keys_b, variables, slab_records, params):
    if how not in HOWS:
        raise UsageError(f"how={how!r}; use one of {', '.join(HOWS)}")
    if isinstance(slab_records, bool) or not isinstance(slab_records, int) or slab_records < 1:
        raise UsageError(f"slab_records is {slab_records!r}; give the grid points per slab as an integer >= 1")
    if not isinstance(ds_a, xr.Dataset) or not isinstance(ds_b, xr.Dataset):
        raise UsageError("merge and align take xarray Datasets; convert a DataArray with .to_dataset()")
    keys = tuple(keys) if keys else default_keys(ds_a)
    axes = _axes(ds_a, ds_b, keys, keys_b, eps)
    b_vars = _b_variables(ds_b, [ax.key_b for ax in axes], variables)
    values, stats = _on_a_grid(ds_a, ds_b, axes, b_vars, how, dict(params), slab_records)
    stats.extra.update({"execution": "xarray", "a": ds_a.encoding.get("source"), "b": ds_b.encoding.get("source"),
                        "output": None, "a_masked": None, "b_masked": None,
                        "b_order": "A's key order"})  # B's variables are transposed to A's keys
    stats.extra["b_variables"] = b_vars
    # Dimensions of the result: A's dimension order (of its first variable on all keys).
    ref = next((v.dims for v in ds_a.data_vars.values() if set(keys) <= set(v.dims)), keys)
    dims = tuple(d for d in ref if d in keys)
    perm = [keys.index(d) for d in dims]
    arrays = {}
    for n in b_vars:
        src = ds_b[n]
        da = xr.DataArray(np.transpose(values[n], perm), dims=dims, attrs=dict(src.attrs))
        enc = {k: v for k, v in src.encoding.items() if k not in _DROP_ENCODING}
        if values[n].dtype.kind == "f" and np.dtype(enc.get("dtype", "f8")).kind in "iub" and "_FillValue" not in enc:
            enc.pop("dtype", None)  # no fill value to write the missing points as integers
        da.encoding = enc
        arrays[n] = da
    # B's variables without key dimensions (scalars, other axes) are carried as they are.
    for n, v in ds_b.data_vars.items():
        if n not in arrays and variables is None and not set(v.dims) & {ax.key_b for ax in axes}:
            arrays[str(n)] = v.variable.copy(deep=False)
    return arrays, stats, dims


def _with_stats(ds: xr.Dataset, stats: MergeStats) -> xr.Dataset:
    ds.smerge.stats = stats.as_dict()
    return ds


def merge(ds_a: xr.Dataset, ds_b: xr.Dataset, *, eps: float | Mapping[str, Any] | Sequence = 0.0,
          how: str = "cgm", keys: Sequence[str] | None = None, keys_b: Sequence[str] | None = None,
          variables_b: Sequence[str] | None = None, window_size: int | None = None,
          least_increment: int | None = None, nan_keys: str = "error", delta: float | None = None,
          delta_windows: int = DEFAULT_DELTA_WINDOWS, slab_records: int = DEFAULT_SLAB_RECORDS) -> xr.Dataset:
    """A with B's variables on A's grid (missing where unmatched); ``_b`` appended on name clashes.

    ``eps``: one tolerance or one per key name (others 0); on time keys a duration. ``how``:
    ``"cgm"`` streams both grids through the CGM engine (N = ``window_size``, default
    max(5000, 2 x records of one outer slice); K = ``least_increment``, default N/5);
    ``"exact-grid"`` matches each axis on its own (nearest within eps, as
    ``reindex_like(method="nearest", tolerance=eps)``) and reads only the B rows it needs.
    The statistics (the keys of ``--stats``) are ``result.smerge.stats``.
    """
    params = dict(window_size=window_size, least_increment=least_increment, nan_keys=nan_keys, delta=delta,
                  delta_windows=delta_windows)
    arrays, stats, _ = _b_on_a(ds_a, ds_b, eps=eps, how=how, keys=keys, keys_b=keys_b, variables=variables_b,
                               slab_records=slab_records, params=params)
    taken = [str(n) for n in ds_a.variables]
    names = b_output_names(taken, list(arrays))
    out = ds_a.copy()
    for (n, da), m in zip(arrays.items(), names):
        out[m] = da
    stats.extra["b_names"] = dict(zip(arrays, names))
    return _with_stats(out, stats)


def align(ds_a: xr.Dataset, ds_b: xr.Dataset, *, eps: float | Mapping[str, Any] | Sequence = 0.0,
          how: str = "cgm", join: str = "left", keys: Sequence[str] | None = None,
          keys_b: Sequence[str] | None = None, variables_b: Sequence[str] | None = None,
          slab_records: int = DEFAULT_SLAB_RECORDS, **engine) -> tuple[xr.Dataset, xr.Dataset]:
    """(A, B) both on A's coordinates: B's points within eps take A's coordinate values.

    ``join="outer"``: on the union grid instead, per key A's values plus B's values that have no
    A value within eps (A reindexed exactly onto it, missing where new). The statistics of the
    B side are ``b.smerge.stats``.
    """
    if join not in JOINS:
        raise UsageError(f"join={join!r}; use one of {', '.join(JOINS)}")
    keys = tuple(keys) if keys else default_keys(ds_a)
    if join == "outer":
        axes = _axes(ds_a, ds_b, keys, keys_b, eps)
        new = {}
        for ax in axes:
            if ax.kind == "index":
                raise UsageError(f"join='outer' needs a coordinate variable for {ax.key_a!r}")
            unmatched = _axis_match(ax.b, ax.a, ax.eps) < 0
            if unmatched.any():
                extra = ds_b[ax.key_b].values[unmatched]
                union = np.concatenate([ds_a[ax.key_a].values, extra])  # numbers promote (int + float: float)
                new[ax.key_a] = np.sort(union, kind="stable")
        if new:
            ds_a = ds_a.reindex(new)
    params = dict(engine)
    arrays, stats, dims = _b_on_a(ds_a, ds_b, eps=eps, how=how, keys=keys, keys_b=keys_b, variables=variables_b,
                                  slab_records=slab_records, params=params)
    coords = {k: ds_a[k] for k in keys if k in ds_a.coords}
    b = xr.Dataset(arrays, coords=coords, attrs=dict(ds_b.attrs))
    return ds_a, _with_stats(b, stats)


@xr.register_dataset_accessor("smerge")
class SmergeAccessor:
    """``ds.smerge.merge(other, eps=...)``, ``ds.smerge.align(other, eps=...)``; ``ds.smerge.stats``
    holds the statistics of the run that produced ``ds`` (``None`` otherwise)."""

    def __init__(self, ds: xr.Dataset):
        self._ds = ds
        self.stats: dict | None = None

    def merge(self, other: xr.Dataset, **kw) -> xr.Dataset:
        return merge(self._ds, other, **kw)

    def align(self, other: xr.Dataset, **kw) -> tuple[xr.Dataset, xr.Dataset]:
        return align(self._ds, other, **kw)


__all__ = ["merge", "align", "default_keys", "SmergeAccessor", "HOWS", "JOINS"]
