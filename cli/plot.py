"""``smerge plot STATS.json -o run.png``: a picture of a run from its ``--stats`` JSON."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from smerge.cli.common import run_guarded

app = typer.Typer(add_completion=False)


PlotOpt = Annotated[Optional[str], typer.Option("--plot", help="Also draw the run's statistics to this PNG (as `smerge plot`).")]


def check_plot(path: str | None, job, *, overwrite: bool, inputs=()) -> None:
    """Before the run: the output rule for ``--plot PNG`` (exit 2 when it exists without
    --overwrite, is an input, or is the path of another output of ``job``: -o, --unmatched's
    files, --stats)."""
    if not path:
        return
    from smerge.cli.common import check_file_option
    from smerge.jobs.outputs import check_distinct_paths, named_outputs

    check_distinct_paths(inputs, named_outputs(job) + [("--plot", path, False)])
    check_file_option(path, "--plot", overwrite=overwrite, inputs=inputs)


def write_plot(stats: dict, path: str | None) -> None:
    """After the run: draw the statistics to ``path`` (written atomically)."""
    if path:
        from smerge.plot import save_plot

        save_plot(stats, path)


@app.command("plot")
def plot(
    stats: Annotated[str, typer.Argument(help="Statistics JSON written by --stats (cgm, rtm, wjoin or count).")],
    output: Annotated[str, typer.Option("-o", "--output", help="PNG to write.")] = "run.png",
    title: Annotated[Optional[str], typer.Option("--title", help="Title above the panels (default: a summary of the run).")] = None,
    dpi: Annotated[int, typer.Option("--dpi", help="Resolution: the image is 8 x 2.2 inches per panel.")] = 100,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Allow replacing an existing PNG.")] = False,
    json_: Annotated[bool, typer.Option("--json", help="Print what was written as JSON instead of a line.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks of unexpected errors.")] = False,
) -> None:
    """Kappa per report window, the moving drop rate against delta, K when adapted and the
    fetch/merge/write split (cgm, rtm); tuples and buffers over the run (wjoin)."""

    def body() -> int:
        from smerge.datasets.outputs import check_target
        from smerge.errors import InputError, UsageError
        from smerge.plot import save_plot

        if dpi < 10 or dpi > 1000:
            raise UsageError(f"--dpi is {dpi}; use 10 to 1000")
        try:
            with open(stats) as f:
                data = json.load(f)
        except FileNotFoundError:
            raise UsageError(f"{stats}: no such statistics file") from None
        except (ValueError, UnicodeDecodeError) as e:
            raise InputError(f"{stats}: not a JSON file ({e})") from None
        check_target(output, overwrite=overwrite, folder=False, inputs=[stats], opt="-o")
        series = save_plot(data, output, dpi=dpi, title=title)
        from smerge.plot import PANEL_HEIGHT_IN, PANEL_WIDTH_IN

        done = {"command": "plot", "stats": stats, "output": output, "panels": list(series),
                "pixels": [round(PANEL_WIDTH_IN * dpi), round(PANEL_HEIGHT_IN * dpi * len(series))]}
        if json_:
            typer.echo(json.dumps(done, indent=2))
        else:
            typer.echo(f"smerge plot: {stats} -> {output} ({len(series)} panels: {', '.join(series)}; "
                       f"{done['pixels'][0]} x {done['pixels'][1]} pixels)")
        return 0

    run_guarded(body, debug=debug)
