"""Output layout of a merge (docs/semantics.md section 2) and the row store that gathers payload.

Output columns: every column of A under its own name, then every column of B, with ``_b``
added to a B column whose name already exists; with ids, ``a_row`` and ``b_row`` (int64).
"""

from __future__ import annotations

import bisect
from typing import Sequence

import numpy as np
import pyarrow as pa

from smerge.merge.arrays import int64_array, values


def empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], type=f.type) for f in schema], schema=schema)


def b_output_names(names_a: Sequence[str], names_b: Sequence[str]) -> list[str]:
    """B's column names in the output: ``_b`` appended while the name is already taken."""
    taken = set(names_a)
    out = []
    for n in names_b:
        m = n
        while m in taken:
            m = m + "_b"
        taken.add(m)
        out.append(m)
    return out


def pair_schema(schema_a: pa.Schema, schema_b: pa.Schema, *, with_ids: bool) -> pa.Schema:
    names_b = b_output_names(schema_a.names, schema_b.names)
    fields = list(schema_a) + [f.with_name(n) for f, n in zip(schema_b, names_b)]
    if with_ids:
        fields += [pa.field("a_row", pa.int64(), nullable=False), pa.field("b_row", pa.int64(), nullable=False)]
    return pa.schema(fields)


def pair_batch(schema: pa.Schema, a: pa.RecordBatch, b: pa.RecordBatch,
               a_rows: np.ndarray | None, b_rows: np.ndarray | None) -> pa.RecordBatch:
    cols = list(a.columns) + list(b.columns)
    if a_rows is not None:
        cols += [int64_array(a_rows), int64_array(b_rows)]
    return pa.RecordBatch.from_arrays(cols, schema=schema)


_TAKE = None


def _take(data, pos: np.ndarray):
    """Arrow's take kernel on a RecordBatch or Table. Called through ``pyarrow._compute``:
    ``batch.take`` imports ``pyarrow.compute``, whose wrappers cost 60-200 ms of a process."""
    global _TAKE
    if _TAKE is None:
        from pyarrow._compute import get_function

        _TAKE = get_function("take")
    return _TAKE.call([data, int64_array(pos)])


def _numpy_take(batches: pa.RecordBatch | Sequence[pa.RecordBatch], pos: np.ndarray) -> pa.RecordBatch | None:
    """The rows at ``pos`` of the batches' concatenation (``Table.from_batches(batches).take(pos)``)
    by numpy (one batch) or the C kernel (several: no concatenation), when ``arrays.values`` reads
    every column (fixed-width numbers and times without nulls: the usual payload of gridded
    data), else None: as fast as Arrow's take on one batch, faster on several (Arrow concatenated
    them first, fresh pages for every flush), and a process that needs nothing else of Arrow's
    compute functions does not load them (~12 ms). Positions are checked once, then every
    column is gathered without a check per element."""
    if isinstance(batches, pa.RecordBatch):
        batches = [batches]
    vals = [[values(b.column(j)) for b in batches] for j in range(batches[0].num_columns)]
    if any(v is None for col in vals for v in col):
        return None
    total = sum(b.num_rows for b in batches)
    if pos.size and (int(pos.min()) < 0 or int(pos.max()) >= total):
        raise IndexError(f"row positions {int(pos.min())}..{int(pos.max())} outside batches of {total} rows")
    cols = []
    for field, col in zip(batches[0].schema, vals):
        # Arrow's memory (its pool reuses the pages of batches written and freed, in any thread)
        buf = pa.allocate_buffer(pos.size * col[0].itemsize)
        out = np.frombuffer(buf, col[0].dtype)
        if len(col) == 1:
            col[0].take(pos, out=out, mode="clip")
        else:
            from smerge.merge._kernel import gather_segments

            gather_segments(col, pos, out)
        cols.append(pa.Array.from_buffers(field.type, pos.size, [None, buf]))
    return pa.RecordBatch.from_arrays(cols, schema=batches[0].schema)


def _gather(batch: pa.RecordBatch, pos: np.ndarray) -> pa.RecordBatch:
    """``batch.take(pos)``: a zero-copy slice for a consecutive run, else numpy's or Arrow's take
    (both release the GIL)."""
    n = pos.size
    if n and int(pos[-1]) - int(pos[0]) == n - 1 and (n == 1 or bool((np.diff(pos) == 1).all())):
        return batch.slice(int(pos[0]), n)
    taken = _numpy_take(batch, pos)
    return taken if taken is not None else _take(batch, pos)


def _take_batches(batches: list[pa.RecordBatch], pos: np.ndarray, schema: pa.Schema) -> pa.RecordBatch:
    """The rows at ``pos`` of several batches' concatenation, as one batch: the C kernel's gather,
    else Arrow's take."""
    taken = _numpy_take(batches, pos)
    if taken is not None:
        return taken
    return _one_batch(_take(pa.Table.from_batches(batches, schema=schema), pos), schema)


