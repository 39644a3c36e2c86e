"""One run's sampled archive reads: what each archive input is asked to be read with, and what
each read reports (docs/archive.md, "How the fraction reaches the reader").

A :class:`Sampling` is made for one run (``smerge.jobs.pipeline.execute`` makes it from the job
and its options, ``smerge.jobs.sampling.apply_samples``), travels with the job
(``job.sampling``) to the code that opens the inputs, which passes it to
``open_input(path, sample=sampling)``; the archive reader takes its fraction and seed from it
and reports the counters of each read back to it. The run's statistics are built from it after
the run. Nothing is kept between runs: two runs in one process have two Sampling objects.

No heavy import here (the archive reader is imported when a fraction is resolved).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any


def _key(path: str) -> str:
    return os.path.realpath(path)


@dataclass
class Sampling:
    """The fraction (a float in (0, 1] or an ``archive.read.Budget``) and seed requested per
    archive input of one run, and the counters each archive read of the run reported."""

    requested: dict[str, tuple[Any, int | None]] = field(default_factory=dict)  # realpath -> (sample, seed)
    used: dict[str, dict] = field(default_factory=dict)  # realpath -> counters of the last read

    def request(self, path: str, fraction, seed: int | None = None) -> None:
        """Read the archive at ``path`` with ``fraction`` (or a Budget) and ``seed`` (None: the default)."""
        from smerge.datasets.archive.read import check_sample

        self.requested[_key(path)] = (check_sample(fraction), seed)

    def requested_for(self, path: str) -> tuple[Any, int | None]:
        """``(sample, seed)`` requested for ``path``; ``(None, None)``: none (the environment's, else 1)."""
        return self.requested.get(_key(path), (None, None))

    def resolve(self, path: str) -> tuple[Any, int]:
        """The fraction (or Budget) and seed the archive at ``path`` is read with in this run: the
        request, else the environment (``SMERGE_ARCHIVE_SAMPLE``, ``SMERGE_ARCHIVE_SEED``), else 1."""
        from smerge.datasets.archive.read import resolve_sample

        return resolve_sample(*self.requested_for(path))

    def fraction_for(self, path: str):
        """The fraction (or Budget) the archive at ``path`` is read with in this run."""
        return self.resolve(path)[0]

    def report(self, path: str, counters: dict) -> None:
        """Called by the archive reader when a read of ``path`` starts: its counters (filled as it reads)."""
        self.used[_key(path)] = counters

    def counters_for(self, path: str) -> dict | None:
        """The counters of the last read of the archive at ``path`` in this run (None: not read):
        ``sample_fraction`` (auto: the expected share of the archive's records, sum f_i n_i / N),
        ``run_fractions`` and ``run_records`` (per run read, auto only), ``blocks_read``, ..."""
        return self.used.get(_key(path))


__all__ = ["Sampling"]
