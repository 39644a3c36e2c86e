"""An R-tree over stream B's key points (libspatialindex via ``rtree``), kept beside B's records.

``BIndex`` holds B in stored order (a ``pyarrow.Table``; row id = position), the key matrix
(``float64``, shape ``(n, d)``), an R-tree bulk-loaded over the key points, and the global sort
rank of every record by exact key order, ties by row id (docs/semantics.md section 5). Queries:

- ``range_query(box)``: records with ``lo_j <= k_j <= hi_j`` for every key j;
- ``symdiff_query(box1, box2)``: records inside exactly one of the two boxes;

both return row ids sorted by (key, row id), at most ``limit`` per call, with a stateless
continuation token (the sort rank of the last record returned plus a fingerprint of the query),
so a retried or resumed call — even against a restarted server on the same persisted index —
returns exactly the next records. Boxes are closed; ``lo > hi`` on any key is an empty box;
``lo == hi`` is a degenerate box (a point or a hyperplane); +-inf bounds are allowed.

Two access paths answer a query, with identical results (tested): B's keys in sort order
(rank order) are kept column by column, so the records whose *leading* key lies in the query's
range form one contiguous run of ranks (found by binary search); when that run holds at most
``scan_max_rows`` records it is scanned in rank order, chunk by chunk, until the page is full
(already sorted: no sort, and a page costs O(records scanned), not O(query)). Otherwise the
R-tree answers (its ids are mapped to ranks and sorted; the first page is cached). An
in-memory R-tree is built on first use (``tree="lazy"``), in a background thread
(``"background"``) or at once (``"eager"``); a persisted one is always built at once.

Memory: B's records, keys (twice: stored and rank order) and ranks are held in memory
(O(|B|)); the R-tree may live on disk. libspatialindex needs >= 2 dimensions: a 1-key index
adds a constant second coordinate.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa

from smerge.datasets.metadata import schema_list, short_error
from smerge.errors import InputError, KeyNaNError, SmergeError, UsageError, param
from smerge.index.format import (INDEX_FILES, INDEX_FORMAT_VERSION, MAX_DIMS, check_file, check_order, damaged,
                                 file_digest, meta_digest, read_meta)
from smerge.index.paging import Page, fingerprint, parse_token
from smerge.index.tree import build_tree, open_tree, sort_order
from smerge.merge.range_source import ROW_ID_COLUMN, Box

RESULT_CACHE_ROWS = 8_000_000  # total cached sorted ranks (int64) across queries: 64 MB
RESULT_CACHE_ENTRIES = 64
SCAN_MAX_ROWS = 1 << 20  # leading-key runs up to this many records are scanned, larger ones use the R-tree
SCAN_CHUNK_ROWS = 4096  # first chunk of a scan (doubles while the page is not full)
TREE_MODES = ("lazy", "background", "eager")


class BIndex:
    """B's records + an R-tree over their keys + their global sort rank (see module doc)."""

    def __init__(self, table: pa.Table, keys: tuple[str, ...], key_matrix: np.ndarray, order: np.ndarray,
                 tree, *, name: str, nan_keys: int = 0, source: str | None = None,
                 tree_builder: Callable[[], object] | None = None):
        self.table = table
        self.keys = keys
        self.key_matrix = key_matrix
        self.order = order  # order[rank] = row id (only rows with valid keys)
        self.rank = np.full(table.num_rows, -1, np.int64)
        self.rank[order] = np.arange(order.size, dtype=np.int64)
        self.tree = tree
        self._tree_builder = tree_builder  # builds the R-tree on first use when ``tree`` is None
        self._tree_lock = threading.Lock()
        self._tree_thread: threading.Thread | None = None
        self.name = name
        self.nan_keys = nan_keys
        self.source = source
        self.scan_max_rows = SCAN_MAX_ROWS
        self._lock = threading.Lock()  # libspatialindex handles are not safe for concurrent queries
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cache_rows = 0
        # keys in rank order, one contiguous column per key (the scan path)
        self.sorted_cols = [np.ascontiguousarray(key_matrix[order, j]) for j in range(len(keys))]
        self.bounds_lo = np.array([c.min() if c.size else 0.0 for c in self.sorted_cols], np.float64)
        self.bounds_hi = np.array([c.max() if c.size else 0.0 for c in self.sorted_cols], np.float64)

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def build(cls, table: pa.Table, keys: Sequence[str], *, name: str = "b", nan_keys: str = "error",
              directory: str | None = None, source: str | None = None, tree: str = "lazy") -> "BIndex":
        """Index ``table``'s keys: sort order now, the R-tree in memory per ``tree`` (lazy,
        background or eager; see the module doc) or at once on disk under ``directory``."""
        from smerge.merge.keys import check_keys, key_matrix

        keys = tuple(keys)
        if not keys:
            raise UsageError(f"the index needs at least one key; pass {param.keys}")
        if len(keys) > MAX_DIMS:
            raise UsageError(f"{len(keys)} keys; the index supports at most {MAX_DIMS}")
        if ROW_ID_COLUMN in table.schema.names:
            raise InputError(f"B has a column named {ROW_ID_COLUMN!r}, which the index reserves; rename it")
        check_keys(table.schema, keys, side="B", source=source)
        table = table.combine_chunks()
        km = np.ascontiguousarray(key_matrix(table, keys))
        bad = np.isnan(km).any(axis=1)
        n_bad = int(bad.sum())
        if n_bad and nan_keys == "error":
            first = int(np.argmax(bad))
            col = next(c for j, c in enumerate(keys) if np.isnan(km[first, j]))
            raise KeyNaNError(col, first, source)
        if tree not in TREE_MODES:
            raise UsageError(f"tree is {tree!r}; use one of {', '.join(TREE_MODES)}")
        valid_rows = np.nonzero(~bad)[0].astype(np.int64) if n_bad else np.arange(km.shape[0], dtype=np.int64)
        order = valid_rows[sort_order(km[valid_rows])] if n_bad else sort_order(km)
        if directory is not None or tree == "eager":
            idx = cls(table, keys, km, order, build_tree(km, valid_rows, directory), name=name, nan_keys=n_bad,
                      source=source)
        else:
            idx = cls(table, keys, km, order, None, name=name, nan_keys=n_bad, source=source,
                      tree_builder=lambda: build_tree(km, valid_rows, None))
            if tree == "background":
                idx._tree_thread = threading.Thread(target=idx.rtree, name="smerge-rtree-build", daemon=True)
                idx._tree_thread.start()
        return idx

    @classmethod
    def from_source(cls, src, *, name: str | None = None, nan_keys: str = "error",
                    directory: str | None = None, tree: str = "lazy") -> "BIndex":
        """Read a whole ``smerge.datasets.InputSource`` (loads it all into memory) and index it.
        An input that cannot fit is refused before it is read (``smerge.memory``)."""
        from smerge.memory import check_fits, record_bytes

        if src.num_rows:
            d = len(src.keys)
            check_fits(src.num_rows * (2 * record_bytes(src.schema) + 16 * d + 72),
                       f"indexing {src.path} ({src.num_rows:,} records, held whole with their R-tree)",
                       "merge it with smerge cgm, which streams, or index a subset")
        batches = list(src.batches())
        table = pa.Table.from_batches(batches, schema=src.schema)  # also with no batch (empty_table() imports pandas)
        nm = name or os.path.splitext(os.path.basename(str(src.path).rstrip("/")))[0] or "b"
        return cls.build(table, src.keys, name=nm, nan_keys=nan_keys, directory=directory, source=src.path,
                         tree=tree)

    def save(self, directory: str) -> None:
        """Persist records (Parquet), sort order and metadata; the R-tree must already be on disk there
        (closed). ``meta.json`` records the SHA-256 and size of every file, the record count, keys
        and schema, and its own SHA-256: ``load`` verifies them all."""
        import pyarrow.parquet as pq

        pq.write_table(self.table, os.path.join(directory, "data.parquet"))
        np.save(os.path.join(directory, "order.npy"), self.order)
        meta = {"format": "smerge-index", "version": INDEX_FORMAT_VERSION, "name": self.name,
                "keys": list(self.keys), "count": self.table.num_rows, "indexed": int(self.order.size),
                "nan_keys": self.nan_keys, "source": self.source, "schema": schema_list(self.table.schema),
                "files": {f: file_digest(os.path.join(directory, f)) for f in INDEX_FILES}}
        meta["meta_sha256"] = meta_digest(meta)
        with open(os.path.join(directory, "meta.json"), "w") as f:
            json.dump(meta, f, indent=2)

    @classmethod
    def load(cls, directory: str, *, verify: bool = True) -> "BIndex":
        """Open an index written by ``build_index``; the R-tree is opened from disk, not rebuilt.

        Any damage is an ``InputError`` (one line), found before anything is served: meta.json's
        own checksum and fields; with ``verify`` (the default) the SHA-256 and size of every file
        (reads them all once: about 1.5 GB/s here); then always the record count and schema, the
        row order (a 1-D integer array, a permutation of the rows with valid keys, in exact
        (key, row id) order) and that the R-tree opens. ``verify=False`` skips only the checksums.
        """
        import pyarrow.parquet as pq

        from smerge.merge.keys import key_matrix

        meta = read_meta(directory)
        if verify:
            for fname in ("data.parquet", "order.npy"):
                check_file(directory, fname, meta["files"][fname])
        try:
            table = pq.read_table(os.path.join(directory, "data.parquet"), memory_map=True).combine_chunks()
            order = np.load(os.path.join(directory, "order.npy"), allow_pickle=False)
        except (OSError, ValueError, EOFError, pa.ArrowException) as e:
            raise damaged(directory, f"cannot read its files ({short_error(e)})") from None
        if table.num_rows != meta["count"]:
            raise damaged(directory, f"data.parquet has {table.num_rows} records, meta.json says {meta['count']}")
        if schema_list(table.schema) != meta["schema"]:
            raise damaged(directory, "data.parquet's schema differs from the one recorded in meta.json")
        keys = tuple(meta["keys"])
        try:
            km = np.ascontiguousarray(key_matrix(table, keys))
        except (SmergeError, KeyError, TypeError, ValueError, pa.ArrowException) as e:
            raise damaged(directory, f"its keys cannot be read ({short_error(e)})") from None
        order = check_order(directory, order, km, meta)
        tree = open_tree(directory, len(keys), meta["files"] if verify else None)
        return cls(table, keys, km, order, tree, name=meta["name"], nan_keys=int(meta["nan_keys"]),
                   source=meta.get("source"))

    # -- the R-tree -------------------------------------------------------------------------------

    def rtree(self):
        """The R-tree, built now if it was left for later (thread-safe; built once)."""
        if self.tree is None and self._tree_builder is not None:
            with self._tree_lock:
                if self.tree is None and self._tree_builder is not None:
                    self.tree = self._tree_builder()
                    self._tree_builder = None
        return self.tree

    # -- queries --------------------------------------------------------------------------------

    @property
    def num_rows(self) -> int:
        return self.table.num_rows

    def info(self) -> dict:
        return {"name": self.name, "keys": list(self.keys), "count": self.table.num_rows,
                "indexed": int(self.order.size), "nan_keys": self.nan_keys,
                "bounds": {"lo": self.bounds_lo.tolist(), "hi": self.bounds_hi.tolist()},
                "schema": [[f.name, str(f.type)] for f in self.table.schema]}

    def check_box(self, box: Box) -> None:
        d = len(self.keys)
        if len(box.lo) != d or len(box.hi) != d:
            raise UsageError(f"a box needs {d} bounds per side (keys {', '.join(self.keys)}); "
                             f"got {len(box.lo)} and {len(box.hi)}")
        if any(np.isnan(v) for v in box.lo + box.hi):
            raise UsageError("box bounds must be numbers, not NaN")

    def _tree_ids(self, box: Box, first_key_floor: float | None = None) -> np.ndarray:
        """Row ids inside the closed box (unsorted). Bounds are clamped to the data bounds."""
        if box.empty or self.order.size == 0:
            return np.empty(0, np.int64)
        lo = np.maximum(np.asarray(box.lo, np.float64), self.bounds_lo)
        hi = np.minimum(np.asarray(box.hi, np.float64), self.bounds_hi)
        if first_key_floor is not None:
            lo[0] = max(lo[0], first_key_floor)
        if (lo > hi).any():
            return np.empty(0, np.int64)
        if lo.size == 1:
            lo, hi = np.append(lo, 0.0), np.append(hi, 0.0)
        with self._lock:
            ids, _ = self.rtree().intersection_v(lo.reshape(1, -1), hi.reshape(1, -1))
        return np.asarray(ids, np.int64)

    def _sorted_ranks(self, op: str, boxes: Sequence[Box], after: int) -> np.ndarray:
        floor = float(self.key_matrix[self.order[after], 0]) if after >= 0 else None
        if op == "range":
            ids = self._tree_ids(boxes[0], floor)
        else:
            ids = np.setxor1d(self._tree_ids(boxes[0], floor), self._tree_ids(boxes[1], floor), assume_unique=True)
        ranks = np.sort(self.rank[ids])
        if after >= 0:
            ranks = ranks[np.searchsorted(ranks, after, side="right"):]
        return ranks

    def _leading_run(self, boxes: Sequence[Box], after: int) -> tuple[int, int]:
        """Ranks [start, end) after ``after`` whose leading key lies in some box's leading range."""
        live = [b for b in boxes if not b.empty]
        if not live or self.order.size == 0:
            return 0, 0
        first = self.sorted_cols[0]
        start = int(np.searchsorted(first, min(b.lo[0] for b in live), side="left"))
        end = int(np.searchsorted(first, max(b.hi[0] for b in live), side="right"))
        return max(start, after + 1), end

    def _inside(self, box: Box, s: int, e: int, first_col: int) -> np.ndarray:
        if box.empty:
            return np.zeros(e - s, np.bool_)
        m = np.ones(e - s, np.bool_)
        for j in range(first_col, len(self.keys)):
            c = self.sorted_cols[j][s:e]
            m &= (c >= box.lo[j]) & (c <= box.hi[j])
        return m

    def _scan(self, op: str, boxes: Sequence[Box], start: int, end: int, want: int) -> np.ndarray:
        """The first ``want`` ranks in [start, end) inside the query, scanning in rank order."""
        found: list[np.ndarray] = []
        got, s, chunk = 0, start, max(SCAN_CHUNK_ROWS, 2 * want)
        while s < end and got < want:
            e = min(end, s + chunk)
            if op == "range":  # the leading key is inside the box for every rank of the run
                m = self._inside(boxes[0], s, e, 1)
            else:
                m = self._inside(boxes[0], s, e, 0) ^ self._inside(boxes[1], s, e, 0)
            hits = np.flatnonzero(m)
            if hits.size:
                found.append(hits + s)
                got += hits.size
            s, chunk = e, 2 * chunk
        return np.concatenate(found)[:want] if found else np.empty(0, np.int64)

    def _query(self, op: str, boxes: Sequence[Box], limit: int, token: str | None) -> Page:
        for b in boxes:
            self.check_box(b)
        if limit < 1:
            raise UsageError(f"limit is {limit}; ask for at least 1 record per page")
        fp = fingerprint(op, boxes)
        after = parse_token(token, fp)
        if after >= self.order.size:
            raise UsageError(f"continuation token {token!r} is past the end of this index; "
                             "start the query again without a token")
        if all(b.empty or self._covers_trailing(b) for b in boxes):
            ranks = self._interval_ranks(op, boxes, after, limit + 1)
            page = ranks[:limit]
            next_token = f"{int(page[-1])}.{fp}" if ranks.size > limit else None
            return Page(self.order[page], next_token)
        start, end = self._leading_run(boxes, after)
        if end - start <= self.scan_max_rows:
            ranks = self._scan(op, boxes, start, end, limit + 1) if end > start else np.empty(0, np.int64)
            page = ranks[:limit]
            next_token = f"{int(page[-1])}.{fp}" if ranks.size > limit else None
            return Page(self.order[page], next_token)
        with self._lock:
            ranks = self._cache.get(fp)
            if ranks is not None:
                self._cache.move_to_end(fp)
        if ranks is not None:
            ranks = ranks[np.searchsorted(ranks, after, side="right"):] if after >= 0 else ranks
        else:
            ranks = self._sorted_ranks(op, boxes, after)
            if after < 0 and ranks.size > limit:
                self._remember(fp, ranks)
        page = ranks[:limit]
        next_token = f"{int(page[-1])}.{fp}" if ranks.size > limit else None
        return Page(self.order[page], next_token)

    def _covers_trailing(self, box: Box) -> bool:
        """Whether ``box`` holds every record on all keys but the leading one (then the records
        inside it are exactly one run of ranks: no scan, no R-tree)."""
        return all(box.lo[j] <= self.bounds_lo[j] and box.hi[j] >= self.bounds_hi[j]
                   for j in range(1, len(self.keys)))

    def _interval_ranks(self, op: str, boxes: Sequence[Box], after: int, want: int) -> np.ndarray:
        """The first ``want`` ranks after ``after`` of a query whose boxes all cover the trailing
        keys: each box is a run of ranks (binary search on the leading key), the answer their
        union (range) or symmetric difference (symdiff). O(log n + want) per page."""
        first = self.sorted_cols[0]
        runs = []
        for b in boxes:
            if b.empty or first.size == 0:
                runs.append((0, 0))
            else:
                runs.append((int(np.searchsorted(first, b.lo[0], side="left")),
                             int(np.searchsorted(first, b.hi[0], side="right"))))
        cuts = sorted({p for r in runs for p in r})
        out, got = [], 0
        for s, e in zip(cuts, cuts[1:]):
            inside = [r[0] <= s < r[1] for r in runs]
            if not (inside[0] if op == "range" else inside[0] != inside[1]):
                continue
            s = max(s, after + 1)
            if s >= e:
                continue
            take = min(e - s, want - got)
            out.append(np.arange(s, s + take, dtype=np.int64))
            got += take
            if got >= want:
                break
        return np.concatenate(out) if out else np.empty(0, np.int64)

    def _remember(self, fp: str, ranks: np.ndarray) -> None:
        if ranks.size > RESULT_CACHE_ROWS // 4:
            return
        with self._lock:
            self._cache[fp] = ranks
            self._cache_rows += ranks.size
            while self._cache_rows > RESULT_CACHE_ROWS or len(self._cache) > RESULT_CACHE_ENTRIES:
                _, old = self._cache.popitem(last=False)
                self._cache_rows -= old.size

    def range_query(self, box: Box, *, limit: int, token: str | None = None) -> Page:
        """Rows with every key inside ``box``, sorted by (key, row id); at most ``limit``."""
        return self._query("range", [box], limit, token)

    def symdiff_query(self, box1: Box, box2: Box, *, limit: int, token: str | None = None) -> Page:
        """Rows inside exactly one of ``box1`` and ``box2``, sorted by (key, row id)."""
        return self._query("symdiff", [box1, box2], limit, token)

    def take(self, rows: np.ndarray, columns: Sequence[str] | None = None) -> pa.Table:
        """Records by row id (in the given order) with their row id in ``ROW_ID_COLUMN``."""
        t = self.table if columns is None else self.table.select(list(columns))
        out = t.take(pa.array(rows, pa.int64()))
        return out.append_column(pa.field(ROW_ID_COLUMN, pa.int64(), nullable=False), pa.array(rows, pa.int64()))

    def result_schema(self, columns: Sequence[str] | None = None) -> pa.Schema:
        s = self.table.schema if columns is None else pa.schema([self.table.schema.field(c) for c in columns])
        return s.append(pa.field(ROW_ID_COLUMN, pa.int64(), nullable=False))

    def close(self) -> None:
        if self._tree_thread is not None:
            self._tree_thread.join()
            self._tree_thread = None
        self._tree_builder = None
        if self.tree is not None:
            self.tree.close()
            self.tree = None


