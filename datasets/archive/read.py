"""Reading an archive (docs/semantics.md section 8) with sampling fraction f in (0, 1], and its backend.

Per run (in append order): ``ceil(R * f)`` of the run's R blocks are chosen at random, each of
their records is kept with probability ``f * R / ceil(R * f)`` (so every record is in the
sample with probability exactly f), and the chosen blocks are merged by time (stable), so the
sample arrives in time order within each run. f = 1 reads every block and keeps every record:
the archive's records exactly once. The bytes read are those of the chosen blocks: f of the
archive up to whole blocks per run. Randomness: ``numpy.random.default_rng([seed, run])``, so
a read is reproducible for a given seed and runs are sampled independently.

Memory: one run's chosen blocks at a time (at most R x B x f records, plus one block).

The fraction of an archive input comes from ``open_input(path, sample=f, sample_seed=s)``; a
run passes its :class:`~smerge.datasets.archive.sampling.Sampling` instead
(``sample=sampling``: what the CLI's ``--sample-a/-b`` asked for that input), and the reader
reports the counters of its read to it. With no fraction given, it comes from the environment
(``SMERGE_ARCHIVE_SAMPLE``, ``SMERGE_ARCHIVE_SEED``), else 1. Nothing is kept in this module
between reads.

``sample`` may also be a :class:`Budget` (CLI: ``--sample auto --budget SECONDS``; environment:
``SMERGE_ARCHIVE_SAMPLE=auto`` with ``SMERGE_ARCHIVE_BUDGET``): the fraction is then chosen per
run from the throughput measured so far (the r-UDF feedback of OSCAR), see :func:`auto_batches`.
"""

from __future__ import annotations

import functools
import math
import os
import time
from dataclasses import dataclass, field
from typing import Iterator, Sequence, Union

import numpy as np
import pyarrow as pa

from smerge.datasets.archive.blocks import time_order
from smerge.datasets.archive.manifest import (EAGER, Manifest, blocks_for_fraction, eager_fractions, read_block,
                                              read_manifest)
from smerge.datasets.archive.probe import is_archive
from smerge.datasets.archive.sampling import Sampling
from smerge.datasets.base import DEFAULT_BATCH_ROWS, InputSource, register_backend
from smerge.datasets.tabular import rebatch, resolve_columns, sliced
from smerge.errors import UsageError, param
from smerge.merge import values

ARCHIVE_MAGIC = b"smerge-archive-folder\x00"  # what base.read_magic returns for an archive folder
SAMPLE_ENV = "SMERGE_ARCHIVE_SAMPLE"
SEED_ENV = "SMERGE_ARCHIVE_SEED"
BUDGET_ENV = "SMERGE_ARCHIVE_BUDGET"
DEFAULT_SAMPLE_SEED = 0
SPARK_AUTO = ("auto runs in-process only (each run's fraction comes from the throughput that one reader measures); "
              f"on Spark pass a fixed fraction, e.g. 0.25, or {param.local}")
MAX_BUDGET = 365 * 86400.0
PILOT_SHARE = 0.1  # the first run reads blocks for at most this share of its part of the budget
RECENT_WEIGHT = 0.5  # weight of the last run in the recent seconds per record


@dataclass
class Budget:
    """``--sample auto --budget SECONDS``: the archive reads of one command should end ``seconds``
    after ``start`` (``time.perf_counter()``; by default when the Budget is made). One Budget is
    shared by every archive input of a command, so their reads aim at the same deadline."""

    seconds: float
    start: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        s = self.seconds
        if not isinstance(s, (int, float)) or isinstance(s, bool) or not (0.0 < float(s) <= MAX_BUDGET):
            raise UsageError(f"the budget is {s!r} seconds; give a number of seconds above 0 (at most {MAX_BUDGET:g})")
        self.seconds = float(s)

    @property
    def deadline(self) -> float:
        return self.start + self.seconds


Sample = Union[float, Budget]


def check_fraction(f: float, what: str = "the sampling fraction") -> float:
    return values.check_fraction(f, what, note="(1 reads every record)")


def check_sample(sample: Sample, what: str = "the sampling fraction") -> Sample:
    return sample if isinstance(sample, Budget) else check_fraction(sample, what)


def parse_fraction(text: str, what: str) -> float:
    return values.parse_fraction(text, what, note="(1 reads every record)",
                                 hint=f"e.g. 0.25, or auto with {param.budget} SECONDS")


