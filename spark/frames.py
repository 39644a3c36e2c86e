"""Inputs read by Spark's own readers: Parquet and CSV at any URL the cluster can open.

The CGM merge normally pairs slabs: each task reads the chunks of A and B it needs with
smerge's own readers (docs/spark.md). Those readers open local paths only. An input given as a
URL -- ``hdfs://``, ``s3a://``, ``gs://``, ``abfss://``, ``file://``, any scheme Spark's Hadoop
filesystems know -- is read by Spark's own Parquet or CSV reader instead, on the executors,
and the two inputs meet through a shuffle (the issue's second plan):

1. **Scan** (one job per input): the leading key k1 of every record, with the record's file
   split (``_metadata.file_path``, ``_metadata.file_block_start``). Per split: the record
   count, the k1 range, the first NaN k1 and a sample of k1. Only these summaries reach the
   driver. Spark reads only the k1 column of Parquet; CSV is parsed whole.
2. **Row ids.** The arrival order of a file source is its files in name (path) order, and in a
   file the records in order. Spark keeps the records of one split together and in order, so
   a record's row id is the number of records in the splits before its split (from the scan)
   plus its position inside its split. The driver picks the P - 1 boundaries from the sample
   (``choose_bounds``, as for slab pairing).
3. **Tag and shuffle**: a ``mapInArrow`` pass gives each record its row id ``_row`` and the
   partition(s) that must see it (A: its owner; B: its owner and the neighbours within eps1,
   the ownership rule of ``smerge.spark.cgm.tasks``), as a salted group key whose hash sends
   group p to shuffle partition p. Then ``cogroup(...).applyInArrow``: one call per partition
   with A's and B's records as two Arrow tables, sorted by ``_row`` (arrival order), merged by
   the unchanged engine task (``run_partition``), which writes its part files as in slab
   pairing and returns its statistics and seam pairs.

A local netCDF input given together with a URL input is read through the ``smerge_netcdf``
data source (records carry ``_row`` already). A local Parquet/CSV input given together with a
URL is read by Spark's reader too, so both inputs are typed by Spark. Arrow IPC files and
index-server streams cannot meet a URL input (no Spark reader); convert them to Parquet.

Costs (measured, BENCHMARKS.md): every record passes through the JVM's rows and a shuffle,
about an order of magnitude slower than slab pairing -- that is why local paths keep slab
pairing unless ``--conf smerge.reader=spark``. Memory: ``cogroup`` hands a partition's
records to Python as whole tables (pyspark 4.3 has no iterator form), so a task holds its
partition of A and B; use more partitions for larger inputs.
"""

from __future__ import annotations

import os
import pickle
import re
from urllib.parse import unquote
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa

from smerge.datasets.base import InputSource, is_spark_url
from smerge.datasets.remote import is_remote
from smerge.datasets.tabular import resolve_columns
from smerge.errors import InputError, SmergeError, UsageError, param
from smerge.merge.keys import key_matrix

ROW = "_row"
GROUP = "_salt"
FILE, BLOCK = "_smerge_file", "_smerge_block"
RESERVED = (ROW, GROUP, FILE, BLOCK, "_metadata")
SAMPLE_PER_SPLIT = 256
PARQUET_EXT = (".parquet", ".pq")
CSV_EXT = (".csv", ".tsv", ".txt")
COMPRESSED = (".gz", ".bz2", ".deflate", ".lz4", ".snappy", ".zst")

def frame_format(path: str, fmt: str | None = None) -> str:
    """``parquet`` or ``csv`` for Spark's reader, from ``fmt`` or the path's extension; a path
    without an extension (or ending in ``/``) is a Parquet dataset folder."""
    if fmt in ("parquet", "csv"):
        return fmt
    if fmt is not None:
        raise UsageError(f"{path}: Spark reads Parquet or CSV at a URL, not {fmt}; convert the input")
    name = path.rstrip("/").rsplit("/", 1)[-1].lower()
    for c in COMPRESSED:
        if name.endswith(c) and name[: -len(c)].endswith(CSV_EXT):
            name = name[: -len(c)]
    if name.endswith(PARQUET_EXT) or path.endswith("/") or "." not in name:
        return "parquet"
    if name.endswith(CSV_EXT):
        return "csv"
    raise InputError(f"{path}: Spark's readers take Parquet (.parquet, or a folder) or CSV (.csv, .tsv, .txt) "
                     "at a URL; rename the file or convert it")


