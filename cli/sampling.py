"""``--sample-a/--sample-b`` (cgm, rtm), ``--sample`` (wjoin, count) and ``--budget``: the options
(the sampling itself and its estimates are library code: ``smerge.jobs.sampling``)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from smerge.jobs.sampling import (apply_sample_all, apply_samples, estimate, estimate_runs,  # noqa: F401
                                  estimate_spread, sample_stats, wjoin_sample_stats)

SampleAOpt = Annotated[Optional[str], typer.Option("--sample-a", help="Read fraction F in (0, 1] of A when A is an "
                                                                      "archive folder (default 1: every record), or "
                                                                      "auto: F per run to fit --budget.")]
SampleBOpt = Annotated[Optional[str], typer.Option("--sample-b", help="Read fraction F in (0, 1] of B when B is an "
                                                                      "archive folder (default 1: every record), or "
                                                                      "auto: F per run to fit --budget.")]
SampleOpt = Annotated[Optional[str], typer.Option("--sample", help="Read fraction F in (0, 1] of every input that "
                                                                   "is an archive folder (default 1), or auto: F "
                                                                   "per run to fit --budget.")]
BudgetOpt = Annotated[Optional[str], typer.Option("--budget", help="With --sample auto: the seconds the archive "
                                                                   "reads may take; the fraction of each next run "
                                                                   "is set from the throughput measured so far.")]
