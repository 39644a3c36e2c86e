"""Frequent-item transport (docs/semantics.md section 9; the frequent-items paper, sections 3-5): sender and receiver.

The sender turns a stream of records (item, time) into the summarised stream: lifetimes of fixed
length L aligned to multiples of L; an hCount sketch over each lifetime finds the frequent items
(estimate >= support * n, at most ``max_frequent``); at the start of the next lifetime one
forecast-body (item, lifetime, estimated count) per frequent item is sent and their occurrences
in that lifetime are not; every other record is sent raw (held back into batches of about
``RAW_BATCH_ROWS``, flushed at each lifetime's end); at its end a correct-body (item,
lifetime, true - estimated) is sent for each frequent item with |estimated - true| > c * true.
The receiver counts raw records + forecasts + corrections (``smerge.counting.itemcount.ItemCounts``).

Wire format (one Arrow schema, Flight's or IPC's): the columns ``item`` and ``time`` (the source's
names and types), the schema metadata ``smerge.summary`` (JSON: columns, lifetime length in the
time column's ticks, support, correct-factor, sketch, max_frequent). A batch without
app-metadata holds raw records. A body batch holds the items and the lifetime's start time; its
app-metadata is ``b"F"`` (forecast) or ``b"C"`` (correction), the lifetime number v as int64 and
one int64 count per row (little-endian). The last message is an empty batch whose app-metadata
is ``b"E"`` + JSON statistics of the sender (records_raw, bytes_raw, ...).

Records are expected roughly in time order: a record of a lifetime already closed is sent raw
(``late_records``), which keeps every count exact. Memory: the sketch, the FDI (at most
``max_frequent`` items) and the distinct items of the current lifetime (eFreq's candidates).
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import asdict, dataclass, field
from typing import Iterable, Iterator

import numpy as np
import pyarrow as pa

from smerge.errors import InputError, UsageError, param
from smerge.counting.hcount import (DEFAULT_DEPTH, DEFAULT_MAX_FREQUENT, DEFAULT_SUPPORT, DEFAULT_WIDTH, HCount,
                                    item_keys)
from smerge.counting.itemcount import ItemCounts, check_time_type, duration_ticks, lifetime_ids, time_values

SUMMARY_META_KEY = b"smerge.summary"
FORECAST, CORRECT, TRAILER = b"F", b"C", b"E"
MAX_FREQUENT_LIMIT = 10_000_000
RAW_BATCH_ROWS = 65_536  # raw records are sent in batches of about this many (and at each lifetime's end)
Message = tuple[pa.RecordBatch, bytes | None]


@dataclass(frozen=True)
class SummaryParams:
    """Parameters of the sender (validated once). ``lifetime``: a duration (``1h``) or a plain
    number in the time column's unit; ``sketch``: (h, m)."""

    item: str
    time: str
    lifetime: str | float
    support: float = DEFAULT_SUPPORT
    correct_factor: float = 0.0
    sketch: tuple[int, int] = (DEFAULT_DEPTH, DEFAULT_WIDTH)
    max_frequent: int = DEFAULT_MAX_FREQUENT
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.item or not self.time:
            raise UsageError(f"{param.summarize} COL and {param.time} COL name the item and time columns")
        if self.item == self.time:
            raise UsageError(f"{param.summarize} and {param.time} both name {self.item!r}; the items and times are two columns")
        if not (isinstance(self.support, (int, float)) and 0 < self.support <= 1):
            raise UsageError(f"{param.support} {self.support}: give a fraction in (0, 1], e.g. 0.005")
        if not (isinstance(self.correct_factor, (int, float)) and math.isfinite(self.correct_factor)
                and self.correct_factor >= 0):
            raise UsageError(f"{param.correct_factor} {self.correct_factor}: give a number >= 0 (0: every count exact)")
        if not 0 <= self.max_frequent <= MAX_FREQUENT_LIMIT:
            raise UsageError(f"{param.max_frequent} {self.max_frequent}: give 0..{MAX_FREQUENT_LIMIT:,}")
        HCount(*self.sketch)  # validates h x m

    def resolve(self, schema: pa.Schema, source: str = "the stream") -> int | float:
        """Check the columns against ``schema``; the lifetime length in the time column's ticks."""
        for what, col in ((param.summarize, self.item), (param.time, self.time)):
            if col not in schema.names:
                raise UsageError(f"{source}: {what} {col!r} is not a column; columns: {', '.join(schema.names[:20])}")
        check_time_type(schema.field(self.time).type, self.time)
        return duration_ticks(self.lifetime, schema.field(self.time), param.lifetime)

    def describe(self, length: int | float) -> dict:
        return {"item": self.item, "time": self.time, "lifetime": length, "lifetime_text": str(self.lifetime),
                "support": self.support, "correct_factor": self.correct_factor, "sketch": list(self.sketch),
                "max_frequent": self.max_frequent}

    # What a server needs to offer the summarised stream (the transport layer imports no counting
    # code: ``smerge serve`` hands it these parameters).
    def summary_schema(self, schema: pa.Schema, length: int | float) -> pa.Schema:
        return summary_schema(schema, self, length)

    def summarize(self, batches: Iterable[pa.RecordBatch], schema: pa.Schema) -> Iterator[Message]:
        return summarize(batches, schema, self)


