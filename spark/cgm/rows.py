"""A partition's map from local stream positions to values (``smerge.spark.cgm.tasks``)."""

from __future__ import annotations

import numpy as np


class Rows:
    """Values by local position in a partition's stream (global row ids, or a flag per B record),
    kept as segments: a run ``first + step * i`` (step 1: consecutive row ids, step 0: one
    flag) or explicit values. A task reading whole chunks holds a few runs instead of 8 bytes
    per record (measured: the per-record map was a sixth of the extra task CPU at P = 8).

    Appended by a reader thread, read by the engine thread: a segment's values are stored
    before its start is published, and ``take`` only asks for positions already handed over.
    """

    def __init__(self, dtype=np.int64):
        self.dtype = np.dtype(dtype)
        self._starts: list[int] = []  # local position of each segment's first value
        self._base: list[int] = []  # a run's first value, or an explicit segment's offset in _vals
        self._step: list[int] = []  # 1 or 0: a run; -1: explicit values
        self._vals = np.empty(0, dtype=self.dtype)
        self._nvals = 0
        self.n = 0

    def extend_run(self, first: int, count: int, step: int = 1) -> None:
        if count <= 0:
            return
        if self._step and self._step[-1] == step and step >= 0 and \
                self._base[-1] + step * (self.n - self._starts[-1]) == first:
            self.n += count  # continues the last run
            return
        self._base.append(int(first))
        self._step.append(step)
        self._starts.append(self.n)
        self.n += count

    def extend(self, values: np.ndarray) -> None:
        k = values.size
        if k == 0:
            return
        need = self._nvals + k
        if need > self._vals.size:
            new = np.empty(max(need, 2 * self._vals.size, 1 << 16), dtype=self.dtype)
            new[: self._nvals] = self._vals[: self._nvals]
            new[self._nvals: need] = values
            self._vals = new
        else:
            self._vals[self._nvals: need] = values
        self._base.append(self._nvals)
        self._step.append(-1)
        self._nvals = need
        self._starts.append(self.n)
        self.n += k

    def take(self, local: np.ndarray) -> np.ndarray:
        """The values at local positions ``local`` (each below ``n``)."""
        m = len(self._starts)
        local = np.asarray(local, dtype=np.int64)
        if m == 0 or local.size == 0:
            return np.empty(local.size, dtype=self.dtype)
        starts = np.asarray(self._starts[:m], dtype=np.int64)
        base = np.asarray(self._base[:m], dtype=np.int64)
        step = np.asarray(self._step[:m], dtype=np.int64)
        if m == 1 and step[0] >= 0:
            out = local * step[0] + base[0]
            return out if self.dtype == out.dtype else out.astype(self.dtype)
        seg = np.searchsorted(starts, local, side="right") - 1
        off = local - starts[seg]
        b, s = base[seg], step[seg]
        ex = s < 0
        if not ex.any():
            out = b + s * off
        else:
            vals = self._vals
            out = np.where(ex, 0, b + s * off)
            out[ex] = vals[b[ex] + off[ex]]
        return out if self.dtype == out.dtype else out.astype(self.dtype)
