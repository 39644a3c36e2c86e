"""``smerge gen OUT``: NCAR-like gridded test data (see smerge.datasets.gen for the model)."""

from __future__ import annotations

from typing import Annotated

import typer

from smerge.cli.common import (check_stats_path, counted, emit_stats, finish_command, progress_enabled, require_text,
                               run_guarded, split_list, tqdm_progress)
from smerge.cli.options import JsonOpt, ProgressOpt, StatsOpt

app = typer.Typer(add_completion=False)


@app.command("gen")
def gen(
    out: Annotated[str, typer.Argument(help="Output file: .nc (grid, or CF point list when shuffled), .parquet, .csv, .arrow.")],
    records: Annotated[int, typer.Option("--records", help="Number of records.")],
    randomize: Annotated[float, typer.Option("--randomize", help="Percent of records moved to a random nearby position.")] = 0.0,
    displacement: Annotated[int, typer.Option("--displacement", help="Largest move of a randomized record, in records.")] = 1000,
    jitter: Annotated[float, typer.Option("--jitter", help="Uniform noise added to every lat/lon (degrees), so eps > 0 is needed.")] = 0.0,
    seed: Annotated[int, typer.Option("--seed", help="Random seed (same seed, same bytes).")] = 0,
    grid: Annotated[str, typer.Option("--grid", help="NLAT,NLON of the grid.")] = "50,100",
    variables: Annotated[str, typer.Option("--vars", help="Variable names (float32).")] = "p,t,u",
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Allow replacing an existing file.")] = False,
    stats: StatsOpt = None,
    json_: JsonOpt = False,
    progress: ProgressOpt = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks of unexpected errors.")] = False,
) -> None:
    """Generate NCAR-like gridded test data: time x lat x lon, float32 variables, ~28 bytes a record."""

    def body() -> int:
        import os
        import time

        t0 = time.perf_counter()

        from smerge.datasets import check_output_path, format_for, open_output
        from smerge.datasets.output_commit import claim_file
        from smerge.datasets.output_space import space_errors
        from smerge.datasets.output_staging import make_temp_file
        from smerge.datasets.gen import MIN_RECORD_BYTES, GenParams, check_netcdf_names, generate, write_netcdf
        from smerge.memory import check_free_space
        from smerge.errors import UsageError

        require_text(out, "OUT", "name the output file")
        try:
            nlat, nlon = (int(x) for x in grid.split(","))
        except ValueError:
            raise UsageError(f"--grid {grid!r} is not NLAT,NLON (two integers from 1 to 10^6)") from None
        p = GenParams(records=records, randomize=randomize, displacement=displacement, jitter=jitter, seed=seed,
                      nlat=nlat, nlon=nlon, variables=split_list(variables, what="--vars"))
        fmt = format_for(out)
        if fmt == "netcdf":
            check_netcdf_names(p)
        check_output_path(out, overwrite=overwrite, fmt=fmt)
        check_stats_path(stats, overwrite=overwrite, inputs=[out])
        p.check_memory()
        check_free_space(out, p.records * MIN_RECORD_BYTES, f"{p.records:,} records")
        if fmt == "netcdf":
            tmp = make_temp_file(out)  # owner-tagged, 0666 minus the umask
            try:
                with space_errors(out, where=tmp):
                    write_netcdf(tmp, p)
                    claim_file(tmp, out, overwrite=overwrite)  # atomic: a file created there meanwhile is kept
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        else:
            batches = counted(generate(p), tqdm_progress(progress_enabled(progress)), p.records, "gen records")
            first = next(batches)
            with open_output(out, first.schema, fmt=fmt, overwrite=overwrite) as w:
                w.write(first)
                for b in batches:
                    w.write(b)
        shape = "grid" if p.gridded or fmt != "netcdf" else "point list"
        result = finish_command({"records": p.records, "output": out, "format": fmt, "shape": shape,
                                 "randomize": p.randomize, "displacement": p.displacement, "jitter": p.jitter,
                                 "seed": p.seed, "grid": [p.nlat, p.nlon], "variables": list(p.variables)},
                                "gen", t0, stats_path=stats, overwrite=overwrite)
        emit_stats(result, as_json=json_, summary=lambda r: (
            f"smerge gen: wrote {p.records:,} records to {out} ({shape}, randomize {p.randomize}%, seed {p.seed})"))
        return 0

    run_guarded(body, debug=debug)
