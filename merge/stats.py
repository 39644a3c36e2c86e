"""Match statistics and the best-effort delta check (docs/semantics.md section 4)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class ReportWindows:
    """Groups consecutive passes (or RTM A-windows) until >= N records of A are retired.

    ``kappa_i = matched / retired`` for each report window. Every report window retires at least
    N records of A (docs/semantics.md section 4): the records of a last group that ends short of N (the
    end of the run) join the report window before it (``finish``); a run that retires fewer
    than N records in all has that one short window.
    """

    window_size: int
    kappas: list[float] = field(default_factory=list)
    counts: list[tuple[int, int]] = field(default_factory=list)  # (matched, retired) per window
    _matched: int = 0
    _retired: int = 0

    def add(self, matched: int, retired: int) -> None:
        self._matched += matched
        self._retired += retired
        if self._retired >= self.window_size:
            self._close()

    def add_unmatched(self, count: int) -> None:
        """``count`` records retired unmatched in one go (the end of a run): they fill the open
        window up to N, then whole windows of N, whatever batches they arrived in."""
        while count > 0:
            k = min(count, max(1, self.window_size - self._retired))
            self.add(0, k)
            count -= k

    @property
    def open_retired(self) -> int:
        """A records retired in the open (not yet closed) report window."""
        return self._retired

    def add_many(self, matched: np.ndarray, retired: np.ndarray) -> None:
        for m, r in zip(matched.tolist(), retired.tolist()):
            self.add(m, r)

    def finish(self) -> None:
        """End of the run: a short open group joins the last closed report window (its kappa is
        that of the union), or is the only window when none closed."""
        if self._retired > 0:
            if self.counts:
                m, r = self.counts[-1]
                self._matched += m
                self._retired += r
                self.counts.pop()
                self.kappas.pop()
            self._close()

    def _close(self) -> None:
        self.kappas.append(self._matched / self._retired)
        self.counts.append((self._matched, self._retired))
        self._matched = 0
        self._retired = 0


MAX_SERIES = 10_000  # per-window series in the statistics JSON hold at most this many points


def decimate(values, limit: int = MAX_SERIES) -> tuple[list[float], int]:
    """At most ``limit`` evenly spaced items of ``values`` (every s-th from the first, with
    s = ceil(n / limit)) and the stride s; ``values`` as a list when n <= limit (s = 1)."""
    n = len(values)
    s = max(1, -(-n // limit))
    return [float(x) for x in values[::s]], s


def drop_rate_moving(kappas: list[float], m: int) -> np.ndarray:
    """1 - Delta_{m,n} for n = m .. len(kappas) (the moving drop rate over m report windows;
    item j ends at report window j + m - 1, 0-based); empty with fewer than m windows."""
    if len(kappas) < m:
        return np.empty(0)
    c = np.concatenate([[0.0], np.cumsum(np.asarray(kappas, dtype=np.float64))])
    return 1.0 - (c[m:] - c[:-m]) / m


def drop_rate_moving_max(kappas: list[float], m: int, overall_kappa: float) -> float:
    """max over n >= m of 1 - Delta_{m,n}; with fewer than m windows, the overall drop rate."""
    if len(kappas) < m:
        return 1.0 - overall_kappa
    k = np.asarray(kappas, dtype=np.float64)
    c = np.concatenate([[0.0], np.cumsum(k)])
    moving = (c[m:] - c[:-m]) / m
    return float(1.0 - moving.min())


@dataclass
class MergeStats:
    """Statistics of one merge run; ``as_dict`` gives the JSON of docs/cli.md."""

    algorithm: str
    a_records: int = 0
    b_records: int = 0
    matched: int = 0
    a_unmatched: int = 0
    b_unmatched: int = 0
    a_nan_keys: int = 0
    b_nan_keys: int = 0
    passes: int = 0
    kappas: list[float] = field(default_factory=list)
    report_counts: list[tuple[int, int]] = field(default_factory=list)  # (matched, retired) per report window
    k_windows: list[tuple[int, int]] = field(default_factory=list)  # (K_A, K_B) in force per report window
    kappa_max: float | None = None  # the ceiling (merge.ceiling): no run can pass it
    kappa_max_method: str | None = None
    kappa_greedy: float | None = None  # the unbounded-window merge (greedy: a run can pass it)
    window_needed: int | None = None  # least N under which all but one point of A's pairs arrive
    fetch_seconds: float = 0.0
    merge_seconds: float = 0.0
    write_seconds: float = 0.0
    total_seconds: float = 0.0
    params: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    def set_kappa(self, figures: dict) -> None:
        """The figures of ``merge.ceiling.kappa_figures``."""
        self.kappa_max = figures["kappa_max"]
        self.kappa_max_method = figures["kappa_max_method"]
        self.kappa_greedy = figures["kappa_greedy"]
        self.window_needed = figures.get("window_needed")

    def check_accounting(self) -> None:
        """Exact accounting (docs/semantics.md section 2): matched + unmatched = read, for both inputs."""
        if self.matched + self.a_unmatched != self.a_records:
            raise AssertionError(f"A accounting broken: {self.matched} + {self.a_unmatched} != {self.a_records}")
        if self.algorithm == "cgm" and self.matched + self.b_unmatched != self.b_records:
            raise AssertionError(f"B accounting broken: {self.matched} + {self.b_unmatched} != {self.b_records}")

    @property
    def match_pct(self) -> float:
        return 100.0 * self.matched / self.a_records if self.a_records else 0.0

    def as_dict(self) -> dict:
        delta = self.params.get("delta")
        m = int(self.params.get("delta_windows", 10))
        overall = self.matched / self.a_records if self.a_records else 1.0
        drop = drop_rate_moving_max(self.kappas, m, overall) if self.a_records else 0.0
        out = {
            "algorithm": self.algorithm,
            "a_records": self.a_records,
            "b_records": self.b_records,
            "matched": self.matched,
            "a_unmatched": self.a_unmatched,
            "b_unmatched": self.b_unmatched,
            "a_nan_keys": self.a_nan_keys,
            "b_nan_keys": self.b_nan_keys,
            "match_pct": self.match_pct,
            "passes": self.passes,
            "report_windows": len(self.kappas),
            "kappa_min": min(self.kappas) if self.kappas else None,
            "drop_rate_moving_max": drop,
            "delta_ok": (drop <= delta + 1e-12) if delta is not None else None,
            "kappa_max": self.kappa_max,
            "fetch_seconds": self.fetch_seconds,
            "merge_seconds": self.merge_seconds,
            "write_seconds": self.write_seconds,
            "total_seconds": self.total_seconds,
            "params": self.params,
        }
        # Per-window series for plots (``smerge plot``), bounded: at most MAX_SERIES points each,
        # every ``series_stride``-th report window when there are more (and the same for the moving
        # drop rate, whose item j ends at report window j + delta_windows - 1).
        out["kappa_per_window"], out["series_stride"] = decimate(self.kappas)
        out["drop_rate_moving"] = [float(x) for x in drop_rate_moving(self.kappas, m)[::out["series_stride"]]]
        if self.params.get("adapt"):
            # [K_A, K_B] in force in each report window (docs/semantics.md section 10), thinned like kappa_per_window
            out["k_per_window"] = [[int(x) for x in k] for k in self.k_windows[::out["series_stride"]]]
        if delta is None:
            del out["delta_ok"]
        if self.kappa_max is None:
            del out["kappa_max"]
        else:
            out["kappa_max_method"] = self.kappa_max_method
            out["kappa_greedy"] = self.kappa_greedy
            hint = recover_hint(self.algorithm, overall if self.a_records else 1.0, self.kappa_max,
                                self.window_needed, self.params)
            if hint is not None:
                out["recover"] = hint
        out.update(self.extra)
        return out


RECOVER_POINT = 0.01  # a recovery hint when the match rate is more than one point (of A) under the ceiling
HINT_MAX_WINDOW = 10_000_000  # a window past this is not a cheap change: smerge rtm instead
SAFE_K_FRACTION = 32  # K <= N / 32: under the drop cliff in every gen case measured (docs/cgm.md)


def _round_up(x: int) -> int:
    """x rounded up to two significant digits."""
    step = 10 ** max(0, len(str(int(x))) - 2)
    return -(-int(x) // step) * step


def recover_hint(algorithm: str, rate: float, kappa_max: float | None, window_needed: int | None,
                 params: dict) -> dict | None:
    """The cheapest change that would bring a CGM run within one point of the ceiling, from what
    the run measured: ``window_needed`` (the stream distance under which all but one point of A's
    pairs arrive). A window under it: ``--window`` that distance (with K <= N / 32), or ``smerge
    rtm`` past ``HINT_MAX_WINDOW``; a window over it: the drops came from evictions, so a smaller
    least increment ``--increment N / 32``; when K is already that small, ``smerge rtm`` (its
    sweep refills pages and pairs what CGM's window sweep misses). None within one point."""
    if kappa_max is None or algorithm != "cgm" or kappa_max - rate <= RECOVER_POINT or window_needed is None:
        return None
    n = int(params.get("window_size", 0))
    k = max(int(params.get("least_increment_a", 1)), int(params.get("least_increment_b", 1)))
    gap = kappa_max - rate
    if window_needed > n:
        if window_needed > HINT_MAX_WINDOW:
            return {"change": "rtm", "command": "smerge rtm", "shortfall": gap, "window_needed": window_needed}
        n2 = _round_up(window_needed)
        k2 = max(1, n2 // SAFE_K_FRACTION)
        return {"change": "window", "window_size": n2, "least_increment": k2,
                "command": f"--window {n2} --increment {k2}", "shortfall": gap, "window_needed": window_needed}
    k2 = max(1, n // SAFE_K_FRACTION)
    if k2 < k or params.get("adapt"):
        return {"change": "increment", "least_increment": k2, "command": f"--increment {k2}", "shortfall": gap,
                "window_needed": window_needed}
    return {"change": "rtm", "command": "smerge rtm", "shortfall": gap, "window_needed": window_needed}


@dataclass
class BoundedSeries:
    """Rows recorded over a run (e.g. one per W-join chunk), at most ``limit`` of them: when full,
    every other row is dropped and only every ``stride``-th later call is kept (stride doubles),
    so the rows stay evenly spaced (rows k x stride, 0-based calls). JSON: ``as_dict``."""

    columns: tuple[str, ...]
    limit: int = MAX_SERIES
    rows: list[list[float]] = field(default_factory=list)
    stride: int = 1
    calls: int = 0

    def append(self, row) -> None:
        if self.calls % self.stride == 0:
            self.rows.append([float(x) for x in row])
            if len(self.rows) > self.limit:
                self.rows = self.rows[::2]
                self.stride *= 2
        self.calls += 1

    def as_dict(self) -> dict:
        return {"columns": list(self.columns), "rows": self.rows, "stride": self.stride, "calls": self.calls}
