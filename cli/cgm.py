"""``smerge cgm A B``: the CGM eps-delta merge of two partially sorted streams."""

from __future__ import annotations

import shlex
import sys
from typing import Annotated, Optional

import typer

from smerge.cli.common import (AUTO_CONF_KEY, AUTO_ENV, AUTO_MAX_BYTES, delta_exit, emit_stats,
                               merge_summary, parse_conf, parse_eps, progress_enabled, run_guarded,
                               split_list, tqdm_progress)

from smerge.cli.plot import PlotOpt, check_plot, write_plot  # noqa: E402
from smerge.cli.sampling import BudgetOpt, SampleAOpt, SampleBOpt  # noqa: E402

app = typer.Typer(add_completion=False)

# Option declarations shared with the rtm command (same names, same help).
KeysOpt = Annotated[Optional[str], typer.Option("--keys", help="Merge keys K1,K2,.. (same names in both inputs). "
                                                "netCDF default: the coordinate variables of the chosen variables' dimensions.")]
KeysBOpt = Annotated[Optional[str], typer.Option("--keys-b", help="B's key names when they differ from A's.")]
VarsAOpt = Annotated[Optional[str], typer.Option("--vars-a", help="A's payload variables/columns (default: all).")]
VarsBOpt = Annotated[Optional[str], typer.Option("--vars-b", help="B's payload variables/columns (default: all).")]
EpsOpt = Annotated[str, typer.Option("--eps", help="Tolerance: one value, or per key: lat=0.01,lon=0.01,time=0.")]
WindowOpt = Annotated[int, typer.Option("--window", help="Window size N (records).")]
OutputOpt = Annotated[Optional[str], typer.Option("-o", "--output", help="Output (.parquet .nc .csv .arrow); default <stemA>+<stemB>.parquet.")]
FormatOpt = Annotated[Optional[str], typer.Option("--format", help="Output format: parquet, csv, arrow, netcdf (default: from the extension).")]
OverwriteOpt = Annotated[bool, typer.Option("--overwrite", help="Allow replacing an existing output.")]
IdsOpt = Annotated[bool, typer.Option("--with-ids", help="Add a_row, b_row (0-based row ids in the input streams).")]
UnmatchedOpt = Annotated[Optional[str], typer.Option("--unmatched", help="Write unmatched records to PREFIX.a.parquet and PREFIX.b.parquet.")]
StatsOpt = Annotated[Optional[str], typer.Option("--stats", help="Write the run's statistics as JSON to this path.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the statistics JSON on stdout instead of the summary.")]
DeltaOpt = Annotated[Optional[float], typer.Option("--delta", help="Check the best-effort delta-merge: allowed moving drop rate (0-1). Exit 3 when violated.")]
DeltaWOpt = Annotated[int, typer.Option("--delta-windows", help="M, the number of report windows in the moving average.")]
AdaptOpt = Annotated[bool, typer.Option("--adapt", help="Tune K_A, K_B between report windows to hold the moving drop "
                                        "rate at or under --delta at the least merge time (needs --delta; docs/cgm.md).")]
KappaOpt = Annotated[bool, typer.Option("--kappa-max", help="Also compute kappa_max (full sort-merge; holds all keys in memory).")]
LocalOpt = Annotated[bool, typer.Option("--local", help="Run in-process, no JVM (always).")]
MasterOpt = Annotated[Optional[str], typer.Option("--master", help="Spark master URL (local[*], local[N], spark://HOST:7077, "
                                                  "yarn, ...): always runs on Spark. Default auto: in-process when the "
                                                  f"local inputs total at most {AUTO_MAX_BYTES / 1e9:g} GB (--conf "
                                                  f"{AUTO_CONF_KEY}=N, ${AUTO_ENV}), else Spark local[*].")]
