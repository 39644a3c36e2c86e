"""The W-join's chunks and output batches: where a chunk of arrivals is cut, and how the
pieces of output the chunks' blocks form are joined into batches of ``output_rows`` tuples."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa


def joined(ready: list) -> pa.RecordBatch:
    """The pieces in ``ready`` as one batch (``ready`` emptied): the output's batches (a Parquet
    file's row groups) hold ``output_rows`` tuples each, wherever the chunks were cut."""
    b = ready[0] if len(ready) == 1 else pa.concat_batches(ready)
    ready.clear()
    return b


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


__all__ = ["joined", "cap_takes"]
