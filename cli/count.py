"""``smerge count SOURCE --item COL --time COL (--every DUR | --from T --to T)``: item counts.

SOURCE is a local file (exact: the reference), a server's plain stream (``grpc://HOST:PORT/NAME``)
or, when that server summarises ``--item`` over ``--time`` (``smerge serve ... --summarize``),
its frequent-item summarised stream (docs/semantics.md section 9).
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from smerge.cli.options import DebugOpt, JsonOpt, OverwriteOpt, ProgressOpt, StatsOpt
from smerge.cli.common import emit_stats, progress_enabled, require_texts, run_guarded, run_lines, tqdm_progress
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
        require_texts({"--item": item, "--time": time_col, "--every": every, "--from": start, "--to": stop,
                       "-o": output, "--stats": stats_path}, inputs=[source])
        from smerge.jobs.count import CountJob
        from smerge.jobs.pipeline import RunOptions, execute

        shown = []  # the answer, shown when it is not written to -o
        job = CountJob(source=source, item=item, time=time_col, every=every, start=start, stop=stop, output=output,
                       stats=stats_path, overwrite=overwrite, answer=None if output else shown.append)
        result = execute(job, RunOptions(progress=tqdm_progress(progress_enabled(progress)), samples=(sample,),
                                         budget=budget))
        emit_stats(result, as_json=as_json, summary=lambda s: _summary(s, shown[0] if shown else None))
        return 0

    run_guarded(body, debug=debug)


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