@dataclass
class FrameSource(InputSource):
    """An input read by Spark (its records are never read on the driver).

    ``df`` selects the input's columns (keys first) plus the split columns ``FILE``/``BLOCK``
    (file sources) or ``_row`` (the ``smerge_netcdf`` data source).
    """

    df: object = None
    local: InputSource | None = None  # a local netCDF input also opened by smerge's reader

    @property
    def rowed(self) -> bool:
        return self.local is not None


def _spark_error(path: str, e: Exception) -> InputError:
    first = (str(e).splitlines() or [type(e).__name__])[0]
    first = re.sub(r"\s*SQLSTATE:.*$", "", first)
    if "TIMESTAMP(NANOS" in first:
        return InputError(f"{path}: Spark's Parquet reader has no nanosecond timestamps ({first}); write the "
                          "times in microseconds (pandas: to_parquet(..., coerce_timestamps='us')), or give a "
                          f"local path and let smerge's own reader read it (without {param.conf} smerge.reader=spark)")
    return InputError(f"{path}: Spark cannot read it ({first}); check the URL and that the cluster can reach it")


def _csv_separator(spark, path: str, local_path: str | None) -> str:
    """``\t`` for .tsv, ``,`` for .csv; for other names (.txt) the header line decides, as
    smerge's own CSV reader does (tabs and no comma: tab-separated)."""
    name = path.lower()
    if re.search(r"\.tsv(\.[a-z0-9]+)?$", name):
        return "\t"
    if re.search(r"\.csv(\.[a-z0-9]+)?$", name):
        return ","
    if local_path is not None:
        with open(local_path, "rb") as f:
            head = f.readline(65536)
    else:
        try:
            rows = spark.read.text(path).limit(1).collect()
        except Exception as e:  # noqa: BLE001
            raise _spark_error(path, e) from None
        head = rows[0].value.encode() if rows else b""
    return "\t" if b"\t" in head and b"," not in head else ","


def _read_files(spark, path: str, fmt: str, local_path: str | None = None):
    reader = spark.read
    if fmt == "csv":
        # RFC 4180 quoting ("" inside quotes), as pyarrow's reader; malformed rows are errors
        reader = (reader.option("header", True).option("inferSchema", True)
                  .option("sep", _csv_separator(spark, path, local_path)).option("quote", '"')
                  .option("escape", '"').option("mode", "FAILFAST"))
    try:
        return reader.format(fmt).load(path)
    except Exception as e:  # noqa: BLE001 - AnalysisException (path not found, not Parquet, ...)
        raise _spark_error(path, e) from None


