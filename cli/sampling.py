"""``--sample-a/--sample-b`` (cgm, rtm) and ``--sample`` (wjoin): read a fraction of archive inputs.

The fraction is handed to the archive backend before the inputs are opened
(``archive_read.request_sample``); the statistics then give the fraction used per archive input
(``a_sample_fraction``, ``b_sample_fraction``; wjoin: ``sample_fractions``, None for inputs
that are not archives) and counts scaled by 1/f into estimates with 95% intervals. In-process
only for now: Spark runs refuse f < 1.
"""

from __future__ import annotations

import math
from typing import Annotated, Optional, Sequence

import typer

SampleAOpt = Annotated[Optional[str], typer.Option("--sample-a", help="Read fraction F in (0, 1] of A when A is an "
                                                                      "archive folder (default 1: every record).")]
SampleBOpt = Annotated[Optional[str], typer.Option("--sample-b", help="Read fraction F in (0, 1] of B when B is an "
                                                                      "archive folder (default 1: every record).")]
SampleOpt = Annotated[Optional[str], typer.Option("--sample", help="Read fraction F in (0, 1] of every input that "
                                                                   "is an archive folder (default 1).")]


def apply_samples(pairs: Sequence[tuple[str, Optional[str], Optional[str]]], *, spark: bool) -> None:
    """Check each ``(option, fraction text, input path)`` and request the fraction for archive inputs.
    A fraction below 1 for an input that is not an archive, or on Spark, is a UsageError."""
    from smerge.datasets.archive import is_archive
    from smerge.datasets.archive_read import clear_requests, parse_fraction, request_sample
    from smerge.errors import UsageError

    clear_requests()  # a request lasts one command (main() may run several in one process)
    for opt, text, path in pairs:
        if text is None:
            continue
        f = parse_fraction(text, opt)
        if path is None or not is_archive(path):
            if f < 1:
                raise UsageError(f"{opt} {text}: {path or 'that input'} is not an archive folder; sampling reads "
                                 "archives only (`smerge archive append`)")
            continue
        if spark and f < 1:
            raise UsageError(f"{opt} {text}: sampled archive reads run in-process only for now; pass --local")
        request_sample(path, f)


def apply_sample_all(text: Optional[str], inputs: Sequence[str], *, spark: bool) -> None:
    """wjoin's ``--sample F``: every input that is an archive folder is read with F (files in full)."""
    from smerge.datasets.archive import is_archive
    from smerge.errors import UsageError

    archives = [p for p in inputs if is_archive(p)]
    if text is not None and not archives:
        from smerge.datasets.archive_read import parse_fraction

        if parse_fraction(text, "--sample") < 1:
            raise UsageError(f"--sample {text}: no input is an archive folder; sampling reads archives only")
    apply_samples([("--sample", text, p) for p in archives], spark=spark)


Z95 = 1.959964  # two-sided 95% normal quantile


def estimate(count: int, p: float) -> tuple[float, list[float]]:
    """``count / p`` and its 95% interval, as if each counted item of the full run had been kept
    independently with probability ``p`` (binomial, normal approximation; never below ``count``)."""
    est = count / p
    half = Z95 * math.sqrt(count * (1.0 - p)) / p
    return est, [max(float(count), est - half), est + half]


def sample_stats(result: dict, named: Sequence[tuple[str, Optional[str]]]) -> dict:
    """Add ``<name>_sample_fraction`` for each ``(name, path)`` that is an archive folder and, when
    a fraction is below 1, estimates for the full inputs: ``<name>_records_estimate`` and
    ``matched_estimate`` (a pair survives with the product of the fractions), each with ``_95``."""
    from smerge.datasets.archive import is_archive
    from smerge.datasets.archive_read import fraction_for

    p = 1.0
    for name, path in named:
        if path is not None and is_archive(path):
            f = result[f"{name}_sample_fraction"] = fraction_for(path)
            p *= f
            if f < 1 and isinstance(result.get(f"{name}_records"), int):
                result[f"{name}_records_estimate"], result[f"{name}_records_estimate_95"] = \
                    estimate(result[f"{name}_records"], f)
    if p < 1 and isinstance(result.get("matched"), int):
        result["matched_estimate"], result["matched_estimate_95"] = estimate(result["matched"], p)
    return result


def wjoin_sample_stats(result: dict, inputs: Sequence[str]) -> dict:
    from smerge.datasets.archive import is_archive
    from smerge.datasets.archive_read import fraction_for

    if any(is_archive(p) for p in inputs):
        fractions = result["sample_fractions"] = [fraction_for(p) if is_archive(p) else None for p in inputs]
        prod = math.prod(f for f in fractions if f is not None)
        if prod < 1 and isinstance(result.get("tuples"), int):  # a tuple survives with the product
            result["tuples_estimate"], result["tuples_estimate_95"] = estimate(result["tuples"], prod)
    return result
