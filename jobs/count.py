"""Count jobs: ``smerge count`` as a job of the one pipeline (``smerge.jobs.pipeline``).

``CountJob`` is the count as given on the command line: a SOURCE, its item and time columns and
the query (``every`` intervals, or one range ``start``..``stop``). ``prepare`` checks the query's
shape and the output rule for ``-o`` and ``--stats`` before anything is read. ``run_local``
counts in this process (a count has no Spark route): a local file or a server's plain stream
record by record (exact; an archive read with ``--sample`` gives counts scaled by 1/f), or the
server's frequent-item summarised stream when it summarises the same item over the same time
(``smerge.counting.summary``). Its statistics: what travelled (records and Arrow IPC bytes
received against the raw stream's) and the answers (exact or estimated).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import pyarrow as pa
import pyarrow.compute as pc

from smerge.errors import InputError, UsageError, param

if TYPE_CHECKING:
    from smerge.datasets.archive.sampling import Sampling


@dataclass(frozen=True)
class CountJob:
    """One count: SOURCE (a file, or ``grpc://HOST:PORT/NAME``), the item and time columns, and
    either ``every`` or both ``start`` and ``stop`` (text as given: durations, date-times or
    numbers in the time column's unit; their meaning depends on the column). ``answer``, when
    given, receives the answer table (the command line shows its first rows)."""

    source: str
    item: str
    time: str
    every: str | None = None
    start: str | None = None
    stop: str | None = None
    output: str | None = None
    stats: str | None = None
    overwrite: bool = False
    answer: Callable[[pa.Table], None] | None = field(default=None, compare=False, repr=False)
    # The run's sampled archive reads (``smerge.datasets.archive.sampling.Sampling``), set by the
    # pipeline (``execute``); None outside a run: archives read with the environment's fraction, else 1.
    sampling: Sampling | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if (self.every is None) == (self.start is None and self.stop is None) or (
                self.every is None and (self.start is None or self.stop is None)):
            raise UsageError(f"give either {param.every} DUR or both {param.start} T and {param.stop} T")
        if self.item == self.time:
            raise UsageError(f"{param.item} and {param.time} both name {self.item!r}; give the item and the time columns")


@dataclass
class PreparedCount:
    job: CountJob


def prepare(job: CountJob) -> PreparedCount:
    """The output rule for ``-o`` and ``--stats`` (exit 2 before anything is read)."""
    from smerge.datasets.writers import is_dataset_path
    from smerge.jobs.outputs import check_run_outputs

    outputs = ([("-o", job.output, is_dataset_path(job.output, None))] if job.output else []) + (
        [(param.stats, job.stats, False)] if job.stats else [])
    check_run_outputs([job.source], outputs, overwrite=job.overwrite)
    return PreparedCount(job)


def run_local(prep: PreparedCount, *, progress: Callable | None = None) -> dict:
    """Count, write ``-o`` (when given), hand the answer to ``job.answer`` and return the statistics."""
    job = prep.job
    t0 = time.perf_counter()
    table, stats = count_source(job, progress=progress)
    stats["seconds"] = round(time.perf_counter() - t0, 4)
    if job.output:
        from smerge.datasets.writers import open_output

        with open_output(job.output, table.schema, overwrite=job.overwrite) as out:
            for b in table.to_batches():
                out.write(b)
        stats["output"] = job.output
    stats["execution"] = "local"
    if job.stats:
        from smerge.jobs.outputs import write_stats

        write_stats(job.stats, stats, overwrite=job.overwrite)  # claimed now; the pipeline rewrites it
    if job.answer is not None:
        job.answer(table)
    return stats


def count_source(job: CountJob, progress: Callable | None = None) -> tuple[pa.Table, dict]:
    """(the answer, its statistics): the summarised stream when the server offers it for this
    item and time, else every record."""
    from smerge.transport.flight_input import is_flight_url

    if is_flight_url(job.source):
        from smerge.transport.flight_input import credentials
        from smerge.transport.flight_client import IndexClient

        token, certs = credentials()
        with IndexClient(job.source, token=token, tls_root_certs=certs) as client:
            desc = client.info().get("summary")
            if desc and desc["item"] == job.item and desc["time"] == job.time:
                return _from_summary(job, client)
    return _from_records(job, progress)


def _query(job: CountJob, item_type: pa.DataType, time_field: pa.Field):
    """The count query; ``time_field`` (a field: a decoded CF time carries its calendar) gives
    the meaning of durations and date-times."""
    from smerge.counting.itemcount import ItemCounts, check_time_type, duration_ticks, time_point

    time_type = time_field.type
    check_time_type(time_type, param.time)
    if job.every is not None:
        return ItemCounts(item_type, time_type, every=duration_ticks(job.every, time_field, param.every))
    return ItemCounts(item_type, time_type, start=time_point(job.start, time_field, param.start),
                      stop=time_point(job.stop, time_field, param.stop))


def _open_records(source: str, item: str, time_col: str, sampling: Sampling | None = None):
    """The records to count. A netCDF file is read as every other command reads it, and as
    ``smerge serve`` streams it: its default keys (the dimension coordinates, or a point list's
    coordinates) and data variables, one record per grid point. The time joins the keys when it is
    not one (so a CF time is decoded), and the item joins the data variables (or else the keys)
    when it is not a column already. Other inputs: the two columns. ``sampling``: the run's (an
    archive's fraction)."""
    from smerge.datasets import open_input
    from smerge.transport.flight_input import is_flight_url

    src = None if is_flight_url(source) else open_input(source, sample=sampling)
    if src is None or src.format != "netcdf":
        return open_input(source, keys=(time_col,), variables=(item,), sample=sampling)
    names = src.schema.names
    if time_col in src.keys and item in names:
        return src
    keys = list(src.keys) + ([] if time_col in src.keys else [time_col])
    variables = [n for n in names if n not in keys]
    tries = [(keys, variables)] if item in names else [(keys, variables + [item]), (keys + [item], variables)]
    errors = []
    for k, v in tries:
        try:
            return open_input(source, keys=k, variables=v or None, sample=sampling)
        except (UsageError, InputError) as e:
            errors.append(str(e))
    which = f"{param.item} {item!r}" if item not in names else f"{param.time} {time_col!r}"
    raise UsageError(f"{which}: {errors[0]}")


def _from_records(job: CountJob, progress: Callable | None = None) -> tuple[pa.Table, dict]:
    """Every record: a local file (exact) or a server's plain stream of the two columns."""
    from smerge.counting.itemcount import time_values
    from smerge.counting.summary import IpcBytes
    from smerge.transport.flight_input import is_flight_url
    from smerge.jobs.sampling import SampledCounts

    source, item, time_col = job.source, job.item, job.time
    src = _open_records(source, item, time_col, job.sampling)
    names = src.schema.names
    if item not in names:
        raise UsageError(f"{source}: {param.item} {item!r} is not a column; columns: {', '.join(names[:20])}")
    schema = pa.schema([src.schema.field(item), src.schema.field(time_col)])
    counts = SampledCounts(lambda: _query(job, schema.field(0).type, schema.field(1)), src.counters)
    ipc = IpcBytes(schema)
    records = 0
    bar = progress(src.num_rows, "count records") if progress else None
    try:
        for batch in src.batches():
            if bar:
                bar.update(batch.num_rows)
            b = pa.record_batch([batch.column(item), batch.column(time_col)], schema=schema)
            ipc.add(b)
            records += b.num_rows
            if b.column(0).null_count:
                raise InputError(f"{source}: item column {item!r} has missing values")
            counts.add_raw(b.column(0), time_values(b.column(1), time_col))
    finally:
        if bar:
            bar.close()
    table = _time_metadata(counts.table(), schema.field(1))
    mode = "stream" if is_flight_url(source) else "local"
    stats = {"command": "count", "source": source, "mode": mode, "item": item, "time": time_col,
             "records_received": records, "records_raw": records, "bytes_received": ipc.total,
             "bytes_raw": ipc.total}
    return table, _answer_stats(stats, table, job)


def _from_summary(job: CountJob, client) -> tuple[pa.Table, dict]:
    from smerge.counting.summary import SummaryReceiver, summary_description

    schema, messages = client.summary()
    desc = summary_description(schema)
    rx = SummaryReceiver(schema, _query(job, schema.field(0).type, schema.field(1)))
    for batch, meta in messages:
        rx.add(batch, meta)
    table = _time_metadata(rx.table(), schema.field(1))
    st = rx.stats
    stats = {"command": "count", "source": job.source, "mode": "summary", "item": desc["item"], "time": desc["time"],
             "records_received": st.records_received, "records_raw": st.sender.get("records_raw"),
             "bytes_received": st.bytes_received, "bytes_raw": st.sender.get("bytes_raw"),
             "raw_records_received": st.raw_received, "forecast_bodies": st.forecast_bodies,
             "correct_bodies": st.correct_bodies, "late_records": st.sender.get("late_records"),
             "lifetimes": st.sender.get("lifetimes"),
             "summary": {k: desc[k] for k in ("lifetime_text", "support", "correct_factor", "sketch", "max_frequent")}}
    return table, _answer_stats(stats, table, job)


def _time_metadata(table: pa.Table, time_field: pa.Field) -> pa.Table:
    """``start``/``end`` of a decoded CF time carry its units and calendar, like the time column."""
    from smerge.datasets.cf_time import field_calendar

    if field_calendar(time_field) is None:
        return table
    fields = [f.with_metadata(time_field.metadata) if f.name in ("start", "end") else f for f in table.schema]
    return table.cast(pa.schema(fields))


def _answer_stats(stats: dict, table: pa.Table, job: CountJob) -> dict:
    exact = int(pc.sum(table.column("exact")).as_py() or 0)
    stats.update({"every": job.every, "from": job.start, "to": job.stop, "answers": table.num_rows,
                  "exact_answers": exact, "estimated_answers": table.num_rows - exact})
    raw_r, raw_b = stats.get("records_raw"), stats.get("bytes_raw")
    stats["records_ratio"] = round(stats["records_received"] / raw_r, 6) if raw_r else None
    stats["bytes_ratio"] = round(stats["bytes_received"] / raw_b, 6) if raw_b else None
    return stats


__all__ = ["CountJob", "PreparedCount", "prepare", "run_local", "count_source"]
