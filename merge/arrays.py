"""Arrow columns as numpy and back, over the same memory, without pyarrow's own conversions
(``Array.to_numpy`` and ``pa.array`` on a numpy array import pandas or ``numpy.ma`` to check
for their objects: ~0.3 s and ~50 MB, or ~20 ms, of a process). Shared by the CGM's pair
gather (``merge/output.py``), the W-join's numpy paths (``merge/wjoin_numpy.py``) and the
``--where`` evaluator (``merge/expr.py``)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def one_chunk(c):
    """A column as one Arrow array (a chunked one's chunks concatenated)."""
    if isinstance(c, pa.ChunkedArray):
        return c.chunk(0) if c.num_chunks == 1 else c.combine_chunks()
    return c


def numeric_dtype(t: pa.DataType) -> np.dtype | None:
    """numpy's dtype of an Arrow integer or floating-point type; None for any other type."""
    if not (pa.types.is_integer(t) or pa.types.is_floating(t)):
        return None
    return np.dtype(f"{'f' if pa.types.is_floating(t) else 'i' if pa.types.is_signed_integer(t) else 'u'}"
                    f"{t.bit_width // 8}")


def buffer_values(col: pa.Array, dt: np.dtype) -> np.ndarray:
    """The values buffer of a fixed-width array as numpy (no copy); under a NULL, whatever the
    buffer holds."""
    if len(col) == 0:
        return np.empty(0, dt)
    return np.frombuffer(col.buffers()[1], dt, count=len(col), offset=col.offset * dt.itemsize)


def values(col) -> np.ndarray | None:
    """The values of a column without NULLs as numpy over its buffer (one chunk: no copy):
    integers and floats, timestamps, durations and dates as their integer counts. None for a
    column with NULLs, of booleans or of any other type: the caller then uses Arrow's kernels,
    whose first call in a process costs ~10 ms and ~9 MB (the kernel registry and its code)."""
    if col.null_count:
        return None
    col = one_chunk(col)
    t = col.type
    if pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_date64(t):
        dt = np.dtype(np.int64)
    elif pa.types.is_date32(t):
        dt = np.dtype(np.int32)
    else:
        dt = numeric_dtype(t)
        if dt is None:
            return None
    return buffer_values(col, dt)


def int64_array(a) -> pa.Array:
    """An int64 Arrow array over an int64 numpy array's memory (a copy only when ``a`` is not
    contiguous int64)."""
    a = np.ascontiguousarray(a, np.int64)
    return pa.Array.from_buffers(pa.int64(), a.shape[0], [None, pa.py_buffer(a)])
