"""The two access structures of an index: the exact key order of B and the R-tree over its keys.

``sort_order`` ranks the records by (key, row id): an adaptive merge sort for a nearly sorted B
(about O(n)), ``np.lexsort`` otherwise. The R-tree (libspatialindex via ``rtree``) is
bulk-loaded over the key points, in memory or in a folder; libspatialindex needs >= 2
dimensions, so a 1-key index adds a constant second coordinate. A persisted R-tree is opened
from a private copy checked against its recorded SHA-256 (``smerge.index.format``).
"""

from __future__ import annotations

import os

import numpy as np

from smerge.datasets.metadata import short_error
from smerge.index.format import damaged, file_digest

ADAPTIVE_SORT_MAX_INVERSIONS = 0.1  # fraction of adjacent inversions below which B is merge-sorted adaptively


def sort_order(keys: np.ndarray) -> np.ndarray:
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


def _props(d: int):
    from rtree import index

    p = index.Property()
    p.dimension = max(2, d)
    return p


def build_tree(km: np.ndarray, rows: np.ndarray, directory: str | None):
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


def open_tree(directory: str, d: int, files: dict | None = None):
    """Open a private copy of the persisted R-tree (checked against ``files``' SHA-256 while
    copying): libspatialindex rewrites its header page when it closes a tree, so the index
    directory itself is never opened for writing (it may be read-only, and stays verifiable)."""
    import shutil
    import tempfile

    from rtree import index

    base = os.path.join(directory, "rtree")
    for ext in (".idx", ".dat"):
        if not os.path.isfile(base + ext) or os.path.getsize(base + ext) == 0:
            raise damaged(directory, f"rtree{ext} is missing or empty")
    tmp = tempfile.mkdtemp(prefix="smerge-rtree-")
    try:
        for ext in (".idx", ".dat"):
            got = file_digest(base + ext, copy_to=os.path.join(tmp, "rtree" + ext))
            want = files.get("rtree" + ext) if files is not None else None
            if want is not None and (got["size"] != want["size"] or got["sha256"] != want["sha256"]):
                raise damaged(directory, f"rtree{ext} does not match its SHA-256")
        try:
            return index.Index(os.path.join(tmp, "rtree"), properties=_props(d))
        except Exception as e:  # noqa: BLE001 - libspatialindex reports damage as RTreeError/OSError
            raise damaged(directory, f"the R-tree cannot be opened ({short_error(e)})") from None
    except OSError as e:
        raise damaged(directory, f"the R-tree cannot be read ({e.strerror or short_error(e)})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the open tree keeps its (unlinked) files