def open_frame(spark, path: str, *, keys: Sequence[str] | None = None, variables: Sequence[str] | None = None,
               batch_rows: int = 131072, order=None) -> FrameSource:
    """Open ``path`` (a URL, or a local Parquet/CSV/netCDF path) as a Spark DataFrame input."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import to_arrow_schema

    from smerge.datasets import open_input

    local = None
    if not is_spark_url(path):
        local = open_input(path, keys=keys, variables=variables, batch_rows=batch_rows, order=order)
        if local.format == "netcdf":
            from smerge.spark.netcdf import NAME, arrow_schema, register

            arrow_schema(local)  # numeric columns only
            register(spark)
            df = (spark.read.format(NAME).option("path", path if is_remote(path) else os.path.abspath(path))
                  .option("keys", ",".join(local.keys)).option("variables", ",".join(
                      n for n in local.schema.names if n not in local.keys) or ",".join(local.keys))
                  .option("numPartitions", max(1, spark.sparkContext.defaultParallelism))
                  .option("batchRows", batch_rows).load())
            return FrameSource(path=path, format="spark-netcdf", schema=local.schema, keys=local.keys,
                               num_rows=local.num_rows, outer_size=None, inner_size=1,
                               open_batches=_driver_cannot_read(path), grid=local.grid, df=df, local=local)
        if local.format not in ("parquet", "csv"):
            what = "an archive" if local.format == "archive" else f"a {local.format} input"
            raise UsageError(f"{path}: {what} cannot be read together with a URL input (Spark has "
                             "no reader for it); convert it to Parquet")
        fmt = local.format
        url = path if is_remote(path) else "file://" + os.path.abspath(path)  # s3://...: the cluster's filesystem
    else:
        fmt = frame_format(path)
        url = path
    df = _read_files(spark, url, fmt, None if local is None else path)
    clash = sorted({c for c in df.columns if c in RESERVED or c.startswith("_smerge")})
    if clash:
        raise UsageError(f"{path}: column {clash[0]!r} has a name smerge uses inside Spark runs "
                         f"({', '.join(sorted(RESERVED))}); rename it, or copy the input to a local path")
    file_schema = to_arrow_schema(df.schema, timezone=spark.conf.get("spark.sql.session.timeZone"))
    schema, columns, key_names = resolve_columns(path, file_schema, keys, variables)
    for k in key_names:
        t = schema.field(k).type
        if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_timestamp(t)
                or pa.types.is_date(t)):
            raise InputError(f"{path}: key {k!r} is {t} as Spark reads it; keys must be numbers or times")
    df = df.select(*[F.col(f"`{c}`") for c in columns], F.col("_metadata.file_path").alias(FILE),
                   F.col("_metadata.file_block_start").alias(BLOCK))
    return FrameSource(path=path, format=f"spark-{fmt}", schema=schema, keys=key_names, num_rows=None,
                       outer_size=None, inner_size=1, open_batches=_driver_cannot_read(path), df=df)


def _driver_cannot_read(path: str):
    def batches(start: int = 0, stop: int | None = None) -> Iterator[pa.RecordBatch]:
        raise SmergeError(f"{path}: read by Spark's executors, not on the driver")
        yield  # pragma: no cover

    return batches


# --------------------------------------------------------------------------------------------
# Pass 1: the k1 scan, per file split.

SCAN_SCHEMA = "split_file string, split_block long, n long, k1_min double, k1_max double, first_nan long, sample binary"


def _scan_fn(k1: str, rowed: bool):
    def scan(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        acc: dict[tuple[str, int], list] = {}
        for b in batches:
            if not b.num_rows:
                continue
            k = key_matrix(b, (k1,))[:, 0]
            if rowed:
                rows = b.column(ROW).to_numpy()
                runs = [(("", 0), slice(0, b.num_rows))]
            else:
                runs = _split_runs(b)
            for split, sl in runs:
                seg = k[sl]
                st = acc.get(split)
                if st is None:
                    st = acc[split] = [0, np.inf, -np.inf, -1, []]
                nan = np.isnan(seg)
                if nan.any():
                    at = int(rows[sl][nan].min()) if rowed else st[0] + int(np.argmax(nan))
                    if st[3] < 0 or (rowed and at < st[3]):
                        st[3] = at
                    seg = seg[~nan]
                if seg.size:
                    st[1], st[2] = min(st[1], float(seg.min())), max(st[2], float(seg.max()))
                    st[4].append(seg[:: max(1, seg.size // SAMPLE_PER_SPLIT)])
                st[0] += int(sl.stop - sl.start)
        out = {"split_file": [], "split_block": [], "n": [], "k1_min": [], "k1_max": [], "first_nan": [],
               "sample": []}
        for (f, blk), (n, lo, hi, first_nan, samples) in acc.items():
            s = np.concatenate(samples) if samples else np.empty(0)
            s = s[:: max(1, s.size // SAMPLE_PER_SPLIT)]
            for name, v in zip(out, (f, blk, n, lo, hi, first_nan, s.astype(np.float64).tobytes())):
                out[name].append(v)
        yield pa.RecordBatch.from_arrays(
            [pa.array(out["split_file"], pa.string()), pa.array(out["split_block"], pa.int64()),
             pa.array(out["n"], pa.int64()), pa.array(out["k1_min"], pa.float64()),
             pa.array(out["k1_max"], pa.float64()), pa.array(out["first_nan"], pa.int64()),
             pa.array(out["sample"], pa.binary())],
            names=list(out))

    return scan


def _split_runs(b: pa.RecordBatch) -> list[tuple[tuple[str, int], slice]]:
    """Runs of consecutive records of one file split in a batch."""
    files = b.column(FILE).dictionary_encode()
    idx = files.indices.to_numpy(zero_copy_only=False)
    blocks = b.column(BLOCK).to_numpy(zero_copy_only=False)
    change = np.flatnonzero((idx[1:] != idx[:-1]) | (blocks[1:] != blocks[:-1])) + 1
    starts, ends = np.concatenate([[0], change]), np.concatenate([change, [b.num_rows]])
    names = files.dictionary.to_pylist()
    return [((names[idx[a]], int(blocks[a])), slice(int(a), int(e))) for a, e in zip(starts, ends)]


@dataclass
class FrameScan:
    """What the driver knows of a frame input after the scan."""

    count: int
    offsets: dict[tuple[str, int], int]  # first row id of every split (file sources)
    first_nan_row: int  # -1: no NaN k1
    sample: np.ndarray


def scan_frame(src: FrameSource, run) -> FrameScan:
    """Run the k1 scan of ``src``; ``run(fn)`` runs an action (for progress and errors)."""
    k1 = src.keys[0]
    cols = [k1, ROW] if src.rowed else [k1, FILE, BLOCK]
    rows = run(lambda: src.df.select(*cols).mapInArrow(_scan_fn(k1, src.rowed), SCAN_SCHEMA).collect())
    splits: dict[tuple[str, int], list] = {}
    for r in rows:
        key = (r.split_file, r.split_block)
        if key in splits:  # rowed sources: one entry per Spark partition, same key
            prev = splits[key]
            prev[0] += r.n
            if r.first_nan >= 0 and (prev[1] < 0 or r.first_nan < prev[1]):
                prev[1] = r.first_nan
            prev[2].append(np.frombuffer(r.sample, np.float64))
        else:
            splits[key] = [r.n, r.first_nan, [np.frombuffer(r.sample, np.float64)]]
    offsets, row, first_nan = {}, 0, -1
    # files in path order (Spark's file_path is a percent-encoded URI), splits by start
    for key in sorted(splits, key=lambda k: (unquote(k[0]), k[1])):
        n, nan_at, _ = splits[key]
        offsets[key] = row
        if nan_at >= 0 and first_nan < 0:
            first_nan = nan_at if src.rowed else row + nan_at
        row += n
    sample = np.concatenate([s for v in splits.values() for s in v[2]] or [np.empty(0)])
    return FrameScan(count=row, offsets=offsets, first_nan_row=first_nan, sample=sample)


# --------------------------------------------------------------------------------------------
# Pass 2: row ids and partition tags.


def salts(spark, parts: int) -> list[int]:
    """For every partition p a group value v with pmod(hash(v), P) == p: grouping by v sends
    group p to shuffle partition p (Spark hashes group keys with Murmur3)."""
    from pyspark.sql import functions as F

    found: dict[int, int] = {}
    lo = 0
    while len(found) < parts:
        hi = lo + 10 * parts
        cand = spark.range(lo, hi).select(F.col("id").cast("int").alias("v"),
                                          F.pmod(F.hash(F.col("id").cast("int")), F.lit(parts)).alias("t")).collect()
        for r in cand:
            found.setdefault(r.t, r.v)
        lo = hi
    return [found[p] for p in range(parts)]


def _tag_fn(side: str, keys: tuple[str, ...], names: list[str], offsets: dict, bounds: tuple[float, ...],
            eps1: float, salt: list[int], rowed: bool, replicate: bool):
    from smerge.spark.cgm.tasks import owner, visibility

    bounds_arr = np.asarray(bounds, dtype=np.float64)

    def tag(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        seen: dict[tuple[str, int], int] = {}
        for b in batches:
            if not b.num_rows:
                continue
            if rowed:
                rows = b.column(ROW).to_numpy().astype(np.int64, copy=False)
            else:
                rows = np.empty(b.num_rows, dtype=np.int64)
                for split, sl in _split_runs(b):
                    if split not in offsets:
                        raise SmergeError(f"a file split {split} appeared that the key scan did not see; "
                                          "the input changed during the run")
                    pos = seen.get(split, 0)
                    rows[sl] = np.arange(offsets[split] + pos, offsets[split] + pos + (sl.stop - sl.start))
                    seen[split] = pos + (sl.stop - sl.start)
            cols = [b.column(n) for n in names]
            if side == "a" or not replicate or not bounds_arr.size:
                yield _tagged(cols, names, rows, owner(bounds_arr, key_matrix(b, keys[:1])[:, 0]), salt)
                continue
            own, lo, hi = visibility(bounds_arr, key_matrix(b, keys), eps1)
            yield _tagged(cols, names, rows, own, salt)
            for p in np.unique(np.concatenate([np.arange(a, c + 1) for a, c in zip(lo[lo != hi], hi[lo != hi])]
                                              or [np.empty(0, np.int64)])):
                extra = (lo <= p) & (p <= hi) & (own != p)
                if extra.any():
                    idx = np.flatnonzero(extra)
                    yield _tagged([c.take(pa.array(idx)) for c in cols], names, rows[idx],
                                  np.full(idx.size, p, dtype=np.int64), salt)

    return tag


def _tagged(cols, names, rows, parts, salt) -> pa.RecordBatch:
    salt_arr = np.asarray(salt, dtype=np.int32)
    return pa.RecordBatch.from_arrays([*cols, pa.array(rows, pa.int64()), pa.array(salt_arr[parts], pa.int32())],
                                      names=[*names, ROW, GROUP])


def tagged_frame(src: FrameSource, side: str, scan: FrameScan, bounds, eps1: float, salt: list[int],
                 replicate: bool = True):
    """``src``'s records with ``_row`` and the group key ``_salt`` of their partition(s)."""
    from pyspark.sql.types import IntegerType, LongType, StructField, StructType

    names = list(src.schema.names)
    fields = [src.df.schema[n] for n in names]
    out = StructType([*fields, StructField(ROW, LongType()), StructField(GROUP, IntegerType())])
    fn = _tag_fn(side, tuple(src.keys), names, scan.offsets, tuple(bounds), eps1, salt, src.rowed, replicate)
    return src.df.mapInArrow(fn, out)


