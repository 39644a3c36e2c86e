"""W-join parameters (docs/semantics.md section 6): ``WJoinParams``, validated at construction, and
``resolve_bound``, a window bound in the streams' time representation."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from smerge.errors import UsageError, param
from smerge.merge._wjoin_kernel import INT_POS
from smerge.merge.values import NS_PER_UNIT, Duration, parse_duration

METHODS = ("auto", "hash", "nested-loop")
_ALIAS_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class WJoinParams:
    """Parameters of the W-join (docs/semantics.md section 6), validated at construction.

    ``time``: the time column of each stream (one name for all, or one per stream).
    ``window``: the uniform bound for every pair (None: only ``pair_windows``).
    ``pair_windows``: ``(i, j, bound)`` with 0-based stream numbers; ``bound`` None removes the
    pair's constraint. ``on``: columns joined by equality across all streams; ``where``: a
    predicate (merge/expr.py). ``method``: "auto" (hash buckets when the equalities cover all
    streams), "hash" (required) or "nested-loop" (scan the window period).
    """

    n_streams: int
    time: tuple[str, ...]
    window: Duration | None = None
    pair_windows: tuple[tuple[int, int, Duration | None], ...] = ()
    on: tuple[str, ...] = ()
    where: str | None = None
    aliases: tuple[str, ...] = ()
    with_ids: bool = False
    method: str = "auto"

    def __post_init__(self) -> None:
        n = self.n_streams
        if n < 2:
            raise UsageError(f"W-join needs at least 2 streams, got {n}")
        t = tuple(self.time)
        if len(t) == 1:
            t = t * n
        if len(t) != n or not all(t):
            raise UsageError(f"{param.time} names {len(self.time)} columns for {n} streams; give one name or one per stream")
        object.__setattr__(self, "time", t)
        aliases = tuple(self.aliases) or tuple(f"S{i + 1}" for i in range(n))
        if len(aliases) != n:
            raise UsageError(f"{param.aliases} gives {len(aliases)} names for {n} streams")
        for a in aliases:
            if not _ALIAS_RE.match(a):
                raise UsageError(f"alias {a!r} is not a name (letters, digits, _; not starting with a digit)")
        if len({a.lower() for a in aliases}) != n:
            raise UsageError(f"aliases {', '.join(aliases)} are not distinct")
        object.__setattr__(self, "aliases", aliases)
        if self.window is not None:
            object.__setattr__(self, "window", parse_duration(self.window, param.window))
        pw = []
        for i, j, d in self.pair_windows:
            if not (0 <= i < n and 0 <= j < n) or i == j:
                raise UsageError(f"{param.pair_windows} {i + 1},{j + 1}: stream numbers must be two different values "
                                 f"in 1..{n}")
            pw.append((i, j, None if d is None else parse_duration(d, param.pair_windows)))
        object.__setattr__(self, "pair_windows", tuple(pw))
        if self.method not in METHODS:
            raise UsageError(f"method {self.method!r} is not one of {', '.join(METHODS)}")
        if self.window is None and not pw:
            raise UsageError(f"no window: give {param.window} DUR (all pairs) and/or {param.pair_windows} I,J=DUR")
        self.constraint_graph()  # connectivity check

    def constraint_graph(self) -> dict[tuple[int, int], Duration]:
        """The constrained pairs (i < j) and their bounds; raises when they do not connect all streams."""
        n = self.n_streams
        g: dict[tuple[int, int], Duration] = {}
        if self.window is not None:
            g = {(i, j): self.window for i in range(n) for j in range(i + 1, n)}
        for i, j, d in self.pair_windows:
            key = (min(i, j), max(i, j))
            if d is None:
                g.pop(key, None)
            else:
                g[key] = d
        comp = {0}
        frontier = [0]
        while frontier:
            u = frontier.pop()
            for (a, b) in g:
                for x, y in ((a, b), (b, a)):
                    if x == u and y not in comp:
                        comp.add(y)
                        frontier.append(y)
        if len(comp) != n:
            left = [self.aliases[i] for i in range(n) if i not in comp]
            raise UsageError(
                f"the window constraints do not connect all streams: {', '.join(left)} "
                f"{'is' if len(left) == 1 else 'are'} not linked to {self.aliases[0]} by any chain of bounds, so "
                f"their buffers would grow without limit; add {param.window} or {param.pair_windows} I,J=DUR")
        return g


def _floor_ticks(x: float) -> int:
    """A bound in whole ticks, at most int64's largest (a longer bound is as good as none)."""
    return int(min(math.floor(x + 1e-9), INT_POS))


def resolve_bound(d: Duration, kind: str, what: str = "window") -> int | float:
    """A bound in the time representation of ``kind`` (see ``_time_kind``): int64 ns
    ("datetime"), int64 us ("datetime_us", and "cf:<calendar>" for decoded CF times in other
    calendars), int (integer times) or float. A plain number on a decoded CF time is refused:
    its unit would be a guess."""
    if kind.startswith(("datetime", "cf:")):
        base, _, plain_unit = kind.partition("@")
        ns_per_raw = 1 if base.split("+")[0] == "datetime" else 1000
        if d.unit is None:
            if base.endswith("+cf") or base.startswith("cf:"):
                raise UsageError(f"{what} {d} has no unit and the time is a decoded CF time; give a duration "
                                 "such as 6h, 30min or 2d")
            if not plain_unit:
                raise UsageError(f"{what} {d} has no unit and the streams' timestamps have different units; give "
                                 "a duration such as 90s, 30min or 6h")
            # A plain number is in the time columns' own unit (seconds for timestamp[s], ...).
            return _floor_ticks(d.value * NS_PER_UNIT[plain_unit] / ns_per_raw)
        # decoded CF times carry their calendar in the kind ("cf:360_day"); the others are standard
        return _floor_ticks(d.nanoseconds(kind[3:] if kind.startswith("cf:") else None, what) / ns_per_raw)
    if d.unit:
        raise UsageError(f"{what} {d} has a unit but the time column is a plain number; give the bound as a plain "
                         "number in the time column's unit")
    if kind == "int":
        return _floor_ticks(d.value)
    return float(d.value)



__all__ = ["WJoinParams", "resolve_bound", "METHODS"]
