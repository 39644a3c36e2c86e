"""``smerge rtm A B`` / ``smerge rtm A --server URL``: the RTM merge against B's R-tree index server."""

from __future__ import annotations

import shlex
import sys
from typing import Annotated, Optional

import typer

from smerge.cli.cgm import (DebugOpt, DeltaOpt, DeltaWOpt, EpsOpt, FormatOpt, IdsOpt, JsonOpt, KappaOpt, KeysBOpt,
                            KeysOpt, NanOpt, OutputOpt, OverwriteOpt, ProgressOpt, StatsOpt, UnmatchedOpt,
                            VarsAOpt, VarsBOpt, WindowOpt)
from smerge.cli.common import delta_exit, emit_stats, merge_summary, parse_eps, progress_enabled, run_guarded, \
    split_list, tqdm_progress

app = typer.Typer(add_completion=False)
RTMLocalOpt = Annotated[bool, typer.Option("--local", help="Accepted for symmetry with cgm: RTM always runs in "
                                           "this process (there is no Spark path for RTM).")]


@app.command("rtm")
def rtm(
    a: Annotated[str, typer.Argument(help="Stream A (netCDF, Parquet, CSV or Arrow IPC).")],
    b: Annotated[Optional[str], typer.Argument(help="Stream B, indexed by a server started for this run "
                                                    "(omit with --server).")] = None,
    server: Annotated[Optional[str], typer.Option("--server", help="URL of a running `smerge serve` "
                                                  "(grpc://HOST:PORT or grpc+tls://HOST:PORT).")] = None,
    token_file: Annotated[Optional[str], typer.Option("--token-file", help="File holding the server's bearer token.")] = None,
    tls_root_cert: Annotated[Optional[str], typer.Option("--tls-root-cert", help="PEM certificate(s) to trust for grpc+tls.")] = None,
    refill: Annotated[str, typer.Option("--refill", help="Window-B refill: page (lossless, default) or symdiff (the paper's).")] = "page",
    keys: KeysOpt = None,
    keys_b: KeysBOpt = None,
    vars_a: VarsAOpt = None,
    vars_b: VarsBOpt = None,
    eps: EpsOpt = "0",
    window: WindowOpt = 5000,
    output: OutputOpt = None,
    format: FormatOpt = None,
    overwrite: OverwriteOpt = False,
    with_ids: IdsOpt = False,
    unmatched: UnmatchedOpt = None,
    stats: StatsOpt = None,
    json_: JsonOpt = False,
    delta: DeltaOpt = None,
    delta_windows: DeltaWOpt = 10,
    kappa_max: KappaOpt = False,
    nan_keys: NanOpt = "error",
    local: RTMLocalOpt = False,
    progress: ProgressOpt = None,
    debug: DebugOpt = False,
) -> None:
    """RTM merge (spec section 5): each A window queries B's R-tree server for its eps-box.

    RTM always runs in this process (--local is accepted for symmetry with cgm and changes
    nothing; there is no Spark path). B is served by an embedded index server (loopback, free
    port, random token) unless --server is given.
    """

    def body() -> int:
        from smerge.rtm_job import RTMJob, prepare_rtm, run_rtm

        job = RTMJob(
            a=a, b=b, server=server, token_file=token_file, tls_root_cert=tls_root_cert, output=output,
            format=format, keys_a=split_list(keys), keys_b=split_list(keys_b), vars_a=split_list(vars_a),
            vars_b=split_list(vars_b), eps=parse_eps(eps), window_size=window, refill=refill, with_ids=with_ids,
            nan_keys=nan_keys, delta=delta, delta_windows=delta_windows, unmatched=unmatched, stats=stats,
            kappa_max=kappa_max, overwrite=overwrite,
            command="smerge " + " ".join(shlex.quote(x) for x in sys.argv[1:]),
        )
        prep = prepare_rtm(job)
        result = run_rtm(prep, progress=tqdm_progress(progress_enabled(progress)))
        emit_stats(result, as_json=json_, summary=merge_summary)
        return delta_exit(result)

    run_guarded(body, debug=debug)
