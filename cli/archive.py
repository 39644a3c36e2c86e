"""``smerge archive append|info``: archived streams read with sampling (docs/semantics.md section 8)."""

from __future__ import annotations

import json
import time
from typing import Annotated, List, Optional

import typer

from smerge.cli.common import (check_stats_path, counted, emit_stats, finish_command, progress_enabled, run_guarded,
                               tqdm_progress)
from smerge.cli.options import DebugOpt, JsonOpt, ProgressOpt, StatsOpt

app = typer.Typer(add_completion=False)
archive_app = typer.Typer(add_completion=False, no_args_is_help=True,
                          help="Archive a stream (randomize-then-sort or eager layout, optional "
                               "aggregates); every command reads an archive folder.")
app.add_typer(archive_app, name="archive")


@archive_app.command("append")
def append_cmd(
    archive: Annotated[str, typer.Argument(help="Archive folder (created when absent or empty).")],
    source: Annotated[str, typer.Argument(help="Stream to append (any input smerge reads).")],
    time_col: Annotated[str, typer.Option("--time", help="Time column: each block is sorted by it.")],
    run_blocks: Annotated[int, typer.Option("--run-blocks", help="R: blocks per run.")] = 16,
    block_rows: Annotated[int, typer.Option("--block-rows", help="B: records per block at most; a run ends when "
                                                                 "one of its blocks is full.")] = 65536,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Seed of the record-to-block assignment and of the "
                                                             "eager copies (default: fresh; recorded per run).")] = None,
    layout: Annotated[Optional[str], typer.Option("--layout", help="randomize-then-sort (default for a new archive) "
                                                                 "or eager (with --copies); an existing archive "
                                                                 "keeps its own.")] = None,
    copies: Annotated[Optional[str], typer.Option("--copies", help="eager: reduction levels in (0, 1), e.g. "
                                                                 "0.2,0.4,0.6,0.8 (a copy keeping 80/60/40/20% of "
                                                                 "the records); implies --layout eager.")] = None,
    aggregate: Annotated[Optional[List[str]], typer.Option("--aggregate", help="EVERY:FUNCS[:BY], e.g. "
                                                                             "1h:count,mean,min,max:station: "
                                                                             "tumbling-window aggregates written "
                                                                             "with each run (repeatable).")] = None,
    stats: StatsOpt = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Allow replacing an existing --stats file (the "
                                                                "archive itself is appended to, never replaced).")]
    = False,
    json_: JsonOpt = False,
    progress: ProgressOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Append SOURCE to ARCHIVE, one run at a time (each run atomic: a killed append loses only its current run)."""

    def body() -> int:
        from smerge.datasets import open_input
        from smerge.datasets.archive.aggregate import parse_aggregate
        from smerge.datasets.archive.append import AppendParams, append, parse_copies
        from smerge.datasets.outputs import local_real
        from smerge.errors import UsageError

        params = AppendParams(time=time_col, run_blocks=run_blocks, block_rows=block_rows, seed=seed, layout=layout,
                              copies=parse_copies(copies) if copies is not None else (),
                              aggregates=tuple(parse_aggregate(a) for a in aggregate or ()))
        if local_real(source) is not None and local_real(source) == local_real(archive):
            raise UsageError(f"{source}: is the archive itself; append another stream")
        t0 = time.perf_counter()
        check_stats_path(stats, overwrite=overwrite, inputs=[source, archive])
        src = open_input(source)
        batches = counted(src.batches(), tqdm_progress(progress_enabled(progress)), src.num_rows, "append records")
        summary = append(archive, source, batches, src.schema, params)
        summary["seconds"] = time.perf_counter() - t0
        finish_command(summary, "archive append", t0, stats_path=stats, overwrite=overwrite)
        emit_stats(summary, as_json=json_, summary=lambda s: (
            f"smerge archive: {s['records_added']:,} records of {source} in {s['runs_added']} runs -> {archive} "
            f"({s['count']:,} records, {s['runs']} runs; {s['seconds']:.2f} s)"))
        return 0

    run_guarded(body, debug=debug)


@archive_app.command("info")
def info_cmd(
    archive: Annotated[str, typer.Argument(help="Archive folder.")],
    json_: Annotated[bool, typer.Option("--json", help="Print everything as JSON (with the runs).")] = False,
    verify: Annotated[bool, typer.Option("--verify", help="Also read every block and check its SHA-256.")] = False,
    debug: DebugOpt = False,
) -> None:
    """Layout, runs, blocks, records, bytes, time range, eager copies and aggregates of ARCHIVE (its manifest and
    file sizes are checked)."""

    def body() -> int:
        from smerge.datasets.archive.manifest import info

        d = info(archive, verify=verify)
        if json_:
            typer.echo(json.dumps(d, indent=2))
        else:
            lines = [f"{archive}: {d['format']} {d['layout']}, time column {d['time']}",
                     f"  {d['count']:,} records in {d['runs']} runs, {d['blocks']} blocks, {d['bytes']:,} bytes",
                     f"  time {d['t_min']} .. {d['t_max']}",
                     f"  columns: {', '.join(f'{n} {t}' for n, t in d['schema'])}"]
            for c in d.get("copies", ()):
                lines.append(f"  copy at {c['level']:g} reduction (keeps {c['fraction']:g}): {c['count']:,} records, "
                             f"{c['blocks']} blocks, {c['bytes']:,} bytes")
            for a in d["aggregates"]:
                lines.append(f"  aggregate {a['name']}: every {a['every']}, {','.join(a['funcs'])}"
                             + (f" by {','.join(a['by'])}" if a["by"] else "")
                             + f" of {','.join(a['values']) or 'records'}: {a['rows']:,} partial rows in {a['path']}")
            typer.echo("\n".join(lines))
        return 0

    run_guarded(body, debug=debug)
