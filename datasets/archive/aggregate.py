"""Aggregate copies of an archive (``--aggregate EVERY:FUNCS[:BY]``, docs/archive.md): parsing and
checking the definition, one run's tumbling-window partial aggregate (written with the run), and
``read_aggregate``, which combines the runs' files into the aggregate of the whole archive.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from smerge.datasets.archive.manifest import (AGG_DIR, AGG_FUNCS, _AGG_NAME, Manifest, _make_dir, _read_range, damaged,
                                              read_manifest)
from smerge.errors import UsageError, param
from smerge.merge.keys import tick_ns
from smerge.merge.values import parse_duration

@dataclass(frozen=True)
class AggregateSpec:
    """``--aggregate EVERY:FUNCS[:BY]``: tumbling windows of EVERY (a duration such as 1h, or a plain
    number in the time column's unit), FUNCS of count, mean, min, max, grouped by the BY columns."""

    every: str
    funcs: tuple[str, ...]
    by: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return "_".join((self.every,) + self.by)


def parse_aggregate(text: str) -> AggregateSpec:
    what = f"{param.aggregate} {text!r}"
    parts = text.split(":")
    if not 2 <= len(parts) <= 3:
        raise UsageError(f"{what}: write EVERY:FUNCS[:BY], e.g. 1h:count,mean,min,max:station")
    every = parts[0].strip()
    parse_duration(every, f"{what}: EVERY", positive=True)
    funcs = tuple(f.strip() for f in parts[1].split(","))
    bad = [f for f in funcs if f not in AGG_FUNCS]
    if bad or not funcs or len(set(funcs)) != len(funcs):
        raise UsageError(f"{what}: FUNCS must be distinct names among {', '.join(AGG_FUNCS)}"
                         + (f" (not {', '.join(map(repr, bad))})" if bad else ""))
    by = tuple(c.strip() for c in parts[2].split(",")) if len(parts) == 3 else ()
    if any(not c for c in by) or len(set(by)) != len(by):
        raise UsageError(f"{what}: BY must be distinct column names separated by commas")
    spec = AggregateSpec(every.replace(" ", ""), funcs, by)
    if not _AGG_NAME.match(spec.name):
        raise UsageError(f"{what}: its name {spec.name!r} must be letters, digits, _ . - (BY columns with other "
                         "characters cannot be used)")
    return spec


def _ticks_per_window(spec: AggregateSpec, ttype: pa.DataType) -> int | float:
    """EVERY in the time column's own ticks (its unit; days for date32, ms for date64)."""
    d = parse_duration(spec.every, f"{param.aggregate} EVERY")
    what = f"{param.aggregate} {spec.every}:..."
    if pa.types.is_timestamp(ttype) or pa.types.is_date(ttype):
        ticks = d.ticks(tick_ns(ttype), None, what)
        if ticks < 1 or abs(ticks - round(ticks)) > 1e-9 * max(1.0, ticks):
            raise UsageError(f"{what}: EVERY must be a whole number of the time column's ticks ({ttype})")
        if ticks > 2**62:
            raise UsageError(f"{what}: EVERY is longer than the time column's ticks ({ttype}) can count; give "
                             "a shorter window")
        return int(round(ticks))
    if d.unit:
        raise UsageError(f"{what}: the time column is a plain number ({ttype}); give EVERY as a number in its unit")
    if pa.types.is_integer(ttype):
        if d.value != int(d.value):
            raise UsageError(f"{what}: the time column is an integer; EVERY must be a whole number")
        return int(d.value)
    return d.value


def _value_columns(schema: pa.Schema, time: str, spec: AggregateSpec) -> list[str]:
    if not {"mean", "min", "max"} & set(spec.funcs):
        return []
    numeric = (pa.types.is_integer, pa.types.is_floating)
    return [f.name for f in schema if f.name != time and f.name not in spec.by and any(p(f.type) for p in numeric)]


def check_aggregate(where: str, schema: pa.Schema, time: str, spec: AggregateSpec) -> dict:
    """The manifest's entry for ``spec`` on this schema (UsageError when it does not apply)."""
    for c in spec.by:
        if c not in schema.names:
            raise UsageError(f"{where}: {param.aggregate} BY column {c!r} is not a column ({', '.join(schema.names)})")
        if c == time:
            raise UsageError(f"{where}: {param.aggregate} groups by windows of the time column already; drop {c!r} from BY")
    _ticks_per_window(spec, schema.field(time).type)
    values = _value_columns(schema, time, spec)
    if {"mean", "min", "max"} & set(spec.funcs) and not values:
        raise UsageError(f"{where}: {param.aggregate} {spec.every}: mean/min/max need a numeric column besides the time "
                         "and BY columns; there is none")
    return {"name": spec.name, "every": spec.every, "funcs": list(spec.funcs), "by": list(spec.by), "values": values}


def window_starts(column: pa.ChunkedArray | pa.Array, every: int | float) -> pa.Array:
    """The start of each record's tumbling window (multiples of ``every`` ticks from 0), of the time type."""
    ttype = column.type
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_floating(ttype):
        return pa.array(np.floor(column.to_numpy() / every) * every, ttype)
    width = pa.int32() if ttype.bit_width == 32 else pa.int64()
    raw = column.view(width).to_numpy().astype(np.int64) if not pa.types.is_integer(ttype) else \
        column.to_numpy().astype(np.int64)
    starts = (raw // every) * every
    if pa.types.is_integer(ttype):
        return pa.array(starts).cast(ttype)
    return pa.array(starts.astype(np.int32 if width == pa.int32() else np.int64), width).view(ttype)


def aggregate_table(table: pa.Table, time: str, spec: dict) -> pa.Table:
    """One run's partial aggregate for ``spec`` (a manifest entry): per window and group, ``count``
    (records) and per value column v: ``v_count`` (non-null values, with mean), ``v_mean``, ``v_min``,
    ``v_max``; sorted by window then group."""
    ttype = table.schema.field(time).type
    every = _ticks_per_window(AggregateSpec(spec["every"], tuple(spec["funcs"]), tuple(spec["by"])), ttype)
    keys = ["window"] + spec["by"]
    t = pa.table([window_starts(table.column(time), every)] + [table.column(c) for c in spec["by"]], names=keys)
    aggs: list[tuple] = [([], "count_all")]
    cols = []
    for v in spec["values"]:
        t = t.append_column(f"__{v}", table.column(v))
        if "mean" in spec["funcs"]:
            aggs += [(f"__{v}", "count"), (f"__{v}", "mean")]
            cols += [f"{v}_count", f"{v}_mean"]
        for fn in ("min", "max"):
            if fn in spec["funcs"]:
                aggs.append((f"__{v}", fn))
                cols.append(f"{v}_{fn}")
    g = t.group_by(keys, use_threads=False).aggregate(aggs)
    out = g.select(keys + ["count_all"] + [n for n in g.column_names if n.startswith("__")])
    out = out.rename_columns(keys + ["count"] + cols)
    return out.sort_by([(k, "ascending") for k in keys])


def read_aggregate(directory: str, name: str) -> pa.Table:
    """The aggregate ``name`` over the whole archive: each run's partial aggregate (its Parquet file,
    checked against its SHA-256) combined per window and group (counts added, min of mins, max of
    maxes, means weighted by their non-null counts), sorted by window then group."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    man = read_manifest(directory)
    specs = {s["name"]: s for s in man.meta.get("aggregates", [])}
    if name not in specs:
        raise UsageError(f"{directory}: no aggregate {name!r}; it has {', '.join(specs) or 'none'}")
    spec = specs[name]
    parts = []
    for r in man.runs:
        a = next(x for x in r["aggregates"] if x["name"] == name)
        data = _read_range(man, a["file"], 0, a["bytes"])
        if hashlib.sha256(data).hexdigest() != a["sha256"]:
            raise damaged(directory, f"{a['file']} does not match its SHA-256")
        parts.append(pq.read_table(pa.BufferReader(data)))
    keys = ["window"] + spec["by"]
    if not parts:
        return _empty_aggregate(man, spec)
    t = pa.concat_tables(parts)
    aggs: list[tuple] = [("count", "sum")]
    for v in spec["values"]:
        if "mean" in spec["funcs"]:
            w = pc.multiply(pc.cast(t.column(f"{v}_mean"), pa.float64()), pc.cast(t.column(f"{v}_count"), pa.float64()))
            w = pc.if_else(pc.equal(t.column(f"{v}_count"), 0), 0.0, w)
            t = t.append_column(f"__{v}_wsum", w)
            aggs += [(f"{v}_count", "sum"), (f"__{v}_wsum", "sum")]
        for fn in ("min", "max"):
            if fn in spec["funcs"]:
                aggs.append((f"{v}_{fn}", fn))
    g = t.group_by(keys, use_threads=False).aggregate(aggs)
    cols = {"window": g.column("window")}
    for k in spec["by"]:
        cols[k] = g.column(k)
    cols["count"] = g.column("count_sum")
    for v in spec["values"]:
        if "mean" in spec["funcs"]:
            n = g.column(f"{v}_count_sum")
            cols[f"{v}_count"] = n
            cols[f"{v}_mean"] = pc.if_else(pc.equal(n, 0), pa.scalar(None, pa.float64()),
                                           pc.divide(g.column(f"__{v}_wsum_sum"), pc.cast(n, pa.float64())))
        for fn in ("min", "max"):
            if fn in spec["funcs"]:
                cols[f"{v}_{fn}"] = g.column(f"{v}_{fn}_{fn}")
    return pa.table(cols).sort_by([(k, "ascending") for k in keys])


def _empty_aggregate(man: Manifest, spec: dict) -> pa.Table:
    empty = pa.Table.from_batches([], schema=man.schema)  # Schema.empty_table() imports pandas
    return aggregate_table(empty, man.time, spec)


def _write_aggregates(directory: str, table: pa.Table, time: str, specs: list[dict], run_id: str) -> list[dict]:
    import pyarrow.parquet as pq

    out = []
    for s in specs:
        folder = os.path.join(directory, AGG_DIR, s["name"])
        _make_dir(folder)
        sink = pa.BufferOutputStream()
        agg = aggregate_table(table, time, s)
        pq.write_table(agg, sink)
        data = sink.getvalue()
        name = f"{AGG_DIR}/{s['name']}/{run_id}.parquet"
        with open(os.path.join(directory, name), "xb") as f:
            f.write(data)
        out.append({"name": s["name"], "file": name, "count": agg.num_rows, "bytes": data.size,
                    "sha256": hashlib.sha256(data).hexdigest()})
    return out
