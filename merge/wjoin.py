"""W-join: multi-way sliding-window join of time-stamped streams (docs/semantics.md section 6, seed 6.2).

``wjoin(streams, schemas, params)`` consumes n >= 2 iterators of ``pyarrow.RecordBatch`` (each
in non-decreasing time order) and yields record batches of joined n-tuples: every
(x_1..x_n) with the predicate TRUE and |t(x_i) - t(x_j)| <= w_ij for every constrained pair,
exactly once, as formed when its last member arrives. Arrival order interleaves the streams
by timestamp, ties by stream number, then position.

Execution: records are taken from the inputs in *chunks* — everything strictly below the
smallest last-loaded timestamp of the live streams, so no later record can precede them. The
arrivals of a chunk are processed as a left-deep pipeline, vectorised over all arrivals of
one stream at a time: an arrival probes the next stream's buffer (NLW-join: the time period
allowed by the bounds; HW-join: the hash bucket of its equality key inside that period) and
only buffer records that arrived *before* it (so each tuple is formed once), then the
conjuncts of the predicate whose streams are all bound filter the partial tuples. After the
chunk the purge rule is replayed record by record (``_wjoin_kernel.purge_walk``): a buffered
record x of S_i is dropped once, for every other stream j, the latest timestamp seen on S_j
exceeds t(x) + D_ij (D = shortest paths in the graph of window bounds). An exhausted stream
counts as +infinity (no later record of it can join).

Memory: the buffers (records the rule keeps) plus one chunk of input per stream — never the
whole stream. ``WJoinStats.peak_buffered`` reports the buffers per arrival as the rule defines
them; ``peak_held`` the records physically held (buffer + current chunk + read-ahead).
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from smerge.errors import InputError, UsageError
from smerge.merge import expr as X
from smerge.merge._wjoin_kernel import INT_NEG, INT_POS, BucketIndex, expand_ranges, purge_walk
from smerge.merge.hashing import mix64 as _mix
from smerge.merge.stats import BoundedSeries
from smerge.merge.values import NS_PER_UNIT, Duration, parse_duration

DEFAULT_OUTPUT_ROWS = 65536
# Partial tuples of one level above which a block of arrivals is cut (2^18: the index arrays and
# the columns a predicate reads stay a few tens of MB; 2^20 cost ~30 MB more peak memory on a
# 48k + 48k band join and no time).
SPLIT_TUPLES = 1 << 18
# One arrival's partial tuples at one level. Each is held in about 2n + 4 int64 index arrays
# (members, times, parents) and, at the last level, in every output column before the block is
# written: 4M keeps a 3-way step under ~1 GB (32M reached 5.5 GB and was killed by a 2 GB
# address-space limit with an inequality between two of the streams).
MAX_PARTIAL_TUPLES = 4_000_000
METHODS = ("auto", "hash", "nested-loop")
_ALIAS_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# ---- parameters -----------------------------------------------------------------------------

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
            raise UsageError(f"--time names {len(self.time)} columns for {n} streams; give one name or one per stream")
        object.__setattr__(self, "time", t)
        aliases = tuple(self.aliases) or tuple(f"S{i + 1}" for i in range(n))
        if len(aliases) != n:
            raise UsageError(f"--aliases gives {len(aliases)} names for {n} streams")
        for a in aliases:
            if not _ALIAS_RE.match(a):
                raise UsageError(f"alias {a!r} is not a name (letters, digits, _; not starting with a digit)")
        if len({a.lower() for a in aliases}) != n:
            raise UsageError(f"aliases {', '.join(aliases)} are not distinct")
        object.__setattr__(self, "aliases", aliases)
        if self.window is not None:
            object.__setattr__(self, "window", parse_duration(self.window, "--window"))
        pw = []
        for i, j, d in self.pair_windows:
            if not (0 <= i < n and 0 <= j < n) or i == j:
                raise UsageError(f"--pair-window {i + 1},{j + 1}: stream numbers must be two different values "
                                 f"in 1..{n}")
            pw.append((i, j, None if d is None else parse_duration(d, "--pair-window")))
        object.__setattr__(self, "pair_windows", tuple(pw))
        if self.method not in METHODS:
            raise UsageError(f"method {self.method!r} is not one of {', '.join(METHODS)}")
        if self.window is None and not pw:
            raise UsageError("no window: give --window DUR (all pairs) and/or --pair-window I,J=DUR")
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
                "their buffers would grow without limit; add --window or --pair-window I,J=DUR")
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


# ---- statistics -----------------------------------------------------------------------------

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


# ---- the plan: everything derived from params + schemas, once ------------------------------

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
            raise UsageError(f"{a}: no time column {c!r}; it has {', '.join(s.names)} (use --time, or choose "
                             f"variables on a time dimension with --vars {k + 1}=V1,V2)")
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
class _Plan:
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


def make_plan(schemas: Sequence[pa.Schema], params: WJoinParams, *, sources: Sequence[str] | None = None) -> _Plan:
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
        dist_t = np.array([[int(min(v, INT_POS // 4)) for v in row] for row in dist], dtype=np.int64)
    else:
        dist_t = dist.astype(np.float64)
    # predicate: --on equalities + --where
    conj: list[X.Node] = []
    for c in params.on:
        for s, a in enumerate(params.aliases):
            if c not in schemas[s].names:
                raise UsageError(f"--on {c}: stream {a} has no column {c!r}; it has {', '.join(schemas[s].names)}")
        text = " and ".join(f"{params.aliases[0]}.{c} == {params.aliases[s]}.{c}" for s in range(1, n))
        conj += X.conjuncts(X.parse_expr(text, params.aliases, schemas))
    if params.where:
        conj += X.conjuncts(X.parse_expr(params.where, params.aliases, schemas))
    predicate = X.conjoin(conj)
    hash_terms = _full_classes(conj, n)
    method = params.method
    if method == "hash" and hash_terms is None:
        raise UsageError("HW-join (method hash) needs equalities linking every stream (--on COLS or "
                         "S1.a = S2.a = ... in --where); none cover all streams")
    if method == "nested-loop":
        hash_terms = None
    orders, level_conj = [], []
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
        orders.append(order)
        level_conj.append(levels)
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
    return _Plan(n=n, kind=kind, wmat=w, dist=dist_t, dtype=dtype, predicate=predicate, hash_terms=hash_terms,
                 orders=orders, level_conj=level_conj, out_schema=pa.schema(out_fields), out_names=out_names,
                 id_names=id_names, aliases=tuple(params.aliases))


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


# ---- hashing of equality keys ---------------------------------------------------------------



def _hash_column(col: pa.ChunkedArray | pa.Array, kind: str) -> np.ndarray:
    """A 64-bit hash per value such that equal values (SQL '=') hash equal across streams."""
    if kind in ("num", "bool"):
        v = X.to_numpy(pc.cast(col, pa.float64()))
        v = np.where(np.isnan(v), 0.0, v) + 0.0  # NULL/NaN never match; -0.0 -> 0.0
        return _mix(v.view(np.uint64))
    if kind == "time":
        # (seconds, nanoseconds within the second) from the column's own unit: equal instants
        # hash equal across units, and dates outside 1678-2262 never overflow a cast to ns.
        t = col.type
        if pa.types.is_date32(t):
            col = pc.cast(col, pa.timestamp("s"))
        elif pa.types.is_date64(t):
            col = pc.cast(col, pa.timestamp("ms"))
        per_s = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}[col.type.unit]
        v = X.to_numpy(pc.cast(col, pa.int64()).fill_null(0)).astype(np.int64)
        sec, sub = np.divmod(v, np.int64(per_s))
        sub = sub * np.int64(10**9 // per_s)
        return _mix(_mix(sec.view(np.uint64)) ^ sub.view(np.uint64))
    import pandas as pd

    v = pc.cast(col, pa.string()).to_numpy(zero_copy_only=False)
    return pd.util.hash_array(v.astype(object)).astype(np.uint64)


def _hash_values(columns: Sequence[tuple[pa.Array | pa.ChunkedArray, str]], rows: int) -> np.ndarray:
    """One hash per row over several (column, term kind) pairs, in order."""
    h = np.zeros(rows, np.uint64)
    with np.errstate(over="ignore"):
        for col, kind in columns:
            h = _mix(h * np.uint64(31) + _hash_column(col, kind))
    return h


def _hash_terms(table: pa.Table, terms: Sequence[X.Col]) -> np.ndarray:
    return _hash_values([(table.column(t.name), t.kind) for t in terms], table.num_rows)


# ---- the engine -----------------------------------------------------------------------------

class _Stream:
    """One input: its reader, read-ahead (pending) and W-join buffer."""

    def __init__(self, it: Iterable[pa.RecordBatch], schema: pa.Schema, time_col: str, name: str, dtype: type):
        self.it = iter(it)
        self.schema = schema
        self.time_col = time_col
        self.name = name
        self.done = False
        self.rows_read = 0
        self.last_t = None
        empty_t = np.empty(0, dtype)
        self.pend = schema.empty_table()
        self.pend_t, self.pend_h, self.pend_row = empty_t, np.empty(0, np.uint64), np.empty(0, np.int64)
        self.buf = schema.empty_table()
        self.buf_t, self.buf_h, self.buf_row = empty_t, np.empty(0, np.uint64), np.empty(0, np.int64)


def _times(col, kind: str, s: _Stream) -> np.ndarray:
    if col.null_count:
        row = s.rows_read + int(pc.index(pc.is_null(col), True).as_py())
        raise InputError(f"{s.name}: time column {s.time_col!r} is missing at row {row}; every record needs a time")
    if kind.startswith(("datetime", "cf:")):
        if kind.startswith("cf:"):
            return X.to_numpy(pc.cast(col, pa.int64())).astype(np.int64)
        unit = "ns" if kind.partition("@")[0].split("+")[0] == "datetime" else "us"
        try:
            col = pc.cast(col, pa.timestamp(unit, getattr(col.type, "tz", None)))
        except pa.ArrowInvalid:
            raise InputError(f"{s.name}: time column {s.time_col!r} holds dates outside 1678-2262 that another "
                             "stream's nanosecond timestamps cannot share; cast that stream to timestamp[us]") from None
        return X.to_numpy(pc.cast(col, pa.int64())).astype(np.int64)
    if kind == "int":
        return X.to_numpy(pc.cast(col, pa.int64())).astype(np.int64)
    v = X.to_numpy(pc.cast(col, pa.float64())).astype(np.float64)
    if np.isnan(v).any():
        row = s.rows_read + int(np.argmax(np.isnan(v)))
        raise InputError(f"{s.name}: time column {s.time_col!r} is NaN at row {row}; every record needs a time")
    return v


def wjoin(streams: Sequence[Iterable[pa.RecordBatch]], schemas: Sequence[pa.Schema], params: WJoinParams, *,
          stats: WJoinStats | None = None, sources: Sequence[str] | None = None,
          output_rows: int = DEFAULT_OUTPUT_ROWS, trace: list | None = None) -> Iterator[pa.RecordBatch]:
    """Join n time-ordered streams of record batches; yield batches of ``plan.out_schema``.

    Lazy: input batches are pulled as the join advances; memory holds the W-join buffers plus
    about one input batch per stream. ``trace`` (diagnostics, tests): a list that receives, per
    chunk, ``(arrival streams, arrival row ids, [(row ids dropped, arrival index) per stream])``.
    """
    plan = make_plan(schemas, params, sources=sources)
    return _run(plan, streams, schemas, params, stats if stats is not None else WJoinStats(), sources, output_rows,
                trace)


def output_schema(schemas: Sequence[pa.Schema], params: WJoinParams) -> pa.Schema:
    return make_plan(schemas, params).out_schema


def _run(plan: _Plan, streams, schemas, params: WJoinParams, stats: WJoinStats, sources, output_rows: int, trace):
    n = plan.n
    sources = list(sources) if sources else list(params.aliases)
    st = [_Stream(it, sch, params.time[i], sources[i], plan.dtype) for i, (it, sch) in enumerate(zip(streams, schemas))]
    stats.aliases = params.aliases
    stats.method = "hash" if plan.hash_terms is not None else "nested-loop"
    stats.records_read = [0] * n
    stats.peak_buffered = [0] * n
    stats.peak_held = [0] * n
    stats.timeline = BoundedSeries(("records_read", "tuples") + tuple(f"buffered_{a}" for a in params.aliases))
    neg, pos = (INT_NEG, INT_POS) if plan.dtype is np.int64 else (-np.inf, np.inf)
    latest = np.full(n, neg, dtype=plan.dtype)
    block: list = [None]  # arrivals per block, as the last split chose (see _chunk)
    t_start = time.perf_counter()

    def load(s: _Stream, i: int) -> None:
        for batch in s.it:
            if batch.num_rows == 0:
                continue
            tab = pa.Table.from_batches([batch])
            if tab.schema.names != s.schema.names:
                tab = tab.select(s.schema.names)
            if not tab.schema.equals(s.schema):
                tab = tab.cast(s.schema)
            t = _times(tab.column(s.time_col), plan.kind, s)
            prev = s.last_t
            if (prev is not None and t[0] < prev) or (t.shape[0] > 1 and np.any(t[1:] < t[:-1])):
                d = np.flatnonzero(np.diff(np.concatenate([[prev if prev is not None else t[0]], t])) < 0)[0]
                raise InputError(f"{s.name}: time column {s.time_col!r} decreases at row {s.rows_read + d}; "
                                 "W-join needs every stream in non-decreasing time order (sort it first)")
            s.last_t = t[-1]
            h = _hash_terms(tab, plan.hash_terms[i]) if plan.hash_terms is not None else np.empty(0, np.uint64)
            rows = np.arange(s.rows_read, s.rows_read + tab.num_rows, dtype=np.int64)
            s.rows_read += tab.num_rows
            s.pend = pa.concat_tables([s.pend, tab]) if s.pend.num_rows else tab
            s.pend_t = np.concatenate([s.pend_t, t]) if s.pend_t.shape[0] else t
            s.pend_h = np.concatenate([s.pend_h, h])
            s.pend_row = np.concatenate([s.pend_row, rows])
            return
        s.done = True

    # prime every stream
    for i, s in enumerate(st):
        load(s, i)
    while True:
        for i, s in enumerate(st):
            if s.done and s.pend_t.shape[0] == 0:
                latest[i] = pos  # exhausted: no later record of it can join
        live = [s for s in st if not s.done]
        if live:
            frontier = min(s.pend_t[-1] for s in live)
            takes = [int(np.searchsorted(s.pend_t, frontier, "left")) for s in st]
        else:
            takes = [s.pend_t.shape[0] for s in st]
        for i, s in enumerate(st):
            held = s.buf_t.shape[0] + s.pend_t.shape[0]
            stats.peak_held[i] = max(stats.peak_held[i], held)
        if sum(takes):
            out = _chunk(plan, st, takes, latest, neg, pos, stats, output_rows, trace, block)
            for b in out:
                stats.tuples += b.num_rows
                yield b
            stats.timeline.append([sum(s.rows_read for s in st), stats.tuples] + [s.buf_t.shape[0] for s in st])
        if not live:
            break
        for i, s in enumerate(st):
            if not s.done and (s.pend_t.shape[0] == 0 or s.pend_t[-1] <= frontier):
                load(s, i)
    for i, s in enumerate(st):
        stats.records_read[i] = s.rows_read
    stats.join_seconds += time.perf_counter() - t_start


def _chunk(plan: _Plan, st: list[_Stream], takes: list[int], latest: np.ndarray, neg, pos, stats: WJoinStats,
           output_rows: int, trace: list | None = None, block: list | None = None) -> Iterator[pa.RecordBatch]:
    """The output of one chunk of arrivals, block by block; the buffers and the purge pointers
    are updated when the generator is exhausted (the caller drains it before the next chunk)."""
    n = plan.n
    stats.chunks += 1
    comb_tab, comb_t, comb_h, comb_row, base = [], [], [], [], np.zeros(n, np.int64)
    final_rank = np.full(n, -1, np.int64)
    for i, s in enumerate(st):
        k = takes[i]
        base[i] = s.buf_t.shape[0]
        comb_t.append(np.concatenate([s.buf_t, s.pend_t[:k]]).astype(plan.dtype, copy=False))
        comb_h.append(np.concatenate([s.buf_h, s.pend_h[:k]]))
        comb_row.append(np.concatenate([s.buf_row, s.pend_row[:k]]))
        comb_tab.append(pa.concat_tables([s.buf, s.pend.slice(0, k)]).combine_chunks())
    # arrival order: by time, then stream number, then position
    S = np.concatenate([np.full(takes[i], i, np.int64) for i in range(n)])
    T = np.concatenate([comb_t[i][base[i]:] for i in range(n)])
    P = np.concatenate([np.arange(takes[i], dtype=np.int64) for i in range(n)])
    order = np.lexsort((P, S, T))
    arr_s, arr_t, arr_p = S[order], T[order], P[order]
    arr_pos = base[arr_s] + arr_p
    pe = []  # pe[j][a] = records of stream j that arrived before arrival a (buffer end for a)
    for j in range(n):
        is_j = arr_s == j
        pe.append(base[j] + np.cumsum(is_j) - is_j)
        if st[j].done and takes[j] == st[j].pend_t.shape[0] and takes[j] > 0:
            final_rank[j] = int(np.flatnonzero(is_j)[-1])
    slack = 0.0
    if plan.dtype is np.float64:
        scale = max(float(np.max(np.abs(T))) if T.shape[0] else 0.0, float(np.max(plan.dist)))
        slack = 1e-12 * max(scale, 1.0)
    buckets: dict = {}
    pair_buckets: dict = {}
    # Arrivals in blocks, in arrival order: partial tuples of different arrivals never meet, so
    # a block bounds the intermediate results and the output held at once by what its arrivals
    # form. A chunk is one block unless a level of it would exceed SPLIT_TUPLES partial tuples:
    # then the block is halved (and the hash chains rebuilt), down to single arrivals.
    # ``block[0]``: the block size (arrivals) the last split chose, kept for the next chunks so
    # that a chunk of similar data is not formed once in full only to be cut again.
    block = block if block is not None else [None]
    size = block[0] or max(arr_s.shape[0], 1)
    todo = [(b, min(b + size, arr_s.shape[0])) for b in reversed(range(0, arr_s.shape[0], size))]
    while todo:
        a0, a1 = todo.pop()
        groups = []
        try:
            for i in range(n):
                sel = a0 + np.flatnonzero(arr_s[a0:a1] == i)
                if sel.shape[0] == 0:
                    continue
                res = _expand(plan, i, sel, arr_pos, comb_t, comb_h, comb_tab, pe, buckets, slack, pair_buckets,
                              can_split=a1 - a0 > 1)
                if res is not None:
                    groups.append(res)
        except _Split as e:
            # Blocks sized from what this one would have formed; the hash chains restart once
            # (later blocks come later in arrival order and extend them).
            buckets.clear()
            pair_buckets.clear()
            size = max(1, min((a1 - a0) // 2, int((a1 - a0) * SPLIT_TUPLES / (2 * max(e.args[0], 1)))))
            block[0] = size
            todo += [(b, min(b + size, a1)) for b in reversed(range(a0, a1, size))]
            stats.block_splits += 1
            continue
        if not groups:
            continue
        a_idx = np.concatenate([g[0] for g in groups])
        members = [np.concatenate([g[1][j] for g in groups]) for j in range(n)]
        if not a_idx.shape[0]:
            continue
        o = np.lexsort(tuple(members[j] for j in reversed(range(n))) + (a_idx,))
        members = [m[o] for m in members]
        cols = []
        for j in range(n):
            idx = X.from_numpy(members[j])
            for c, _ in plan.out_names[j]:
                cols.append(comb_tab[j].column(c).take(idx))
        for j in range(len(plan.id_names)):
            cols.append(X.from_numpy(comb_row[j][members[j]]))
        table = pa.Table.from_arrays(cols, schema=plan.out_schema)
        for batch in table.to_batches(max_chunksize=output_rows):
            yield batch
    # purge rule, replayed arrival by arrival
    offsets = np.zeros(n + 1, np.int64)
    offsets[1:] = np.cumsum([c.shape[0] for c in comb_t])
    ptr = np.zeros(n, np.int64)
    peak = np.array(stats.peak_buffered, np.int64)
    drop_at = np.full(int(offsets[-1]) if trace is not None else 0, -1, np.int64)
    stats.peak_buffered_total = int(purge_walk(
        arr_s, arr_t.astype(plan.dtype), np.concatenate(comb_t), offsets, base, ptr, latest,
        plan.dist, plan.dtype(slack), final_rank, drop_at, peak, stats.peak_buffered_total,
        plan.dtype(neg), plan.dtype(pos)))
    if trace is not None:
        rows = np.array([comb_row[s_][p_] for s_, p_ in zip(arr_s, arr_pos)], np.int64)
        dropped = []
        for j in range(n):
            d = drop_at[offsets[j]:offsets[j + 1]]
            dropped.append((comb_row[j][d >= 0], d[d >= 0]))
        trace.append((arr_s.copy(), rows, dropped))
    stats.peak_buffered = [int(x) for x in peak]
    for i, s in enumerate(st):
        k, p = takes[i], int(ptr[i])
        s.buf = comb_tab[i].slice(p)
        s.buf_t, s.buf_h, s.buf_row = comb_t[i][p:], comb_h[i][p:], comb_row[i][p:]
        s.pend = s.pend.slice(k)
        s.pend_t, s.pend_h, s.pend_row = s.pend_t[k:], s.pend_h[k:], s.pend_row[k:]


def _pair_probe(plan: _Plan, j: int, bound: list[int], conjs: Sequence[X.Node]) -> list[tuple[X.Col, X.Col]]:
    """Equality conjuncts ``Sj.x == Sb.y`` (b already bound) usable as hash probes into stream
    j, as (column of j, column of b) pairs in a fixed order."""
    out = []
    for c in conjs:
        eq = X.equality_terms(c)
        if not eq:
            continue
        l, r = eq
        if l.stream == j and r.stream in bound:
            out.append((l, r))
        elif r.stream == j and l.stream in bound:
            out.append((r, l))
    return sorted(out, key=lambda p: (p[0].name, p[1].stream, p[1].name))


def _too_large(plan: _Plan, i: int, j: int, bound: list[int], total: int, probed: bool = False) -> UsageError:
    windows = ", ".join(f"{plan.aliases[b]},{plan.aliases[j]} <= {plan.wmat[b, j]:g}" for b in bound
                        if np.isfinite(plan.wmat[b, j])) or "none direct (a chain of windows)"
    if probed:
        return UsageError(
            f"wjoin: stream {plan.aliases[j]} would give more than {MAX_PARTIAL_TUPLES:,} partial tuples (the "
            f"limit) for one {plan.aliases[i]} arrival; within its window bounds ({windows}) too many records share "
            f"the equality values that link it to {', '.join(plan.aliases[b] for b in bound)}: narrow the window "
            "or add a more selective equality to --where")
    return UsageError(
        f"wjoin: stream {plan.aliases[j]} would give {total:,} partial tuples for one {plan.aliases[i]} "
        f"arrival (limit {MAX_PARTIAL_TUPLES:,}); its window bounds ({windows}) hold too many records and no "
        f"equality links it to {', '.join(plan.aliases[b] for b in bound)}: narrow the window or add an "
        f"equality such as {plan.aliases[j]}.col = {plan.aliases[bound[0]]}.col to --where")


class _Split(Exception):
    """A block of arrivals would form too many partial tuples at once: halve it."""


def _expand(plan: _Plan, i: int, sel: np.ndarray, arr_pos, comb_t, comb_h, comb_tab, pe, buckets, slack,
            pair_buckets: dict | None = None, can_split: bool = False):
    """Left-deep expansion of the arrivals ``sel`` of stream ``i``: (arrival ids, members per stream).

    Each level binds one more stream j: the HW-join probes the full equality class's hash
    chains; otherwise an equality conjunct between j and a bound stream becomes a hash probe
    (``_pair_probe``), and only without one are the time ranges enumerated. Every conjunct is
    applied as soon as the streams it names are bound."""
    n = plan.n
    a_idx = sel
    mem: dict[int, np.ndarray] = {i: arr_pos[sel]}
    tim: dict[int, np.ndarray] = {i: comb_t[i][mem[i]]}
    hashed = plan.hash_terms is not None
    h = comb_h[i][mem[i]] if hashed else None
    bound = [i]

    def apply(conjs):
        nonlocal a_idx, h
        if not conjs or a_idx.shape[0] == 0:
            return
        node = X.conjoin(conjs)
        m = X.mask(node, lambda s, c: comb_tab[s].column(c).take(X.from_numpy(mem[s])), a_idx.shape[0])
        keep(m)

    def keep(m):
        nonlocal a_idx, h
        a_idx = a_idx[m]
        for k in mem:
            mem[k] = mem[k][m]
            tim[k] = tim[k][m]
        if h is not None:
            h = h[m]

    apply(plan.level_conj[i][0])
    for lvl, j in enumerate(plan.orders[i], start=1):
        if a_idx.shape[0] == 0:
            return None
        lo = hi = None
        for b in bound:
            d = plan.dist[b, j]
            l_, h_ = tim[b] - d - slack, tim[b] + d + slack
            lo = l_ if lo is None else np.maximum(lo, l_)
            hi = h_ if hi is None else np.minimum(hi, h_)
        probes = [] if hashed or pair_buckets is None else _pair_probe(plan, j, bound, plan.level_conj[i][lvl])
        limit = SPLIT_TUPLES if can_split else MAX_PARTIAL_TUPLES  # a probe stops past it (then split or refuse)
        if hashed:
            # One index per (arriving stream, probed stream): its chains grow block by block.
            if (i, j) not in buckets:
                buckets[(i, j)] = BucketIndex(comb_h[j])
            parent, cand = buckets[(i, j)].probe(h, comb_t[j], lo, hi, pe[j][a_idx], limit)
        elif probes:
            key = (i, j, tuple(p[0].name for p in probes))
            if key not in pair_buckets:
                pair_buckets[key] = BucketIndex(_hash_terms(comb_tab[j], [p[0] for p in probes]))
            hp = _hash_values([(comb_tab[cb.stream].column(cb.name).take(X.from_numpy(mem[cb.stream])), cj.kind)
                               for cj, cb in probes], a_idx.shape[0])
            parent, cand = pair_buckets[key].probe(hp, comb_t[j], lo, hi, pe[j][a_idx], limit)
        else:
            start = np.searchsorted(comb_t[j], lo, "left").astype(np.int64)
            end = np.minimum(np.searchsorted(comb_t[j], hi, "right"), pe[j][a_idx]).astype(np.int64)
            total = int(np.maximum(end - start, 0).sum())
            if total > SPLIT_TUPLES and can_split:
                raise _Split(total)
            if total > MAX_PARTIAL_TUPLES:
                raise _too_large(plan, i, j, bound, total)
            parent, cand = expand_ranges(start, end)
        if parent.shape[0] > SPLIT_TUPLES and can_split:
            raise _Split(parent.shape[0])
        if parent.shape[0] > MAX_PARTIAL_TUPLES:  # a probe that stopped at the limit
            raise _too_large(plan, i, j, bound, MAX_PARTIAL_TUPLES, probed=True)
        a_idx = a_idx[parent]
        for kk in mem:
            mem[kk] = mem[kk][parent]
            tim[kk] = tim[kk][parent]
        if h is not None:
            h = h[parent]
        mem[j] = cand
        tim[j] = comb_t[j][cand]
        if plan.dtype is np.float64:  # exact direct bounds, in the arithmetic SQL uses
            m = np.ones(a_idx.shape[0], bool)
            for b in bound:
                if np.isfinite(plan.wmat[b, j]):
                    m &= np.abs(tim[j] - tim[b]) <= plan.wmat[b, j]
            if not m.all():
                keep(m)
        bound.append(j)
        apply(plan.level_conj[i][lvl])
    if a_idx.shape[0] == 0:
        return None
    return a_idx, [mem[j] for j in range(n)]


__all__ = ["Duration", "parse_duration", "WJoinParams", "WJoinStats", "resolve_bound", "make_plan", "wjoin",
           "output_schema", "DEFAULT_OUTPUT_ROWS", "METHODS"]
