"""``smerge serve B``: an Arrow Flight index server over B (range/symdiff queries, plain stream)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Annotated, Optional

import typer

from smerge.cli.cgm import DebugOpt, KeysOpt, NanOpt
from smerge.cli.common import run_guarded, split_list

app = typer.Typer(add_completion=False)


@app.command("serve")
def serve(
    b: Annotated[Optional[str], typer.Argument(help="Stream B to serve (omit with --index).")] = None,
    host: Annotated[str, typer.Option("--host", help="Address to bind; non-loopback addresses need --token-file.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on (0: a free port).")] = 8815,
    token_file: Annotated[Optional[str], typer.Option("--token-file", help="Require this bearer token (file content).")] = None,
    keys: KeysOpt = None,
    vars_: Annotated[Optional[str], typer.Option("--vars", help="Payload variables/columns to serve (default: all).")] = None,
    index: Annotated[Optional[str], typer.Option("--index", help="Serve a persisted index (`smerge index build`).")] = None,
    name: Annotated[Optional[str], typer.Option("--name", help="Dataset name (default: B's file stem).")] = None,
    tls_cert: Annotated[Optional[str], typer.Option("--tls-cert", help="PEM certificate: serve grpc+tls.")] = None,
    tls_key: Annotated[Optional[str], typer.Option("--tls-key", help="PEM private key for --tls-cert.")] = None,
    max_page: Annotated[int, typer.Option("--max-page", help="Largest page (records) a query may ask for.")] = 1_000_000,
    summarize: Annotated[Optional[str], typer.Option("--summarize", help="Also offer the frequent-item summarised stream of this item column (smerge count).")] = None,
    time_col: Annotated[Optional[str], typer.Option("--time", help="Time column of --summarize.")] = None,
    lifetime: Annotated[Optional[str], typer.Option("--lifetime", help="Lifetime length of --summarize (1h, 30min, or a number in the time column's unit).")] = None,
    support: Annotated[float, typer.Option("--support", help="Support lambda: frequent means estimated count >= lambda * n.")] = 0.005,
    correct_factor: Annotated[float, typer.Option("--correct-factor", help="Correct-bodies only where |estimated - true| > C * true (0: every count exact).")] = 0.0,
    sketch: Annotated[str, typer.Option("--sketch", help="hCount sketch HxM (hash rows x counters).")] = "30x30",
    max_frequent: Annotated[int, typer.Option("--max-frequent", help="At most F frequent items per lifetime.")] = 300,
    nan_keys: NanOpt = "error",
    json_: Annotated[bool, typer.Option("--json", help="Print the served dataset as one JSON line (url, name, "
                                                      "records, keys, token, summarised item) instead of its URL.")]
    = False,
    debug: DebugOpt = False,
) -> None:
    """Serve B's records and R-tree index over Arrow Flight until SIGTERM or Ctrl-C."""

    def body() -> int:
        import warnings

        from smerge.datasets import open_input
        from smerge.errors import OutputError, UsageError
        from smerge.index import BIndex
        from smerge.transport.flight_server import SHUTDOWN_GRACE, IndexServer
        from smerge.transport.tokens import read_token_file, token_file_exposure

        warnings.simplefilter("ignore")  # a server's stderr is its log: no Python warnings with source paths

        if (b is None) == (index is None):
            raise UsageError("give either B or --index DIR")
        if not 0 <= port <= 65535:
            raise UsageError(f"--port {port} is not a port number (0-65535)")
        if max_page < 1:
            raise UsageError(f"--max-page is {max_page}; use an integer >= 1")
        wants_summary = summarize is not None or time_col is not None or lifetime is not None
        if wants_summary and not (summarize and time_col and lifetime):
            raise UsageError("a summarised stream needs --summarize COL, --time COL and --lifetime DUR")
        token = read_token_file(token_file) if token_file else None
        exposed = token_file_exposure(token_file, host) if token_file else None
        if exposed:
            typer.echo(exposed, err=True)
        cert = key = None
        if tls_cert or tls_key:
            if not (tls_cert and tls_key):
                raise UsageError("TLS needs both --tls-cert and --tls-key")
            cert, key = _read_file(tls_cert, "--tls-cert"), _read_file(tls_key, "--tls-key")
        if index is not None:
            if keys or vars_:
                raise UsageError("--keys/--vars are fixed when the index is built; drop them with --index")
            idx = BIndex.load(index)
            if name:
                idx.name = name
        else:
            if nan_keys not in ("error", "unmatched"):
                raise UsageError(f"--nan-keys is {nan_keys!r}; use error or unmatched")
            # a summarised stream needs no other index: without --keys, index its times
            index_keys = keys if keys or not (summarize and time_col) else time_col
            src = open_input(b, keys=split_list(index_keys), variables=split_list(vars_))
            if not src.keys:
                raise UsageError(f"{b}: no merge keys; pass --keys K1,K2 (tabular inputs have no default keys)")
            from smerge.jobs.inputs import check_keys_cover

            check_keys_cover(src, "B", "--vars")  # a dimension no key is on: any of its records could pair
            idx = BIndex.from_source(src, name=name, nan_keys=nan_keys, tree="background")
        summaries = None
        if wants_summary:
            from smerge.counting.hcount import parse_sketch
            from smerge.counting.summary import SummaryParams

            summaries = {idx.name: SummaryParams(summarize, time_col, lifetime, support=support,
                                                 correct_factor=correct_factor, sketch=parse_sketch(sketch),
                                                 max_frequent=max_frequent)}
        server = IndexServer(idx, host=host, port=port, token=token, tls_cert=cert, tls_key=key, max_page=max_page,
                             summaries=summaries)
        stop = threading.Event()
        signals = []

        def on_signal(signum, frame):
            signals.append(signum)
            if len(signals) > 1:  # a second SIGTERM / Ctrl-C: stop at once
                sys.stderr.write("smerge serve: stopped at once (second signal)\n")
                sys.stderr.flush()
                os._exit(0)
            stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        try:
            if json_:  # one line, as the URL is (scripts read the first line)
                import json

                typer.echo(json.dumps({"command": "serve", "url": f"{server.url}/{idx.name}", "name": idx.name,
                                       "records": idx.num_rows, "keys": list(idx.keys), "token": bool(token),
                                       "summarized": summarize if summaries else None}), err=False)
            else:
                typer.echo(f"{server.url}/{idx.name}", err=False)
            sys.stdout.flush()
        except OSError as e:  # e.g. standard output on a full disk
            server.shutdown(grace=0)
            sys.stdout = open(os.devnull, "w")  # what could not be written is not tried again at exit
            raise OutputError(f"cannot write the server's URL to standard output ({e.strerror or e}); "
                              "free space there or redirect it elsewhere") from None
        typer.echo(f"smerge serve: {idx.name} ({idx.num_rows:,} records, keys {','.join(idx.keys)}) at "
                   f"{server.url}/{idx.name}" + (" (token required)" if token else "")
                   + (f"; summarised on {summarize} (smerge count)" if summaries else ""), err=True)
        while not stop.wait(0.5):  # the main thread stays in Python so that signals are handled
            pass
        dropped = server.shutdown(grace=SHUTDOWN_GRACE)
        note = f"; cancelled the calls of {dropped} connection(s) still busy after {SHUTDOWN_GRACE:g} s" \
            if dropped else ""
        typer.echo(f"smerge serve: stopped after {server.requests:,} requests ({server.errors:,} rejected){note}",
                   err=True)
        if not server.stopped_cleanly:  # calls that would not end: leave without waiting for them
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        return 0

    run_guarded(body, debug=debug)


def _read_file(path: str, option: str) -> bytes:
    from smerge.errors import UsageError

    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise UsageError(f"{option} {path}: cannot be read ({e.strerror})") from None
