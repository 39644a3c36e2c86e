"""Sampled reads of archive inputs (``--sample-a/--sample-b``, ``--sample``, ``--budget``) and their estimates.

Each run has its own :class:`~smerge.datasets.archive.sampling.Sampling`: ``apply_samples``
(``apply_sample_all``) checks the options and returns it with the fraction asked for each
archive input; the pipeline puts it on the job (``job.sampling``), the code that opens the
inputs passes it to the archive reader (``open_input(path, sample=job.sampling)``), which
reports the counters of its read to it; after the run the statistics are built from it: the
fraction used per archive input (``a_sample_fraction``, ``b_sample_fraction``; wjoin:
``sample_fractions``, None for inputs that are not archives) and counts scaled by 1/f into
estimates with 95% intervals. Nothing is kept between runs.
``auto`` with ``--budget SECONDS`` chooses the fraction per run from the measured throughput
(``archive.read.auto_batches``); one budget is shared by the command's archive inputs, counted
from when the options are checked. On Spark a fixed fraction is pinned on the driver and read
by the tasks (``smerge.spark.archive``); auto is refused there. The archive modules are imported
only when some input is an archive folder or a fraction is given (``datasets.archive.probe``).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

from smerge.datasets.archive.sampling import Sampling
from smerge.errors import param

AUTO = "auto"


def _budget(texts: Sequence[Optional[str]], budget: Optional[str]):
    """The command's shared Budget when some fraction is ``auto`` (None otherwise); --budget without
    auto, or auto without --budget, is a UsageError."""
    from smerge.errors import UsageError

    auto = any(t is not None and t.strip().lower() == AUTO for t in texts)
    if budget is not None and not auto:
        raise UsageError(f"{param.budget} {budget}: it applies to {param.sample} auto (or {param.sample_a}/-b auto) only")
    if auto and budget is None:
        raise UsageError(f"{param.sample} auto needs {param.budget} SECONDS (the time the archive reads may take)")
    if not auto:
        return None
    from smerge.datasets.archive.read import Budget, parse_budget

    return Budget(parse_budget(budget))


def apply_samples(pairs: Sequence[tuple[str, Optional[str], Optional[str]]], *, spark: bool,
                  budget: Optional[str] = None) -> Sampling:
    """Check each ``(option, fraction text, input path)`` and return the run's Sampling, with the
    fraction requested for each archive input.
    A fraction below 1 (or auto) for an input that is not an archive is a UsageError, and so is
    auto on Spark (also from ``SMERGE_ARCHIVE_SAMPLE``); ``budget`` is the text of ``--budget``
    (needed by, and only by, auto). Imports the archive modules only when some input is an
    archive folder or a fraction is given."""
    from smerge.datasets.archive.probe import is_archive
    from smerge.errors import UsageError

    sampling = Sampling()  # one per run: nothing is shared with another run in this process
    shared = _budget([text for _, text, _ in pairs], budget)
    for opt, text, path in pairs:
        archive = path is not None and is_archive(path)
        if text is None:
            if spark and archive:  # the environment's fraction: checked here, pinned for the tasks later
                from smerge.datasets.archive.read import SAMPLE_ENV, pinned_sample

                pinned_sample(path, f"${SAMPLE_ENV} for {path}", sampling)
            continue
        from smerge.datasets.archive.read import parse_fraction

        auto = text.strip().lower() == AUTO
        f = shared if auto else parse_fraction(text, opt)
        if not archive:
            if auto or f < 1:
                raise UsageError(f"{opt} {text}: {path or 'that input'} is not an archive folder; sampling reads "
                                 "archives only (`smerge archive append`)")
            continue
        if spark and auto:
            from smerge.datasets.archive.read import SPARK_AUTO

            raise UsageError(f"{opt} auto: {SPARK_AUTO}")
        sampling.request(path, f)
    return sampling


def apply_sample_all(text: Optional[str], inputs: Sequence[str], *, spark: bool, budget: Optional[str] = None,
                     option: str = param.sample) -> Sampling:
    """wjoin's (and count's) ``--sample F|auto``: the run's Sampling, every input that is an
    archive folder read with F (files in full)."""
    from smerge.datasets.archive.probe import is_archive
    from smerge.errors import UsageError

    archives = [p for p in inputs if is_archive(p)]
    if text is not None and not archives:
        from smerge.datasets.archive.read import parse_fraction

        _budget([text], budget)
        if text.strip().lower() == AUTO or parse_fraction(text, option) < 1:
            raise UsageError(f"{option} {text}: no input is an archive folder; sampling reads archives only")
        return Sampling()
    return apply_samples([(option, text, p) for p in archives], spark=spark, budget=budget)


Z95 = 1.959964  # two-sided 95% normal quantile


def estimate(count: int, p: float) -> tuple[float, list[float]]:
    """``count / p`` and its 95% interval, as if each counted item of the full run had been kept
    independently with probability ``p`` (binomial, normal approximation; never below ``count``)."""
    est = count / p
    half = Z95 * math.sqrt(count * (1.0 - p)) / p
    return est, [max(float(count), est - half), est + half]


def estimate_runs(counts: Sequence[int], fractions: Sequence[float]) -> tuple[float, list[float]]:
    """Horvitz-Thompson over runs read with different fractions: ``sum count_i / f_i``, with the
    binomial variance ``sum count_i (1 - f_i) / f_i^2`` (normal approximation; never below the count)."""
    est = sum(c / f for c, f in zip(counts, fractions))
    var = sum(c * (1.0 - f) / (f * f) for c, f in zip(counts, fractions))
    return est, [max(float(sum(counts)), est - Z95 * math.sqrt(var)), est + Z95 * math.sqrt(var)]


def estimate_spread(count: int, used: dict, other: float = 1.0) -> tuple[float, list[float]]:
    """A count of items (matched pairs, tuples) over an input read with ``--sample auto``, whose
    runs had different fractions f_i: the items are taken to be spread over the runs like the
    records (n_i records in run i), so the sample holds t_i = count f_i n_i / sum f_j n_j of them
    from run i, each kept with p_i = f_i x ``other`` (the other inputs' fraction).
    Horvitz-Thompson: sum t_i / p_i (= count / (F x other), F = sum f_i n_i / N), variance
    sum t_i (1 - p_i) / p_i^2: runs read at a small fraction widen the interval as they should."""
    fr, n = used.get("run_fractions") or [], used.get("run_counts") or []
    s = sum(f * m for f, m in zip(fr, n))
    if not fr or s <= 0:
        return estimate(count, other)
    t = [count * f * m / s for f, m in zip(fr, n)]
    p = [f * other for f in fr]
    est = sum(ti / pi for ti, pi in zip(t, p))
    half = Z95 * math.sqrt(sum(ti * (1.0 - pi) / (pi * pi) for ti, pi in zip(t, p)))
    return est, [max(float(count), est - half), est + half]


def used_fraction(path: str, sampling: Sampling) -> tuple[float, Optional[dict]]:
    """The fraction an archive input was read with in the run of ``sampling`` and, for auto, its
    reader's counters: the fraction is then the expected share of the archive read (sum f_i n_i / N
    over its runs)."""
    from smerge.datasets.archive.read import Budget

    f = sampling.fraction_for(path)
    if not isinstance(f, Budget):
        return f, None
    used = sampling.counters_for(path) or {}
    return used.get("sample_fraction") or 1.0, used


def _auto_stats(result: dict, prefix: str, used: dict) -> None:
    result[f"{prefix}sample_mode"] = "auto"
    result[f"{prefix}sample_budget"] = used.get("budget_seconds")
    result[f"{prefix}sample_run_fractions"] = list(used.get("run_fractions", []))
    result[f"{prefix}sample_read_seconds"] = round(used.get("read_seconds", 0.0), 4)


def sample_stats(result: dict, named: Sequence[tuple[str, Optional[str]]], sampling: Sampling) -> dict:
    """Add ``<name>_sample_fraction`` for each ``(name, path)`` that is an archive folder and, when
    a fraction is below 1, estimates for the full inputs: ``<name>_records_estimate`` and
    ``matched_estimate`` (a pair survives with the product of the fractions), each with ``_95``.
    With auto: also ``<name>_sample_mode``, ``_sample_budget``, ``_sample_run_fractions``,
    ``_sample_read_seconds``; the records estimate sums each run's records over its own fraction,
    and ``matched_estimate`` uses the inputs' overall fractions (exact only when f is the same for
    every run, see docs/archive.md)."""
    from smerge.datasets.archive.probe import is_archive

    p = 1.0
    autos = []
    for name, path in named:
        if path is not None and is_archive(path):
            f, used = used_fraction(path, sampling)
            result[f"{name}_sample_fraction"] = f
            p *= f
            if used is not None:
                autos.append((f, used))
                _auto_stats(result, f"{name}_", used)
                if f < 1 and used.get("run_records") is not None:
                    result[f"{name}_records_estimate"], result[f"{name}_records_estimate_95"] = \
                        estimate_runs(used["run_records"], used["run_fractions"])
            elif f < 1 and isinstance(result.get(f"{name}_records"), int):
                result[f"{name}_records_estimate"], result[f"{name}_records_estimate_95"] = \
                    estimate(result[f"{name}_records"], f)
    if p < 1 and isinstance(result.get("matched"), int):
        if autos:  # spread over the (first) auto input's runs; the other input's overall fraction
            f, used = autos[0]
            result["matched_estimate"], result["matched_estimate_95"] = estimate_spread(result["matched"], used, p / f)
        else:
            result["matched_estimate"], result["matched_estimate_95"] = estimate(result["matched"], p)
    return result


def wjoin_sample_stats(result: dict, inputs: Sequence[str], sampling: Sampling) -> dict:
    from smerge.datasets.archive.probe import is_archive

    if any(is_archive(p) for p in inputs):
        used = [used_fraction(p, sampling) if is_archive(p) else (None, None) for p in inputs]
        fractions = result["sample_fractions"] = [f for f, _ in used]
        autos = [u for _, u in used if u is not None]
        if autos:
            result["sample_mode"] = "auto"
            result["sample_budget"] = autos[0].get("budget_seconds")
            result["sample_run_fractions"] = [None if u is None else list(u.get("run_fractions", [])) for _, u in used]
        prod = math.prod(f for f in fractions if f is not None)
        if prod < 1 and isinstance(result.get("tuples"), int):  # a tuple survives with the product
            if autos:
                f = next(f for f, u in used if u is autos[0])
                result["tuples_estimate"], result["tuples_estimate_95"] = \
                    estimate_spread(result["tuples"], autos[0], prod / f)
            else:
                result["tuples_estimate"], result["tuples_estimate_95"] = estimate(result["tuples"], prod)
    return result


class SampledCounts:
    """``smerge count`` over a sampled archive: one ``ItemCounts`` per fraction the records were
    read with (auto reads runs with different fractions; the reader sets ``current_fraction``
    before each batch it yields), each count scaled by 1/f in ``table()`` (Horvitz-Thompson) and
    marked not exact. With every record read (f = 1, or a file) it is the plain ``ItemCounts``."""

    def __init__(self, make, counters: dict):
        self._make, self._counters = make, counters
        self._empty = make()  # checks the query's arguments before anything is read
        self._by_fraction: dict[float, object] = {}

    def fraction(self) -> float:
        f = self._counters.get("current_fraction", self._counters.get("sample_fraction"))
        return f if isinstance(f, float) else 1.0

    def add_raw(self, items, times) -> None:
        f = self.fraction()
        if f not in self._by_fraction:
            self._by_fraction[f] = self._make()
        self._by_fraction[f].add_raw(items, times)

    def table(self):
        import pyarrow as pa
        import pyarrow.compute as pc

        if not self._by_fraction:
            return self._empty.table()
        if list(self._by_fraction) == [1.0]:
            return self._by_fraction[1.0].table()
        parts = []
        for f, counts in self._by_fraction.items():
            t = counts.table()
            parts.append(t.set_column(t.schema.get_field_index("count"), "count", pc.divide(t.column("count"), f))
                         .set_column(t.schema.get_field_index("exact"), "exact",
                                     pa.array([f >= 1.0] * t.num_rows, pa.bool_())))
        t = pa.concat_tables(parts)
        g = t.group_by(["start", "end", "item"]).aggregate([("count", "sum"), ("exact", "min")])
        g = g.rename_columns(["start", "end", "item", "count", "exact"]).select(t.schema.names)
        return g.sort_by([("start", "ascending"), ("item", "ascending")]).cast(t.schema)


def count_sample_stats(stats: dict, source: str, sampling: Sampling) -> dict:
    """``smerge count``'s statistics for an archive source: ``sample_fraction`` and, below 1,
    ``records_estimate`` with its 95% interval (auto: also the mode, budget and run fractions)."""
    from smerge.datasets.archive.probe import is_archive

    if is_archive(source):
        f, used = used_fraction(source, sampling)
        stats["sample_fraction"] = f
        if used is not None:
            _auto_stats(stats, "", used)
            if f < 1:
                stats["records_estimate"], stats["records_estimate_95"] = \
                    estimate_runs(used.get("run_records", []), used.get("run_fractions", []))
        elif f < 1:
            stats["records_estimate"], stats["records_estimate_95"] = estimate(stats["records_received"], f)
    return stats