def parse_budget(text: str, what: str = param.budget) -> float:
    try:
        s = float(text)
    except ValueError:
        raise UsageError(f"{what} is {text!r}; give the seconds the archive reads may take, e.g. 30") from None
    if not (0.0 < s <= MAX_BUDGET):
        raise UsageError(f"{what} is {text!r}; give a number of seconds above 0 (at most {MAX_BUDGET:g})")
    return s


def _env_sample() -> Sample | None:
    text = os.environ.get(SAMPLE_ENV)
    if not text:
        return None
    if text.strip().lower() == "auto":
        b = os.environ.get(BUDGET_ENV)
        if not b:
            raise UsageError(f"${SAMPLE_ENV}=auto needs ${BUDGET_ENV} (seconds)")
        return Budget(parse_budget(b, f"${BUDGET_ENV}"))
    return parse_fraction(text, f"${SAMPLE_ENV}")


def resolve_sample(sample: Sample | None, sample_seed: int | None) -> tuple[Sample, int]:
    """The fraction (or Budget) and seed of a read: those given, else the environment's
    (``SMERGE_ARCHIVE_SAMPLE``, ``SMERGE_ARCHIVE_SEED``), else 1 and ``DEFAULT_SAMPLE_SEED``."""
    if sample is None:
        sample = _env_sample()
    if sample_seed is None and os.environ.get(SEED_ENV):
        try:
            sample_seed = int(os.environ[SEED_ENV])
        except ValueError:
            raise UsageError(f"${SEED_ENV} is {os.environ[SEED_ENV]!r}; give an integer") from None
    return check_sample(1.0 if sample is None else sample), DEFAULT_SAMPLE_SEED if sample_seed is None else sample_seed


def _resolve(path: str, sample, sample_seed: int | None) -> tuple[Sample, int, Sampling | None]:
    """``sample`` may be the run's :class:`Sampling`: the fraction and seed requested for ``path``
    there (a ``sample_seed`` given wins), and the Sampling the read reports to."""
    sampling = sample if isinstance(sample, Sampling) else None
    if sampling is not None:
        sample, seed = sampling.requested_for(path)
        sample_seed = sample_seed if sample_seed is not None else seed
    return (*resolve_sample(sample, sample_seed), sampling)


def pinned_sample(path: str, what: str = "", sampling: Sampling | None = None) -> tuple[float, int]:
    """The fixed fraction and seed the archive at ``path`` is read with in the run of ``sampling``
    (None: no request, the environment's), for tasks that reopen it elsewhere (Spark executors
    see neither the driver's Sampling nor, on a cluster, its environment). auto is a UsageError:
    its fraction is decided per run by the one reader that measures the throughput, which a task
    reading part of the archive is not."""
    sample, seed = sampling.resolve(path) if sampling is not None else resolve_sample(None, None)
    if isinstance(sample, Budget):  # (the message names the option or variable that asked for it)
        raise UsageError(f"{what or path}: {SPARK_AUTO}")
    return sample, seed


def _read_chosen(man: Manifest, blocks: Sequence[dict], read_cols: list[str] | None,
                 counters: dict, masks: Sequence[np.ndarray | None] | None = None) -> list[pa.Table]:
    """The ``blocks`` read, each reduced to the records its mask keeps (``masks``: one per block,
    None for a block kept whole; no ``masks``: every record)."""
    parts = []
    for i, block in enumerate(blocks):
        t = read_block(man, block, read_cols)
        counters["blocks_read"] = counters.get("blocks_read", 0) + 1
        counters["bytes_read"] = counters.get("bytes_read", 0) + block["bytes"]
        mask = None if masks is None else masks[i]
        if mask is not None:  # the kept rows by index: Table.take is ~5x faster than Table.filter on a mask
            kept = np.flatnonzero(mask)
            if kept.size < t.num_rows:
                t = t.take(pa.array(kept))
        if t.num_rows:
            parts.append(t)
    return parts


def _merge_run(man: Manifest, parts: list[pa.Table], columns: list[str] | None, counters: dict) -> pa.Table | None:
    if not parts:
        return None
    table = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
    if len(parts) > 1:
        table = table.take(time_order(table.column(man.time)))  # stable: ties in block order
    counters["records_read"] = counters.get("records_read", 0) + table.num_rows
    return table if columns is None else table.select(columns)


def _read_cols(man: Manifest, columns: list[str] | None) -> list[str] | None:
    return None if columns is None else list(dict.fromkeys(list(columns) + [man.time]))


