"""Engine parameters: one frozen dataclass per engine, validated once at construction."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from smerge.errors import UsageError
from smerge.memory import check_fits

DEFAULT_WINDOW_SIZE = 5000
DEFAULT_LEAST_INCREMENT = 1000
DEFAULT_DELTA_WINDOWS = 10
# Upper bounds (README lists them): the engines allocate their window buffers, about 200 bytes
# per record of N for three keys, up front; a larger N cannot be a real request.
MAX_WINDOW_SIZE = 10**9
WINDOW_RECORD_BYTES = 200
MAX_DELTA_WINDOWS = 10**9
NAN_KEY_POLICIES = ("error", "unmatched")


def resolve_eps(eps: float | Sequence[float] | Mapping[str, float], keys: Sequence[str]) -> tuple[float, ...]:
    """One tolerance per key: a scalar applies to all keys; a mapping names keys (others 0)."""
    if isinstance(eps, Mapping):
        unknown = sorted(set(eps) - set(keys))
        if unknown:
            raise UsageError(
                f"--eps names {', '.join(unknown)}, which are not merge keys; the keys are {', '.join(keys)}"
            )
        out = tuple(float(eps.get(k, 0.0)) for k in keys)
    elif isinstance(eps, (int, float)):
        out = (float(eps),) * len(keys)
    else:
        out = tuple(float(e) for e in eps)
        if len(out) != len(keys):
            raise UsageError(f"--eps has {len(out)} values but there are {len(keys)} keys ({', '.join(keys)})")
    for k, e in zip(keys, out):
        if math.isnan(e) or e < 0 or math.isinf(e):
            raise UsageError(f"--eps for key {k!r} is {e}; a tolerance must be a finite number >= 0")
    return out


@dataclass(frozen=True)
class MergeKeys:
    """Key column names in A and in B (same length, compared position by position)."""

    a: tuple[str, ...]
    b: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.a:
            raise UsageError("no merge keys: pass --keys K1,K2 (tabular inputs have no default keys)")
        if len(self.a) != len(self.b):
            raise UsageError(
                f"A has {len(self.a)} keys ({', '.join(self.a)}) but B has {len(self.b)} "
                f"({', '.join(self.b)}); give both the same number of keys with --keys/--keys-b"
            )


def check_common(p) -> None:
    """Checks shared by the engines' parameter classes (window size, eps, NaN policy, delta)."""
    n = p.window_size
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_WINDOW_SIZE:
        raise UsageError(f"--window is {n}; the window size N must be an integer from 1 to 10^9 "
                         "(its buffers, about 200 bytes a record, are allocated up front)")
    check_fits(n * WINDOW_RECORD_BYTES, f"--window {n:,} (its buffers are allocated up front)", "lower --window")
    if len(p.eps) != len(p.keys.a):
        raise UsageError(f"{len(p.eps)} tolerances for {len(p.keys.a)} keys")
    for k, e in zip(p.keys.a, p.eps):
        if math.isnan(e) or e < 0 or math.isinf(e):
            raise UsageError(f"--eps for key {k!r} is {e}; a tolerance must be a finite number >= 0")
    if p.nan_keys not in NAN_KEY_POLICIES:
        raise UsageError(f"--nan-keys is {p.nan_keys!r}; use one of {', '.join(NAN_KEY_POLICIES)}")
    if p.delta is not None and (isinstance(p.delta, bool) or not isinstance(p.delta, (int, float))
                                or not 0.0 <= p.delta <= 1.0):
        raise UsageError(f"--delta is {p.delta}; the allowed drop rate is a fraction in [0, 1]")
    m = p.delta_windows
    if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= MAX_DELTA_WINDOWS:
        raise UsageError(f"--delta-windows is {m}; use an integer from 1 to 10^9")


def check_adapt(adapt: bool, delta: float | None) -> None:
    """Adaptive K (docs/semantics.md section 10) needs the delta target it holds."""
    if adapt and delta is None:
        raise UsageError("--adapt tunes K to hold the moving drop rate at or under --delta; give --delta D too")


@dataclass(frozen=True)
class CGMParams:
    """Parameters of the CGM merge (docs/semantics.md section 3).

    ``window_size`` is N; ``least_increment_a``/``_b`` are K_A/K_B with 0 < K <= N;
    ``eps`` has one tolerance per key (in the key's unit). With ``adapt`` (needs ``delta``) the
    K's are the starting values, and ``merge.adapt.DeltaController`` moves them within
    ``adapt_k_range`` between report windows (docs/semantics.md section 10).
    """

    keys: MergeKeys
    eps: tuple[float, ...]
    window_size: int = DEFAULT_WINDOW_SIZE
    least_increment_a: int = DEFAULT_LEAST_INCREMENT
    least_increment_b: int = DEFAULT_LEAST_INCREMENT
    with_ids: bool = False
    nan_keys: str = "error"
    delta: float | None = None
    delta_windows: int = DEFAULT_DELTA_WINDOWS
    adapt: bool = False
    out_batch_rows: int = field(default=65536, compare=False)

    def __post_init__(self) -> None:
        check_common(self)
        n = self.window_size
        for name, k in (("--increment-a", self.least_increment_a), ("--increment-b", self.least_increment_b)):
            if isinstance(k, bool) or not isinstance(k, int) or k < 1:
                raise UsageError(f"{name} is {k}; the least window increment K must be an integer >= 1")
            if k > n:
                raise UsageError(f"{name} is {k} but the window size N is {n}; use K <= N")
        check_adapt(self.adapt, self.delta)

    @property
    def adapt_k_range(self) -> tuple[int, int]:
        """The bounds [1, N] within which ``adapt`` moves K_A and K_B (docs/semantics.md section 10)."""
        return 1, self.window_size

    def as_dict(self) -> dict:
        return {
            "keys_a": list(self.keys.a),
            "keys_b": list(self.keys.b),
            "eps": dict(zip(self.keys.a, self.eps)),
            "window_size": self.window_size,
            "least_increment_a": self.least_increment_a,
            "least_increment_b": self.least_increment_b,
            "with_ids": self.with_ids,
            "nan_keys": self.nan_keys,
            "delta": self.delta,
            "delta_windows": self.delta_windows,
            **({"adapt": True, "adapt_k_range": list(self.adapt_k_range)} if self.adapt else {}),
        }