def summary_schema(schema: pa.Schema, params: SummaryParams, length: int | float) -> pa.Schema:
    fields = [schema.field(params.item), schema.field(params.time)]
    return pa.schema(fields, metadata={SUMMARY_META_KEY: json.dumps(params.describe(length)).encode()})


class IpcBytes:
    """Bytes of batches written as one Arrow IPC stream (schema message included), not stored."""

    def __init__(self, schema: pa.Schema, options: pa.ipc.IpcWriteOptions | None = None):
        self._sink = pa.MockOutputStream()
        self._writer = pa.ipc.new_stream(self._sink, schema, options=options)

    def add(self, batch: pa.RecordBatch) -> None:
        self._writer.write_batch(batch)

    @property
    def total(self) -> int:
        return self._sink.size()


@dataclass
class SenderStats:
    records_raw: int = 0  # records of the source stream
    bytes_raw: int = 0  # their Arrow IPC bytes (item and time columns)
    raw_sent: int = 0  # records sent raw
    forecast_bodies: int = 0
    correct_bodies: int = 0
    lifetimes: int = 0
    late_records: int = 0  # records of a closed lifetime (sent raw)
    frequent_per_lifetime_max: int = 0


@dataclass
class _FDI:
    """The frequent items of the open lifetime: keys (sorted), values, estimates, true counts."""

    keys: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    items: pa.Array | None = None
    est: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    true: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


def summarize(batches: Iterable[pa.RecordBatch], schema: pa.Schema, params: SummaryParams, *,
              stats: SenderStats | None = None, ipc_options: pa.ipc.IpcWriteOptions | None = None
              ) -> Iterator[Message]:
    """The summarised stream of ``batches`` (each holding at least the item and time columns):
    (batch, app-metadata) messages of ``summary_schema``; see the module doc."""
    length = params.resolve(schema)
    out_schema = summary_schema(schema, params, length)
    sender = _Sender(out_schema, params, length, stats if stats is not None else SenderStats(), ipc_options)
    for batch in batches:
        if batch.num_rows:
            yield from sender.add(batch)
    yield from sender.finish()