def _run_draws(man: Manifest, run_index: int, fraction: float, seed: int) -> list[tuple[dict, np.ndarray | None]]:
    """The blocks run ``run_index``'s sample reads at a fixed ``fraction`` and ``seed``, each with
    the mask of the records it keeps (None: all). The draws (the blocks chosen, then one uniform
    number per record of a chosen block) depend on the manifest's block counts only: the read
    (:func:`run_sample`) and the count (:func:`sample_counts`) share them."""
    rng = np.random.default_rng([seed, run_index])
    blocks, represented = blocks_for_fraction(man, run_index, fraction, rng)
    keep = min(1.0, fraction / represented)  # randomize-then-sort: f R / ceil(R f); eager: f / the copy's
    if keep >= 1.0:
        return [(b, None) for b in blocks]
    return [(b, rng.random(b["count"]) < keep) for b in blocks]


def run_sample(man: Manifest, run_index: int, fraction: float, seed: int,
               columns: list[str] | None, counters: dict) -> pa.Table | None:
    """The sampled records of run ``run_index``, merged by time (stable); None when none is kept."""
    draws = _run_draws(man, run_index, fraction, seed)
    parts = _read_chosen(man, [b for b, _ in draws], _read_cols(man, columns), counters, [m for _, m in draws])
    return _merge_run(man, parts, columns, counters)


class _Counted:
    """A manifest as a cache key: its folder and checksum (the draws depend on its block counts only)."""

    def __init__(self, man: Manifest):
        self.man = man
        self.key = (os.path.realpath(man.directory), man.meta.get("manifest_sha256"))

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other) -> bool:
        return isinstance(other, _Counted) and other.key == self.key


@functools.lru_cache(maxsize=256)
def _counts(counted: _Counted, fraction: float, seed: int) -> tuple[int, ...]:
    man, out = counted.man, []
    for i, run in enumerate(man.runs):
        if fraction >= 1.0:
            out.append(sum(b["count"] for b in run["blocks"]))
            continue
        out.append(sum(b["count"] if m is None else int(np.count_nonzero(m))
                       for b, m in _run_draws(man, i, fraction, seed)))
    return tuple(out)


def sample_counts(man: Manifest, fraction: float, seed: int) -> list[int]:
    """The records of each run's sample at a fixed ``fraction`` and ``seed``, from the manifest
    alone: :func:`run_sample`'s draws (:func:`_run_draws`) replayed without reading a block.
    Costs about ``fraction`` x N random numbers (none at f = 1); memoized per process (a pure
    function of the manifest's checksum, the fraction and the seed)."""
    return list(_counts(_Counted(man), float(fraction), int(seed)))


def sample_batches(man: Manifest, fraction: float, seed: int, *, columns: list[str] | None = None,
                   batch_rows: int = DEFAULT_BATCH_ROWS, counters: dict | None = None, start: int = 0,
                   stop: int | None = None, cache: dict | None = None) -> Iterator[pa.RecordBatch]:
    """The sample's records ``start`` to ``stop`` (positions in the whole sample; None: to the end)
    as record batches of at most ``batch_rows`` rows: runs in append order, each in time order.

    Only the runs holding some of those records are read (their chosen blocks): the sample's
    records per run are known from the manifest (:func:`sample_counts`), so a Spark task reading
    a range of rows reads the runs of its range and skips the others. ``cache`` (a dict kept by
    the caller) holds the last run read, so consecutive ranges cutting one run read it once
    (memory: one run's sample)."""
    counters = {} if counters is None else counters
    counts = sample_counts(man, fraction, seed)
    lo = 0
    for i, n in enumerate(counts):
        hi = lo + n
        if stop is not None and lo >= stop:
            break
        if n and hi > start:
            if cache is not None and cache.get("run") == (i, fraction, seed, columns and tuple(columns)):
                table = cache["table"]
            else:
                table = run_sample(man, i, fraction, seed, columns, counters)
                if cache is not None:
                    cache.update(run=(i, fraction, seed, columns and tuple(columns)), table=table)
            a, b = max(start, lo) - lo, (n if stop is None else min(stop, hi) - lo)
            if table is not None and b > a:
                part = table if (a, b) == (0, table.num_rows) else table.slice(a, b - a)
                yield from rebatch(part.combine_chunks().to_batches(), batch_rows)
        lo = hi