PartOpt = Annotated[Optional[int], typer.Option("--partitions", help="Spark partitions (default: the engine's choice).")]
ConfOpt = Annotated[Optional[list[str]], typer.Option("--conf", help="Spark setting KEY=VALUE (repeatable).")]
ProgressOpt = Annotated[Optional[bool], typer.Option("--progress/--no-progress", help="Progress bar on stderr (default: when stderr is a terminal).")]
NanOpt = Annotated[str, typer.Option("--nan-keys", help="NaN or missing keys: 'error' (default) or 'unmatched' (counted).")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show tracebacks of unexpected errors.")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", help="Show Spark's own log output.")]


@app.command("cgm")
def cgm(
    a: Annotated[str, typer.Argument(help="Stream A (netCDF, Parquet, CSV or Arrow IPC), or a Parquet/CSV URL "
                                          "(hdfs://, s3a://, file://, ...) read by Spark's own readers.")],
    b: Annotated[str, typer.Argument(help="Stream B (the same kinds as A).")],
    keys: KeysOpt = None,
    keys_b: KeysBOpt = None,
    vars_a: VarsAOpt = None,
    vars_b: VarsBOpt = None,
    eps: EpsOpt = "0",
    window: WindowOpt = 5000,
    increment: Annotated[int, typer.Option("--increment", help="Least window increment K (sets K_A and K_B).")] = 1000,
    increment_a: Annotated[Optional[int], typer.Option("--increment-a", help="K_A, when it differs from K_B.")] = None,
    increment_b: Annotated[Optional[int], typer.Option("--increment-b", help="K_B, when it differs from K_A.")] = None,
    output: OutputOpt = None,
    format: FormatOpt = None,
    overwrite: OverwriteOpt = False,
    with_ids: IdsOpt = False,
    unmatched: UnmatchedOpt = None,
    stats: StatsOpt = None,
    plot: PlotOpt = None,
    json_: JsonOpt = False,
    delta: DeltaOpt = None,
    delta_windows: DeltaWOpt = 10,
    adapt: AdaptOpt = False,
    kappa_max: KappaOpt = False,
    nan_keys: NanOpt = "error",
    sample_a: SampleAOpt = None,
    sample_b: SampleBOpt = None,
    budget: BudgetOpt = None,
    local: LocalOpt = False,
    master: MasterOpt = None,
    partitions: PartOpt = None,
    conf: ConfOpt = None,
    progress: ProgressOpt = None,
    verbose: VerboseOpt = False,
    debug: DebugOpt = False,
) -> None:
    """CGM best-effort eps-delta merge of two partially sorted streams (spec section 3)."""

    def body() -> int:
        from smerge.cli.common import MAX_PARTITIONS, check_int_range, require_texts

        require_texts({"-o": output, "--format": format, "--unmatched": unmatched, "--stats": stats,
                       "--plot": plot, "--master": master}, inputs=(a, b))
        check_int_range(partitions, "--partitions", 1, MAX_PARTITIONS)
        from smerge.jobs.cgm import CGMJob
        from smerge.jobs.pipeline import RunOptions, execute
        from smerge.merge.params import check_adapt

        job = CGMJob(
            a=a, b=b, output=output, format=format, keys_a=split_list(keys), keys_b=split_list(keys_b),
            vars_a=split_list(vars_a), vars_b=split_list(vars_b), eps=parse_eps(eps), window_size=window,
            least_increment_a=increment_a if increment_a is not None else increment,
            least_increment_b=increment_b if increment_b is not None else increment,
            with_ids=with_ids, nan_keys=nan_keys, delta=delta, delta_windows=delta_windows, adapt=adapt,
            unmatched=unmatched,
            stats=stats, kappa_max=kappa_max, overwrite=overwrite,
            command="smerge " + " ".join(shlex.quote(x) for x in sys.argv[1:]),
        )
        check_adapt(adapt, delta)
        result = execute(job, RunOptions(local=local, master=master, partitions=partitions, conf=parse_conf(conf),
                                         progress=tqdm_progress(progress_enabled(progress)), verbose=verbose,
                                         samples=(sample_a, sample_b), budget=budget),
                         before_run=lambda j: check_plot(plot, overwrite=overwrite, inputs=(a, b)))
        write_plot(result, plot)
        emit_stats(result, as_json=json_, summary=merge_summary)
        return delta_exit(result)

    run_guarded(body, debug=debug)
