"""The ``smerge`` command: one Typer app per command module, combined here."""

from __future__ import annotations

import importlib
import sys
from typing import Annotated

import typer
import typer.main

from smerge.cli import coerce

coerce.install()  # plain option values converted without building pydantic adapters (cli/coerce.py)

HELP = "Merge gridded and partially sorted data streams on common keys (CGM, RTM, W-join), in-process or on Spark."

# Each module defines `app`, a Typer app holding the command(s) named here. Add a module here to
# add a command (tests/cli/test_local_process.py checks the names against what each module registers).
COMMANDS = {
    "cgm": "smerge.cli.cgm",
    "gen": "smerge.cli.gen",
    "rtm": "smerge.cli.rtm",
    "serve": "smerge.cli.serve",
    "index": "smerge.cli.index",
    "wjoin": "smerge.cli.wjoin",
    "batch": "smerge.cli.batch",
    "plot": "smerge.cli.plot",
    "count": "smerge.cli.count",
    "archive": "smerge.cli.archive",
}
COMMAND_MODULES = list(dict.fromkeys(COMMANDS.values()))


def _version(value: bool) -> None:
    if value:
        from smerge import __version__

        typer.echo(f"smerge {__version__}")
        raise typer.Exit(0)


def _root(version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_version,
                                                help="Print smerge's version and exit.")] = False) -> None:
    """smerge: best-effort eps-delta merges and window joins of partially sorted streams."""


def make_app(modules: list[str] | None = None) -> typer.Typer:
    """The ``smerge`` app with the commands of ``modules`` (default: every command)."""
    root = typer.Typer(name="smerge", help=HELP, add_completion=False, no_args_is_help=True,
                       pretty_exceptions_enable=False, rich_markup_mode=None)
    root.callback()(_root)
    for name in COMMAND_MODULES if modules is None else modules:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            continue  # that command is not part of this version yet
        root.add_typer(mod.app)
    return root


