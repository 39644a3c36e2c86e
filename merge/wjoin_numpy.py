"""The W-join's numpy paths: columns without NULLs read from their buffers, gathered and
compared by numpy (``merge/expr.py`` evaluates the rest with Arrow's kernels). A W-join of
numeric and time columns then never loads Arrow's compute kernels, whose first call in a
process costs ~10 ms and ~9 MB of resident memory (the kernel registry and its code): on the
48k-record benchmark shapes, whole process, that was 9-10 MB of a ~100 MB peak."""

from __future__ import annotations

import functools
from typing import Callable

import numpy as np
import pyarrow as pa

from smerge.errors import InputError
from smerge.merge import expr as X
from smerge.merge.arrays import one_chunk, values


def take(col, idx) -> pa.Array:
    """``col`` at the positions ``idx`` (an int64 numpy array) as one Arrow array of its type:
    gathered by numpy when ``values`` reads the column, else by Arrow's ``take``."""
    v = values(col)
    if v is None:
        return one_chunk(X.call("take", col, X.from_numpy(idx)))
    a = v[idx]
    return pa.Array.from_buffers(col.type, a.shape[0], [None, pa.py_buffer(a)])


class _NotNumpy(Exception):
    """The expression needs Arrow's kernels (``mask_numpy``)."""


def mask_numpy(node: X.Node, column: Callable, length: int):
    """``mask`` computed by numpy, or None when Arrow's kernels are needed: every column ``node``
    reads must be int64 or float64 without NULLs (``column(stream, name)`` returns its numpy
    values, or None), literals numbers, and no ``/`` (division by zero is NULL). SQL's NULL
    then never arises, and numpy's arithmetic (int64 wraps, int64 with float64 gives float64)
    and comparisons (IEEE: NaN equals nothing) are Arrow's."""
    try:
        with np.errstate(all="ignore"):
            v = _np_eval(node, column)
    except _NotNumpy:
        return None
    if isinstance(v, np.ndarray):
        return v if v.dtype == bool else None
    return np.full(length, bool(v)) if isinstance(v, (bool, np.bool_)) else None


_NP_CMP = {"<": "less", "<=": "less_equal", ">": "greater", ">=": "greater_equal", "==": "equal", "!=": "not_equal"}
_NP_ARITH = {"+": "add", "-": "subtract", "*": "multiply"}


def _np_eval(node: X.Node, column: Callable):
    if isinstance(node, X.Col):
        v = column(node.stream, node.name) if node.kind == "num" else None
        if v is None or v.dtype not in (np.int64, np.float64):
            raise _NotNumpy
        return v
    if isinstance(node, X.Lit):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise _NotNumpy
        if isinstance(node.value, float):
            return np.float64(node.value)
        if not -(2**63) <= node.value < 2**63:
            raise _NotNumpy
        return np.int64(node.value)
    if isinstance(node, (X.Neg, X.Abs)):
        x = _np_eval(node.x, column)
        if np.asarray(x).dtype == bool:
            raise _NotNumpy
        return np.negative(x) if isinstance(node, X.Neg) else np.abs(x)
    if isinstance(node, (X.Arith, X.Cmp)):
        if node.op not in (_NP_ARITH if isinstance(node, X.Arith) else _NP_CMP):
            raise _NotNumpy
        left, right = _np_eval(node.left, column), _np_eval(node.right, column)
        if np.asarray(left).dtype == bool or np.asarray(right).dtype == bool:
            raise _NotNumpy
        return getattr(np, (_NP_ARITH if isinstance(node, X.Arith) else _NP_CMP)[node.op])(left, right)
    if isinstance(node, X.Not):
        x = _np_eval(node.x, column)
        if np.asarray(x).dtype != bool:
            raise _NotNumpy
        return np.logical_not(x)
    items = [_np_eval(i, column) for i in node.items]
    if any(np.asarray(x).dtype != bool for x in items):
        raise _NotNumpy
    return functools.reduce(np.logical_and if node.op == "and" else np.logical_or, items)


_PER_S = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}


