"""Parameters of the RTM merge (docs/semantics.md section 5): one frozen dataclass, validated once."""

from __future__ import annotations

from dataclasses import dataclass, field

from smerge.errors import UsageError, param
from smerge.merge.params import DEFAULT_DELTA_WINDOWS, DEFAULT_WINDOW_SIZE, MergeKeys, check_common

REFILL_MODES = ("page", "symdiff")
DEFAULT_FETCH_ROWS = 262144


@dataclass(frozen=True)
class RTMParams:
    """``window_size`` is N (A-window and B-window size, records); ``eps`` one tolerance per key;
    ``refill`` is ``page`` (default; every window B swept until dry, lossless with eps = 0) or
    ``symdiff`` (the paper's variant).

    ``fetch_rows`` caps how many records one range request may bring back in page mode: the
    client asks for N first, then doubles up to this cap and slices the result into N-record
    windows B, so the windows are exactly the paper's pages; it changes the number of round
    trips, never the result.
    """

    keys: MergeKeys
    eps: tuple[float, ...]
    window_size: int = DEFAULT_WINDOW_SIZE
    refill: str = "page"
    with_ids: bool = False
    nan_keys: str = "error"
    delta: float | None = None
    delta_windows: int = DEFAULT_DELTA_WINDOWS
    fetch_rows: int = field(default=DEFAULT_FETCH_ROWS, compare=False)

    def __post_init__(self) -> None:
        check_common(self)
        if self.refill not in REFILL_MODES:
            raise UsageError(f"{param.refill} is {self.refill!r}; use page (lossless) or symdiff (the paper's)")
        if self.fetch_rows < 1:
            raise UsageError(f"fetch_rows is {self.fetch_rows}; use an integer >= 1")

    def as_dict(self) -> dict:
        return {
            "keys_a": list(self.keys.a),
            "keys_b": list(self.keys.b),
            "eps": dict(zip(self.keys.a, self.eps)),
            "window_size": self.window_size,
            "refill": self.refill,
            "with_ids": self.with_ids,
            "nan_keys": self.nan_keys,
            "delta": self.delta,
            "delta_windows": self.delta_windows,
        }
