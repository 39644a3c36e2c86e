"""``smerge rtm A B`` / ``smerge rtm A --server URL``: the RTM merge against B's R-tree index server."""

from __future__ import annotations

import shlex
import sys
from typing import Annotated, Optional

import typer

from smerge.cli.cgm import (ConfOpt, DebugOpt, DeltaOpt, DeltaWOpt, EpsOpt, FormatOpt, IdsOpt, JsonOpt, KappaOpt, KeysBOpt,
                            KeysOpt, MasterOpt, NanOpt, OutputOpt, OverwriteOpt, ProgressOpt, StatsOpt, UnmatchedOpt,
                            VarsAOpt, VarsBOpt, VerboseOpt, WindowOpt)
from smerge.cli.common import delta_exit, emit_stats, merge_summary, parse_conf, \
    progress_enabled, run_guarded, split_list, tqdm_progress

from smerge.cli.plot import PlotOpt, check_plot, write_plot  # noqa: E402
from smerge.cli.sampling import BudgetOpt, SampleAOpt, SampleBOpt  # noqa: E402
from smerge.merge.params import DEFAULT_DELTA_WINDOWS, DEFAULT_WINDOW_SIZE
from smerge.merge.values import parse_eps

app = typer.Typer(add_completion=False)
RTMLocalOpt = Annotated[bool, typer.Option("--local", help="Run in this process, no JVM (default: auto, see "
                                           "--master; on Spark each partition of A queries the server).")]
RTMPartitionsOpt = Annotated[Optional[int], typer.Option("--partitions", help="Spark partitions of A (contiguous row "
                             "ranges cut at multiples of lcm(N, outer slab); default: Spark's default parallelism).")]


@app.command("rtm")
def rtm(
    a: Annotated[str, typer.Argument(help="Stream A (netCDF, Parquet, CSV or Arrow IPC).")],
    b: Annotated[Optional[str], typer.Argument(help="Stream B, indexed by a server started for this run "
                                                    "(omit with --server).")] = None,
    server: Annotated[Optional[str], typer.Option("--server", help="URL of a running `smerge serve` "
                                                  "(grpc://HOST:PORT or grpc+tls://HOST:PORT).")] = None,
    token_file: Annotated[Optional[str], typer.Option("--token-file", help="File holding the server's bearer token.")] = None,
    tls_root_cert: Annotated[Optional[str], typer.Option("--tls-root-cert", help="PEM certificate(s) to trust for grpc+tls.")] = None,
    refill: Annotated[str, typer.Option("--refill", help="Window-B refill: page (default; lossless with eps 0) or symdiff (the paper's).")] = "page",
    keys: KeysOpt = None,
    keys_b: KeysBOpt = None,
    vars_a: VarsAOpt = None,
    vars_b: VarsBOpt = None,
    eps: EpsOpt = "0",
    window: WindowOpt = DEFAULT_WINDOW_SIZE,
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
    kappa_max: KappaOpt = False,
    nan_keys: NanOpt = "error",
    sample_a: SampleAOpt = None,
    sample_b: SampleBOpt = None,
    budget: BudgetOpt = None,
    local: RTMLocalOpt = False,
    master: MasterOpt = None,
    partitions: RTMPartitionsOpt = None,
    conf: ConfOpt = None,
    verbose: VerboseOpt = False,
    progress: ProgressOpt = None,
    debug: DebugOpt = False,
) -> None:
    """RTM merge (docs/semantics.md section 5): each A window queries B's R-tree server for its eps-box.

    By default (--master auto) small inputs run in this process and large ones on Spark
    local[*]; a named --master always runs on Spark: A is split into row ranges whose
    boundaries are multiples of N, each task queries the server for its windows, and the
    output equals --local's exactly. --local always runs in this process. B is served by an embedded
    index server (driver's loopback, free port, random token: fine for local[*] and a one-host
    cluster) unless --server is given (on a real cluster: a server the workers can reach).
    """

    def body() -> int:
        from smerge.cli.common import MAX_PARTITIONS, check_int_range, require_texts
        from smerge.errors import UsageError

        require_texts({"--server": server, "--token-file": token_file,
                       "--tls-root-cert": tls_root_cert, "-o": output, "--format": format, "--unmatched": unmatched,
                       "--stats": stats, "--plot": plot, "--master": master}, inputs=(a, b))
        if b is None and server is None:
            raise UsageError("rtm needs B: give a second input to index for this run, or --server URL of a "
                             "running `smerge serve`")
        check_int_range(partitions, "--partitions", 1, MAX_PARTITIONS)
        from smerge.jobs.pipeline import RunOptions, execute
        from smerge.jobs.rtm import RTMJob

        job = RTMJob(
            a=a, b=b, server=server, token_file=token_file, tls_root_cert=tls_root_cert, output=output,
            format=format, keys_a=split_list(keys), keys_b=split_list(keys_b), vars_a=split_list(vars_a),
            vars_b=split_list(vars_b), eps=parse_eps(eps), window_size=window, refill=refill, with_ids=with_ids,
            nan_keys=nan_keys, delta=delta, delta_windows=delta_windows, unmatched=unmatched, stats=stats,
            kappa_max=kappa_max, overwrite=overwrite,
            command="smerge " + " ".join(shlex.quote(x) for x in sys.argv[1:]),
        )
        result = execute(job, RunOptions(local=local, master=master, partitions=partitions, conf=parse_conf(conf),
                                         progress=tqdm_progress(progress_enabled(progress)), verbose=verbose,
                                         samples=(sample_a, sample_b), budget=budget),
                         before_run=lambda j: check_plot(plot, j, overwrite=overwrite, inputs=(a, b)))
        write_plot(result, plot)
        emit_stats(result, as_json=json_, summary=merge_summary)
        return delta_exit(result)

    run_guarded(body, debug=debug)
