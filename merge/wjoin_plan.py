"""The W-join's plan: everything derived once from the parameters and the streams' schemas.

The time representation shared by all streams, the window bounds and their shortest paths, the
predicate (``--on`` equalities and ``--where``) split into conjuncts, the equality classes that
cover every stream (the HW-join's hash keys), per arriving stream the order in which the other
streams are probed and the conjuncts applied at each level, and the output schema.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pyarrow as pa

from smerge.errors import UsageError, param
from smerge.merge import expr as X
from smerge.merge._wjoin_kernel import INT_POS
from smerge.merge.wjoin_params import WJoinParams, resolve_bound


def _time_kind(schemas: Sequence[pa.Schema], cols: Sequence[str], aliases: Sequence[str],
               sources: Sequence[str] | None = None) -> str:
    """One time representation for all streams: "datetime" (int64 ns; some stream has ns
    timestamps), "datetime_us" (int64 us: every timestamp is s/ms/us or a date, e.g. decoded CF
    times), "cf:<calendar>" (decoded CF times in a non-standard calendar, int64 us), "int" or
    "float". A "+cf" suffix marks decoded CF times (plain-number bounds are refused).
    ``sources`` (the inputs' paths, optional) name the streams in the messages."""
    kinds: dict[str, list[str]] = {}
    cf = False
    names = [f"{a} ({src})" if src else a for a, src in zip(aliases, sources or [None] * len(aliases))]
    for k, (s, c, a, name) in enumerate(zip(schemas, cols, aliases, names)):
        if c not in s.names:
            raise UsageError(f"{a}: no time column {c!r}; it has {', '.join(s.names)} (use {param.time}, or choose "
                             f"variables on a time dimension with {param.vars} {k + 1}=V1,V2)")
        f = s.field(c)
        t, md = f.type, f.metadata or {}
        cf = cf or b"smerge.cf_units" in md
        if b"smerge.cf_units" in md and not pa.types.is_timestamp(t):
            k = f"cf:{md.get(b'calendar', b'?').decode()}"
        elif pa.types.is_timestamp(t):
            k = "datetime" if t.unit == "ns" else "datetime_us"
        elif pa.types.is_date(t):
            k = "datetime_us"
        elif pa.types.is_integer(t):
            k = "int"
        elif pa.types.is_floating(t):
            k = "float"
        else:
            raise UsageError(f"{name}: time column {c!r} has type {t}; it must be numeric or a datetime")
        kinds.setdefault(k, []).append(f"{name} has {c!r} as {_kind_words(k)}")
    groups = {("time" if k.startswith(("datetime", "cf:")) else "number") for k in kinds}
    cals = [k for k in kinds if k.startswith("cf:")]
    if len(groups) > 1 or len(cals) > 1 or (cals and len(kinds) > 1):
        raise UsageError("time columns cannot be compared: " + "; ".join(x for v in kinds.values() for x in v)
                         + "; give every stream the same kind of time (and the same calendar)")
    if cals:
        return cals[0]
    # The unit a plain-number bound is in: the timestamps' own unit when all streams share one.
    units = {s.field(c).type.unit if pa.types.is_timestamp(s.field(c).type) else "?" for s, c in zip(schemas, cols)}
    plain = f"@{units.pop()}" if len(units) == 1 and "?" not in units else ""
    if "datetime" in kinds:
        return ("datetime+cf" if cf else "datetime") + plain
    if "datetime_us" in kinds:
        return ("datetime_us+cf" if cf else "datetime_us") + plain
    return "float" if "float" in kinds else "int"


def _kind_words(k: str) -> str:
    if k.startswith("cf:"):
        return f"time in the {k[3:]} calendar"
    return {"datetime": "timestamp[ns]", "datetime_us": "timestamp", "int": "integer", "float": "number"}[k]


@dataclass
class Plan:
    n: int
    kind: str
    wmat: np.ndarray  # direct bounds (inf = none), float64 for checks
    dist: np.ndarray  # shortest paths, in the time dtype
    dtype: type
    predicate: X.Node | None
    hash_terms: list[list[X.Col]] | None  # per stream: its term of each full equality class
    orders: list[list[int]]  # per arriving stream: the other streams, in probe order
    level_conj: list[list[list[X.Node]]]  # [arriving stream][level] -> conjuncts to apply
    out_schema: pa.Schema
    out_names: list[list[tuple[str, str]]]  # per stream: (column, output name)
    id_names: list[str]
    aliases: tuple[str, ...] = ()
    # [arriving stream][level] -> band conjuncts checked inside the probe of that level (taken
    # out of level_conj): see BandTerm
    level_band: list[list[list["BandTerm"]]] = field(default_factory=list)
    # per stream: its floating-point columns the predicate (--on, --where) reads, where a NaN
    # is refused (see merge/wjoin.py: SQL and IEEE disagree on NaN)
    float_cols: list[list[str]] = field(default_factory=list)


@dataclass(frozen=True)
class BandTerm:
    """A conjunct ``cand OP par`` between the stream probed at a level and one already bound,
    both sides float64 columns, each optionally plus or minus a numeric literal (``adj``:
    ("+" or "-", value) or None). Checked inside the compiled probe, before a pair is formed,
    with the arithmetic Arrow uses (float64; NULL as NaN, which fails every comparison)."""

    op: str  # "<", "<=", ">", ">=" with the probed stream on the left
    cand: tuple[int, str, tuple[str, float] | None]  # (stream, column, adj)
    par: tuple[int, str, tuple[str, float] | None]


_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}


