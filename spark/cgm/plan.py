"""Planning the key ranges of a partitioned CGM run (driver side, and the k1 scans the
executors run for it).

Per chunk (``step`` outer indices) of each input: the count, the k1 range, NaNs and a sample of
k1 -- from the file's metadata for gridded inputs keyed by their outer coordinate, else from a
scan of k1 alone on the executors (``scan_chunks``); inputs read by Spark's own readers are
scanned by ``smerge.spark.frames.scan_frame``. The driver picks P - 1 boundaries
(``choose_bounds``) and, for slab pairing, the chunk runs every partition reads
(``needed_runs``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from smerge.errors import KeyNaNError, SmergeError, UsageError, param
from smerge.jobs import PreparedMerge
from smerge.spark.actions import arrow_batches, raise_task_error, run_job, session_conf, spark_action
from smerge.spark.archive import pinned_sample
from smerge.spark.cgm.tasks import SideSpec, key_columns

SAMPLE_PER_CHUNK = 256  # k1 values per chunk for the boundaries
ORDER_PER_CHUNK = 4096  # k1 values per chunk, in arrival order, for the partitions' windows (spark.cgm.windows)


@dataclass
class ChunkStats:
    side: str
    chunk: int
    count: int = 0
    k1_min: float = np.inf
    k1_max: float = -np.inf
    nan_k1: bool = False
    first_nan_row: int = -1
    first_nan_key: str = ""
    sample: np.ndarray = field(default_factory=lambda: np.empty(0))
    order: np.ndarray = field(default_factory=lambda: np.empty(0))  # evenly spaced, in arrival order


SCAN_BATCH_CHUNKS = 8  # the k1 scan reads this many chunks per call (one key column: small)


def _open_k1(spec: SideSpec):
    """The input reduced to its leading key when the format allows it (same rows), else ``open_keys``."""
    from smerge.datasets import open_input

    try:
        src = open_input(spec.path, keys=spec.keys[:1], variables=spec.keys[:1],
                         batch_rows=spec.step * spec.inner * SCAN_BATCH_CHUNKS, **spec.open_options)
        if (tuple(src.schema.names) == spec.keys[:1] and src.outer_size == spec.outer
                and src.inner_size == spec.inner):
            return src
    except Exception:  # noqa: BLE001 - e.g. a gridded key: fall back
        pass
    return spec.open_keys()


def _k1_batches(spec: SideSpec, start: int, stop: int | None):
    """(values, missing, to_key) per batch of the leading key of outer indices ``start:stop``:
    its stored values when the reader offers them (``InputSource.raw_key``: a chunk's few
    statistics are mapped to key values instead of every record), else the key values."""
    src = _open_k1(spec)
    if src.raw_key is not None:
        k1 = spec.keys[0]
        to_key = lambda v: key_columns(pa.RecordBatch.from_arrays([src.raw_key.to_arrow(v)], names=[k1]),  # noqa: E731
                                       (k1,))[:, 0]
        for values, missing in src.raw_key.batches(start, stop):
            yield values, missing, to_key
        return
    for b in src.batches(start, stop):
        k1 = key_columns(b, spec.keys[:1])[:, 0]
        yield k1, np.isnan(k1), None


def scan_chunks(side: str, spec: SideSpec, first_chunk: int, last_chunk: int | None) -> list[ChunkStats]:
    """Read the leading key k1 of chunks ``first_chunk .. last_chunk`` (None: to the end); their stats.

    Only k1 is read when the format allows it (netCDF variables, Parquet/Arrow columns), in its
    stored form where the reader offers it (netCDF: times not decoded record by record). Streams:
    holds one batch and at most one chunk of k1 values at a time (a chunk spanning two batches is
    joined), not the whole range (allocating that, 8 bytes per record, cost more than reading it).
    """
    start = first_chunk * spec.step
    stop = None if last_chunk is None else (last_chunk + 1) * spec.step
    chunk_rows = spec.step * spec.inner
    row0 = start * spec.inner
    out: list[ChunkStats] = []
    carry: list[tuple[np.ndarray, np.ndarray | None]] = []  # the start of a chunk the next batch completes
    done = 0  # records of the range turned into chunk stats
    to_key = None

    def emit(seg: np.ndarray, missing: np.ndarray | None) -> None:
        nonlocal done
        off = done
        out.append(_chunk_stats(side, (row0 + off) // chunk_rows, seg.size, seg, spec.keys[0],
                                lambda i, o=off: row0 + o + i, missing=missing, to_key=to_key))
        done += seg.size

    def joined(parts):
        vals = np.concatenate([v for v, _ in parts])
        if all(m is None for _, m in parts):
            return vals, None
        return vals, np.concatenate([np.zeros(v.size, bool) if m is None else m for v, m in parts])

    for k1, missing, to_key in _k1_batches(spec, start, stop):
        pos = 0
        if carry:
            need = chunk_rows - sum(v.size for v, _ in carry)
            carry.append((k1[:need], None if missing is None else missing[:need]))
            pos = min(need, k1.size)
            if sum(v.size for v, _ in carry) < chunk_rows:
                continue
            emit(*joined(carry))
            carry = []
        while k1.size - pos >= chunk_rows:
            emit(k1[pos:pos + chunk_rows], None if missing is None else missing[pos:pos + chunk_rows])
            pos += chunk_rows
        if pos < k1.size:
            carry.append((k1[pos:].copy(), None if missing is None else missing[pos:].copy()))
    if carry:
        emit(*joined(carry))
    return out


def _chunk_stats(side: str, chunk: int, count: int, seg: np.ndarray, k1: str, row_of, *,
                 missing: np.ndarray | None = None, to_key=None) -> ChunkStats:
    """One chunk's stats from the k1 values ``seg`` of its records (or of its outer indices);
    ``row_of(i)`` is the global row of the record behind ``seg[i]``. ``missing``: the records
    without a key (None: none). ``to_key``: maps stored values to key values (a non-decreasing
    map; ``InputSource.raw_key``), applied to the range and samples only."""
    st = ChunkStats(side, chunk, count=count)
    nan = missing
    if nan is not None and nan.any():
        st.nan_k1 = True
        st.first_nan_row = row_of(int(np.argmax(nan)))
        st.first_nan_key = k1
        seg = seg[~nan]
    if seg.size:
        lo_hi = np.array([seg.min(), seg.max()], dtype=seg.dtype)
        sample = seg[::max(1, seg.size // SAMPLE_PER_CHUNK)].copy()
        order = seg[::max(1, seg.size // ORDER_PER_CHUNK)].copy()
        if to_key is not None:  # one mapping of the range and both samples together
            mapped = to_key(np.concatenate([lo_hi, sample, order]))
            lo_hi, sample, order = mapped[:2], mapped[2:2 + sample.size], mapped[2 + sample.size:]
        st.k1_min, st.k1_max = float(lo_hi[0]), float(lo_hi[1])
        st.sample = np.asarray(sample, dtype=np.float64)
        st.order = np.asarray(order, dtype=np.float64)
    return st


def coord_chunk_stats(side: str, spec: SideSpec, k1_by_outer: np.ndarray) -> list[ChunkStats]:
    """Chunk stats from the values of k1 per outer index (a gridded input keyed by the
    coordinate of its outer dimension): metadata only, no data is read."""
    out = []
    for c, a in enumerate(range(0, k1_by_outer.size, spec.step)):
        seg = k1_by_outer[a:a + spec.step]
        out.append(_chunk_stats(side, c, seg.size * spec.inner, seg, spec.keys[0],
                                lambda i, a=a: (a + i) * spec.inner, missing=np.isnan(seg)))
    return out


def choose_bounds(sample: np.ndarray, parts: int) -> tuple[float, ...]:
    """P - 1 boundaries at the sample's quantiles, each moved into the gap below its value.

    A boundary half-way between two distinct sampled values lies in a gap of the data, so on
    gridded keys (time steps) no record is within a small eps of it and nothing is shared.
    Fewer boundaries result when the sample has few distinct values.
    """
    if parts <= 1 or sample.size == 0:
        return ()
    vals = np.unique(sample)
    if vals.size < 2:
        return ()
    srt = np.sort(sample)
    bounds = []
    for i in range(1, parts):
        q = srt[min(srt.size - 1, (i * srt.size) // parts)]
        j = int(np.searchsorted(vals, q))
        if j == 0:
            continue
        b = (vals[j - 1] + vals[j]) / 2.0
        if not bounds or b > bounds[-1]:
            bounds.append(float(b))
    return tuple(bounds)


def needed_runs(stats: list[ChunkStats], lo: float, hi: float, closed_hi: bool, with_nan: bool,
                step: int) -> tuple[tuple[int, int], ...]:
    """Outer-index runs of the chunks whose k1 range meets [lo, hi) (or [lo, hi])."""
    chunks = []
    for st in stats:
        if st.count == 0:
            continue
        meets = st.k1_max >= lo and (st.k1_min <= hi if closed_hi else st.k1_min < hi)
        if meets or (with_nan and (st.nan_k1 or st.first_nan_row >= 0)):
            chunks.append(st.chunk)
    runs: list[list[int]] = []
    for c in chunks:
        if runs and runs[-1][1] == c * step:
            runs[-1][1] = (c + 1) * step
        else:
            runs.append([c * step, (c + 1) * step])
    return tuple((a, b) for a, b in runs)


def outer_runs(k1_by_outer: np.ndarray, lo: float, hi: float, closed_hi: bool,
               with_nan: bool) -> tuple[tuple[int, int], ...]:
    """Outer-index runs whose k1 lies in [lo, hi) (or [lo, hi]), NaN ones too when ``with_nan``:
    ``needed_runs`` for an input whose k1 is known per outer index (metadata), exact to the
    outer index instead of to the chunk, so a task reads no record it does not own or see."""
    with np.errstate(invalid="ignore"):
        inside = (k1_by_outer >= lo) & ((k1_by_outer <= hi) if closed_hi else (k1_by_outer < hi))
    if with_nan:
        inside |= np.isnan(k1_by_outer)
    edges = np.flatnonzero(np.diff(np.concatenate(([0], inside.astype(np.int8), [0]))))
    return tuple((int(a), int(b)) for a, b in zip(edges[::2], edges[1::2]))


def side_spec(prep: PreparedMerge, side: str) -> SideSpec:
    src = prep.src_a if side == "a" else prep.src_b
    job = prep.job
    variables = job.vars_a if side == "a" else job.vars_b
    inner = max(int(src.inner_size or 1), 1)
    step = max(1, job.batch_rows // inner)
    return SideSpec(path=src.path, keys=tuple(src.keys), variables=tuple(variables) if variables else None,
                    batch_rows=job.batch_rows, schema=src.schema, step=step, inner=inner, outer=src.outer_size,
                    sample=pinned_sample(src.path, job.sampling), reopen=getattr(src, "reopen", None),
                    reordered=bool(src.grid is not None and src.grid.reordered))


def _outer_coordinate_k1(src) -> np.ndarray | None:
    """k1 per outer index when k1 is the coordinate variable of a gridded input's outer
    dimension (known from the file's metadata), else None."""
    grid = src.grid
    k1 = src.keys[0]
    if grid is None or not grid.dims or grid.dims[0] != k1 or k1 not in grid.coords:
        return None
    if not isinstance(grid.coords[k1], np.ndarray):  # a long index, generated per slab
        return None
    vals = grid.coords[k1]
    if vals.ndim != 1 or vals.size != src.outer_size:
        return None
    field = src.schema.field(k1)
    try:
        arr = pa.array(vals).cast(field.type)
    except (pa.ArrowException, TypeError, ValueError):
        return None
    return key_columns(pa.RecordBatch.from_arrays([arr], names=[k1]), (k1,))[:, 0]


def _scan_tasks(spec: SideSpec, side: str, groups: int) -> list[tuple[str, int, int | None]]:
    if spec.outer is None:
        return [(side, 0, None)]
    n_chunks = max(1, -(-spec.outer // spec.step))
    g = max(1, min(groups, n_chunks))
    edges = [round(i * n_chunks / g) for i in range(g + 1)]
    return [(side, a, b - 1) for a, b in zip(edges[:-1], edges[1:]) if b > a]


def _scan(item, specs):
    from smerge.spark.session import freeze_worker_heap

    freeze_worker_heap()
    side, first, last = item
    try:
        return scan_chunks(side, specs[side], first, last)
    except SmergeError as e:
        return (type(e).__name__, str(e), None, None)


def _plan_chunks(prep: PreparedMerge, sc, specs: dict, own: dict, progress) -> tuple[dict, dict, dict]:
    """Chunk statistics of both inputs: from metadata where the file allows it (gridded netCDF
    keyed by its outer coordinate; k1 per outer index is returned for those), else from a scan
    of k1 on the executors."""
    stats: dict[str, list[ChunkStats]] = {}
    how: dict[str, str] = {}
    by_outer: dict[str, np.ndarray] = {}
    for side, src in (("a", prep.src_a), ("b", prep.src_b)):
        k1 = _outer_coordinate_k1(src)
        if k1 is not None:
            stats[side] = coord_chunk_stats(side, specs[side], k1)
            how[side] = "metadata"
            by_outer[side] = k1
    todo = [s for s in ("a", "b") if s not in stats]
    if todo:
        default_groups = max(1, -(-sc.defaultParallelism // len(todo)))
        groups = _positive_int(own, "smerge.plan.groups", default_groups)
        items = [it for s in todo for it in _scan_tasks(specs[s], s, groups)]
        scanned = run_job(sc, lambda: sc.parallelize(items, len(items)).map(lambda it: _scan(it, specs)).collect(),
                           len(items), progress if len(items) > 4 else None, "scan keys")
        for s in todo:
            stats[s] = []
            how[s] = "scan"
        for res in scanned:
            if isinstance(res, tuple):
                raise_task_error(res)
            for st in res:
                stats[st.side].append(st)
    for side in ("a", "b"):
        stats[side].sort(key=lambda s: s.chunk)
    return stats, how, by_outer


MIN_PARTITION_RECORDS = 1_000_000


def default_partitions(prep: PreparedMerge, parallelism: int, own: dict) -> int:
    """P when --partitions is not given: Spark's default parallelism, but no more partitions
    than the larger input has ``smerge.partition.min_records`` (default 1,000,000) records:
    below that a partition's merge takes less time than planning and one more task cost."""
    return _default_parts([prep.src_a.num_rows, prep.src_b.num_rows], parallelism, own)


def _positive_int(own: dict, key: str, default: int, *, allow_zero: bool = False) -> int:
    """The whole number ``--conf KEY=N`` (or ``default``); exit 2 naming the key otherwise."""
    raw = own.get(key, default)
    try:
        value = int(raw)
    except (TypeError, ValueError):
        value = -1
    if value < (0 if allow_zero else 1):
        least = "0 (0: no floor)" if allow_zero else "1"
        raise UsageError(f"{param.conf} {key}={raw!r}: give a whole number >= {least}")
    return value


def _default_parts(sizes: list[int | None], parallelism: int, own: dict) -> int:
    floor = _positive_int(own, "smerge.partition.min_records", MIN_PARTITION_RECORDS, allow_zero=True)
    sizes = [n for n in sizes if n is not None]
    parts = max(1, parallelism)
    if sizes and len(sizes) == 2 and floor > 0:
        parts = min(parts, max(1, -(-max(sizes) // floor)))
    return parts


def explicit_bounds(own: dict) -> tuple[float, ...] | None:
    if not own.get("smerge.bounds"):
        return None
    try:
        return tuple(sorted({float(x) for x in own["smerge.bounds"].split(",") if x.strip()}))
    except ValueError:
        raise UsageError(f"{param.conf} smerge.bounds={own['smerge.bounds']!r}: give numbers separated by commas") from None


def plan_slabs(prep: PreparedMerge, sc, specs: dict, partitions: int | None, bounds, own: dict, progress):
    """Slab pairing: (bounds, how each input was planned, chunk runs of A and B per partition,
    the k1 samples in arrival order per input for ``smerge.spark.cgm.windows`` (None with one partition))."""
    job = prep.job
    parts = partitions or default_partitions(prep, sc.defaultParallelism, own)
    if bounds == () or (bounds is None and parts == 1):
        return (), {"a": "none", "b": "none"}, (((0, specs["a"].outer),),), (((0, specs["b"].outer),),), None
    chunk_stats, plan_how, by_outer = _plan_chunks(prep, sc, specs, own, progress)
    if job.nan_keys == "error":
        for side, path in (("a", job.a), ("b", job.b)):
            bad = [s for s in chunk_stats[side] if s.first_nan_row >= 0]
            if bad:
                raise KeyNaNError(bad[0].first_nan_key, bad[0].first_nan_row, path)
    if bounds is None:
        sample = np.concatenate([s.sample for side in ("a", "b") for s in chunk_stats[side]] or [np.empty(0)])
        bounds = choose_bounds(sample, parts)
    eps1 = float(prep.params.eps[0])
    edges = [-np.inf, *bounds, np.inf]
    P = len(bounds) + 1

    def runs(side: str, lo: float, hi: float, closed_hi: bool, with_nan: bool):
        if side in by_outer:
            return outer_runs(by_outer[side], lo, hi, closed_hi, with_nan)
        return needed_runs(chunk_stats[side], lo, hi, closed_hi, with_nan, specs[side].step)

    runs_a = tuple(runs("a", edges[p], edges[p + 1], False, p == 0) for p in range(P))
    runs_b = tuple(runs("b", edges[p] - eps1, edges[p + 1] + eps1, True, p == 0) for p in range(P))
    order = {side: [(st.count / st.order.size, st.order) for st in chunk_stats[side] if st.order.size]
             for side in ("a", "b")}
    return bounds, plan_how, runs_a, runs_b, order


def plan_frames(spark, prep: PreparedMerge, frames: dict, partitions: int | None, bounds, own: dict, progress):
    """The k1 scans of both inputs (row-id offsets, NaN check, sample) and the bounds."""
    from smerge.spark.frames import scan_frame

    sc = spark.sparkContext
    job = prep.job
    scans = {}
    for side, src in frames.items():
        act = spark_action(src.path)
        with session_conf(spark, arrow_batches(job.batch_rows)):
            scans[side] = act(lambda: scan_frame(
                src, lambda fn: run_job(sc, fn, 1, None, f"scan keys of {side.upper()}")))
        if job.nan_keys == "error" and scans[side].first_nan_row >= 0:
            raise KeyNaNError(src.keys[0], scans[side].first_nan_row, src.path)
    parts = partitions or _default_parts([scans["a"].count, scans["b"].count], sc.defaultParallelism, own)
    if bounds is None:
        bounds = choose_bounds(np.concatenate([scans["a"].sample, scans["b"].sample]), parts) if parts > 1 else ()
    return scans, bounds


def frame_order(scan) -> list[tuple[float, np.ndarray]]:
    """The k1 sample of a frame input's scan as one stretch in arrival order (each split's sample
    is in order; splits come in the order Spark returned them: an approximation)."""
    return [(scan.count / scan.sample.size, scan.sample)] if scan.sample.size else []


__all__ = ["ChunkStats", "scan_chunks", "coord_chunk_stats", "choose_bounds", "needed_runs", "outer_runs", "side_spec",
           "default_partitions", "explicit_bounds", "plan_slabs", "plan_frames", "frame_order",
           "MIN_PARTITION_RECORDS"]