class _Sender:
    def __init__(self, schema: pa.Schema, params: SummaryParams, length: int | float, stats: SenderStats,
                 ipc_options):
        self.schema, self.params, self.length, self.stats = schema, params, length, stats
        self.item_type, self.time_type = schema.field(0).type, schema.field(1).type
        self.sketch = HCount(*params.sketch, seed=params.seed)
        self.raw_bytes = IpcBytes(schema.remove_metadata(), ipc_options)
        self.cur: int | None = None
        self.fdi = _FDI()
        self.cand_keys: list[np.ndarray] = []
        self.cand_items: list[pa.Array] = []
        self.pending: list[pa.RecordBatch] = []  # raw records of the open lifetime not yet sent
        self.pending_rows = 0

    def add(self, batch: pa.RecordBatch) -> Iterator[Message]:
        items = batch.column(self.params.item)
        if items.null_count:
            raise InputError(f"item column {self.params.item!r} has missing values; every record needs an item")
        raw = pa.record_batch([items, batch.column(self.params.time)], schema=self.schema.remove_metadata())
        self.raw_bytes.add(raw)
        self.stats.records_raw += raw.num_rows
        times = time_values(raw.column(1), self.params.time)
        lt = lifetime_ids(times, self.length)
        keys = item_keys(items)
        cuts = np.concatenate(([0], np.flatnonzero(np.diff(lt)) + 1, [len(lt)]))
        for a, b in zip(cuts[:-1], cuts[1:]):
            yield from self._segment(int(lt[a]), raw.slice(a, b - a), keys[a:b])

    def _segment(self, v: int, raw: pa.RecordBatch, keys: np.ndarray) -> Iterator[Message]:
        if self.cur is None:
            self.cur = v
            self.stats.lifetimes += 1
        if v < self.cur:  # late: its lifetime is closed; raw keeps the count exact
            self.stats.late_records += raw.num_rows
            self.stats.raw_sent += raw.num_rows
            yield raw, None
            return
        while self.cur < v:
            yield from self._close()
            if len(self.fdi.keys) == 0:
                self.cur = v  # nothing is frequent: the lifetimes in between send nothing
            else:
                self.cur += 1
            self.stats.lifetimes += 1
            yield from self._open()
        fdi = self.fdi
        # each distinct item of the segment is hashed and looked up once
        u, first, inverse, counts = np.unique(keys, return_index=True, return_inverse=True, return_counts=True)
        self.cand_keys.append(u)
        self.cand_items.append(raw.column(0).take(pa.array(first)))
        self.sketch.update(u, counts)
        if len(fdi.keys):
            pos = np.minimum(np.searchsorted(fdi.keys, u), len(fdi.keys) - 1)
            hit_u = fdi.keys[pos] == u
            if hit_u.any():
                fdi.true += np.bincount(pos[hit_u], weights=counts[hit_u], minlength=len(fdi.keys)).astype(np.int64)
                raw = raw.filter(pa.array(~hit_u[inverse]))
        if raw.num_rows:
            self.stats.raw_sent += raw.num_rows
            self.pending.append(raw)
            self.pending_rows += raw.num_rows
            if self.pending_rows >= RAW_BATCH_ROWS:
                yield from self._flush()

    def _flush(self) -> Iterator[Message]:
        """The raw records held back, as one batch (the receiver's cost grows with batches)."""
        if self.pending_rows:
            batch = pa.Table.from_batches(self.pending).combine_chunks().to_batches(max_chunksize=self.pending_rows)[0]
            yield batch, None
        self.pending, self.pending_rows = [], 0

    def _bodies(self, kind: bytes, sel: np.ndarray, counts: np.ndarray) -> Message:
        items = self.fdi.items.take(pa.array(sel))
        start = pa.array(np.full(len(sel), self.cur * self.length))
        start = start.cast(self.time_type) if self.time_type != start.type else start
        batch = pa.record_batch([items, start], schema=self.schema.remove_metadata())
        meta = kind + struct.pack("<q", self.cur) + np.asarray(counts, "<i8").tobytes()
        return batch, meta

    def _open(self) -> Iterator[Message]:
        """Forecast-bodies of the lifetime ``self.cur`` (the FDI chosen when the last one closed)."""
        n = len(self.fdi.keys)
        if n:
            self.stats.forecast_bodies += n
            self.stats.frequent_per_lifetime_max = max(self.stats.frequent_per_lifetime_max, n)
            yield self._bodies(FORECAST, np.arange(n), self.fdi.est)

    def _close(self) -> Iterator[Message]:
        """Correct-bodies of ``self.cur``; then eFreq over its sketch gives the next FDI."""
        yield from self._flush()
        fdi = self.fdi
        if len(fdi.keys):
            diff = fdi.true - fdi.est
            sel = np.nonzero(np.abs(diff) > self.params.correct_factor * fdi.true)[0]
            if len(sel):
                self.stats.correct_bodies += len(sel)
                yield self._bodies(CORRECT, sel, diff[sel])
        nxt = _FDI()
        if self.sketch.n:
            keys = np.concatenate(self.cand_keys)
            items = pa.concat_arrays(self.cand_items)
            u, first = np.unique(keys, return_index=True)
            pos, est = self.sketch.frequent(u, self.params.support, self.params.max_frequent)
            order = np.argsort(u[pos])
            pos, est = pos[order], est[order]
            nxt = _FDI(keys=u[pos], items=items.take(pa.array(first[pos])), est=est.astype(np.int64),
                       true=np.zeros(len(pos), np.int64))
        self.fdi = nxt
        self.sketch.reset()
        self.cand_keys, self.cand_items = [], []

    def finish(self) -> Iterator[Message]:
        if self.cur is not None:
            yield from self._close()
        self.stats.bytes_raw = self.raw_bytes.total
        trailer = json.dumps(asdict(self.stats)).encode()
        empty = pa.record_batch([pa.array([], self.item_type), pa.array([], self.time_type)],
                                schema=self.schema.remove_metadata())
        yield empty, TRAILER + trailer