def _one_batch(table: pa.Table, schema: pa.Schema) -> pa.RecordBatch:
    batches = table.combine_chunks().to_batches()
    return batches[0] if batches else empty_batch(schema)


class RowStore:
    """Holds the input batches whose records may still be output, addressed by row id.

    Segments are ``(first_row, row_ids or None, batch)``: a plain segment covers the
    contiguous rows ``first_row ..``; a compacted one lists its (sorted) row ids. ``compact``
    keeps only the rows still alive, so memory stays O(window) whatever the stream length.
    """

    def __init__(self, schema: pa.Schema):
        self.schema = schema
        self._segs: list[tuple[int, np.ndarray | None, pa.RecordBatch]] = []
        self._firsts: list[int] = []  # first row id of every segment (for bisect)
        self.rows_held = 0

    def append(self, batch: pa.RecordBatch, first_row: int) -> None:
        if batch.num_rows:
            self._segs.append((first_row, None, batch))
            self._firsts.append(first_row)
            self.rows_held += batch.num_rows

    def frozen(self) -> "RowStore":
        """A view holding the segments held now: its ``take`` gives the same records whatever
        ``append``, ``release`` or ``compact`` do to this store later (e.g. in another thread)."""
        view = RowStore(self.schema)
        view._segs, view._firsts, view.rows_held = list(self._segs), list(self._firsts), self.rows_held
        return view

    def _last_row(self, seg) -> int:
        first, ids, batch = seg
        return int(ids[-1]) if ids is not None else first + batch.num_rows - 1

    def take(self, rows: np.ndarray) -> pa.RecordBatch:
        """Records with the given row ids, in the given order."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size == 0:
            return empty_batch(self.schema)
        # The common case: the rows lie in plain segments of consecutive row ids (no compacted
        # one among them), so a row's position is its distance from the first of them.
        lo = bisect.bisect_right(self._firsts, int(rows.min())) - 1
        hi = bisect.bisect_right(self._firsts, int(rows.max()))
        run = self._segs[max(lo, 0):hi]
        if lo >= 0 and all(ids is None for _, ids, _ in run) and all(
                run[k + 1][0] == run[k][0] + run[k][2].num_rows for k in range(len(run) - 1)):
            pos = rows - run[0][0]
            if len(run) == 1:
                return _gather(run[0][2], pos)
            return _take_batches([b for _, _, b in run], pos, self.schema)
        firsts = np.array([s[0] for s in self._segs], dtype=np.int64)
        seg_of = np.searchsorted(firsts, rows, side="right") - 1
        offsets = np.zeros(len(self._segs) + 1, dtype=np.int64)
        np.cumsum([s[2].num_rows for s in self._segs], out=offsets[1:])
        # Plain segments: position = offset + row - first; compacted ones look their ids up.
        pos = rows + (offsets[:-1] - firsts)[seg_of]
        lo, hi = int(seg_of.min()), int(seg_of.max()) + 1
        for s in range(lo, hi):
            ids = self._segs[s][1]
            if ids is not None:
                sel = seg_of == s
                pos[sel] = offsets[s] + np.searchsorted(ids, rows[sel])
        if hi - lo == 1:
            return _gather(self._segs[lo][2], pos - offsets[lo])
        return _take_batches([s[2] for s in self._segs[lo:hi]], pos - offsets[lo], self.schema)

    def release(self, live_rows: np.ndarray, next_row: int) -> None:
        """Drop rows that are not live: ``live_rows`` (any order) plus every row >= ``next_row``.

        Segments wholly dead are dropped; when the held rows exceed twice the live count
        (plus one batch), the old segments are compacted into one of live rows only.
        """
        if not self._segs:
            return
        live = np.sort(np.asarray(live_rows, dtype=np.int64))
        keep = []
        for seg in self._segs:
            first, ids, batch = seg
            last = self._last_row(seg)
            if last >= next_row:
                keep.append(seg)
                continue
            lo = np.searchsorted(live, first)
            hi = np.searchsorted(live, last, side="right")
            if hi > lo:
                keep.append(seg)
        self._segs = keep
        self._firsts = [seg[0] for seg in keep]
        self.rows_held = sum(s[2].num_rows for s in self._segs)
        old = [s for s in self._segs if self._last_row(s) < next_row]
        old_rows = sum(s[2].num_rows for s in old)
        n_live_old = int(np.searchsorted(live, next_row))
        if len(old) > 1 and old_rows > 2 * n_live_old + 4096:
            ids = live[:n_live_old]
            compacted = self.take(ids)
            self._segs = [(int(ids[0]), ids, compacted)] + self._segs[len(old):]
            self._firsts = [seg[0] for seg in self._segs]
            self.rows_held = sum(s[2].num_rows for s in self._segs)