class _Plan:
    """What is left to read of an archive, grouped by blocks per run, to predict the cost of
    reading every remaining run with fraction k/R."""

    def __init__(self, man: Manifest):
        self.sizes = [(len(r["blocks"]), r["count"]) for r in man.runs]
        self.left: dict[int, int] = {}
        for r, n in self.sizes:
            self.left[r] = self.left.get(r, 0) + n

    def done(self, i: int) -> None:
        r, n = self.sizes[i]
        self.left[r] -= n

    def records(self, f: float) -> float:
        """Records in the blocks read if every remaining run is read at fraction f (ceil(R f) blocks)."""
        return sum(n * max(1, math.ceil(r * f - 1e-9)) / r for r, n in self.left.items() if n)

    def choose_copy(self, fractions: list[float], seconds_per_record: float, seconds_left: float) -> float:
        """eager: the largest of the copies' fractions (ascending) whose read of the remaining runs fits (at least the smallest)."""
        fit = [f for f in fractions if f * sum(self.left.values()) * seconds_per_record <= seconds_left]
        return fit[-1] if fit else fractions[0]

    def choose(self, r: int, seconds_per_record: float, seconds_left: float) -> int:
        """The most blocks k of R for which reading the remaining runs at k/R fits the time left (at least 1)."""
        lo, hi = 1, r
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.records(mid / r) * seconds_per_record <= seconds_left:
                lo = mid
            else:
                hi = mid - 1
        return lo


def auto_batches(man: Manifest, budget: Budget, seed: int, *, columns: list[str] | None = None,
                 batch_rows: int = DEFAULT_BATCH_ROWS, counters: dict | None = None,
                 clock=time.perf_counter) -> Iterator[pa.RecordBatch]:
    """``--sample auto``: each run is read with fraction f_i = k_i / R_i, k_i of its R_i blocks
    chosen at random (a random permutation's first k_i), every record of them kept.

    k_i comes from the feedback of what was read so far (OSCAR's r-UDF): the seconds per record
    read (reading, merging by time and whatever the consumer did with the records in between,
    measured from the start of a run to the start of the next), exponentially weighted over the
    runs after the pilot (weight ``RECENT_WEIGHT`` for the last one: a load that arrives is seen
    at the next run; the pilot's own rate plans only the run after it, so one-time costs of the
    start, such as a live stream's first batch or a consumer's imports, do not hold the fraction
    down for the rest of the read; their time is still spent from the budget), times
    the records the remaining runs would need at k/R, must fit the time left before the
    budget's deadline; k_i is the largest such k, at least one block. The first run has no
    measurement yet (the pilot): its blocks are read one by one in random order until the read
    seconds per record predict that one more would pass ``PILOT_SHARE`` (a tenth) of the run's
    share of the time left (its records over the archive's): the consumer's time is not seen
    until the run is handed over, so reading is assumed to be at least a tenth of the cost; a
    heavier consumer makes the pilot overrun its share, which the next runs make up for (an
    archive of one run cannot). k_i depends on timings only,
    never on the records' values, so given k_i the run's sample is a uniform k_i-subset of its
    blocks: each record is in it with probability f_i, which the statistics use (Horvitz-Thompson).

    Eager archives: f_i is one of the copies' fractions (``eager_fractions``: 1 - level, and 1),
    the largest whose read of the remaining runs fits, and run i is read from that copy whole;
    the pilot reads the smallest copy (a copy's blocks are in time order, so reading some of
    them would not be a sample).

    ``counters``: ``run_fractions`` and ``run_records`` (records delivered per run),
    ``sample_fraction`` (expected share of the archive, sum f_i n_i / N), ``current_fraction``
    (the fraction of the run the last yielded batch came from), ``read_seconds``.
    """
    counters = {} if counters is None else counters
    fractions = counters.setdefault("run_fractions", [])
    run_records = counters.setdefault("run_records", [])
    plan = _Plan(man)
    eager = man.layout == EAGER
    copies = eager_fractions(man)
    read_cols = _read_cols(man, columns)
    total = man.count
    expected = 0.0
    t0 = t_prev = None
    read = read_prev = 0  # records in the blocks read so far, and by the previous run
    pilot = recent = None  # seconds per record of the pilot run; of the runs after it (exponentially weighted)
    if man.runs:  # first-use costs (imports of the Parquet reader: ~1 s) are not a rate to plan with
        read_block(man, min((b for r in man.runs for b in r["blocks"]), key=lambda b: b["bytes"]), read_cols)
    for i, run in enumerate(man.runs):
        now = clock()
        t0 = now if t0 is None else t0
        if read_prev:
            rate = (now - t_prev) / read_prev
            if pilot is None:
                pilot = rate
            else:
                recent = rate if recent is None else RECENT_WEIGHT * rate + (1 - RECENT_WEIGHT) * recent
        r = len(run["blocks"])
        rng = np.random.default_rng([seed, i])
        order = [] if eager else rng.permutation(r).tolist()
        left = budget.deadline - now
        if read:  # the runs after the pilot once there are some: one-time costs of the start are not a rate
            rate = recent if recent is not None else pilot
            if eager:
                f = plan.choose_copy(copies, rate, left)
                blocks = blocks_for_fraction(man, i, f)[0]
            else:
                k = plan.choose(r, rate, left)
                f, blocks = k / r, [run["blocks"][b] for b in sorted(order[:k])]
            parts = _read_chosen(man, blocks, read_cols, counters)
        elif eager:  # the pilot: the smallest copy (eager copies are in time order: no prefix of one is a sample)
            f = copies[0]
            blocks = blocks_for_fraction(man, i, f)[0]
            parts = _read_chosen(man, blocks, read_cols, counters)
        else:  # the pilot
            remaining = sum(plan.left.values())
            cap = PILOT_SHARE * max(0.0, left) * run["count"] / max(1, remaining)
            pairs, k, t_read, n_read = [], 0, 0.0, 0
            for b in order:
                ts = clock()
                pairs += [(b, t) for t in _read_chosen(man, [run["blocks"][b]], read_cols, counters)]
                t_read += clock() - ts
                n_read += run["blocks"][b]["count"]
                k += 1
                if k < r and t_read / n_read * (n_read + run["count"] / r) > cap:
                    break
            parts = [t for _, t in sorted(pairs, key=lambda bt: bt[0])]  # block order, as planned runs merge
            f, blocks = k / r, [run["blocks"][b] for b in order[:k]]
        read_prev = sum(b["count"] for b in blocks)
        read += read_prev
        t_prev = now
        plan.done(i)
        fractions.append(f)
        counters.setdefault("run_counts", []).append(run["count"])
        expected += f * run["count"]
        counters["sample_fraction"] = expected / total if total else 1.0
        table = _merge_run(man, parts, columns, counters)
        run_records.append(0 if table is None else table.num_rows)
        counters["current_fraction"] = f
        if table is not None:
            yield from rebatch(table.combine_chunks().to_batches(), batch_rows)
        counters["read_seconds"] = clock() - t0


