"""Small data builders for the Spark tests (importable: conftest puts this folder on sys.path)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def write_stream(path, k1, k2=None, seed=0) -> str:
    """A Parquet stream with keys k1 (and k2) in arrival order and a float payload."""
    rng = np.random.default_rng(seed)
    cols = {"k1": pa.array(np.asarray(k1, dtype=np.float64))}
    if k2 is not None:
        cols["k2"] = pa.array(np.asarray(k2, dtype=np.float64))
    cols["v"] = pa.array(rng.random(len(k1)).astype(np.float32))
    pq.write_table(pa.table(cols), path, row_group_size=max(1, len(k1) // 3 or 1))
    return str(path)


def partially_sorted(n, rng, *, spread=50.0, disorder=0.2, grid=0.25):
    """Keys on a grid (so ties and exact boundary hits happen), locally shuffled."""
    k = np.sort(rng.integers(0, int(spread / grid), n)) * grid
    idx = np.arange(n, dtype=np.float64) + rng.normal(0, disorder * n / 10 + 1e-9, n)
    return k[np.argsort(idx, kind="stable")]
