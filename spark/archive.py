"""Archive inputs on Spark (docs/archive.md, "On Spark"): the driver pins each archive input's
sampling fraction and seed (from the run's ``Sampling``, ``job.sampling``, else the driver's
environment), and the tasks reopen it with them.

An archive read at a fixed fraction f has a known number of records per run (the draws depend
on the manifest's block counts only: ``archive.read.sample_counts``), so it is an input with a
known row count like a Parquet file: the Spark routes cut it into row ranges as they cut a file,
and a task reading rows [start, stop) reads only the runs holding them (their chosen blocks),
each once (``archive.read.sample_batches``). Records, order and row ids are --local's.

Nothing here imports pyspark; the archive modules are imported only for archive inputs.
"""

from __future__ import annotations


def pinned_sample(path: str | None, sampling=None) -> tuple:
    """``(fraction, seed)`` the driver reads the archive at ``path`` with in the run of
    ``sampling`` (``()``: not an archive). auto (``--sample auto``, ``SMERGE_ARCHIVE_SAMPLE=auto``)
    is a UsageError: see ``archive.read.pinned_sample``."""
    from smerge.datasets.archive.probe import is_archive

    if not path or not is_archive(path):
        return ()
    from smerge.datasets.archive.read import pinned_sample as pin

    return pin(path, sampling=sampling)


def open_options(sample: tuple) -> dict:
    """Keyword arguments of ``open_input`` that read the pinned sample (none for other inputs)."""
    if not sample:
        return {}
    fraction, seed = sample
    return {"sample": fraction, "sample_seed": seed}
