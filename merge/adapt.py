"""Adaptive delta control (docs/semantics.md section 10): the K of CGM between report windows.

CGM's least increments K_A, K_B trade time for matches (the paper's Figure 5): a pass of a
behind window retires at least K records, the records evicted to make up K are dropped
unmatched, and their partners, arriving later, are dropped too (a cascade no later K undoes).
Measured on gen data (docs/cgm.md, "Adaptive K"), the drop rate against K is a cliff: every K
under it drops nothing and runs the same passes (a pass matches more than K, K does not bind),
every K over it cascades. K only buys time when it binds *and* the records it evicts are
unmatchable anyway (records without a partner fill the window until each pass retires only K).
``DeltaController`` therefore starts low and grows K only on evidence that it is safe:

- *start*: K = min(the given K, N / 32) (at least 1): under the cliff of every gen case
  measured, and no slower there than any K (K does not bind);
- *K does not bind* (the window dropped nothing): K stays: a larger K changes nothing;
- *probe*: the window dropped something, and both it and the moving drop rate are at most
  delta / 2: K doubles (a binding K with drops to spare: unmatchable records are in the way),
  never above the ceiling;
- *cascade*: a window over delta / 2 right after a doubling (or over twice the drop rate seen
  before it, plus delta / 8): K returns to the K before the doubling, which becomes the
  ceiling for the rest of the run (never probe above a K that cascaded), and K holds for m
  windows (the partners of evicted records are dropped later whatever K is);
- *too many drops* otherwise (over delta / 2, not an echo of a cascade within m windows):
  K halves, not under a floor of start / 2, and the halved K becomes the ceiling; when even the floor drops too many, delta is out of reach of any K on this data and
  K stays (a smaller K would only cost passes).

K_A and K_B move together (each doubled or halved, bounded to [1, N]).
"""


from __future__ import annotations

from collections import deque

from smerge.merge.params import CGMParams

START_FRACTION = 32  # start at K = min(given K, N / START_FRACTION)
TOO_MANY = 0.5       # a window dropping more than TOO_MANY x delta is too many
FLOOR_DIVISOR = 2    # K never halves under start / FLOOR_DIVISOR


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
        n = params.window_size
        start = max(self.k_min, n // START_FRACTION)
        self.ks: tuple[int, int] = (min(params.least_increment_a, start), min(params.least_increment_b, start))
        self.floor = tuple(max(self.k_min, k // FLOOR_DIVISOR) for k in self.ks)
        self.ceiling: list[int] = [self.k_max, self.k_max]
        self.recent: deque[float] = deque(maxlen=self.m)
        self.windows = 0
        self.probe: tuple[tuple[int, int], float] | None = None  # (K before the doubling, its drop rate)
        self.hold_until = 0  # no change before this window (echoes of a cascade)

    def update(self, kappa: float) -> tuple[int, int]:
        drop = 1.0 - kappa
        self.recent.append(drop)
        moving = sum(self.recent) / len(self.recent)
        self.windows += 1
        ks = list(self.ks)
        probe, self.probe = self.probe, None
        high = drop > TOO_MANY * self.delta
        if probe is not None and (high or drop > 2 * probe[1] + self.delta / 8):
            # the doubling cascaded: back to the K before it, for good
            ks = list(probe[0])
            self.ceiling = [max(self.k_min, k) for k in ks]
            self.hold_until = self.windows + self.m
        elif self.windows < self.hold_until:
            pass
        elif high:
            halved = [max(self.floor[s], ks[s] // 2) for s in (0, 1)]
            if halved != ks:
                self.ceiling = [min(self.ceiling[s], halved[s]) for s in (0, 1)]
                self.hold_until = self.windows + self.m
            ks = halved
        elif drop > 0.0 and moving <= TOO_MANY * self.delta:
            grown = [min(self.ceiling[s], self.k_max, 2 * ks[s]) for s in (0, 1)]
            if grown != ks:
                self.probe = (self.ks, drop)
            ks = grown
        self.ks = (ks[0], ks[1])
        return self.ks
