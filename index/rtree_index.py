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

import hashlib
import json
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa

from smerge.errors import InputError, KeyNaNError, SmergeError, UsageError

ROW_ID_COLUMN = "__smerge_row"
INDEX_FORMAT_VERSION = 3  # 2: meta.json records a SHA-256 and size of every file, the schema and its own SHA-256;
# 3: time keys on one base (microseconds since 1970 UTC) in the R-tree and sort order, whatever their unit
INDEX_FILES = ("data.parquet", "order.npy", "rtree.dat", "rtree.idx")
HASH_CHUNK = 8 << 20
MAX_DIMS = 8
RESULT_CACHE_ROWS = 8_000_000  # total cached sorted ranks (int64) across queries: 64 MB
RESULT_CACHE_ENTRIES = 64
SCAN_MAX_ROWS = 1 << 20  # leading-key runs up to this many records are scanned, larger ones use the R-tree
SCAN_CHUNK_ROWS = 4096  # first chunk of a scan (doubles while the page is not full)
TREE_MODES = ("lazy", "background", "eager")
ADAPTIVE_SORT_MAX_INVERSIONS = 0.1  # fraction of adjacent inversions below which B is merge-sorted adaptively


@dataclass(frozen=True)
class Box:
    """A closed axis-aligned box over the d keys: ``lo[j] <= k_j <= hi[j]``."""

    lo: tuple[float, ...]
    hi: tuple[float, ...]

    @property
    def empty(self) -> bool:
        return any(l > h for l, h in zip(self.lo, self.hi))

    def as_json(self) -> dict:
        return {"lo": list(self.lo), "hi": list(self.hi)}

    @classmethod
    def from_arrays(cls, lo: Sequence[float], hi: Sequence[float]) -> "Box":
        return cls(tuple(float(x) for x in lo), tuple(float(x) for x in hi))


@dataclass(frozen=True)
class Page:
    """One page of a query: B row ids in (key, row id) order and the token of the next page."""

    rows: np.ndarray
    next_token: str | None


def _fingerprint(op: str, boxes: Sequence[Box]) -> str:
    body = json.dumps([op] + [b.as_json() for b in boxes], separators=(",", ":"))
    return hashlib.blake2b(body.encode(), digest_size=6).hexdigest()


def parse_token(token: str | None, fp: str) -> int:
    """The sort rank after which the next page starts (-1: from the beginning)."""
    if token is None or token == "":
        return -1
    rank, sep, tfp = str(token).partition(".")
    if not sep or tfp != fp or not (rank.isascii() and rank.isdigit()) or len(rank) > 19:
        shown = token if len(token) <= 40 else token[:37] + "..."
        raise UsageError(f"continuation token {shown!r} does not belong to this query; "
                         "start the query again without a token")
    return int(rank)


def _sort_order(keys: np.ndarray) -> np.ndarray:
    """Positions of records in exact key order, ties by position (a stable lexicographic sort).

    A partially sorted B (few adjacent inversions) is sorted by the adaptive merge kernel
    (about O(n) when nearly sorted), anything else by ``np.lexsort``; both give the same order.
    """
    n = keys.shape[0]
    if n == 0:
        return np.empty(0, np.int64)
    gt, eq = np.zeros(n - 1, np.bool_), np.ones(n - 1, np.bool_)
    for j in range(keys.shape[1]):  # adjacent pairs out of lexicographic order
        x, y = keys[:-1, j], keys[1:, j]
        gt |= eq & (x > y)
        eq &= x == y
    inversions = int(np.count_nonzero(gt))
    if inversions == 0:
        return np.arange(n, dtype=np.int64)
    if inversions <= n * ADAPTIVE_SORT_MAX_INVERSIONS:
        from smerge.merge._kernel import argsort_keys

        return argsort_keys(np.ascontiguousarray(keys), np.arange(n, dtype=np.int64)).astype(np.int64)
    return np.lexsort(tuple(keys[:, j] for j in range(keys.shape[1] - 1, -1, -1))).astype(np.int64)


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
            raise UsageError("the index needs at least one key; pass --keys")
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
        order = valid_rows[_sort_order(km[valid_rows])] if n_bad else _sort_order(km)
        if directory is not None or tree == "eager":
            idx = cls(table, keys, km, order, _build_tree(km, valid_rows, directory), name=name, nan_keys=n_bad,
                      source=source)
        else:
            idx = cls(table, keys, km, order, None, name=name, nan_keys=n_bad, source=source,
                      tree_builder=lambda: _build_tree(km, valid_rows, None))
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
        table = pa.Table.from_batches(batches, schema=src.schema) if batches else src.schema.empty_table()
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
                "nan_keys": self.nan_keys, "source": self.source, "schema": _schema_list(self.table.schema),
                "files": {f: _file_digest(os.path.join(directory, f)) for f in INDEX_FILES}}
        meta["meta_sha256"] = _meta_digest(meta)
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

        meta = _read_meta(directory)
        if verify:
            for fname in ("data.parquet", "order.npy"):
                _check_file(directory, fname, meta["files"][fname])
        try:
            table = pq.read_table(os.path.join(directory, "data.parquet"), memory_map=True).combine_chunks()
            order = np.load(os.path.join(directory, "order.npy"), allow_pickle=False)
        except (OSError, ValueError, EOFError, pa.ArrowException) as e:
            raise _damaged(directory, f"cannot read its files ({_short(e)})") from None
        if table.num_rows != meta["count"]:
            raise _damaged(directory, f"data.parquet has {table.num_rows} records, meta.json says {meta['count']}")
        if _schema_list(table.schema) != meta["schema"]:
            raise _damaged(directory, "data.parquet's schema differs from the one recorded in meta.json")
        keys = tuple(meta["keys"])
        try:
            km = np.ascontiguousarray(key_matrix(table, keys))
        except (SmergeError, KeyError, TypeError, ValueError, pa.ArrowException) as e:
            raise _damaged(directory, f"its keys cannot be read ({_short(e)})") from None
        order = _check_order(directory, order, km, meta)
        tree = _open_tree(directory, len(keys), meta["files"] if verify else None)
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
        fp = _fingerprint(op, boxes)
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