def build_index(src, directory: str, *, name: str | None = None, nan_keys: str = "error",
                overwrite: bool = False) -> BIndex:
    """Build and persist an index of ``src`` (an InputSource) under ``directory`` (atomically)."""
    import shutil

    from smerge.datasets.output_commit import replace_dir
    from smerge.datasets.output_space import space_errors
    from smerge.datasets.output_staging import make_staging
    from smerge.datasets.outputs import check_target

    # the output rule of smerge.datasets.outputs: a marked staging folder, put in place atomically;
    # a full disk is one line (libspatialindex reports it as a "Corrupted data file")
    check_target(directory, overwrite=overwrite, folder=True, inputs=[src.path])
    directory = os.path.abspath(directory)
    tmp = make_staging(directory, "index", dataset=True)
    try:
        with space_errors(directory, where=tmp):
            idx = BIndex.from_source(src, name=name, nan_keys=nan_keys, directory=tmp)
            idx.tree.close()
            idx.tree = None
            idx.save(tmp)
            replace_dir(tmp, directory, overwrite=overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return BIndex.load(directory)


class LocalSource:
    """An in-process ``RangeSource`` for RTM over a ``BIndex`` (no server; for tests and embedding)."""

    def __init__(self, index: BIndex):
        self.index = index

    def range_query(self, box: Box, *, limit: int, token: str | None = None) -> tuple[pa.Table, str | None]:
        page = self.index.range_query(box, limit=limit, token=token)
        return self.index.take(page.rows), page.next_token

    def symdiff_query(self, box1: Box, box2: Box, *, limit: int,
                      token: str | None = None) -> tuple[pa.Table, str | None]:
        page = self.index.symdiff_query(box1, box2, limit=limit, token=token)
        return self.index.take(page.rows), page.next_token