def _band_side(x: X.Node, schemas: Sequence[pa.Schema]):
    """(stream, column, adj) when ``x`` is a float64 column, alone or plus/minus a numeric literal."""
    adj = None
    if isinstance(x, X.Arith) and x.op in ("+", "-"):
        col, lit = x.left, x.right
        if x.op == "+" and isinstance(col, X.Lit):
            col, lit = lit, col
        if not (isinstance(col, X.Col) and isinstance(lit, X.Lit) and lit.kind == "num"
                and type(lit.value) in (int, float) and (type(lit.value) is float or abs(lit.value) <= 2**53)):
            return None
        adj, x = (x.op, float(lit.value)), col
    if not isinstance(x, X.Col) or schemas[x.stream].field(x.name).type != pa.float64():
        return None
    return x.stream, x.name, adj


def _band_term(c: X.Node, j: int, schemas: Sequence[pa.Schema]) -> BandTerm | None:
    """``c`` as a BandTerm with stream ``j`` as the candidate side, or None."""
    if not isinstance(c, X.Cmp) or c.op not in _FLIP:
        return None
    left, right = _band_side(c.left, schemas), _band_side(c.right, schemas)
    if left is None or right is None or left[0] == right[0]:
        return None
    if left[0] == j:
        return BandTerm(c.op, left, right)
    if right[0] == j:
        return BandTerm(_FLIP[c.op], right, left)
    return None