def __getattr__(name: str):
    # `from smerge.cli.main import app` (tests, embedding): every command, built on first use.
    # A `smerge CMD ...` process builds only CMD's (main below): importing and declaring the
    # other nine commands' options cost ~0.05 s of every run.
    if name == "app":
        globals()["app"] = make_app()
        return globals()["app"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _app_for(args: list[str]) -> typer.Typer:
    """The app for one command line: only the named command's module when the first word names
    one (its help, errors and exit codes are the same), else every command (``--help``, typos)."""
    if "app" not in globals() and args and args[0] in COMMANDS:
        return make_app([COMMANDS[args[0]]])
    return __getattr__("app")


def _is_usage_error(e: BaseException) -> bool:
    # Typer may vendor Click; match Click's UsageError family by name, not by import.
    return any(c.__name__ == "UsageError" for c in type(e).__mro__) and hasattr(e, "format_message")


def _command_path(e: BaseException, argv: list[str] | None, app: typer.Typer) -> str:
    """The full command a usage error belongs to, e.g. ``smerge index build`` (Click's context
    knows it; an option missing its value has no context: the command names leading argv)."""
    path = getattr(getattr(e, "ctx", None), "command_path", None)
    if path:
        return path
    cmd, words = typer.main.get_command(app), ["smerge"]
    for arg in sys.argv[1:] if argv is None else argv:
        sub = getattr(cmd, "commands", {}).get(arg)
        if sub is None:
            break
        cmd = sub
        words.append(arg)
    return " ".join(words)


def _on_sigterm(signum, frame) -> None:
    raise KeyboardInterrupt  # unwinds like Ctrl-C: temporary and staging files are removed


class _SkipPandas:
    """A meta-path finder that makes ``import pandas`` fail (installed for one call only)."""

    def find_spec(self, name, path=None, target=None):
        if name == "pandas" or name.startswith("pandas."):
            raise ImportError("smerge: pandas is not needed here")
        return None


def _pyarrow_without_pandas() -> None:
    """In-process runs never hand pandas objects to pyarrow, yet pyarrow 26 imports pandas on
    its first numpy conversion, to check for them: about 0.25 s of every ``--local`` process.
    Let that one check find no pandas. pandas stays importable (and ``to_pandas`` works) for
    code that imports it itself. Only for the ``smerge`` process, never for callers of
    ``main(argv)`` in their own process."""
    if "pandas" in sys.modules:
        return
    import os

    # Arrow's allocator (mimalloc) backs large buffers with 2 MB huge pages, each zeroed by the
    # kernel when first touched: ~15% of a --local run's CPU on short-lived batches (issue 11).
    os.environ.setdefault("MIMALLOC_ALLOW_THP", "0")  # read once, when pyarrow loads (just below)
    # ... and returns freed pages to the system after 10 ms, to fault them in again for the next
    # batch: keeping them cut a --local CGM run's CPU by 4-7% and its wall time by 5-11% (1M-10M
    # records per input; peak RSS 186 -> 216 MB at 10M, the live peak is never exceeded). Only
    # for the merges that stream batch after batch (cgm, rtm): a W-join's chunks vary in size,
    # and kept pages only raise its peak memory.
    if sys.argv[1:2] and sys.argv[1] in _KEEP_FREED_PAGES:
        os.environ.setdefault("MIMALLOC_PURGE_DELAY", "-1")
    # numpy's OpenBLAS starts a thread per core at import, and each spins for ~0.1 s waiting for
    # work that an in-process run never gives it (smerge does no BLAS calls): ~0.09 s of CPU
    # taken from the readers and the writer on 2 cores. Read once, when numpy loads.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    import pyarrow as pa

    finder = _SkipPandas()
    sys.meta_path.insert(0, finder)
    try:
        # pyarrow's own check, asked directly: a numpy conversion would also import numpy.ma
        # (~30 ms), a list's dateutil (~8 ms)
        shim = getattr(pa.lib, "_pandas_api", None)
        if shim is None or shim.have_pandas is not False:
            pa.array([0.0])
    except Exception:  # noqa: BLE001 - a speed-up only; never in the way of the run
        pass
    finally:
        sys.meta_path.remove(finder)


_KEEP_FREED_PAGES = {"cgm", "rtm"}  # commands whose Arrow allocator keeps freed pages (_pyarrow_without_pandas)
_NEVER_SPARK = {"count", "archive"}  # commands that run in-process only (no pandas objects reach pyarrow)
_OWN_PROCESS = False  # main() runs as the `smerge` process (not main(argv) inside a caller's process)


def in_process_route() -> None:
    """The run was routed in-process (``--master auto`` chose it): as ``--local`` does, let
    pyarrow's first numpy conversion find no pandas -- only in the ``smerge`` process, and only
    before any such conversion (else pandas is loaded already and this does nothing)."""
    if _OWN_PROCESS:
        _pyarrow_without_pandas()


def main(argv: list[str] | None = None) -> int:
    """Console entry point; usage errors become one line on stderr and exit code 2.

    SIGTERM (cron's ``timeout``, a scheduler stopping the job) is handled like Ctrl-C: the run
    stops, its temporary outputs and Spark staging folder are removed, exit code 130.
    """
    if argv is not None:
        return _main(argv)
    try:
        rc = _main(None)
    finally:
        # The `smerge` process is about to end: leave the objects of its ~400 modules out of
        # the garbage collections of interpreter shutdown (they only walk what the process
        # frees anyway; ~0.05 s of every run), should the interpreter end it (_end_process).
        import gc

        gc.freeze()
    return rc


def console() -> int:
    """The ``smerge`` program (its console script and ``python -m smerge``): ``main()``, then
    the process ends (``_end_process``). A caller of ``main()`` keeps its process."""
    rc = main()
    _end_process(rc)
    return rc


def _end_process(rc: int) -> None:
    """End the `smerge` process now: its exit handlers run (``atexit``: a Spark session's stop,
    logging's flush, finalizers), its standard streams are flushed, and the interpreter's
    teardown of its ~400 modules is skipped (~15 ms, 3% of a 0.5 s merge); the run has committed
    or removed its outputs and closed its files by now. Only with no other Python thread alive
    (the interpreter would wait for it); otherwise, or when a stream cannot be flushed (e.g. a
    closed pipe, which the interpreter reports), the process ends as usual."""
    import atexit
    import os
    import threading

    if threading.active_count() > 1:
        return
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - reported by the interpreter's own shutdown
        return
    os._exit(rc)


def _main(argv: list[str] | None) -> int:
    import signal
    import threading

    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)
    global _OWN_PROCESS
    _OWN_PROCESS = argv is None
    if argv is None and ("--local" in sys.argv[1:] or sys.argv[1:2] and sys.argv[1] in _NEVER_SPARK):
        _pyarrow_without_pandas()
    from smerge.cli.flags import flag
    from smerge.errors import name_parameters

    naming = name_parameters(flag)  # messages name this command line's options, not library parameters
    try:
        return _run(argv)
    finally:
        name_parameters(naming)


def _run(argv: list[str] | None) -> int:
    try:
        app = _app_for(sys.argv[1:] if argv is None else list(argv))
        from smerge.cli.help import readable

        rv = readable(typer.main.get_command(app))(args=argv, prog_name="smerge", standalone_mode=False)
    except typer.Exit as e:
        return e.exit_code
    except typer.Abort:
        print("smerge: error: aborted", file=sys.stderr)
        return 130
    except Exception as e:
        if not _is_usage_error(e):
            raise
        if type(e).__name__ == "NoArgsIsHelpError":  # bare `smerge`: the help, as Click prints it
            print(e.format_message(), file=sys.stderr)
            return 2
        print(f"smerge: error: {e.format_message()} (see {_command_path(e, argv, app)} --help)", file=sys.stderr)
        return 2
    return rv if isinstance(rv, int) else 0


if __name__ == "__main__":
    sys.exit(main())
