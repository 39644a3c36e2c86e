"""Engine parameters: one frozen dataclass per engine, validated once at construction."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from smerge.errors import UsageError, param
from smerge.memory import check_fits
from smerge.merge.values import check_count, check_eps, check_fraction, check_window_size, eps_per_key

DEFAULT_WINDOW_SIZE = 5000
DEFAULT_LEAST_INCREMENT = 1000
DEFAULT_DELTA_WINDOWS = 10
# Upper bounds (README lists them; MAX_WINDOW_SIZE is merge.values'): the engines allocate their
# window buffers, about 200 bytes per record of N for three keys, up front.
WINDOW_RECORD_BYTES = 200
MAX_DELTA_WINDOWS = 10**9
NAN_KEY_POLICIES = ("error", "unmatched")


def resolve_eps(eps: float | Sequence[float] | Mapping[str, float], keys: Sequence[str]) -> tuple[float, ...]:
    """One tolerance per key: a scalar applies to all keys; a mapping names keys (others 0).
    The values are checked once, by the parameters they go into (``check_common``)."""
    return eps_per_key(eps, keys)


@dataclass(frozen=True)
class MergeKeys:
    """Key column names in A and in B (same length, compared position by position)."""

    a: tuple[str, ...]
    b: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.a:
            raise UsageError(f"no merge keys: pass {param.keys} K1,K2 (tabular inputs have no default keys)")
        if len(self.a) != len(self.b):
            raise UsageError(
                f"A has {len(self.a)} keys ({', '.join(self.a)}) but B has {len(self.b)} "
                f"({', '.join(self.b)}); give both the same number of keys with {param.keys}/{param.keys_b}"
            )


def check_common(p) -> None:
    """Checks shared by the engines' parameter classes (window size, eps, NaN policy, delta)."""
    n = check_window_size(p.window_size)
    check_fits(n * WINDOW_RECORD_BYTES, f"{param.window_size} {n:,} (its buffers are allocated up front)",
               f"lower {param.window_size}")
    check_eps(p.eps, p.keys.a)
    if p.nan_keys not in NAN_KEY_POLICIES:
        raise UsageError(f"{param.nan_keys} is {p.nan_keys!r}; use one of {', '.join(NAN_KEY_POLICIES)}")
    if p.delta is not None:
        check_fraction(p.delta, param.delta, zero=True, note="(the allowed drop rate)")
    check_count(p.delta_windows, param.delta_windows, 1, MAX_DELTA_WINDOWS)


def check_adapt(adapt: bool, delta: float | None) -> None:
    """Adaptive K (docs/semantics.md section 10) needs the delta target it holds."""
    if adapt and delta is None:
        raise UsageError(f"{param.adapt} tunes K to hold the moving drop rate at or under {param.delta}; "
                         f"give {param.delta} D too")


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
        for name, k in ((param.least_increment_a, self.least_increment_a), (param.least_increment_b, self.least_increment_b)):
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
