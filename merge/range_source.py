"""What the RTM engine needs of an index of B: boxes over the keys, and pages of B records.

RTM (``smerge.merge.rtm``) asks a *range source* for the B records inside a box, N at a time.
Anything with ``range_query``/``symdiff_query`` returning ``(table, next_token)`` is one: the
index server's client (``smerge.transport.flight_client.IndexClient``) or an in-process index
(``smerge.index.LocalSource``). Both are built on the types here, so the engine depends on no
index, server or file code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import pyarrow as pa

ROW_ID_COLUMN = "__smerge_row"  # a page's column holding each B record's row id (its position in B)


@dataclass(frozen=True)
class Box:
    """A closed axis-aligned box over the d keys: ``lo[j] <= k_j <= hi[j]``; ``lo > hi`` on any
    key is an empty box, ``lo == hi`` a degenerate one; +-inf bounds are allowed."""

    lo: tuple[float, ...]
    hi: tuple[float, ...]

    @property
    def empty(self) -> bool:
        return any(l > h for l, h in zip(self.lo, self.hi))

    def as_json(self) -> dict:
        return {"lo": list(self.lo), "hi": list(self.hi)}

    @classmethod
    def from_arrays(cls, lo: Sequence[float], hi: Sequence[float]) -> "Box":
        return cls(tuple(float(x) for x in lo), tuple(float(x) for x in hi))


class RangeSource(Protocol):
    """What RTM needs of the index server (docs/semantics.md section 5): the B records inside a
    box (``range_query``) or inside exactly one of two boxes (``symdiff_query``), with their row
    ids in ``ROW_ID_COLUMN``, sorted by (key, row id), at most ``limit`` per call, and the token
    of the next page (None after the last)."""

    def range_query(self, box: Box, *, limit: int, token: str | None = None) -> tuple[pa.Table, str | None]: ...

    def symdiff_query(self, box1: Box, box2: Box, *, limit: int,
                      token: str | None = None) -> tuple[pa.Table, str | None]: ...

    # Optional: ``prefetch(box, limit=...)`` announces the next A window's first range request
    # (same box and limit, no token) so that a source may start it while this window is swept.