def make_plan(schemas: Sequence[pa.Schema], params: WJoinParams, *, sources: Sequence[str] | None = None) -> Plan:
    n = params.n_streams
    if len(schemas) != n:
        raise UsageError(f"{len(schemas)} schemas for {n} streams")
    kind = _time_kind(schemas, params.time, params.aliases, sources)
    g = params.constraint_graph()
    inf = math.inf
    w = np.full((n, n), inf)
    for (i, j), d in g.items():
        w[i, j] = w[j, i] = resolve_bound(d, kind, f"window {params.aliases[i]},{params.aliases[j]}")
    np.fill_diagonal(w, 0)
    dist = w.copy()
    for k in range(n):  # Floyd-Warshall on <= a handful of streams
        dist = np.minimum(dist, dist[:, [k]] + dist[[k], :])
    dtype = np.float64 if kind == "float" else np.int64
    if dtype is np.int64:
        # The probes and purges add bounds to times: 2^61 keeps the sums in int64. Every pair's
        # bound counts: its own window, or the one the other windows imply (a chain of them).
        for i in range(n):
            for j in range(i + 1, n):
                bound, how = ((w[i, j], "") if math.isfinite(w[i, j]) else
                              (dist[i, j], " (implied by the windows through the other streams)"))
                if bound > INT_POS // 4:
                    unit = "nanoseconds" if kind.startswith("datetime") else "units of the time column"
                    raise UsageError(f"window {params.aliases[i]},{params.aliases[j]}{how} is {bound:,.0f} {unit}, "
                                     f"beyond the {INT_POS // 4:,} this join can bound (about 73 years in nanoseconds); "
                                     "give shorter windows, or cast the time columns to a coarser unit (timestamp[us])")
        dist_t = np.array([[int(min(v, INT_POS // 4)) for v in row] for row in dist], dtype=np.int64)
    else:
        dist_t = dist.astype(np.float64)
    # predicate: --on equalities + --where
    conj: list[X.Node] = []
    for c in params.on:
        for s, a in enumerate(params.aliases):
            if c not in schemas[s].names:
                raise UsageError(f"{param.on} {c}: stream {a} has no column {c!r}; it has {', '.join(schemas[s].names)}")
        text = " and ".join(f"{params.aliases[0]}.{c} == {params.aliases[s]}.{c}" for s in range(1, n))
        conj += X.conjuncts(X.parse_expr(text, params.aliases, schemas))
    if params.where:
        conj += X.conjuncts(X.parse_expr(params.where, params.aliases, schemas))
    predicate = X.conjoin(conj)
    hash_terms = _full_classes(conj, n)
    method = params.method
    if method == "hash" and hash_terms is None:
        raise UsageError(f"HW-join (method hash) needs equalities linking every stream ({param.on} COLS or "
                         f"S1.a = S2.a = ... in {param.where}); none cover all streams")
    if method == "nested-loop":
        hash_terms = None
    orders, level_conj, level_band = [], [], []
    sets = [X.streams_of(c) for c in conj]
    for i in range(n):
        bound, order = [i], []
        while len(order) < n - 1:
            rest = [j for j in range(n) if j not in bound]
            def score(j):
                # Prefer a stream an equality links to the bound ones (a hash probe), then the
                # nearest in time, then the one that closes the most conjuncts.
                closes = sum(1 for s in sets if j in s and s <= set(bound) | {j})
                linked = any(j in s and s <= set(bound) | {j} and X.equality_terms(c) is not None
                             for c, s in zip(conj, sets))
                return (not linked, min(dist[b, j] for b in bound), -closes, j)
            j = min(rest, key=score)
            order.append(j)
            bound.append(j)
        levels: list[list[X.Node]] = [[] for _ in range(n)]
        for c, s in zip(conj, sets):
            lvl = max((bound.index(x) for x in s), default=0)
            levels[lvl].append(c)
        bands: list[list[BandTerm]] = [[] for _ in range(n)]
        for lvl in range(1, n):
            terms = [(c, _band_term(c, order[lvl - 1], schemas)) for c in levels[lvl]]
            bands[lvl] = [b for _, b in terms if b is not None]
            levels[lvl] = [c for c, b in terms if b is None]
        orders.append(order)
        level_conj.append(levels)
        level_band.append(bands)
    out_fields, out_names, id_names = [], [], []
    used = set()
    for s, a in enumerate(params.aliases):
        names = []
        for f in schemas[s]:
            nm = f"{a}_{f.name}"
            names.append((f.name, nm))
            out_fields.append(f.with_name(nm))  # keeps the field metadata (a CF time's units, calendar)
            used.add(nm)
        out_names.append(names)
    if params.with_ids:
        for a in params.aliases:
            nm = f"{a}_row"
            while nm in used:
                nm += "_"
            used.add(nm)
            id_names.append(nm)
            out_fields.append(pa.field(nm, pa.int64()))
    read = X.columns_of(predicate)
    float_cols = [sorted(c for s2, c in read if s2 == s and pa.types.is_floating(schemas[s].field(c).type))
                  for s in range(n)]
    return Plan(n=n, kind=kind, wmat=w, dist=dist_t, dtype=dtype, predicate=predicate, hash_terms=hash_terms,
                 orders=orders, level_conj=level_conj, level_band=level_band, out_schema=pa.schema(out_fields), out_names=out_names,
                 id_names=id_names, aliases=tuple(params.aliases), float_cols=float_cols)


def _full_classes(conj: Sequence[X.Node], n: int) -> list[list[X.Col]] | None:
    """Equality classes (union of ``Si.a == Sj.b`` conjuncts) that hold a term of every stream."""
    parent: dict = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    for c in conj:
        eq = X.equality_terms(c)
        if eq:
            l, r = eq
            parent[find((l.stream, l.name))] = find((r.stream, r.name))
    classes: dict = {}
    kinds: dict = {}
    for c in conj:
        eq = X.equality_terms(c)
        if eq:
            for t in eq:
                classes.setdefault(find((t.stream, t.name)), {}).setdefault(t.stream, t)
                kinds[find((t.stream, t.name))] = t.kind
    full = [cls for cls in classes.values() if len(cls) == n]
    if not full:
        return None
    return [[cls[s] for cls in full] for s in range(n)]




def output_schema(schemas: Sequence[pa.Schema], params: WJoinParams) -> pa.Schema:
    return make_plan(schemas, params).out_schema


__all__ = ["Plan", "BandTerm", "make_plan", "output_schema"]
