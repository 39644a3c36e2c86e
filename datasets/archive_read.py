"""Reading an archive (ENGINES.md section 8) with sampling fraction f in (0, 1], and its backend.

Per run (in append order): ``ceil(R * f)`` of the run's R blocks are chosen at random, each of
their records is kept with probability ``f * R / ceil(R * f)`` (so every record is in the
sample with probability exactly f), and the chosen blocks are merged by time (stable), so the
sample arrives in time order within each run. f = 1 reads every block and keeps every record:
the archive's records exactly once. The bytes read are those of the chosen blocks: f of the
archive up to whole blocks per run. Randomness: ``numpy.random.default_rng([seed, run])``, so
a read is reproducible for a given seed and runs are sampled independently.

Memory: one run's chosen blocks at a time (at most R x B x f records, plus one block).

The fraction of an archive input comes from ``open_input(path, sample=f, sample_seed=s)``,
else from ``request_sample(path, f)`` (what the CLI's ``--sample-a/-b`` set), else from the
environment (``SMERGE_ARCHIVE_SAMPLE``, ``SMERGE_ARCHIVE_SEED``), else 1.
"""

from __future__ import annotations

import math
import os
from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa

from smerge.datasets.archive import Manifest, is_archive, read_block, read_manifest, time_order
from smerge.datasets.base import DEFAULT_BATCH_ROWS, InputSource, register_backend
from smerge.datasets.tabular import rebatch, resolve_columns, sliced
from smerge.errors import UsageError

ARCHIVE_MAGIC = b"smerge-archive-folder\x00"  # what base.read_magic returns for an archive folder
SAMPLE_ENV = "SMERGE_ARCHIVE_SAMPLE"
SEED_ENV = "SMERGE_ARCHIVE_SEED"
DEFAULT_SAMPLE_SEED = 0
_REQUESTED: dict[str, tuple[float, int | None]] = {}


def check_fraction(f: float, what: str = "the sampling fraction") -> float:
    if not isinstance(f, (int, float)) or isinstance(f, bool) or not (0.0 < float(f) <= 1.0):
        raise UsageError(f"{what} is {f!r}; it must be in (0, 1] (1 reads every record)")
    return float(f)


def parse_fraction(text: str, what: str) -> float:
    try:
        f = float(text)
    except ValueError:
        raise UsageError(f"{what} is {text!r}; give a fraction in (0, 1], e.g. 0.25") from None
    return check_fraction(f, what)


def request_sample(path: str, fraction: float, seed: int | None = None) -> None:
    """Read the archive at ``path`` with ``fraction`` when it is opened later in this process."""
    _REQUESTED[os.path.realpath(path)] = (check_fraction(fraction), seed)


def clear_requests() -> None:
    _REQUESTED.clear()


def _resolve(path: str, sample: float | None, sample_seed: int | None) -> tuple[float, int]:
    req = _REQUESTED.get(os.path.realpath(path))
    if sample is None and req is not None:
        sample, sample_seed = req[0], sample_seed if sample_seed is not None else req[1]
    if sample is None and os.environ.get(SAMPLE_ENV):
        sample = parse_fraction(os.environ[SAMPLE_ENV], f"${SAMPLE_ENV}")
    if sample_seed is None and os.environ.get(SEED_ENV):
        try:
            sample_seed = int(os.environ[SEED_ENV])
        except ValueError:
            raise UsageError(f"${SEED_ENV} is {os.environ[SEED_ENV]!r}; give an integer") from None
    return check_fraction(1.0 if sample is None else sample), DEFAULT_SAMPLE_SEED if sample_seed is None else sample_seed


def fraction_for(path: str) -> float:
    """The fraction an archive at ``path`` is read with when opened with no ``sample`` argument."""
    return _resolve(path, None, None)[0]


def run_sample(man: Manifest, run_index: int, fraction: float, seed: int,
               columns: list[str] | None, counters: dict) -> pa.Table | None:
    """The sampled records of run ``run_index``, merged by time (stable); None when none is kept."""
    run = man.runs[run_index]
    blocks = run["blocks"]
    r = len(blocks)
    rng = np.random.default_rng([seed, run_index])
    if fraction >= 1.0:
        chosen, keep = range(r), 1.0
    else:
        k = max(1, math.ceil(r * fraction - 1e-9))
        chosen, keep = sorted(rng.choice(r, size=k, replace=False).tolist()), min(1.0, fraction * r / k)
    read_cols = None if columns is None else list(dict.fromkeys(list(columns) + [man.time]))
    parts = []
    for i in chosen:
        t = read_block(man, blocks[i], read_cols)
        counters["blocks_read"] = counters.get("blocks_read", 0) + 1
        counters["bytes_read"] = counters.get("bytes_read", 0) + blocks[i]["bytes"]
        if keep < 1.0:
            t = t.filter(pa.array(rng.random(t.num_rows) < keep))
        if t.num_rows:
            parts.append(t)
    if not parts:
        return None
    table = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
    if len(parts) > 1:
        table = table.take(time_order(table.column(man.time)))  # stable: ties in block order
    counters["records_read"] = counters.get("records_read", 0) + table.num_rows
    return table if columns is None else table.select(columns)


def sample_batches(man: Manifest, fraction: float, seed: int, *, columns: list[str] | None = None,
                   batch_rows: int = DEFAULT_BATCH_ROWS, counters: dict | None = None) -> Iterator[pa.RecordBatch]:
    """The sample as record batches of at most ``batch_rows`` rows: runs in append order, each in time order."""
    counters = {} if counters is None else counters
    for i in range(len(man.runs)):
        table = run_sample(man, i, fraction, seed, columns, counters)
        if table is not None:
            yield from rebatch(table.combine_chunks().to_batches(), batch_rows)


class ArchiveBackend:
    name = "archive"
    extensions: tuple[str, ...] = ()

    def guess_can_open(self, path: str, magic: bytes) -> bool:
        return magic.startswith(ARCHIVE_MAGIC) or (bool(path) and is_archive(path))

    def open(self, path: str, *, keys: Sequence[str] | None = None, variables: Sequence[str] | None = None,
             batch_rows: int = DEFAULT_BATCH_ROWS, decode_times: bool = False, sample: float | None = None,
             sample_seed: int | None = None) -> InputSource:
        fraction, seed = _resolve(path, sample, sample_seed)
        man = read_manifest(path)
        schema, columns, key_names = resolve_columns(path, man.schema, keys, variables)
        counters: dict = {"sample_fraction": fraction, "sample_seed": seed}
        whole = fraction >= 1.0

        def batches(start: int = 0, stop: int | None = None) -> Iterator[pa.RecordBatch]:
            it = sample_batches(man, fraction, seed, columns=columns, batch_rows=batch_rows, counters=counters)
            yield from it if (start, stop) == (0, None) else sliced(it, start, stop, schema)

        # With f < 1 the sample's size is known only once read: no row count (like a server stream).
        n = man.count if whole else None
        return InputSource(path=path, format=self.name, schema=schema, keys=key_names, num_rows=n,
                           outer_size=n, inner_size=1, open_batches=batches, counters=counters)


register_backend(ArchiveBackend())
