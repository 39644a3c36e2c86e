"""Per-partition windows of a partitioned CGM run, and the expected-pairs check (docs/spark.md,
"Windows of a partition").

Why P > 1 lost pairs. Partition p's stream holds only the records whose k1 lies in its range.
When the arrival order is not sorted by k1 (station reports keyed (lat, lon) arriving in time
order), N records of p's stream span about 1/d arrival positions for every one of the whole
stream's, where d is p's share of the records there (about 1/P), so a window of N holds about d
times as many distinct keys as a window of ``--local``. A sweep pairs a key at most once per
pass (docs/semantics.md section 3, step 3), but a behind window still evicts K - m records: with
fewer distinct keys per window, m is smaller and each pass evicts more records unmatched (the
issue: 4,612 of ``--local``'s 11,864 pairs at P = 3; station data built here: 30% at P = 3, 14%
at P = 8).

The rule. Partition p runs CGM with the windows of ``--local`` thinned to its share of the
arrival order, with margins:

    N_p = min(N, round(1.1 N max(dA_p, dB_p))),  K_X,p = round(0.97 K_X dX_p)  (X = A, B)

(at least 1, K at most N_p; when N_p = N the partition's records are contiguous in the stream and
K_X,p = round(K_X dX_p)), where dA_p is the *arrival density* of p in A: over p's records, the
mean share of p's records among the N records of A around them (the same in B). A window of
N d_p of p's records spans the same stretch of the stream as a window of N in ``--local``.
Without margins a run found 0.95-1.07 of ``--local``'s pairs (station reports, P = 2..8): a
partition's count moves by 1-3% with its windows' composition (where the bounds fall), and
partitions evict more in aggregate (a behind window evicts max(0, K - m) records per pass; the
partitions' sum of max(0, K_p - m_p) is at least ``--local``'s max(0, K - sum m_p)). A wider
window pairs more keys per pass, a smaller K evicts fewer records; the two margins together
(``WINDOW_MARGIN``, ``INCREMENT_MARGIN``) lifted every measured case to >= 0.997 (docs/spark.md).
When k1 is sorted in arrival order (gridded time steps), a partition's records are contiguous,
d = 1 and the windows are ``--local``'s; when k1 is spread evenly over the stream, d = 1/P. The
density comes from the planning's sample of k1 (in arrival order per chunk): no extra read.

The check. A partitioned run is still a best-effort merge with its own windows; to say whether
it reached ``--local``'s pairs, the driver runs the in-process engine (keys only) over the whole
inputs when they are small, else over a few stretches of them, while the merge job runs, and
extrapolates the pairs an in-process run would find (``pairs_expected``).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from smerge.merge import CGMParams, MergeStats, cgm_merge
from smerge.errors import param

TARGET = 0.99  # pairs(P) / pairs(--local) a partitioned run should reach (issue 15)
# Margins of a thinned partition's windows (N_p < N): N_p = N d_p WINDOW_MARGIN, K_p = K d_p
# INCREMENT_MARGIN. Measured on station reports (docs/spark.md, "Windows of a partition").
WINDOW_MARGIN = 1.1
INCREMENT_MARGIN = 0.97
ESTIMATE_STRETCHES = 4
ESTIMATE_MIN_STRETCH = 65_536  # records of A per stretch, at least 20 windows
ESTIMATE_MAX_RECORDS = 2_000_000  # per input, over all stretches


def owner_of(bounds, k1: np.ndarray) -> np.ndarray:
    return np.searchsorted(np.asarray(bounds, dtype=np.float64), k1, side="right")


def arrival_density(segments, bounds, window: int) -> np.ndarray:
    """Per partition, the mean share of its records among the ``window`` records around them.

    ``segments``: (records per sample value, k1 sample in arrival order) for consecutive stretches
    of one input (the planning's chunks). Windows are counted in sample values: ``window /
    records per sample``, at least 2 values (a coarser scale when the sample is sparser than a
    window). A partition without sampled records gets 1 (its windows stay ``--local``'s).
    """
    P = len(bounds) + 1
    num, den = np.zeros(P), np.zeros(P)
    for per, sample in segments:
        s = np.asarray(sample, dtype=np.float64)
        s = s[~np.isnan(s)]
        m = s.size
        if m < 2:  # no neighbours to count
            continue
        own = owner_of(bounds, s)
        w = int(min(m, max(2, math.ceil(window / max(per, 1e-12)))))
        lo = np.clip(np.arange(m) - w // 2, 0, m - w)
        for p in np.unique(own):
            c = np.concatenate([[0], np.cumsum(own == p)])
            mine = own == p
            share = ((c[lo + w] - c[lo])[mine] - 1) / (w - 1)  # the others around it: unbiased
            num[p] += per * share.sum()
            den[p] += per * mine.sum()
    return np.where(den > 0, num / np.where(den > 0, den, 1), 1.0)


def partition_windows(params: CGMParams, dens_a: np.ndarray, dens_b: np.ndarray) -> tuple[tuple[int, int, int], ...]:
    """(N_p, K_A,p, K_B,p) per partition (the rule in the module's docstring)."""
    out = []
    n0 = params.window_size
    for da, db in zip(dens_a, dens_b):
        n = max(1, min(n0, round(n0 * WINDOW_MARGIN * max(da, db))))
        km = INCREMENT_MARGIN if n < n0 else 1.0  # a contiguous partition (N_p = N) keeps K d
        ka = max(1, min(n, round(params.least_increment_a * da * km)))
        kb = max(1, min(n, round(params.least_increment_b * db * km)))
        out.append((n, ka, kb))
    return tuple(out)


def task_params(params: CGMParams, windows, p: int) -> CGMParams:
    """The CGM parameters partition ``p`` runs with (``windows`` None: the job's own)."""
    if not windows:
        return params
    n, ka, kb = windows[p]
    if (n, ka, kb) == (params.window_size, params.least_increment_a, params.least_increment_b):
        return params
    return replace(params, window_size=n, least_increment_a=ka, least_increment_b=kb)


def plan_windows(params: CGMParams, bounds, segments_a, segments_b, mode: str):
    """(windows, densities) for a run with ``bounds``; windows None with one partition or
    ``mode == "fixed"`` (every partition runs the job's N and K)."""
    if not bounds:
        return None, None
    dens = {"a": arrival_density(segments_a, bounds, params.window_size),
            "b": arrival_density(segments_b, bounds, params.window_size)}
    if mode == "fixed":
        return None, dens
    return partition_windows(params, dens["a"], dens["b"]), dens


def window_mode(own: dict) -> str:
    """``--conf smerge.partition.windows``: ``scaled`` (the rule), ``fixed`` (every partition runs
    the job's N and K), ``auto`` (default): scaled, except with boundaries given by
    ``smerge.bounds`` (expert use: a given partitioning reproduced exactly, whichever plan reads
    the inputs, as the slab and shuffle plans sample k1 differently)."""
    from smerge.errors import UsageError

    v = str(own.get("smerge.partition.windows", "auto")).lower()
    if v not in ("auto", "scaled", "fixed"):
        raise UsageError(f"{param.conf} smerge.partition.windows={v!r}: use auto, scaled or fixed")
    if v == "auto":
        return "fixed" if own.get("smerge.bounds") else "scaled"
    return v


def regroup_windows(counts, k_windows, n: int) -> tuple[list[list[int]], list]:
    """A partition's report windows (matched, retired) -- closed every N_p retired A records by
    its engine -- grouped again until at least ``n`` (the job's N) records of A are retired, the
    short group at the end joining the one before it (docs/semantics.md section 4), so the run's report
    windows are as large as ``--local``'s. Group ends are window ends, so a seam pair's position
    among the partition's pairs still names its window. K of a group: its first window's."""
    counts = [tuple(c) for c in counts]
    groups: list[list[int]] = []
    ks: list = []
    cur, start = [0, 0], 0
    for i, (m, r) in enumerate(counts):
        cur[0] += m
        cur[1] += r
        if cur[1] >= n:
            groups.append(cur)
            ks.append(k_windows[start] if start < len(k_windows) else None)
            cur, start = [0, 0], i + 1
    if cur[1] or cur[0]:
        if groups:
            groups[-1] = [groups[-1][0] + cur[0], groups[-1][1] + cur[1]]
        else:
            groups.append(cur)
            ks.append(k_windows[start] if start < len(k_windows) else None)
    return groups, [k for k in ks if k is not None]


# ---------------------------------------------------------------------------------------------
# The expected pairs of an in-process run


def _keys_only(spec, side_keys, start: int, stop: int | None):
    src = spec.open_keys()
    for b in src.batches(start, stop):
        yield b.select(list(side_keys))


def _stretches(n_a: int, outer_a: int | None, inner_a: int, window: int):
    """A's stretches as (first outer index, stop outer index) and the counting margin in records;
    None: the whole input."""
    s = max(20 * window, ESTIMATE_MIN_STRETCH)
    k = max(1, min(ESTIMATE_STRETCHES, ESTIMATE_MAX_RECORDS // s))
    if n_a <= k * s * 1.5:
        return None, 0
    if outer_a is None:
        raise ValueError("A's chunks are unknown before it is read (CSV); stretches need them")
    so = max(1, -(-s // inner_a))
    starts = [round(i * (outer_a - so) / max(1, k - 1)) for i in range(k)] if k > 1 else [(outer_a - so) // 2]
    return [(x, x + so) for x in starts], 2 * window


def estimate_local_pairs(spec_a, spec_b, params: CGMParams, n_a: int, n_b: int) -> dict:
    """The pairs an in-process run of ``params`` is expected to find: the engine on the keys of
    the whole inputs (exact) when they are small, else on ``ESTIMATE_STRETCHES`` stretches (A's
    stretches spread evenly, B's at the same relative positions), counting the pairs of A
    records at least two windows inside a stretch per A record there."""
    keys_a, keys_b = params.keys.a, params.keys.b
    p = replace(params, with_ids=True, delta=None, adapt=False)
    stretches, margin = _stretches(n_a, spec_a.outer, spec_a.inner, params.window_size)
    if stretches is None:
        stats = MergeStats("cgm")
        for _ in cgm_merge(_keys_only(spec_a, keys_a, 0, None), _keys_only(spec_b, keys_b, 0, None), p, stats=stats,
                           source_a=spec_a.path, source_b=spec_b.path):
            pass
        return {"pairs_expected": int(stats.matched), "pairs_expected_from": "in-process engine over the whole inputs",
                "estimate_records": int(stats.a_records + stats.b_records)}
    pairs = counted = read = 0
    inner_b = spec_b.inner
    outer_b = spec_b.outer if spec_b.outer is not None else max(1, -(-n_b // inner_b))
    for x0, x1 in stretches:
        y0 = int(x0 * spec_a.inner * n_b / max(1, n_a)) // inner_b
        y1 = max(y0 + 1, int(x1 * spec_a.inner * n_b / max(1, n_a)) // inner_b)
        y1 = min(y1, outer_b)
        stats = MergeStats("cgm")
        lo, hi = margin, (x1 - x0) * spec_a.inner - margin
        for batch in cgm_merge(_keys_only(spec_a, keys_a, x0, x1), _keys_only(spec_b, keys_b, y0, y1), p, stats=stats,
                               source_a=spec_a.path, source_b=spec_b.path):
            r = batch.column("a_row").to_numpy()
            pairs += int(((r >= lo) & (r < hi)).sum())
        counted += max(0, min(hi, stats.a_records) - lo)
        read += stats.a_records + stats.b_records
    rate = pairs / counted if counted else 0.0
    return {"pairs_expected": int(round(rate * n_a)),
            "pairs_expected_from": f"in-process engine over {len(stretches)} stretches of A and B "
                                   f"({read:,} records), scaled to the inputs",
            "estimate_records": int(read)}


def check(matched: int, estimate: dict | None, reason: str = "") -> dict:
    """Statistics of the check: expected vs found and whether the run reached ``TARGET``."""
    if not estimate:
        return {"pairs_expected": None, "pairs_found_share": None,
                "pairs_check": f"not estimated{': ' + reason if reason else ''}"}
    exp = estimate["pairs_expected"]
    share = matched / exp if exp else 1.0
    ok = exp == 0 or matched >= TARGET * exp
    return {**estimate, "pairs_found_share": round(share, 4),
            "pairs_check": "ok" if ok else f"below {TARGET:.0%} of the in-process run's expected pairs"}


__all__ = ["TARGET", "arrival_density", "partition_windows", "task_params", "plan_windows", "regroup_windows",
           "window_mode", "estimate_local_pairs", "check"]