class ArchiveBackend:
    name = "archive"
    extensions: tuple[str, ...] = ()

    def guess_can_open(self, path: str, magic: bytes) -> bool:
        return magic.startswith(ARCHIVE_MAGIC) or (bool(path) and is_archive(path))

    def open(self, path: str, *, keys: Sequence[str] | None = None, variables: Sequence[str] | None = None,
             batch_rows: int = DEFAULT_BATCH_ROWS, decode_times: bool = False, sample: Sample | None = None,
             sample_seed: int | None = None) -> InputSource:
        """``sample``: a fraction, a :class:`Budget`, or the run's :class:`Sampling` (its request
        for ``path``; each read reports its counters to it). The counters are also the source's
        ``counters``."""
        fraction, seed, sampling = _resolve(path, sample, sample_seed)
        man = read_manifest(path)
        schema, columns, key_names = resolve_columns(path, man.schema, keys, variables)
        auto = isinstance(fraction, Budget)
        counters: dict = {"sample_fraction": fraction, "sample_seed": seed}
        if auto:
            counters.update(sample_fraction=None, sample_mode="auto", budget_seconds=fraction.seconds)
        whole = not auto and fraction >= 1.0

        cache: dict = {}

        def batches(start: int = 0, stop: int | None = None) -> Iterator[pa.RecordBatch]:
            if sampling is not None:
                sampling.report(path, counters)
            if auto:
                for k in ("run_fractions", "run_records", "run_counts", "blocks_read", "bytes_read", "records_read"):
                    counters.pop(k, None)
                it = auto_batches(man, fraction, seed, columns=columns, batch_rows=batch_rows, counters=counters)
                yield from it if (start, stop) == (0, None) else sliced(it, start, stop, schema)
            else:  # a range reads the runs holding it only
                yield from sample_batches(man, fraction, seed, columns=columns, batch_rows=batch_rows,
                                          counters=counters, start=start, stop=stop, cache=cache)

        # A fixed fraction's sample size follows from the manifest and the seed; auto's is known only once read.
        n = None if auto else (man.count if whole else sum(sample_counts(man, fraction, seed)))
        return InputSource(path=path, format=self.name, schema=schema, keys=key_names, num_rows=n,
                           outer_size=n, inner_size=1, open_batches=batches, counters=counters)


register_backend(ArchiveBackend())
