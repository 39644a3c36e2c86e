"""References for the W-join tests: the DuckDB SQL oracle and a brute-force purge rule.

Independent of smerge.merge.wjoin: the SQL is written from docs/semantics.md section 6 and the purge
rule is replayed record by record in plain Python.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import duckdb
import numpy as np
import pyarrow as pa


def oracle_tuples(tables: Sequence[pa.Table], time_col: str, windows: Mapping[tuple[int, int], float],
                  where_sql: str | None = None, datetime: bool = False) -> list[tuple[int, ...]]:
    """Row-id tuples of the equivalent SQL query, sorted. Tables are s1..sn; ``windows`` has 0-based pairs."""
    con = duckdb.connect()
    n = len(tables)
    for i, t in enumerate(tables):
        con.register(f"s{i + 1}", t.append_column("_r", pa.array(np.arange(t.num_rows, dtype=np.int64))))
    conds = []
    for (i, j), w in windows.items():
        a, b = f"s{i + 1}.{time_col}", f"s{j + 1}.{time_col}"
        if datetime:
            a, b = f"epoch_ns({a})", f"epoch_ns({b})"
        conds.append(f"abs({a} - {b}) <= {w!r}")
    if where_sql:
        conds.append(f"({where_sql})")
    sel = ", ".join(f"s{i + 1}._r" for i in range(n))
    frm = ", ".join(f"s{i + 1}" for i in range(n))
    q = f"SELECT {sel} FROM {frm}" + (" WHERE " + " AND ".join(conds) if conds else "")
    rows = con.execute(q).fetchall()
    con.close()
    return sorted(tuple(int(x) for x in r) for r in rows)


def shortest_paths(n: int, windows: Mapping[tuple[int, int], float]) -> list[list[float]]:
    d = [[0.0 if i == j else math.inf for j in range(n)] for i in range(n)]
    for (i, j), w in windows.items():
        d[i][j] = d[j][i] = min(d[i][j], w)
    for k in range(n):
        for i in range(n):
            for j in range(n):
                if d[i][k] + d[k][j] < d[i][j]:
                    d[i][j] = d[i][k] + d[k][j]
    return d


def arrival_order(times: Sequence[Sequence[float]]) -> list[tuple[int, int]]:
    """(stream, row) in arrival order: by time, then stream number, then position."""
    recs = [(t, s, r) for s, ts in enumerate(times) for r, t in enumerate(ts)]
    recs.sort()
    return [(s, r) for _, s, r in recs]


def rule_drop_index(times: Sequence[Sequence[float]], dist, exhaustion: bool) -> dict[tuple[int, int], int]:
    """For each record, the first arrival index after which the purge rule allows dropping it.

    Without ``exhaustion`` this is the rule of docs/semantics.md section 6; with it, a stream counts as +inf after its
    last record arrived (the most a correct engine may drop). Records never droppable are absent.
    """
    n = len(times)
    order = arrival_order(times)
    last = {s: max((g for g, (s2, _) in enumerate(order) if s2 == s), default=-1) for s in range(n)}
    latest = [-math.inf] * n
    for s in range(n):
        if exhaustion and last[s] == -1:
            latest[s] = math.inf
    buffered: list[list[int]] = [[] for _ in range(n)]
    out = {}
    for g, (i, r) in enumerate(order):
        latest[i] = math.inf if (exhaustion and last[i] == g) else times[i][r]
        buffered[i].append(r)
        for j in range(n):
            keep = []
            for y in buffered[j]:
                if all(latest[k] > times[j][y] + dist[j][k] for k in range(n) if k != j):
                    out[(j, y)] = g
                else:
                    keep.append(y)
            buffered[j] = keep
    return out
