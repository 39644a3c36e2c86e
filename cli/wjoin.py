"""``smerge wjoin S1 S2 [S3 ...]``: multi-way sliding-window join of time-stamped streams."""

from __future__ import annotations

import os
import shlex
import sys
from typing import Annotated, Optional

import typer

from smerge.cli.options import (ConfOpt, DebugOpt, JsonOpt, MasterOpt, OverwriteOpt,
                                ProgressOpt, StatsOpt, VerboseOpt)
from smerge.cli.common import (run_lines, emit_stats, parse_conf, progress_enabled, run_guarded,
                               split_list, tqdm_progress)

from smerge.cli.plot import PlotOpt, check_plot, write_plot  # noqa: E402
from smerge.cli.sampling import BudgetOpt, SampleOpt  # noqa: E402

app = typer.Typer(add_completion=False)


def wjoin_summary(s: dict) -> str:
    names = " + ".join(os.path.basename(str(p)) for p in s.get("inputs", []))
    lines = [f"smerge wjoin ({s['method']}): {names} -> {s.get('output', '')}",
             f"  tuples    {s['tuples']:,}"]
    for a in s["records_read"]:
        lines.append(f"  {a:<9} read {s['records_read'][a]:,}  peak buffered {s['peak_buffered'][a]:,}  "
                     f"peak held {s['peak_held'][a]:,}")
    lines.append(f"  seconds   fetch {s['fetch_seconds']:.3f}  join {s['join_seconds']:.3f}  "
                 f"write {s['write_seconds']:.3f}  total {s['total_seconds']:.3f}")
    return "\n".join(lines + run_lines(s))


@app.command("wjoin")
def wjoin(
    inputs: Annotated[list[str], typer.Argument(help="Two or more time-ordered streams (netCDF, Parquet, CSV, Arrow IPC).")],
    time: Annotated[str, typer.Option("--time", help="Time column: one name for all streams, or one per stream (t1,t2,..).")],
    window: Annotated[Optional[str], typer.Option("--window", help="Bound for every pair: 90s, 6h, 2d, or a plain number in the time column's unit.")] = None,
    pair_window: Annotated[Optional[list[str]], typer.Option("--pair-window", help="Bound for one pair, I,J=DUR (1-based; DUR 'none' removes it). Repeatable; overrides --window.")] = None,
    vars_: Annotated[Optional[list[str]], typer.Option("--vars", help="Variables/columns of one stream, I=V1,V2 (1-based), or of every stream, V1,V2 (default: all variables on the key dimensions / all columns). Repeatable. A table keeps its time and --on columns.")] = None,
    on: Annotated[Optional[str], typer.Option("--on", help="Columns equal across all streams (HW-join hash buckets), e.g. lat,lon.")] = None,
    where: Annotated[Optional[str], typer.Option("--where", help="Predicate over S1.col, S2.col, ...: comparisons, + - * /, and/or/not, abs().")] = None,
    aliases: Annotated[Optional[str], typer.Option("--aliases", help="Stream names for --where and output prefixes (default S1,S2,..).")] = None,
    method: Annotated[str, typer.Option("--method", help="auto (hash when equalities link all streams), hash, or nested-loop.")] = "auto",
    output: Annotated[Optional[str], typer.Option(
        "-o", "--output", help="Output (.parquet .csv .arrow, or a folder for a Parquet dataset; not netCDF: tuples "
                               "are not on a grid); default <stem1>+<stem2>+...parquet.")] = None,
    format: Annotated[Optional[str], typer.Option("--format", help="Output format: parquet, csv, arrow (default: "
                                                                   "from the extension).")] = None,
    overwrite: OverwriteOpt = False,
    with_ids: Annotated[bool, typer.Option("--with-ids", help="Add S1_row, S2_row, .. (0-based row ids in the inputs).")] = False,
    stats: StatsOpt = None,
    plot: PlotOpt = None,
    json_: JsonOpt = False,
    sample: SampleOpt = None,
    budget: BudgetOpt = None,
    local: Annotated[bool, typer.Option("--local", help="Run in-process, no JVM (default: auto, see --master).")] = False,
    master: MasterOpt = None,
    partitions: Annotated[Optional[int], typer.Option("--partitions", help="Spark partitions for HW-join (hash of the equality key; default: Spark's default parallelism). NLW-join runs as one partition.")] = None,
    conf: ConfOpt = None,
    verbose: VerboseOpt = False,
    batch_rows: Annotated[int, typer.Option("--batch-rows", help="Records read per input batch (memory: window + up to two batches per stream).")] = 8192,
    progress: ProgressOpt = None,
    debug: DebugOpt = False,
) -> None:
    """W-join: every n-tuple, one record per stream, within the window bounds and matching the predicate (docs/semantics.md section 6)."""

    def body() -> int:
        from smerge.cli.common import MAX_BATCH_ROWS, MAX_PARTITIONS, check_int_range, require_texts

        require_texts({"--time": time, "--window": window,
                       "--where": where, "-o": output, "--format": format, "--stats": stats, "--plot": plot,
                       "--master": master}, inputs=inputs)
        check_int_range(partitions, "--partitions", 1, MAX_PARTITIONS)
        check_int_range(batch_rows, "--batch-rows", 1, MAX_BATCH_ROWS)
        from smerge.jobs.pipeline import RunOptions, execute
        from smerge.jobs.wjoin import WJoinJob

        job = WJoinJob(
            inputs=tuple(inputs), time=split_list(time) or (), window=window, pair_windows=tuple(pair_window or ()),
            vars=tuple(vars_ or ()),
            on=split_list(on) or (), where=where, aliases=split_list(aliases) or (), with_ids=with_ids,
            method=method, output=output, format=format, overwrite=overwrite, stats=stats, batch_rows=batch_rows,
            command="smerge " + " ".join(shlex.quote(x) for x in sys.argv[1:]),
        )
        result = execute(job, RunOptions(local=local, master=master, partitions=partitions, conf=parse_conf(conf),
                                         progress=tqdm_progress(progress_enabled(progress)), verbose=verbose,
                                         samples=(sample,), budget=budget),
                         before_run=lambda j: check_plot(plot, j, overwrite=overwrite, inputs=inputs))
        write_plot(result, plot)
        emit_stats(result, as_json=json_, summary=wjoin_summary)
        return 0

    run_guarded(body, debug=debug)
