"""``smerge index build B -o DIR``: a persistent R-tree (+ B's records) for ``smerge serve --index DIR``."""

from __future__ import annotations

import json
import time
from typing import Annotated, Optional

import typer

from smerge.cli.cgm import DebugOpt, KeysOpt, NanOpt
from smerge.cli.common import run_guarded, split_list

app = typer.Typer(add_completion=False)
index_app = typer.Typer(add_completion=False, help="Persistent R-tree indexes of B for `smerge serve --index`.",
                        no_args_is_help=True)
app.add_typer(index_app, name="index")


@index_app.command("build")
def build(
    b: Annotated[str, typer.Argument(help="Stream B to index (netCDF, Parquet, CSV or Arrow IPC).")],
    out: Annotated[str, typer.Option("-o", "--output", help="Index directory to create.")],
    keys: KeysOpt = None,
    vars_: Annotated[Optional[str], typer.Option("--vars", help="Payload variables/columns to keep (default: all).")] = None,
    name: Annotated[Optional[str], typer.Option("--name", help="Dataset name served (default: B's file stem).")] = None,
    nan_keys: NanOpt = "error",
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing index directory.")] = False,
    json_: Annotated[bool, typer.Option("--json", help="Print the index info as JSON.")] = False,
    debug: DebugOpt = False,
) -> None:
    """Bulk-load an R-tree over B's keys and store it with B's records (Parquet) in DIR."""

    def body() -> int:
        from smerge.datasets import open_input
        from smerge.errors import UsageError
        from smerge.index import build_index

        if nan_keys not in ("error", "unmatched"):
            raise UsageError(f"--nan-keys is {nan_keys!r}; use error or unmatched")
        t0 = time.perf_counter()
        src = open_input(b, keys=split_list(keys), variables=split_list(vars_))
        if not src.keys:
            raise UsageError(f"{b}: no merge keys; pass --keys K1,K2 (tabular inputs have no default keys)")
        idx = build_index(src, out, name=name, nan_keys=nan_keys, overwrite=overwrite)
        info = dict(idx.info(), directory=out, seconds=time.perf_counter() - t0)
        idx.close()
        if json_:
            typer.echo(json.dumps(info, indent=2))
        else:
            typer.echo(f"smerge index: {info['count']:,} records of {b} keyed by {','.join(info['keys'])} "
                       f"-> {out} ({info['seconds']:.2f} s)")
        return 0

    run_guarded(body, debug=debug)