# --------------------------------------------------------------------------------------------
# The merge: one cogroup call per partition.

RESULT_SCHEMA = "p int, result binary"


def cogroup_merge(ta, tb, plan, salt: list[int]):
    """The DataFrame of per-partition results (``p``, pickled ``run_partition`` dict)."""
    from smerge.spark.cgm.tasks import run_partition

    part_of = {v: p for p, v in enumerate(salt)}

    def merge(key, left: pa.Table, right: pa.Table) -> pa.Table:
        p = part_of[key[0].as_py()]
        res = run_partition(plan, p, tables=(left, right))
        return pa.table({"p": pa.array([p], pa.int32()), "result": pa.array([pickle.dumps(res)], pa.binary())})

    return ta.groupBy(GROUP).cogroup(tb.groupBy(GROUP)).applyInArrow(merge, RESULT_SCHEMA)


def table_batches(table: pa.Table, schema: pa.Schema, batch_rows: int) -> Iterator[tuple[pa.RecordBatch, np.ndarray]]:
    """A partition's records of one input in arrival order: (batch of ``schema``, row ids)."""
    if table.num_rows:
        table = table.sort_by(ROW)
    ids = table.column(ROW).to_numpy() if table.num_rows else np.empty(0, np.int64)
    data = table.select(list(schema.names))
    if data.schema != schema:
        data = data.cast(schema)
    off = 0
    for batch in data.to_batches(max_chunksize=batch_rows):
        n = batch.num_rows
        yield batch, ids[off:off + n]
        off += n


def results_of(rows) -> list[dict]:
    return [pickle.loads(r.result) for r in rows]


__all__ = ["is_spark_url", "frame_format", "FrameSource", "open_frame", "scan_frame", "FrameScan", "salts",
           "tagged_frame", "cogroup_merge", "table_batches", "results_of", "ROW", "GROUP"]
