"""The persisted index: its files, ``meta.json`` and their verification.

A folder holds ``data.parquet`` (B's records in stored order), ``order.npy`` (row ids in
(key, row id) order), the R-tree (``rtree.dat``, ``rtree.idx``) and ``meta.json``: format and
version, name, keys, record counts, schema, the SHA-256 and size of every file, and its own
SHA-256. Every check turns damage into one ``InputError`` line that says to rebuild the index.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

from smerge.datasets.metadata import json_digest, read_json_object, short_error
from smerge.errors import InputError

INDEX_FORMAT_VERSION = 3  # 2: meta.json records a SHA-256 and size of every file, the schema and its own SHA-256;
# 3: time keys on one base (microseconds since 1970 UTC) in the R-tree and sort order, whatever their unit
INDEX_FILES = ("data.parquet", "order.npy", "rtree.dat", "rtree.idx")
HASH_CHUNK = 8 << 20
MAX_DIMS = 8  # keys of one index


def damaged(directory: str, what: str) -> InputError:
    return InputError(f"{directory}: damaged index ({what}); rebuild it with `smerge index build`")


def file_digest(path: str, copy_to: str | None = None) -> dict:
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


def meta_digest(meta: dict) -> str:
    return json_digest(meta, "meta_sha256")


def read_meta(directory: str) -> dict:
    """meta.json, checked: its own checksum, then every field's type."""
    meta_path = os.path.join(directory, "meta.json")
    if not os.path.isfile(meta_path):
        raise InputError(f"{directory}: not an smerge index (no meta.json); build one with `smerge index build`")
    meta = read_json_object(directory, "meta.json", damaged)
    if meta.get("format") != "smerge-index" or meta.get("version") != INDEX_FORMAT_VERSION:
        fmt, ver = str(meta.get("format"))[:40], str(meta.get("version"))[:40]
        raise InputError(f"{directory}: index format {fmt}/{ver} is not supported (this smerge reads "
                         f"smerge-index/{INDEX_FORMAT_VERSION}, with checksums); rebuild it with `smerge index build`")
    if meta.get("meta_sha256") != meta_digest(meta):
        raise damaged(directory, "meta.json does not match its checksum")
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
        raise damaged(directory, "meta.json has missing or malformed fields")
    return meta


def check_file(directory: str, fname: str, want: dict) -> None:
    path = os.path.join(directory, fname)
    try:
        size = os.path.getsize(path)
        if size != want["size"]:
            raise damaged(directory, f"{fname} has {size} bytes, {want['size']} were written")
        got = file_digest(path)
    except OSError as e:
        raise damaged(directory, f"{fname} cannot be read ({e.strerror or short_error(e)})") from None
    if got["sha256"] != want["sha256"]:
        raise damaged(directory, f"{fname} does not match its SHA-256")


def check_order(directory: str, order: np.ndarray, km: np.ndarray, meta: dict) -> np.ndarray:
    """The row order must be a permutation of the rows with valid keys, in exact (key, row id) order."""
    n = km.shape[0]
    if order.ndim != 1 or order.dtype.kind not in "iu":
        raise damaged(directory, f"order.npy is a {order.ndim}-D {order.dtype} array, not 1-D integers")
    if order.size != meta["indexed"]:
        raise damaged(directory, f"order.npy has {order.size} entries, {meta['indexed']} records are indexed")
    order = order.astype(np.int64, copy=False)
    if order.size and (int(order.min()) < 0 or int(order.max()) >= n):
        raise damaged(directory, "order.npy names rows that do not exist")
    seen = np.zeros(n, np.bool_)
    seen[order] = True
    if int(np.count_nonzero(seen)) != order.size:
        raise damaged(directory, "order.npy repeats rows (not a permutation)")
    nan_rows = np.isnan(km).any(axis=1)
    if np.any(nan_rows[order]) or int(np.count_nonzero(nan_rows)) != meta["nan_keys"]:
        raise damaged(directory, "order.npy and the NaN keys of data.parquet disagree")
    if order.size > 1:
        ks = km[order]
        gt, eq = np.zeros(order.size - 1, np.bool_), np.ones(order.size - 1, np.bool_)
        for j in range(ks.shape[1]):
            x, y = ks[:-1, j], ks[1:, j]
            gt |= eq & (x > y)
            eq &= x == y
        gt |= eq & (order[:-1] > order[1:])
        if gt.any():
            raise damaged(directory, "order.npy does not sort the records by (key, row id)")
    return order