# ---- the receiver -------------------------------------------------------------------------------

@dataclass
class ReceiverStats:
    records_received: int = 0  # rows on the wire: raw records + bodies
    bytes_received: int = 0  # their Arrow IPC bytes + app-metadata bytes
    raw_received: int = 0
    forecast_bodies: int = 0
    correct_bodies: int = 0
    sender: dict = field(default_factory=dict)  # the trailer: records_raw, bytes_raw, ...


def summary_description(schema: pa.Schema) -> dict | None:
    """The ``smerge.summary`` metadata of a summarised stream's schema, or None."""
    raw = (schema.metadata or {}).get(SUMMARY_META_KEY)
    return json.loads(raw) if raw else None


class SummaryReceiver:
    """Feeds a summarised stream into ``counts``; ``stats`` says what travelled."""

    def __init__(self, schema: pa.Schema, counts: ItemCounts, *,
                 ipc_options: pa.ipc.IpcWriteOptions | None = None):
        desc = summary_description(schema)
        if desc is None:
            raise InputError("the stream is not a summarised stream (no smerge.summary metadata)")
        self.description = desc
        self.lifetime = desc["lifetime"]
        self.correct_factor = float(desc["correct_factor"])
        self.counts = counts
        self.stats = ReceiverStats()
        self._bytes = IpcBytes(schema.remove_metadata(), ipc_options)
        self._time_col = desc["time"]
        self._meta_bytes = 0
        self.complete = False

    def add(self, batch: pa.RecordBatch, metadata: bytes | None) -> None:
        self._bytes.add(batch)
        self._meta_bytes += len(metadata) if metadata else 0
        st = self.stats
        st.bytes_received = self._bytes.total + self._meta_bytes
        st.records_received += batch.num_rows
        if not metadata:
            st.raw_received += batch.num_rows
            self.counts.add_raw(batch.column(0), time_values(batch.column(1), self._time_col))
            return
        kind = metadata[:1]
        if kind == TRAILER:
            st.sender = json.loads(bytes(metadata[1:]))
            self.complete = True
            return
        if kind not in (FORECAST, CORRECT) or len(metadata) != 9 + 8 * batch.num_rows:
            raise InputError("the summarised stream has a malformed body message; is the server a smerge server?")
        (v,) = struct.unpack("<q", bytes(metadata[1:9]))
        counts = np.frombuffer(bytes(metadata[9:]), "<i8")
        if kind == FORECAST:
            st.forecast_bodies += batch.num_rows
        else:
            st.correct_bodies += batch.num_rows
        self.counts.add_bodies("forecast" if kind == FORECAST else "correct", batch.column(0), v, counts)

    def table(self) -> pa.Table:
        if not self.complete:
            raise InputError("the summarised stream ended before its last message; counts would be incomplete")
        return self.counts.table(self.lifetime, self.correct_factor)
