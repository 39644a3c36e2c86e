"""``smerge index build B -o DIR``: a persistent R-tree (+ B's records) for ``smerge serve --index DIR``."""

from __future__ import annotations

import time
from typing import Annotated, Optional

import typer

from smerge.cli.common import (check_stats_path, counted, emit_stats, finish_command, progress_enabled, run_guarded,
                               split_list, tqdm_progress)
from smerge.cli.options import DebugOpt, JsonOpt, KeysOpt, NanOpt, ProgressOpt, StatsOpt

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
    stats: StatsOpt = None,
    json_: JsonOpt = False,
    progress: ProgressOpt = None,
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
        from smerge.jobs.inputs import check_keys_cover

        check_keys_cover(src, "B", "--vars")  # a dimension no key is on: any of its records could pair
        check_stats_path(stats, overwrite=overwrite, inputs=[b])
        read = src.open_batches
        bar = tqdm_progress(progress_enabled(progress))
        src.open_batches = lambda start=0, stop=None: counted(read(start, stop), bar, src.num_rows, "index records")
        idx = build_index(src, out, name=name, nan_keys=nan_keys, overwrite=overwrite)
        info = dict(idx.info(), directory=out, seconds=time.perf_counter() - t0)
        idx.close()
        finish_command(info, "index build", t0, stats_path=stats, overwrite=overwrite)
        emit_stats(info, as_json=json_, summary=lambda i: (
            f"smerge index: {i['count']:,} records of {b} keyed by {','.join(i['keys'])} -> {out} "
            f"({i['seconds']:.2f} s)"))
        return 0

    run_guarded(body, debug=debug)