def _unit(kind: str) -> str:
    return "ns" if kind.partition("@")[0].split("+")[0] == "datetime" else "us"


def _outside_ns(s) -> InputError:
    return InputError(f"{s.name}: time column {s.time_col!r} holds dates outside 1678-2262 that another "
                      "stream's nanosecond timestamps cannot share; cast that stream to timestamp[us]")


def _times_numpy(col, kind: str, s) -> np.ndarray | None:
    """``times`` by numpy where it gives Arrow's safe cast exactly (None elsewhere): integer
    times, floating times, timestamps in the time unit or a coarser one (overflow refused)."""
    v = values(col)
    if v is None:
        return None
    if kind.startswith("cf:") or kind == "int":
        return v.astype(np.int64) if v.dtype.kind == "i" or (v.dtype.kind == "u" and v.dtype.itemsize < 8) else None
    if kind == "float":
        return v.astype(np.float64) if v.dtype.kind == "f" or v.dtype.itemsize < 8 else None
    if not pa.types.is_timestamp(col.type) or _PER_S[_unit(kind)] % _PER_S[col.type.unit]:
        return None  # a date, or a finer unit: Arrow's cast checks what would be lost
    f = _PER_S[_unit(kind)] // _PER_S[col.type.unit]
    if f > 1 and v.shape[0] and (int(v.min()) < -(2**63 // f) or int(v.max()) > (2**63 - 1) // f):
        raise _outside_ns(s)
    return v * np.int64(f) if f > 1 else v.astype(np.int64)


def _times_arrow(col, kind: str, s) -> np.ndarray:
    if kind.startswith("datetime"):
        try:
            col = X.cast(col, pa.timestamp(_unit(kind), getattr(col.type, "tz", None)))
        except pa.ArrowInvalid:
            raise _outside_ns(s) from None
    return X.to_numpy(X.cast(col, pa.float64() if kind == "float" else pa.int64()))


def times(col, kind: str, s) -> np.ndarray:
    """The time column ``col`` of stream ``s`` (``name``, ``time_col``, ``rows_read``) as int64
    (integers; datetimes in the plan's unit) or float64, as ``kind`` (``wjoin_plan``) says;
    a missing or NaN time is an ``InputError`` naming its row."""
    if col.null_count:
        row = s.rows_read + int(np.flatnonzero(X.to_numpy(X.call("is_null", col)))[0])
        raise InputError(f"{s.name}: time column {s.time_col!r} is missing at row {row}; every record needs a time")
    v = _times_numpy(col, kind, s)
    if v is None:
        v = _times_arrow(col, kind, s).astype(np.float64 if kind == "float" else np.int64)
    if kind == "float" and np.isnan(v).any():
        row = s.rows_read + int(np.argmax(np.isnan(v)))
        raise InputError(f"{s.name}: time column {s.time_col!r} is NaN at row {row}; every record needs a time")
    return v

def refuse_nan(col, name: str, s) -> None:
    """A NaN (not a NULL) in the floating-point column ``name`` of stream ``s`` that the join's
    predicate reads is an ``InputError`` naming its row: the W-join's result is the SQL query's,
    where NaN equals NaN and sorts above every number, but its probes, band checks and numpy
    comparisons are IEEE's (NaN equals nothing, compares false). Refused rather than answered
    differently from SQL."""
    v = values(col)
    if v is not None:
        m = np.isnan(v)
    else:  # NULLs (or a chunked column): Arrow's is_nan, NULL counted as no NaN
        m = X.to_numpy(X.call("coalesce", X.call("is_nan", col), X.scalar(False)))
    if m.any():
        row = s.rows_read + int(np.argmax(m))
        raise InputError(f"{s.name}: column {name!r} is NaN at row {row}; the join's predicate follows SQL, where NaN "
                         "equals NaN and sorts above every number, which this W-join does not do: write missing "
                         "values as NULL (pandas' to_parquet and pyarrow.Table.from_pandas do) or leave those rows out")


__all__ = ["one_chunk", "values", "take", "mask_numpy", "times", "refuse_nan"]
