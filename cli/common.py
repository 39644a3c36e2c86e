"""Shared CLI plumbing: error mapping to exit codes, option parsing, progress, summaries.

The library raises ``SmergeError`` subclasses; only this module maps them to exit codes
(docs/cli.md): 2 usage/input error (one line, no traceback), 1 unexpected error (one line;
``--debug`` shows the traceback), 3 the run finished but violated ``--delta``.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Callable, Sequence

import typer

from smerge.errors import SmergeError, UsageError
from smerge.jobs.route import (AUTO_CONF_KEY, AUTO_ENV, AUTO_MAX_BYTES, AUTO_SPARK_MASTER,  # noqa: F401 (the CLI's names)
                               Route, auto_max_bytes, choose_route, input_bytes)

EXIT_OK, EXIT_INTERNAL, EXIT_USAGE, EXIT_DELTA = 0, 1, 2, 3


MAX_MESSAGE = 2000  # characters of an error line; a file's names can be megabytes long


def one_line(message: str) -> str:
    """``message`` as one bounded line: newlines folded, words (names, values) longer than 120
    characters shortened, and the middle of a line longer than MAX_MESSAGE cut (its start says
    what is wrong, its end how to fix it)."""
    import re

    msg = " ".join(message.split("\n"))
    msg = re.sub(r"\S{121,}", lambda m: m.group(0)[:100] + f"... ({len(m.group(0)):,} characters)", msg)
    if len(msg) > MAX_MESSAGE:
        msg = msg[:MAX_MESSAGE - 400] + " ... " + msg[-395:]
    return msg


def fail(message: str, code: int = EXIT_USAGE) -> "typer.Exit":
    typer.echo(f"smerge: error: {one_line(message)}", err=True)
    return typer.Exit(code)


def run_guarded(fn: Callable[[], int | None], *, debug: bool = False) -> None:
    """Run a command body; map errors to one stderr line and the exit codes of docs/cli.md."""
    try:
        code = fn()
    except typer.Exit:
        raise
    except SmergeError as e:
        if debug:
            traceback.print_exc()
        from smerge.cli.flags import flag

        raise fail(e.message(flag), e.exit_code)
    except KeyboardInterrupt:
        raise fail("interrupted; no output was written", 130)
    except MemoryError:
        raise fail("out of memory: the run needed more than the machine or its address-space limit (ulimit -v) "
                   "allows", EXIT_INTERNAL)
    except Exception as e:  # unexpected: one line, traceback only with --debug
        if debug:
            traceback.print_exc()
        msg = str(e).splitlines()[0] if str(e) else ""
        raise fail(f"internal error: {type(e).__name__}: {msg} (run with --debug for the traceback)", EXIT_INTERNAL)
    if code in (None, EXIT_OK, EXIT_DELTA) and "smerge.spark.session" in sys.modules:
        sys.modules["smerge.spark.session"].discard_log()  # the run succeeded: its Spark log is not needed
    raise typer.Exit(code or EXIT_OK)


def split_list(value: str | None, *, what: str | None = None) -> tuple[str, ...] | None:
    if value is None:
        return None
    items = tuple(s.strip() for s in value.split(",") if s.strip())
    if not items:
        raise UsageError(f"{what + ' is an ' if what else ''}empty list {value!r}; give names separated by commas")
    return items


def require_text(value: str | None, what: str, hint: str = "give a value, or leave the option out") -> str | None:
    """Refuse an empty (or blank) string given for a path or name option; None passes."""
    if value is not None and not value.strip():
        raise UsageError(f"{what} is empty ({value!r}); {hint}")
    return value


def require_texts(options: dict[str, str | None], *, inputs: Sequence[str | None] = ()) -> None:
    """``require_text`` for each ``{option name: value}`` (None: not given) and each input path."""
    for i, path in enumerate(inputs, 1):
        require_text(path, f"input {i}", "name a file (or a URL)")
    for what, value in options.items():
        require_text(value, what)


# Upper bounds of integer options (exit 2 beyond them; README and docs/ list them).
MAX_PARTITIONS = 2**31 - 1  # Spark's partition counts are Java ints
MAX_BATCH_ROWS = 2**31 - 1  # Arrow readers' batch sizes


def check_int_range(value: int | None, what: str, lo: int, hi: int, *, hint: str = "") -> None:
    """``value`` (None: not given) must be an integer in [lo, hi]; else exit 2 naming the range."""
    if value is None:
        return
    if not lo <= value <= hi:
        top = "2^31-1" if hi == 2**31 - 1 else f"{hi:,}"
        raise UsageError(f"{what} is {value}; give an integer from {lo} to {top}{hint}")


def progress_enabled(flag: bool | None) -> bool:
    return sys.stderr.isatty() if flag is None else flag


def tqdm_progress(enabled: bool):
    """A progress factory for the library runners (tqdm on stderr), or None."""
    if not enabled:
        return None
    from tqdm import tqdm

    class _Bar:
        def __init__(self, total, unit):
            # Scale large record counts (1.2M); small counts (partitions) stay whole numbers.
            scale = total is None or total >= 10_000
            self._bar = tqdm(total=total, unit=" " + unit.split()[-1], unit_scale=scale, file=sys.stderr,
                             desc=unit.split()[0], leave=False, dynamic_ncols=True)

        def update(self, n):
            self._bar.update(n)

        def close(self):
            self._bar.close()

    return lambda total, unit: _Bar(total, unit)


def counted(batches, progress, total: int | None, unit: str):
    """``batches`` passed through, a progress bar (``tqdm_progress``'s factory, or None: none)
    counting their rows."""
    if progress is None:
        yield from batches
        return
    bar = progress(total, unit)
    try:
        for b in batches:
            bar.update(b.num_rows)
            yield b
    finally:
        bar.close()


def check_file_option(path: str | None, opt: str, *, overwrite: bool, inputs=()) -> None:
    """Before the run: a file option's path (``--stats``, ``--plot``) follows the output rule
    (exit 2 when it exists without --overwrite, or is an input)."""
    if path:
        from smerge.datasets.outputs import check_target

        check_target(path, overwrite=overwrite, folder=False, inputs=[i for i in inputs if i], opt=opt)


def check_stats_path(path: str | None, *, overwrite: bool, inputs=()) -> None:
    check_file_option(path, "--stats", overwrite=overwrite, inputs=inputs)


def finish_command(stats: dict, command: str, t0: float, *, stats_path: str | None = None,
                   overwrite: bool = False) -> dict:
    """The statistics every command reports, for a command with no Spark route that does not run
    through the pipeline (gen, index build, archive append): ``command``, ``execution``, ``route``,
    ``session_seconds`` (0) and ``total_seconds`` (the whole run, from ``t0``); written to
    ``stats_path`` when given."""
    import time

    from smerge.jobs.pipeline import in_process_route

    stats.setdefault("command", command)
    stats.update(execution="local", route=in_process_route(command).why, session_seconds=0.0,
                 total_seconds=time.perf_counter() - t0)
    if stats_path:
        from smerge.jobs.outputs import write_stats

        write_stats(stats_path, stats, overwrite=overwrite)
    return stats


def emit_stats(stats: dict, *, as_json: bool, summary: Callable[[dict], str]) -> None:
    if as_json:
        typer.echo(json.dumps(stats, indent=2, default=float))
    else:
        typer.echo(summary(stats))


def merge_summary(s: dict) -> str:
    """The human summary of a cgm/rtm run."""
    lines = [
        f"smerge {s['algorithm']}: {os.path.basename(str(s.get('a', 'A')))} + "
        f"{os.path.basename(str(s.get('b', 'B')))} -> {s.get('output', '')}",
        f"  records   A {s['a_records']:,}  B {s['b_records']:,}",
        f"  matched   {s['matched']:,} pairs ({s['match_pct']:.2f}% of A)",
        f"  unmatched A {s['a_unmatched']:,}  B {s['b_unmatched']:,}",
    ]
    if s.get("report_windows"):
        kmin = s.get("kappa_min")
        lines.append(f"  windows   {s['report_windows']:,} report windows, kappa min "
                     f"{kmin:.4f}, moving drop rate max {s['drop_rate_moving_max']:.4f}")
    if "kappa_max" in s:
        method = s.get("kappa_max_method") or ""
        what = "an upper bound" if method.startswith("bound") else "the most any run can pair"
        lines.append(f"  kappa_max {s['kappa_max']:.4f} (ceiling: {what}; {method})")
        if s.get("kappa_greedy") is not None:
            lines.append(f"  greedy    {s['kappa_greedy']:.4f} (unbounded-window sweep; a window can pass it)")
        if s["kappa_max"] - s["match_pct"] / 100 > 0.01:
            stored = s.get("b_order") == "as stored"
            rec = s.get("recover")
            why = {"window": "B's partners arrived outside the window",
                   "increment": "the window held the partners, but records a behind window evicted to make up K were still to be paired",
                   "rtm": "B's partners arrived outside any cheap window" if rec and rec.get("window_needed", 0)
                   > s.get("params", {}).get("window_size", 0) else "the window's sweep pairs greedily"}
            lines.append(f"  shortfall {s['kappa_max'] - s['match_pct'] / 100:.2%} of A below kappa_max: "
                         + (why[rec["change"]] if rec else "B's partners arrived outside the window")
                         + (" (B is read as stored: only gridded netCDF inputs keyed by their dimensions are read in "
                            "A's order)" if stored else "")
                         + (f"; recover with {rec['command']}" if rec else "; a larger --window, or smerge rtm, finds them"))
    if "delta_ok" in s:
        verdict = "ok" if s["delta_ok"] else "VIOLATED"
        lines.append(f"  delta     {s['params'].get('delta')} over {s['params'].get('delta_windows')} windows: {verdict}")
    lines.append(f"  seconds   fetch {s['fetch_seconds']:.3f}  merge {s['merge_seconds']:.3f}  "
                 f"write {s['write_seconds']:.3f}  total {s['total_seconds']:.3f}")
    if s.get("execution") == "spark" and s.get("pairs_check"):
        # P > 1: pairs an in-process run is expected to find (smerge.spark.cgm.windows)
        exp = s.get("pairs_expected")
        lines.append(f"  expected  {s['pairs_check']}" if exp is None else
                     f"  expected  {exp:,} pairs in-process (estimate), found {s['pairs_found_share']:.1%}: "
                     f"{s['pairs_check']}")
    return "\n".join(lines + run_lines(s))


def run_lines(s: dict) -> list[str]:
    """The summary's last lines, the same for every command: where it ran (in-process, or the
    Spark master, partitions and the session's start) and the route with its reason."""
    lines = []
    if s.get("execution") == "spark":
        parts = s.get("partitions")
        session = s.get("session_seconds", s.get("session_start_seconds"))
        lines.append(f"  spark     {s.get('master', '')}, {parts} partition{'s' if parts != 1 else ''}"
                     + (f", session start {session:.1f} s" if session is not None else ""))
        if s.get("partitions_note"):
            lines.append(f"  note      {s['partitions_note']}")
    elif s.get("execution") == "local":
        lines.append("  ran       in-process")
    if s.get("route"):
        lines.append(f"  route     {s['route']}")
    return lines


def delta_exit(stats: dict) -> int:
    return EXIT_DELTA if stats.get("delta_ok") is False else EXIT_OK


def parse_conf(values: Sequence[str] | None) -> dict[str, str]:
    out = {}
    for v in values or ():
        k, sep, val = v.partition("=")
        if not sep or not k:
            raise UsageError(f"--conf {v!r} is not KEY=VALUE")
        out[k] = val
    return out


# --------------------------------------------------------------------------------------------
# The route: in-process or Spark (--master auto, the default)

def record_route(result: dict, route: Route, stats_path: str | None) -> dict:
    """Put ``route`` in the run's statistics (the dict, and the ``--stats`` file the runner wrote)."""
    result["route"] = route.why
    if stats_path:
        from smerge.jobs import write_stats

        write_stats(stats_path, result)
    return result