def _props(d: int):
    from rtree import index

    p = index.Property()
    p.dimension = max(2, d)
    return p


def _build_tree(km: np.ndarray, rows: np.ndarray, directory: str | None):
    """Bulk-load (STR, libspatialindex >= 2.1) the R-tree over the points ``km[rows]``."""
    from rtree import index

    pts = km[rows]
    if km.shape[1] == 1:
        pts = np.column_stack([pts, np.zeros(rows.size)])
    pts = np.ascontiguousarray(pts, np.float64)
    p = _props(km.shape[1])
    base = os.path.join(directory, "rtree") if directory else None
    if base:
        p.overwrite = True
    if rows.size == 0:
        return index.Index(base, properties=p) if base else index.Index(properties=p)
    arrays = (rows, pts, pts)
    return index.Index(base, arrays, properties=p) if base else index.Index(arrays, properties=p)


def _open_tree(directory: str, d: int, files: dict | None = None):
    """Open a private copy of the persisted R-tree (checked against ``files``' SHA-256 while
    copying): libspatialindex rewrites its header page when it closes a tree, so the index
    directory itself is never opened for writing (it may be read-only, and stays verifiable)."""
    import shutil
    import tempfile

    from rtree import index

    base = os.path.join(directory, "rtree")
    for ext in (".idx", ".dat"):
        if not os.path.isfile(base + ext) or os.path.getsize(base + ext) == 0:
            raise _damaged(directory, f"rtree{ext} is missing or empty")
    tmp = tempfile.mkdtemp(prefix="smerge-rtree-")
    try:
        for ext in (".idx", ".dat"):
            got = _file_digest(base + ext, copy_to=os.path.join(tmp, "rtree" + ext))
            want = files.get("rtree" + ext) if files is not None else None
            if want is not None and (got["size"] != want["size"] or got["sha256"] != want["sha256"]):
                raise _damaged(directory, f"rtree{ext} does not match its SHA-256")
        try:
            return index.Index(os.path.join(tmp, "rtree"), properties=_props(d))
        except Exception as e:  # noqa: BLE001 - libspatialindex reports damage as RTreeError/OSError
            raise _damaged(directory, f"the R-tree cannot be opened ({_short(e)})") from None
    except OSError as e:
        raise _damaged(directory, f"the R-tree cannot be read ({e.strerror or _short(e)})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the open tree keeps its (unlinked) files


# -- persisted index: metadata and verification ----------------------------------------------------


def _short(e: BaseException) -> str:
    text = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return text if len(text) <= 160 else text[:157] + "..."


def _damaged(directory: str, what: str) -> InputError:
    return InputError(f"{directory}: damaged index ({what}); rebuild it with `smerge index build`")


def _schema_list(schema: pa.Schema) -> list[list[str]]:
    return [[f.name, str(f.type)] for f in schema]


def _file_digest(path: str, copy_to: str | None = None) -> dict:
    """Size and SHA-256 of a file (one read), optionally copying it to ``copy_to`` on the way."""
    h = hashlib.sha256()
    size = 0
    out = open(copy_to, "wb") if copy_to else None
    try:
        with open(path, "rb") as f:
            while chunk := f.read(HASH_CHUNK):
                h.update(chunk)
                size += len(chunk)
                if out is not None:
                    out.write(chunk)
    finally:
        if out is not None:
            out.close()
    return {"size": size, "sha256": h.hexdigest()}


def _meta_digest(meta: dict) -> str:
    body = {k: v for k, v in meta.items() if k != "meta_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _read_meta(directory: str) -> dict:
    """meta.json, checked: its own checksum, then every field's type."""
    meta_path = os.path.join(directory, "meta.json")
    if not os.path.isfile(meta_path):
        raise InputError(f"{directory}: not an smerge index (no meta.json); build one with `smerge index build`")
    try:
        with open(meta_path, "rb") as f:
            meta = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise _damaged(directory, f"meta.json cannot be read ({_short(e)})") from None
    if not isinstance(meta, dict):
        raise _damaged(directory, "meta.json is not a JSON object")
    if meta.get("format") != "smerge-index" or meta.get("version") != INDEX_FORMAT_VERSION:
        fmt, ver = str(meta.get("format"))[:40], str(meta.get("version"))[:40]
        raise InputError(f"{directory}: index format {fmt}/{ver} is not supported (this smerge reads "
                         f"smerge-index/{INDEX_FORMAT_VERSION}, with checksums); rebuild it with `smerge index build`")
    if meta.get("meta_sha256") != _meta_digest(meta):
        raise _damaged(directory, "meta.json does not match its checksum")
    files = meta.get("files")
    ok = (isinstance(meta.get("name"), str)
          and isinstance(meta.get("keys"), list) and 1 <= len(meta["keys"]) <= MAX_DIMS
          and all(isinstance(k, str) for k in meta["keys"]) and len(set(meta["keys"])) == len(meta["keys"])
          and all(isinstance(meta.get(f), int) and not isinstance(meta.get(f), bool) and meta[f] >= 0
                  for f in ("count", "indexed", "nan_keys"))
          and meta["indexed"] + meta["nan_keys"] == meta["count"]
          and isinstance(meta.get("schema"), list)
          and isinstance(files, dict)
          and all(isinstance(files.get(f), dict) and isinstance(files[f].get("size"), int)
                  and isinstance(files[f].get("sha256"), str) for f in INDEX_FILES))
    if not ok:
        raise _damaged(directory, "meta.json has missing or malformed fields")
    return meta


def _check_file(directory: str, fname: str, want: dict) -> None:
    path = os.path.join(directory, fname)
    try:
        size = os.path.getsize(path)
        if size != want["size"]:
            raise _damaged(directory, f"{fname} has {size} bytes, {want['size']} were written")
        got = _file_digest(path)
    except OSError as e:
        raise _damaged(directory, f"{fname} cannot be read ({e.strerror or _short(e)})") from None
    if got["sha256"] != want["sha256"]:
        raise _damaged(directory, f"{fname} does not match its SHA-256")


def _check_order(directory: str, order: np.ndarray, km: np.ndarray, meta: dict) -> np.ndarray:
    """The row order must be a permutation of the rows with valid keys, in exact (key, row id) order."""
    n = km.shape[0]
    if order.ndim != 1 or order.dtype.kind not in "iu":
        raise _damaged(directory, f"order.npy is a {order.ndim}-D {order.dtype} array, not 1-D integers")
    if order.size != meta["indexed"]:
        raise _damaged(directory, f"order.npy has {order.size} entries, {meta['indexed']} records are indexed")
    order = order.astype(np.int64, copy=False)
    if order.size and (int(order.min()) < 0 or int(order.max()) >= n):
        raise _damaged(directory, "order.npy names rows that do not exist")
    seen = np.zeros(n, np.bool_)
    seen[order] = True
    if int(np.count_nonzero(seen)) != order.size:
        raise _damaged(directory, "order.npy repeats rows (not a permutation)")
    nan_rows = np.isnan(km).any(axis=1)
    if np.any(nan_rows[order]) or int(np.count_nonzero(nan_rows)) != meta["nan_keys"]:
        raise _damaged(directory, "order.npy and the NaN keys of data.parquet disagree")
    if order.size > 1:
        ks = km[order]
        gt, eq = np.zeros(order.size - 1, np.bool_), np.ones(order.size - 1, np.bool_)
        for j in range(ks.shape[1]):
            x, y = ks[:-1, j], ks[1:, j]
            gt |= eq & (x > y)
            eq &= x == y
        gt |= eq & (order[:-1] > order[1:])
        if gt.any():
            raise _damaged(directory, "order.npy does not sort the records by (key, row id)")
    return order


def build_index(src, directory: str, *, name: str | None = None, nan_keys: str = "error",
                overwrite: bool = False) -> BIndex:
    """Build and persist an index of ``src`` (an InputSource) under ``directory`` (atomically)."""
    import shutil

    from smerge.datasets.outputs import check_target, make_staging, replace_dir, space_errors

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
