"""Pages of an index query and their continuation tokens.

A page holds B row ids in (key, row id) order. Its token is stateless: the sort rank of the
last record returned and a fingerprint of the query (operation and boxes), so a retried or
resumed call (even against a restarted server on the same persisted index) returns exactly the
next records, and a token of another query is refused.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from smerge.errors import UsageError
from smerge.merge.range_source import Box


@dataclass(frozen=True)
class Page:
    """One page of a query: B row ids in (key, row id) order and the token of the next page."""

    rows: np.ndarray
    next_token: str | None


def fingerprint(op: str, boxes: Sequence[Box]) -> str:
    """12 hex digits naming a query (its operation and boxes), carried in its tokens."""
    body = json.dumps([op] + [b.as_json() for b in boxes], separators=(",", ":"))
    return hashlib.blake2b(body.encode(), digest_size=6).hexdigest()


def parse_token(token: str | None, fp: str) -> int:
    """The sort rank after which the next page starts (-1: from the beginning)."""
    if token is None or token == "":
        return -1
    rank, sep, tfp = str(token).partition(".")
    if not sep or tfp != fp or not (rank.isascii() and rank.isdigit()) or len(rank) > 19:
        shown = token if len(token) <= 40 else token[:37] + "..."
        raise UsageError(f"continuation token {shown!r} does not belong to this query; "
                         "start the query again without a token")
    return int(rank)
