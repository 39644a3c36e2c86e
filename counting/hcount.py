"""The hCount sketch with eFreq output (Jin et al. 2003, as used by the frequent-items paper section 4.1).

``HCount`` keeps ``depth`` x ``width`` counters (h x m; the paper's array S). Each of the ``depth``
rows hashes an item to one of ``width`` counters with its own seeded hash; ``update`` adds one to
the item's counter in every row. ``estimate`` is the minimum over the rows (eFreq's F(k)): every
counter an item touches holds its own occurrences plus those of the items colliding with it, so
an estimate never under-counts, and over-counts by the collisions of the least-loaded row (at
most ``n - true``; on average about ``n / width`` per row, and the minimum of ``depth`` rows is
above ``e * n / width`` with probability at most ``exp(-depth)`` for random hashes).
``frequent`` is eFreq: the candidates whose estimate is at least ``support * n``, at most
``max_frequent`` of them (the highest estimates: the FDI's memory).

Items are 64-bit keys (``item_keys``): integers as themselves, floats by their bits, strings and
binaries by a stable 64-bit digest of their bytes. Pure numpy; memory ``depth * width`` counters
plus ``depth`` x (batch length) hashes while a batch is added.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from smerge.errors import UsageError, param
from smerge.merge.hashing import mix64 as _mix

DEFAULT_DEPTH = 30  # h: hash rows (the paper's 30 x 30)
DEFAULT_WIDTH = 30  # m: counters per row
DEFAULT_SUPPORT = 0.005  # lambda: frequent means estimated count >= lambda * n
DEFAULT_MAX_FREQUENT = 300  # F: most frequent items kept (FDI memory)
MAX_CELLS = 1 << 24  # depth * width



def _digest(value: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(value, digest_size=8).digest(), "little")


def item_keys(values: pa.Array | pa.ChunkedArray | np.ndarray) -> np.ndarray:
    """One uint64 key per item (equal items, equal keys). Nulls are refused by the caller."""
    if isinstance(values, np.ndarray):
        values = pa.array(values)
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    t = values.type
    if pa.types.is_dictionary(t):
        return item_keys(values.dictionary)[values.indices.to_numpy(zero_copy_only=False).astype(np.int64)]
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        v = pc.cast(values, pa.int64()).to_numpy(zero_copy_only=False)
        return np.ascontiguousarray(v, np.int64).view(np.uint64)
    if pa.types.is_floating(t):
        v = pc.cast(values, pa.float64()).to_numpy(zero_copy_only=False) + 0.0  # -0.0 -> 0.0
        return np.ascontiguousarray(v, np.float64).view(np.uint64)
    if pa.types.is_temporal(t):
        return item_keys(pc.cast(values, pa.int64()))
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        enc = pc.dictionary_encode(values)
        uniq = np.fromiter((_digest(b) for b in pc.cast(enc.dictionary, pa.large_binary()).to_pylist()),
                           np.uint64, len(enc.dictionary))
        return uniq[enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)]
    raise UsageError(f"items of type {t} cannot be counted; count an integer, string or categorical column")


class HCount:
    """h x m counters with seeded hashes; ``n`` items added since the last ``reset``."""

    def __init__(self, depth: int = DEFAULT_DEPTH, width: int = DEFAULT_WIDTH, *, seed: int = 0):
        if not (isinstance(depth, int) and isinstance(width, int)) or depth < 1 or width < 1 \
                or depth * width > MAX_CELLS:
            raise UsageError(f"sketch {depth}x{width}: give h x m with h, m >= 1 and h * m <= {MAX_CELLS:,}")
        self.depth, self.width, self.seed = depth, width, seed
        rng = np.random.default_rng(seed)
        self._salts = rng.integers(0, np.iinfo(np.int64).max, depth, dtype=np.int64).view(np.uint64)
        self.counters = np.zeros((depth, width), np.int64)
        self.n = 0

    def cells(self, keys: np.ndarray) -> np.ndarray:
        """(depth, len(keys)) counter index of each key in each row."""
        keys = np.asarray(keys, np.uint64)
        h = _mix(keys[None, :] ^ self._salts[:, None])
        return ((h >> np.uint64(32)) % np.uint64(self.width)).astype(np.int64)

    def update(self, keys: np.ndarray, counts: np.ndarray | None = None) -> None:
        """Add one occurrence of each key (repeats count repeatedly), or ``counts[i]`` occurrences
        of ``keys[i]`` (the same counters, hashing each distinct key once)."""
        if len(keys) == 0:
            return
        flat = self.cells(keys) + (np.arange(self.depth, dtype=np.int64) * self.width)[:, None]
        if counts is None:
            add = np.bincount(flat.ravel(), minlength=self.depth * self.width)
            self.n += len(keys)
        else:
            counts = np.asarray(counts, np.int64)
            add = np.bincount(flat.ravel(), weights=np.broadcast_to(counts, flat.shape).ravel(),
                              minlength=self.depth * self.width).round().astype(np.int64)
            self.n += int(counts.sum())
        self.counters += add.reshape(self.depth, self.width)

    def estimate(self, keys: np.ndarray) -> np.ndarray:
        """eFreq's F(k) per key: the minimum of its counters (never below the true count)."""
        if len(keys) == 0:
            return np.zeros(0, np.int64)
        return self.counters[np.arange(self.depth)[:, None], self.cells(keys)].min(axis=0)

    def frequent(self, candidates: np.ndarray, support: float = DEFAULT_SUPPORT,
                 max_frequent: int = DEFAULT_MAX_FREQUENT) -> tuple[np.ndarray, np.ndarray]:
        """(positions into ``candidates``, estimates) of the items with estimate >= support * n,
        the ``max_frequent`` highest estimates (ties: the smaller key), highest first. ``candidates``
        must be distinct (the paper scans the domain; the sender passes the items it saw)."""
        if self.n == 0 or len(candidates) == 0 or max_frequent <= 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        est = self.estimate(candidates)
        pos = np.nonzero(est >= support * self.n)[0]
        order = np.lexsort((np.asarray(candidates, np.uint64)[pos], -est[pos]))[:max_frequent]
        pos = pos[order]
        return pos, est[pos]

    def reset(self) -> None:
        self.counters[:] = 0
        self.n = 0


def parse_sketch(text: str) -> tuple[int, int]:
    """``"30x30"`` -> (30, 30): h hash rows x m counters."""
    h, sep, m = str(text).lower().partition("x")
    try:
        depth, width = int(h), int(m)
    except ValueError:
        depth = width = 0
    if not sep or depth < 1 or width < 1 or depth * width > MAX_CELLS:
        raise UsageError(f"{param.sketch} {text!r}: give HxM, e.g. 30x30 (h hash rows, m counters each, "
                         f"h * m <= {MAX_CELLS:,})")
    return depth, width
