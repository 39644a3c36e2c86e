"""The statistics of a W-join run (``WJoinStats``; ``smerge wjoin --stats``, ``smerge plot``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from smerge.merge.stats import BoundedSeries


@dataclass
class WJoinStats:
    aliases: tuple[str, ...] = ()
    method: str = ""
    tuples: int = 0
    records_read: list[int] = field(default_factory=list)
    peak_buffered: list[int] = field(default_factory=list)
    peak_buffered_total: int = 0
    peak_held: list[int] = field(default_factory=list)
    chunks: int = 0
    block_splits: int = 0  # blocks of arrivals halved to bound the partial tuples held at once
    join_seconds: float = 0.0
    # After each chunk: records read, tuples so far, records buffered per stream (at most
    # stats.MAX_SERIES rows, evenly thinned; for `smerge plot`).
    timeline: BoundedSeries | None = None
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        a = self.aliases
        d = {
            "algorithm": "wjoin", "method": self.method, "streams": len(a), "tuples": self.tuples,
            "records_read": dict(zip(a, self.records_read)), "peak_buffered": dict(zip(a, self.peak_buffered)),
            "peak_buffered_total": self.peak_buffered_total, "peak_held": dict(zip(a, self.peak_held)),
            "chunks": self.chunks, "block_splits": self.block_splits, "join_seconds": self.join_seconds,
        }
        if self.timeline is not None and self.timeline.rows:
            d["timeline"] = self.timeline.as_dict()
        d.update(self.extra)
        return d



__all__ = ["WJoinStats"]
