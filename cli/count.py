"""``smerge count SOURCE --item COL --time COL (--every DUR | --from T --to T)``: item counts.

SOURCE is a local file (exact: the reference), a server's plain stream (``grpc://HOST:PORT/NAME``)
or, when that server summarises ``--item`` over ``--time`` (``smerge serve ... --summarize``),
its frequent-item summarised stream (docs/semantics.md section 9).
"""

from __future__ import annotations

import time
from typing import Annotated, Optional

import typer

from smerge.cli.options import DebugOpt, JsonOpt, OverwriteOpt, ProgressOpt, StatsOpt
from smerge.cli.common import (check_stats_path, counted, emit_stats, finish_command, progress_enabled,
                               require_texts, run_guarded, run_lines, tqdm_progress)
from smerge.cli.sampling import BudgetOpt, SampleOpt

app = typer.Typer(add_completion=False)
SHOWN_ROWS = 50


@app.command("count")
def count(
    source: Annotated[str, typer.Argument(help="A file, or grpc://HOST:PORT/NAME (summarised when the server offers it).")],
    item: Annotated[str, typer.Option("--item", help="The item column to count.")],
    time_col: Annotated[str, typer.Option("--time", help="The time column.")],
    every: Annotated[Optional[str], typer.Option("--every", help="Intervals of this length aligned to its multiples (1h, or a number in the time column's unit).")] = None,
    start: Annotated[Optional[str], typer.Option("--from", help="Start of one time range (inclusive).")] = None,
    stop: Annotated[Optional[str], typer.Option("--to", help="End of the time range (exclusive).")] = None,
    output: Annotated[Optional[str], typer.Option("-o", "--output", help="Write the counts (start, end, item, count, exact) to .parquet, .csv or .arrow.")] = None,
    overwrite: OverwriteOpt = False,
    stats_path: StatsOpt = None,
    sample: SampleOpt = None,
    budget: BudgetOpt = None,
    as_json: JsonOpt = False,
    progress: ProgressOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Count the items of a stream per interval or over a time range."""

    def body() -> int:
        from smerge.errors import UsageError

        require_texts({"--item": item, "--time": time_col, "--every": every, "--from": start, "--to": stop,
                       "-o": output, "--stats": stats_path}, inputs=[source])
        if (every is None) == (start is None and stop is None) or (every is None and (start is None or stop is None)):
            raise UsageError("give either --every DUR or both --from T and --to T")
        if item == time_col:
            raise UsageError(f"--item and --time both name {item!r}; give the item and the time columns")
        if output:
            from smerge.datasets.writers import check_output_path

            check_output_path(output, overwrite=overwrite, inputs=[source])
        check_stats_path(stats_path, overwrite=overwrite, inputs=[source])
        from smerge.cli.sampling import apply_sample_all, count_sample_stats

        apply_sample_all(sample, [source], spark=False, budget=budget)  # an archive SOURCE: counts scaled by 1/f
        t0 = time.perf_counter()
        table, stats = _count(source, item, time_col, every, start, stop,
                              progress=tqdm_progress(progress_enabled(progress)))
        count_sample_stats(stats, source)
        stats["seconds"] = round(time.perf_counter() - t0, 4)
        if output:
            from smerge.datasets.writers import open_output

            with open_output(output, table.schema, overwrite=overwrite) as out:
                for b in table.to_batches():
                    out.write(b)
            stats["output"] = output
        finish_command(stats, "count", t0, stats_path=stats_path, overwrite=overwrite)
        emit_stats(stats, as_json=as_json, summary=lambda s: _summary(s, None if output else table))
        return 0

    run_guarded(body, debug=debug)


def _count(source: str, item: str, time_col: str, every: str | None, start: str | None, stop: str | None,
           progress=None):
    from smerge.datasets.flight import is_flight_url

    if is_flight_url(source):
        from smerge.datasets.flight import credentials
        from smerge.transport.flight_client import IndexClient

        token, certs = credentials()
        with IndexClient(source, token=token, tls_root_certs=certs) as client:
            desc = client.info().get("summary")
            if desc and desc["item"] == item and desc["time"] == time_col:
                return _from_summary(source, client, every, start, stop)
    return _from_records(source, item, time_col, every, start, stop, progress)


def _query(item_type, time_field, every, start, stop):
    """The count query; ``time_field`` (a field: a decoded CF time carries its calendar) gives
    the meaning of durations and date-times."""
    from smerge.counting.itemcount import ItemCounts, check_time_type, duration_ticks, time_point

    time_type = time_field.type
    check_time_type(time_type, "--time")
    if every is not None:
        return ItemCounts(item_type, time_type, every=duration_ticks(every, time_field, "--every"))
    return ItemCounts(item_type, time_type, start=time_point(start, time_field, "--from"),
                      stop=time_point(stop, time_field, "--to"))


def _open_records(source: str, item: str, time_col: str):
    """The records to count. A netCDF file is read as every other command reads it, and as
    ``smerge serve`` streams it: its default keys (the dimension coordinates, or a point list's
    coordinates) and data variables, one record per grid point. The time joins the keys when it is
    not one (so a CF time is decoded), and the item joins the data variables (or else the keys)
    when it is not a column already. Other inputs: the two columns."""
    from smerge.datasets import open_input
    from smerge.datasets.flight import is_flight_url
    from smerge.errors import InputError, UsageError

    src = None if is_flight_url(source) else open_input(source)
    if src is None or src.format != "netcdf":
        return open_input(source, keys=(time_col,), variables=(item,))
    names = src.schema.names
    if time_col in src.keys and item in names:
        return src
    keys = list(src.keys) + ([] if time_col in src.keys else [time_col])
    variables = [n for n in names if n not in keys]
    tries = [(keys, variables)] if item in names else [(keys, variables + [item]), (keys + [item], variables)]
    errors = []
    for k, v in tries:
        try:
            return open_input(source, keys=k, variables=v or None)
        except (UsageError, InputError) as e:
            errors.append(str(e))
    raise UsageError(f"{'--item ' + repr(item) if item not in names else '--time ' + repr(time_col)}: {errors[0]}")


def _from_records(source, item, time_col, every, start, stop, progress=None):
    """Every record: a local file (exact) or a server's plain stream of the two columns."""
    import pyarrow as pa

    from smerge.datasets.flight import is_flight_url
    from smerge.errors import InputError, UsageError
    from smerge.counting.itemcount import time_values
    from smerge.counting.summary import IpcBytes

    src = _open_records(source, item, time_col)
    names = src.schema.names
    if item not in names:
        raise UsageError(f"{source}: --item {item!r} is not a column; columns: {', '.join(names[:20])}")
    schema = pa.schema([src.schema.field(item), src.schema.field(time_col)])
    from smerge.cli.sampling import SampledCounts

    counts = SampledCounts(lambda: _query(schema.field(0).type, schema.field(1), every, start, stop),
                           src.counters)
    ipc = IpcBytes(schema)
    records = 0
    for batch in counted(src.batches(), progress, src.num_rows, "count records"):
        b = pa.record_batch([batch.column(item), batch.column(time_col)], schema=schema)
        ipc.add(b)
        records += b.num_rows
        if b.column(0).null_count:
            raise InputError(f"{source}: item column {item!r} has missing values")
        counts.add_raw(b.column(0), time_values(b.column(1), time_col))
    table = _time_metadata(counts.table(), schema.field(1))
    mode = "stream" if is_flight_url(source) else "local"
    stats = {"command": "count", "source": source, "mode": mode, "item": item, "time": time_col,
             "records_received": records, "records_raw": records, "bytes_received": ipc.total,
             "bytes_raw": ipc.total}
    return table, _answer_stats(stats, table, every, start, stop)


def _from_summary(source, client, every, start, stop):
    from smerge.counting.summary import SummaryReceiver, summary_description

    schema, messages = client.summary()
    desc = summary_description(schema)
    counts = _query(schema.field(0).type, schema.field(1), every, start, stop)
    rx = SummaryReceiver(schema, counts)
    for batch, meta in messages:
        rx.add(batch, meta)
    table = _time_metadata(rx.table(), schema.field(1))
    st = rx.stats
    stats = {"command": "count", "source": source, "mode": "summary", "item": desc["item"], "time": desc["time"],
             "records_received": st.records_received, "records_raw": st.sender.get("records_raw"),
             "bytes_received": st.bytes_received, "bytes_raw": st.sender.get("bytes_raw"),
             "raw_records_received": st.raw_received, "forecast_bodies": st.forecast_bodies,
             "correct_bodies": st.correct_bodies, "late_records": st.sender.get("late_records"),
             "lifetimes": st.sender.get("lifetimes"),
             "summary": {k: desc[k] for k in ("lifetime_text", "support", "correct_factor", "sketch", "max_frequent")}}
    return table, _answer_stats(stats, table, every, start, stop)


def _time_metadata(table, time_field):
    """``start``/``end`` of a decoded CF time carry its units and calendar, like the time column."""
    import pyarrow as pa

    from smerge.datasets.cf_time import field_calendar

    if field_calendar(time_field) is None:
        return table
    fields = [f.with_metadata(time_field.metadata) if f.name in ("start", "end") else f for f in table.schema]
    return table.cast(pa.schema(fields))


def _time_text(table, column: str):
    """A formatter for ``column``'s values: dates in a decoded CF time's calendar, else as they are."""
    from smerge.datasets.cf_time import field_calendar

    cal = field_calendar(table.schema.field(column))
    if cal is None:
        return str
    import datetime as dt

    import cftime

    epoch = cftime.datetime(1970, 1, 1, calendar=cal)
    return lambda us: str(epoch + dt.timedelta(microseconds=us))


def _answer_stats(stats: dict, table, every, start, stop) -> dict:
    import pyarrow.compute as pc

    exact = int(pc.sum(table.column("exact")).as_py() or 0)
    stats.update({"every": every, "from": start, "to": stop, "answers": table.num_rows, "exact_answers": exact,
                  "estimated_answers": table.num_rows - exact})
    raw_r, raw_b = stats.get("records_raw"), stats.get("bytes_raw")
    stats["records_ratio"] = round(stats["records_received"] / raw_r, 6) if raw_r else None
    stats["bytes_ratio"] = round(stats["bytes_received"] / raw_b, 6) if raw_b else None
    return stats


def _summary(s: dict, table) -> str:
    lines = [f"smerge count: {s['source']} ({s['mode']}) {s['item']} over {s['time']}"]
    if table is not None:
        when = _time_text(table, "start")
        for r in table.slice(0, SHOWN_ROWS).to_pylist():
            flag = "" if r["exact"] else "  (estimate)"
            cnt = f"{r['count']:.0f}" if r["exact"] else f"{r['count']:.1f}"
            lines.append(f"  {when(r['start'])} .. {when(r['end'])}  {r['item']}  {cnt}{flag}")
        if table.num_rows > SHOWN_ROWS:
            lines.append(f"  ... {table.num_rows - SHOWN_ROWS:,} more rows (write them all with -o)")
    lines.append(f"  answers   {s['answers']:,} ({s['exact_answers']:,} exact, {s['estimated_answers']:,} estimates)")
    lines.append(f"  records   {s['records_received']:,} received of {s['records_raw']:,} raw")
    lines.append(f"  bytes     {s['bytes_received']:,} received, raw stream {s['bytes_raw']:,} (Arrow IPC)")
    lines.append(f"  seconds   {s['seconds']:.3f}  total {s['total_seconds']:.3f}")
    return "\n".join(lines + run_lines(s))
