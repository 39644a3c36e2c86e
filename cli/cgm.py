"""``smerge cgm A B``: the CGM eps-delta merge of two partially sorted streams."""

from __future__ import annotations

import shlex
import sys
from typing import Annotated, Optional

import typer

from smerge.cli.common import (delta_exit, emit_stats, merge_summary, parse_conf, progress_enabled,
                               run_guarded, split_list, tqdm_progress)
from smerge.cli.options import (AdaptOpt, ConfOpt, DebugOpt, DeltaOpt, DeltaWOpt, EpsOpt,  # noqa: F401 (re-exported)
                                FormatOpt, IdsOpt, JsonOpt, KappaOpt, KeysBOpt, KeysOpt, LocalOpt, MasterOpt, NanOpt,
                                OutputOpt, OverwriteOpt, PartOpt, ProgressOpt, StatsOpt, UnmatchedOpt, VarsAOpt,
                                VarsBOpt, VerboseOpt, WindowOpt)
from smerge.cli.plot import PlotOpt, check_plot, write_plot
from smerge.cli.sampling import BudgetOpt, SampleAOpt, SampleBOpt
from smerge.merge.params import DEFAULT_DELTA_WINDOWS, DEFAULT_LEAST_INCREMENT, DEFAULT_WINDOW_SIZE
from smerge.merge.values import parse_eps

app = typer.Typer(add_completion=False)


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
    window: WindowOpt = DEFAULT_WINDOW_SIZE,
    increment: Annotated[int, typer.Option("--increment", help="Least window increment K (sets K_A and K_B).")] = DEFAULT_LEAST_INCREMENT,
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
    delta_windows: DeltaWOpt = DEFAULT_DELTA_WINDOWS,
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
    """CGM best-effort eps-delta merge of two partially sorted streams (docs/semantics.md section 3)."""

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
                         before_run=lambda j: check_plot(plot, j, overwrite=overwrite, inputs=(a, b)))
        write_plot(result, plot)
        emit_stats(result, as_json=json_, summary=merge_summary)
        return delta_exit(result)

    run_guarded(body, debug=debug)
