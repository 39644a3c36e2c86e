"""Readers and writers: the only package that imports netCDF4 and the Parquet/CSV/IPC modules.

``open_input(path)`` picks a backend by content, then extension, and returns an
``InputSource`` whose ``batches()`` streams record batches of bounded size.
``open_output(path, schema)`` returns an atomic writer (temporary file, then rename).
"""

from __future__ import annotations

import sys
from typing import Sequence

from smerge.datasets.base import (DEFAULT_BATCH_ROWS, GridInfo, InputSource, backends, check_regular, guess_backend,
                                  is_spark_url, local_path, register_backend)
from smerge.datasets.writers import FORMATS, Output, check_output_path, format_for, open_output

__all__ = [
    "DEFAULT_BATCH_ROWS", "GridInfo", "InputSource", "backends", "guess_backend", "register_backend", "is_spark_url",
    "local_path",
    "open_input", "FORMATS", "Output", "check_output_path", "format_for", "open_output",
]


def _is_sampling(sample) -> bool:
    """True for a run's ``Sampling`` (whose module is loaded if one exists: no import here)."""
    mod = sys.modules.get("smerge.datasets.archive.sampling")
    return mod is not None and isinstance(sample, mod.Sampling)


def open_input(path: str, *, keys: Sequence[str] | None = None, variables: Sequence[str] | None = None,
               batch_rows: int = DEFAULT_BATCH_ROWS, fmt: str | None = None, decode_times: bool = False,
               sample=None, sample_seed: int | None = None,
               order: Sequence[tuple[str, int]] | None = None) -> InputSource:
    """Open ``path`` as a stream of records (docs/semantics.md section 1).

    ``keys``: key columns/variables (netCDF default: the coordinate variables of the chosen
    variables' dimensions; tabular files have no default). ``variables``: payload (default: all
    variables on the key dimensions / all non-key columns). ``decode_times``: netCDF keys with
    CF units ``"<unit> since <date>"`` become ``timestamp[ns]``. Nothing is read beyond metadata
    until ``batches()`` is iterated. ``sample``, ``sample_seed``: for an archive folder, the
    sampling fraction in (0, 1] and its seed (datasets/archive/read.py); other inputs refuse a
    fraction below 1. ``sample`` may also be a run's ``Sampling``
    (datasets/archive/sampling.py): an archive is then read with what the run asked for it and
    reports its read to it; other inputs ignore it.
    ``order``: ``(key, direction)`` pairs in another grid's dimension order: a netCDF grid keyed
    by its dimension coordinates is then read in that order (``NetCDFBackend.open``); other
    inputs are read as stored.
    """
    path = local_path(path)  # file:///x read by smerge's own readers (in-process runs)
    if "://" not in path:
        check_regular(path)
    backend = guess_backend(path, fmt)
    if backend.name == "archive":
        return backend.open(path, keys=keys, variables=variables, batch_rows=batch_rows, decode_times=decode_times,
                            sample=sample, sample_seed=sample_seed)
    if sample is not None and _is_sampling(sample):
        sample = None  # a run's sampling: it concerns archive inputs only
    if sample is not None and sample != 1:
        from smerge.errors import UsageError

        raise UsageError(f"{path}: sampling (fraction {sample}) reads archives only; this input is {backend.name}")
    if order and backend.name == "netcdf":
        return backend.open(path, keys=keys, variables=variables, batch_rows=batch_rows, decode_times=decode_times,
                            order=order)
    return backend.open(path, keys=keys, variables=variables, batch_rows=batch_rows, decode_times=decode_times)
