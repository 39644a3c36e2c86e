"""The W-join's chunks and output batches: where a chunk of arrivals is cut, and how the
pieces of output the chunks' blocks form are joined into batches of ``output_rows`` tuples."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa

from smerge.merge.wjoin_numpy import take, values


class OutputBatch:
    """The output batch being filled, ``rows`` tuples (a Parquet file's row group) wherever the
    chunks were cut: each piece of tuples is gathered straight into the batch's column buffers
    (numpy, where ``values`` reads the column; else Arrow pieces, concatenated at ``flush``).
    Gathering pieces and concatenating them held every column twice: 4 MB more peak memory on
    the issue's case (257k tuples)."""

    def __init__(self, schema: pa.Schema, rows: int, first: int = 1 << 20):
        self.schema, self.rows, self.n, self._first = schema, rows, 0, first  # first: a buffer's first size
        self._np: dict[int, np.ndarray] = {}
        self._arrow: dict[int, list] = {}

    def put(self, c: int, col, idx: np.ndarray) -> None:
        """Output column ``c`` of the next ``len(idx)`` tuples: ``col`` (an Arrow column, or a
        numpy array of int64 row ids) at ``idx``; ``advance`` once every column is put."""
        v = col if isinstance(col, np.ndarray) else None if c in self._arrow else values(col)
        if v is not None:
            buf, need = self._np.get(c), self.n + idx.shape[0]
            if buf is None or buf.shape[0] < need:  # pages are touched as they are filled
                grown = np.empty(min(self.rows, max(need, self._first, 2 * (0 if buf is None else buf.shape[0]))), v.dtype)
                if buf is not None:
                    grown[:self.n] = buf[:self.n]
                buf = self._np[c] = grown
            np.take(v, idx, out=buf[self.n:need])
            return
        pieces = self._arrow.setdefault(c, [])
        if c in self._np:  # the column met NULLs (or another type): what is gathered becomes a piece
            pieces.append(self._wrap(c, self._np.pop(c)[:self.n]))
        pieces.append(take(col, idx))

    def advance(self, k: int) -> None:
        self.n += k

    def _wrap(self, c: int, a: np.ndarray) -> pa.Array:
        return pa.Array.from_buffers(self.schema.field(c).type, a.shape[0], [None, pa.py_buffer(a)])

    def flush(self) -> pa.RecordBatch:
        """The batch (``n`` tuples); the next one starts empty."""
        cols = []
        for c in range(len(self.schema)):
            if c in self._arrow:
                pieces = self._arrow.pop(c)
                cols.append(pieces[0] if len(pieces) == 1 else pa.concat_arrays(pieces))
            else:
                cols.append(self._wrap(c, self._np.pop(c)[:self.n]))
        self.n = 0
        return pa.RecordBatch.from_arrays(cols, schema=self.schema)


def cap_takes(st: Sequence, takes: list[int], chunk_arrivals: int) -> list[int] | None:
    """Smaller takes when a stream would bring more than ``chunk_arrivals`` (or twice its buffer)
    arrivals to one chunk, else None. The cut is a time: every stream takes its records before it
    (arrival order and the output are the same as one chunk's). When that time would take nothing
    (a run of equal times longer than the cap), the cut is the next time after it."""
    cut = None
    for s, k in zip(st, takes):
        cap = max(chunk_arrivals, 2 * s.buf_t.shape[0])
        if k > cap and (cut is None or s.pend_t[cap] < cut):
            cut = s.pend_t[cap]
    if cut is None:
        return None
    capped = [min(k, int(np.searchsorted(s.pend_t, cut, "left"))) for s, k in zip(st, takes)]
    if not sum(capped):
        after = [s.pend_t[i] for s, k in zip(st, takes) for i in [int(np.searchsorted(s.pend_t, cut, "right"))] if i < k]
        if not after:
            return None
        capped = [min(k, int(np.searchsorted(s.pend_t, min(after), "left"))) for s, k in zip(st, takes)]
    return capped


__all__ = ["OutputBatch", "cap_takes"]
