"""A prepared run's inputs: opened (metadata only) with their keys matched by name, and what
a run reports about them (values masked by valid ranges). Shared by the cgm and rtm jobs (in
process and on Spark)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping

import pyarrow as pa

from smerge.datasets import InputSource, open_input
from smerge.errors import MissingKeyError, UsageError, param
from smerge.merge import CGMParams

if TYPE_CHECKING:
    from smerge.jobs.cgm import CGMJob

ProgressFactory = Callable[[int | None, str], "Progress"]


class Progress:
    """What the runner needs of a progress bar (the CLI passes a tqdm-backed one)."""

    def update(self, n: int) -> None: ...

    def close(self) -> None: ...


@dataclass
class PreparedMerge:
    job: CGMJob  # or an RTMJob (smerge.jobs.rtm)
    src_a: InputSource
    src_b: InputSource
    params: CGMParams
    output: str
    output_format: str
    out_schema: pa.Schema
    write_ids: bool
    unmatched_paths: tuple[str, str] | None
    extra: dict = field(default_factory=dict)


def open_inputs(job, opener: Callable[..., InputSource] = open_input) -> tuple[InputSource, InputSource]:
    """Open A and B (metadata only) with their keys matched **by name** (docs/data.md, "Keys are matched by name").

    B's keys are ``--keys-b`` when given, else A's key names (given, or A's defaults: the
    coordinate variables of A's dimensions in A's order), whatever B's own dimension order.
    ``job`` needs ``a``, ``b``, ``keys_a``, ``keys_b``, ``vars_a``, ``vars_b``, ``batch_rows``;
    its ``sampling`` (the run's, if any) reaches the archive reader as ``sample``.
    """
    sample = {"sample": job.sampling} if getattr(job, "sampling", None) is not None else {}
    src_a = opener(job.a, keys=job.keys_a, variables=job.vars_a, batch_rows=job.batch_rows, **sample)
    if not src_a.keys:
        raise UsageError(f"{job.a}: no merge keys; pass {param.keys} K1,K2 (tabular inputs have no default keys)")
    keys_b = job.keys_b or tuple(src_a.keys)
    order = grid_order(src_a, keys_b)
    try:
        src_b = opener(job.b, keys=keys_b, variables=job.vars_b, batch_rows=job.batch_rows, **sample,
                       **({"order": order} if order else {}))
    except MissingKeyError as e:
        if job.keys_b:
            raise
        raise UsageError(f"{job.b}: B has no {', '.join(map(repr, e.missing))}, a key of A ({','.join(src_a.keys)}); "
                         f"keys are matched by name: name B's keys in A's order with {param.keys_b}") from None
    if not src_b.keys:
        raise UsageError(f"{job.b}: no merge keys; pass {param.keys} (or {param.keys_b} for B)")
    check_index_keys(src_a, src_b)
    for side, src in (("A", src_a), ("B", src_b)):
        check_keys_cover(src, side)
    from smerge.jobs.longitudes import check_longitudes

    check_longitudes(src_a, src_b)
    return src_a, src_b


def check_keys_cover(src: InputSource, side: str, vars_option: str | None = None) -> None:
    """Every record dimension of a grid is one some key is on. Records that differ only along a
    dimension no key is on (``level`` of ``T(time, level, lat, lon)`` keyed by time, lat, lon)
    have the same keys, so a record of the other input could pair with any of them (cgm and rtm
    pair a record at most once, per run or per A window): B's first level would be taken
    silently, and the output would not say which."""
    g = src.grid
    if g is None or not g.unkeyed_dims:
        return
    what = f"variable {', '.join(map(repr, g.variables))}" if g.variables else "its keys"
    dims = ", ".join(f"{d!r} ({g.shape[g.dims.index(d)]:,})" for d in g.unkeyed_dims)
    first = g.unkeyed_dims[0]
    vars_ = vars_option or (param.vars_a if side == "A" else param.vars_b)
    raise UsageError(
        f"{src.path}: {what} ({side}) has the dimension{'s' if len(g.unkeyed_dims) > 1 else ''} {dims} that no "
        f"key ({','.join(src.keys)}) is on, so its records along it have the same keys and any of them could pair; select one {first} first (ncks -d "
        f"{first},0 or xarray's .isel({first}=0)), name variables on the key dimensions only with {vars_}, or "
        f"add {first!r} as a key of both inputs when it has a coordinate")


def check_kappa_memory(src_a: InputSource, src_b: InputSource) -> None:
    """kappa_max keeps every key of both inputs (and a row id) in memory: refuse before the run
    when they cannot fit (``smerge.memory``)."""
    from smerge.memory import check_fits

    n = (src_a.num_rows or 0) + (src_b.num_rows or 0)
    check_fits(n * (16 * len(src_a.keys) + 16), f"{param.kappa_max} on {n:,} records (every key held for the "
               "unbounded merge)", f"leave out {param.kappa_max}, or run it on a subset")


TABLE_FORMATS = ("parquet", "csv", "arrow", "archive")


def grid_order(src_a: InputSource, keys_b) -> list[tuple[str, int]] | None:
    """B's keys in the order (and direction) A's grid stores them, when A is a grid keyed by its
    dimensions' coordinates (one key per dimension): B, if it is such a grid too, is then read
    in that order, so a B stored (time, lon, lat), (lat, time, lon) or with latitudes north to
    south pairs as if stored like A. When A is a table (Parquet, CSV, Arrow, an archive): B's
    keys in the order given, each ascending. None otherwise (A another grid, or a server)."""
    g = src_a.grid
    if g is None:
        # A table (station reports, a point list written by pandas): its records are taken to be
        # sorted ascending by its keys in the order given, so a grid B is read in that order,
        # every coordinate ascending (B is read as stored when its keys are not one per dimension)
        return [(k, 1) for k in keys_b] if src_a.format in TABLE_FORMATS else None
    if len(src_a.keys) != len(g.dims) or len(keys_b) != len(src_a.keys):
        return None
    by_dim = {d: k for k, d in g.key_dims.items()}
    if set(by_dim) != set(g.dims) or set(by_dim.values()) != set(src_a.keys):
        return None
    pos = {k: i for i, k in enumerate(src_a.keys)}
    return [(keys_b[pos[by_dim[d]]], g.key_direction.get(by_dim[d], 0)) for d in g.dims]


def check_index_keys(src_a: InputSource, src_b: InputSource) -> None:
    """A dimension without a coordinate (keyed by its array index) pairs with B only when B keys
    the same key by index too, on a dimension of the same size, and no variable locates that
    dimension in either input (an auxiliary coordinate ``lon(x)``): otherwise index i of one file
    and index i of the other need not be the same place (a sub-region, another grid)."""
    ga, gb = src_a.grid, src_b.grid
    for side, src, g, other, go in (("A", src_a, ga, src_b, gb), ("B", src_b, gb, src_a, ga)):
        for k in (g.index_keys if g is not None else ()):
            ko = other.keys[list(src.keys).index(k)]
            n = g.shape[g.dims.index(k)] if k in g.dims else None
            if k in g.index_located:
                raise UsageError(
                    f"{src.path}: dimension {k!r} ({side}) is keyed by array index, but {g.index_located[k]} "
                    f"locates it: indices are not places; name the variable that locates it as the key with "
                    f"{param.keys}/{param.keys_b}")
            if go is not None and ko in go.index_located:
                raise UsageError(
                    f"{src.path}: dimension {k!r} ({side}) has no coordinate variable, so its records would be keyed "
                    f"by array index, but {other.path} locates its dimension {ko!r} by {go.index_located[ko]}: index "
                    f"i of one file need not be index i of the other (a sub-region, another grid); give {k!r} the "
                    f"same coordinate in {src.path}, or name keys that locate the records in both with "
                    f"{param.keys}/{param.keys_b}")
            if go is not None and ko in go.index_keys and ko in go.dims and go.shape[go.dims.index(ko)] == n:
                continue
            if go is not None and ko in go.index_keys:
                why = f"{other.path} has {go.shape[go.dims.index(ko)]:,} on its dimension {ko!r}, not {n:,}"
            else:
                why = f"{other.path} keys {ko!r} by its values, not by index"
            raise UsageError(
                f"{src.path}: dimension {k!r} ({side}) has no coordinate variable, so its records would be keyed "
                f"by array index, but {why}: indices are not places; name keys that locate the records with "
                f"{param.keys}/{param.keys_b} (e.g. the latitude and longitude variables), or add a coordinate variable")


def masked_stats(prep: PreparedMerge, *, read_here: bool = True) -> dict:
    """``a_masked``/``b_masked``: values made missing by valid_min/valid_max/valid_range in each
    input (docs/data.md, "Values"); ``None`` for a B behind a running server (not read here).
    ``read_here``: the whole inputs were streamed in this process (else they are counted by a
    read of the variables that have such attributes)."""
    def masked(src) -> int:
        if src.grid is None:  # not netCDF: no valid_* attributes (and no netCDF module to import)
            return 0
        from smerge.datasets.netcdf_slabs import masked_values

        return masked_values(src, read_here=read_here)

    b = None if prep.src_b.format == "flight" else masked(prep.src_b)
    return {"a_masked": masked(prep.src_a), "b_masked": b, "b_order": read_order(prep.src_b)}


def read_order(src: InputSource) -> str:
    """How B's records were read: ``"A's key order"`` (a grid read in A's order) or ``"as stored"``."""
    return "A's key order" if src.grid is not None and src.grid.reordered else "as stored"


def needs_spark_readers(job, conf: Mapping[str, str] | None = None) -> bool:
    """True when an input is a URL for Spark's readers (hdfs://, s3a://, file://, ...) or the
    run asks for them (``--conf smerge.reader=spark``): the inputs are then opened in Spark."""
    from smerge.datasets import is_spark_url

    reader = str((conf or {}).get("smerge.reader", "auto")).lower()
    if reader not in ("auto", "spark", "smerge"):
        raise UsageError(f"{param.conf} smerge.reader={reader!r}: use auto, spark or smerge")
    if reader == "smerge":
        return False
    return reader == "spark" or any(is_spark_url(p) for p in (job.a, job.b) if p)


__all__ = ["Progress", "ProgressFactory", "PreparedMerge", "open_inputs", "grid_order", "check_index_keys",
           "check_keys_cover", "masked_stats", "needs_spark_readers"]
