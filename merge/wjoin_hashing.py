"""Hashing of the W-join's equality keys: equal values (SQL '=') hash equal across streams."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa

from smerge.merge import expr as X
from smerge.merge._wjoin_kernel import hash_combine, hash_f64
from smerge.merge.hashing import mix64 as _mix
from smerge.merge.arrays import one_chunk, values
from smerge.merge.wjoin_numpy import _PER_S


def hash_column(col: pa.ChunkedArray | pa.Array, kind: str) -> np.ndarray:
    """A 64-bit hash per value such that equal values (SQL '=') hash equal across streams."""
    if kind in ("num", "bool"):
        # As float64: an integer beyond 2**53 rounds (equal integers still hash equal; the
        # equality check after the probe tells apart the ones that round alike)
        v = values(col)
        if v is None:  # NULLs: Arrow's cast
            v = X.to_numpy(X.cast(col, pa.float64(), safe=False))
        return hash_f64(v)  # mix64 of the float64 bits; NULL/NaN as 0.0 (never match: re-checked), -0.0 as 0.0
    if kind == "time":
        # (seconds, nanoseconds within the second) from the column's own unit: equal instants
        # hash equal across units, and dates outside 1678-2262 never overflow a cast to ns.
        t = col.type
        v = values(col) if pa.types.is_timestamp(t) else None
        if v is None:
            if pa.types.is_date32(t):
                col = X.cast(col, pa.timestamp("s"))
            elif pa.types.is_date64(t):
                col = X.cast(col, pa.timestamp("ms"))
            v = X.to_numpy(X.call("coalesce", X.cast(col, pa.int64()), X.scalar(0))).astype(np.int64)  # fill_null(0)
        per_s = _PER_S[col.type.unit]
        sec, sub = np.divmod(v, np.int64(per_s))
        sub = sub * np.int64(10**9 // per_s)
        return _mix(_mix(sec.view(np.uint64)) ^ sub.view(np.uint64))
    return _hash_strings(col)


def _hash_strings(col) -> np.ndarray:
    """A 64-bit hash per string of its UTF-8 bytes: every byte mixed with its place in the string,
    summed per string (running sums, so no Python loop), mixed with the length. Equal strings hash
    equal in every process (a Spark task's split and the driver's agree); NULL hashes as what its
    slot holds (the equality re-check drops it). No pandas (its hash_array cost ~0.5 s and ~50 MB
    of import per process)."""
    col = one_chunk(col)
    n = len(col)
    if n == 0:
        return np.empty(0, np.uint64)
    off_t = np.dtype(np.int64 if pa.types.is_large_string(col.type) else np.int32)
    bufs = col.buffers()
    off = np.frombuffer(bufs[1], off_t, count=n + 1, offset=col.offset * off_t.itemsize).astype(np.int64)
    first, last = int(off[0]), int(off[-1])
    data = np.frombuffer(bufs[2], np.uint8, count=last - first, offset=first) if last > first else np.empty(0, np.uint8)
    lengths = off[1:] - off[:-1]
    pos = np.arange(first, last, dtype=np.int64) - np.repeat(off[:-1], lengths)
    with np.errstate(over="ignore"):
        sums = np.concatenate([np.zeros(1, np.uint64),
                               np.cumsum(_mix(data.astype(np.uint64) | (pos.astype(np.uint64) << np.uint64(8))))])
        return _mix(sums[off[1:] - first] - sums[off[:-1] - first] ^ _mix(lengths.astype(np.uint64) + np.uint64(1)))


def hash_values(columns: Sequence[tuple[pa.Array | pa.ChunkedArray, str]], rows: int) -> np.ndarray:
    """One hash per row over several (column, term kind) pairs, in order."""
    h = np.zeros(rows, np.uint64)
    for col, kind in columns:
        hash_combine(h, hash_column(col, kind))  # h = mix64(h * 31 + hash), wrapping
    return h


def hash_terms(table: pa.Table, terms: Sequence[X.Col]) -> np.ndarray:
    return hash_values([(table.column(t.name), t.kind) for t in terms], table.num_rows)



__all__ = ["hash_values", "hash_terms"]
