"""Brute-force maximum bipartite matching (Kuhn's augmenting paths) of the eps-graph: the
reference for ``merge.ceiling`` on small cases. O(V E); only for tests."""

from __future__ import annotations

import sys


def eps_edges(a, b, eps) -> list[list[int]]:
    """adj[i] = the B indices within eps of A record i on every key (records are tuples)."""
    return [[j for j, y in enumerate(b) if all(abs(p - q) <= e for p, q, e in zip(x, y, eps))] for x in a]


def max_matching(adj: list[list[int]], nb: int) -> int:
    match_b = [-1] * nb
    sys.setrecursionlimit(max(1000, 4 * (len(adj) + nb) + 100))

    def augment(v: int, seen: list[bool]) -> bool:
        for w in adj[v]:
            if not seen[w]:
                seen[w] = True
                if match_b[w] < 0 or augment(match_b[w], seen):
                    match_b[w] = v
                    return True
        return False

    return sum(augment(v, [False] * nb) for v in range(len(adj)))
