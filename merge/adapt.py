"""Adaptive delta control (spec ENGINES.md section 10): the K of CGM between report windows.

CGM's least increments K_A, K_B trade time for matches (the paper's Figure 5): a pass of a
behind window retires at least K records, so a larger K means fewer passes, but the records
evicted to make up K are dropped unmatched. With a delta target, ``DeltaController`` looks at
each report window's drop rate when it closes and sets the K of the next one, so that the moving
drop rate (1 - Delta_{m,n}, over the last m report windows) stays at or under delta with K as
large as that allows. The rule (docs/cgm.md, "Adaptive K"):

- *too many drops*: the window's drop rate is over delta / 2 (and, within m windows of the
  last decrease, over the drop rate that caused it): halve K (at least 1), and the K that
  dropped too many becomes a *ceiling*: K stays at least one step under it (the ceiling is never
  under the halved K). Records whose partner was evicted are dropped later whatever K is, so
  the drops that echo a decrease do not halve K again unless they grow;
- *comfortably under*: the window's and the moving drop rate are both at most delta / 4:
  K grows, up to the ceiling, by one step, N / 20 (at least 1), when the window dropped
  nothing (K did not bind: no record of A was evicted), else by a fifth of a step (K binds:
  a larger K evicts more, so it creeps towards the rate where drops cascade);
- otherwise K stays;
- after 4m comfortable windows in a row at the ceiling, the ceiling rises by one step (the data
  may have become better ordered, so K probes upward again).

K_A and K_B move by the same rule (each halved, each grown by the step), bounded to [1, N]; the
starting values are the K's of the parameters. A decrease acts on the next pass; one window with
too many drops adds its drop rate / m to the moving average: windows held under delta / 2 keep
it under delta with room for one such window in every m.
"""

from __future__ import annotations

from collections import deque

from smerge.merge.params import CGMParams

TOO_MANY = 0.5      # a window dropping more than TOO_MANY x delta halves K
COMFORT = 0.25      # K grows while the window's and the moving drop rate are <= COMFORT x delta
STEP_FRACTION = 20  # the additive step is N / STEP_FRACTION
CREEP = 5           # ... divided by CREEP when the window dropped something
CEILING_PATIENCE = 4  # ceiling rises one step after CEILING_PATIENCE x m comfortable windows at it


class DeltaController:
    """Sets K_A, K_B for each report window from the drop rates of the windows before it.

    ``ks`` is the pair in force; ``update(kappa)`` takes the kappa of the report window that
    just closed (run with ``ks``) and returns the pair for the next one. O(m) memory.
    """

    def __init__(self, params: CGMParams) -> None:
        if params.delta is None:
            raise ValueError("adaptive K needs a delta target")
        self.delta = float(params.delta)
        self.m = params.delta_windows
        self.k_min, self.k_max = params.adapt_k_range
        self.step = max(1, params.window_size // STEP_FRACTION)
        self.ks: tuple[int, int] = (params.least_increment_a, params.least_increment_b)
        self.ceiling: list[int] = [self.k_max, self.k_max]
        self.recent: deque[float] = deque(maxlen=self.m)
        self.calm_at_ceiling = 0
        self.windows = 0
        self.last_decrease: tuple[int, float] | None = None  # (window, drop rate that caused it)

    def update(self, kappa: float) -> tuple[int, int]:
        drop = 1.0 - kappa
        self.recent.append(drop)
        moving = sum(self.recent) / len(self.recent)
        ks = list(self.ks)
        self.windows += 1
        echo = (self.last_decrease is not None and self.windows - self.last_decrease[0] <= self.m
                and drop <= self.last_decrease[1])
        if drop > TOO_MANY * self.delta and not echo:
            self.last_decrease = (self.windows, drop)
            for s in (0, 1):
                halved = max(self.k_min, ks[s] // 2)
                self.ceiling[s] = max(halved, min(self.ceiling[s], ks[s] - self.step))
                ks[s] = halved
            self.calm_at_ceiling = 0
        elif drop <= COMFORT * self.delta and moving <= COMFORT * self.delta:
            at_ceiling = all(ks[s] >= self.ceiling[s] for s in (0, 1))
            if at_ceiling:
                self.calm_at_ceiling += 1
                if self.calm_at_ceiling >= CEILING_PATIENCE * self.m:
                    self.ceiling = [min(self.k_max, c + self.step) for c in self.ceiling]
                    self.calm_at_ceiling = 0
            grow = self.step if drop <= 0.0 else max(1, self.step // CREEP)
            for s in (0, 1):
                ks[s] = max(self.k_min, min(self.ceiling[s], ks[s] + grow))
        self.ks = (ks[0], ks[1])
        return self.ks
