"""``smerge archive append|info``: archived streams read with sampling (ENGINES.md section 8)."""

from __future__ import annotations

import json
import time
from typing import Annotated, Optional

import typer

from smerge.cli.cgm import DebugOpt
from smerge.cli.common import run_guarded

app = typer.Typer(add_completion=False)
archive_app = typer.Typer(add_completion=False, no_args_is_help=True,
                          help="Archive a stream in the randomize-then-sort layout; every command reads an archive folder.")
app.add_typer(archive_app, name="archive")


@archive_app.command("append")
def append_cmd(
    archive: Annotated[str, typer.Argument(help="Archive folder (created when absent or empty).")],
    source: Annotated[str, typer.Argument(help="Stream to append (any input smerge reads).")],
    time_col: Annotated[str, typer.Option("--time", help="Time column: each block is sorted by it.")],
    run_blocks: Annotated[int, typer.Option("--run-blocks", help="R: blocks per run.")] = 16,
    block_rows: Annotated[int, typer.Option("--block-rows", help="B: records per block at most; a run ends when "
                                                                 "one of its blocks is full.")] = 65536,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Seed of the record-to-block assignment "
                                                             "(default: fresh; recorded per run).")] = None,
    json_: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    debug: DebugOpt = False,
) -> None:
    """Append SOURCE to ARCHIVE, one run at a time (each run atomic: a killed append loses only its current run)."""

    def body() -> int:
        from smerge.datasets import open_input
        from smerge.datasets.archive import AppendParams, append
        from smerge.datasets.outputs import local_real
        from smerge.errors import UsageError

        params = AppendParams(time=time_col, run_blocks=run_blocks, block_rows=block_rows, seed=seed)
        if local_real(source) is not None and local_real(source) == local_real(archive):
            raise UsageError(f"{source}: is the archive itself; append another stream")
        t0 = time.perf_counter()
        src = open_input(source)
        summary = append(archive, source, src.batches(), src.schema, params)
        summary["seconds"] = time.perf_counter() - t0
        if json_:
            typer.echo(json.dumps(summary, indent=2))
        else:
            typer.echo(f"smerge archive: {summary['records_added']:,} records of {source} in {summary['runs_added']} "
                       f"runs -> {archive} ({summary['count']:,} records, {summary['runs']} runs; "
                       f"{summary['seconds']:.2f} s)")
        return 0

    run_guarded(body, debug=debug)


@archive_app.command("info")
def info_cmd(
    archive: Annotated[str, typer.Argument(help="Archive folder.")],
    json_: Annotated[bool, typer.Option("--json", help="Print everything as JSON (with the runs).")] = False,
    verify: Annotated[bool, typer.Option("--verify", help="Also read every block and check its SHA-256.")] = False,
    debug: DebugOpt = False,
) -> None:
    """Runs, blocks, records, bytes and time range of ARCHIVE (its manifest and block sizes are checked)."""

    def body() -> int:
        from smerge.datasets.archive import info

        d = info(archive, verify=verify)
        if json_:
            typer.echo(json.dumps(d, indent=2))
        else:
            typer.echo(f"{archive}: {d['format']} {d['layout']}, time column {d['time']}\n"
                       f"  {d['count']:,} records in {d['runs']} runs, {d['blocks']} blocks, {d['bytes']:,} bytes\n"
                       f"  time {d['t_min']} .. {d['t_max']}\n"
                       f"  columns: {', '.join(f'{n} {t}' for n, t in d['schema'])}")
        return 0

    run_guarded(body, debug=debug)
