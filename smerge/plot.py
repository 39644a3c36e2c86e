"""Pictures of a run: the statistics JSON (``--stats``) as one PNG of stacked panels.

``plot_series(stats)`` says what is drawn: ``{panel: {label: (x, y)}}`` taken from the
statistics as they are (no recomputation), so a test can compare them with the JSON.
``plot_figure(stats)`` draws them with matplotlib (Agg, no display) and returns
``(figure, series)``; ``save_plot(stats, path)`` writes the PNG atomically.

Merges (cgm, rtm): kappa per report window (``kappa_per_window``, every ``series_stride``-th
window), the moving drop rate (``drop_rate_moving``, item j ends at window j + M - 1) with the
delta line (``params.delta``) when given, K per report window when the run adapted it
(``k_per_window``), the fraction read per run of archived inputs (``a_sample_fraction``,
``a_sample_run_fractions`` and B's) when an input is an archive, and the fetch/merge/write
seconds. W-join: tuples and buffered records per stream against the records read
(``timeline``), the fraction read per run of archived inputs (``sample_fractions``,
``sample_run_fractions``) and the fetch/join/write seconds.
matplotlib is imported only when drawing (``import smerge.merge`` never pulls it in).
"""

from __future__ import annotations

import os
from typing import Any

from smerge.errors import UsageError, param

PANEL_WIDTH_IN = 8.0
PANEL_HEIGHT_IN = 2.2
DEFAULT_DPI = 100

Series = dict[str, dict[str, tuple[list[float], list[float]]]]


def _floats(v) -> list[float]:
    return [float(x) for x in v]


def _merge_series(s: dict) -> Series:
    out: Series = {}
    stride = int(s.get("series_stride", 1))
    kap = s.get("kappa_per_window")
    if kap is None:
        raise UsageError("these statistics have no kappa_per_window (written by an older smerge?); "
                         f"rerun with this version's {param.stats}")
    out["kappa per report window"] = {"kappa": ([float(i * stride) for i in range(len(kap))], _floats(kap))}
    m = int(s.get("params", {}).get("delta_windows", 10))
    drop = s.get("drop_rate_moving", [])
    panel = {"moving drop rate": ([float(j * stride + m - 1) for j in range(len(drop))], _floats(drop))}
    delta = s.get("params", {}).get("delta")
    if delta is not None and (drop or kap):
        n = max(len(kap) * stride - 1, 0)
        panel[f"delta = {delta:g}"] = ([0.0, float(n)], [float(delta), float(delta)])
    out[f"moving drop rate (M = {m})"] = panel
    k = s.get("k_per_window")
    if k:
        ks = stride if len(k) == len(kap) else 1
        x = [float(i * ks) for i in range(len(k))]
        if isinstance(k[0], (list, tuple)):  # --adapt writes [K_A, K_B] per report window
            out["least increment K per report window"] = {"K_A": (x, _floats(p[0] for p in k)),
                                                           "K_B": (x, _floats(p[1] for p in k))}
        else:
            out["least increment K per report window"] = {"K": (x, _floats(k))}
    _fraction_panel(out, [("A", s.get("a_sample_fraction"), s.get("a_sample_run_fractions")),
                          ("B", s.get("b_sample_fraction"), s.get("b_sample_run_fractions"))])
    out["seconds"] = {"seconds": ([0.0, 1.0, 2.0], [float(s.get(f"{x}_seconds") or 0.0)
                                                   for x in ("fetch", "merge", "write")])}
    return out


FRACTION_PANEL = "fraction read per run"
EVERY_RUN = " (every run)"


def _fraction_panel(out: Series, inputs) -> None:
    """The fraction of each archived input read per run, from the statistics of sampled reads
    (docs/archive.md): ``(label, fraction, run fractions)`` per input, fraction None for an input
    that is not an archive. ``--sample auto`` writes one fraction per run (drawn per run); a fixed
    f reads every run with f (drawn flat, labelled "(every run)", over the runs of the longest
    per-run series, or from run 0 to 1 when there is none). No archive input: no panel."""
    per_run = {lab: _floats(r) for lab, f, r in inputs if f is not None and r}
    runs = max((len(r) for r in per_run.values()), default=2)
    panel = {}
    for lab, f, _ in inputs:
        if f is None:
            continue
        if lab in per_run:
            panel[lab] = ([float(i) for i in range(len(per_run[lab]))], per_run[lab])
        else:
            panel[lab + EVERY_RUN] = ([0.0, float(max(runs - 1, 1))], [float(f), float(f)])
    if panel:
        out[FRACTION_PANEL] = panel


def _wjoin_series(s: dict) -> Series:
    out: Series = {}
    tl = s.get("timeline")
    if tl and tl.get("rows"):
        cols = tl["columns"]
        rows = tl["rows"]
        if float(rows[0][0]) > 0:  # the run starts from nothing: 0 records read, 0 tuples, 0 buffered
            rows = [[0.0] * len(cols)] + list(rows)
        x = [float(r[0]) for r in rows]
        out["tuples emitted"] = {"tuples": (x, [float(r[1]) for r in rows])}
        out["records buffered"] = {c[len("buffered_"):]: (x, [float(r[j]) for r in rows])
                                   for j, c in enumerate(cols) if c.startswith("buffered_")}
    fracs = s.get("sample_fractions")
    if fracs:
        names = list(s.get("records_read") or {})
        names = names if len(names) == len(fracs) else [f"input {i + 1}" for i in range(len(fracs))]
        runs = s.get("sample_run_fractions") or [None] * len(fracs)
        _fraction_panel(out, list(zip(names, fracs, runs)))
    out["seconds"] = {"seconds": ([0.0, 1.0, 2.0], [float(s.get(f"{x}_seconds") or 0.0)
                                                   for x in ("fetch", "join", "write")])}
    return out


# Panels drawn as horizontal bars: panel title -> the names of its bars (one series, x = 0, 1, ..)
BAR_PANELS = {"seconds": None, "bytes received": ["raw records", "received"],
              "answers": ["exact", "estimated"]}


def _count_series(s: dict) -> Series:
    """``smerge count --stats``: what the wire carried against the raw records, and how many
    answers were exact or estimated from summaries."""
    out: Series = {}
    out["bytes received"] = {"bytes": ([0.0, 1.0], [float(s.get("bytes_raw") or 0), float(s.get("bytes_received") or 0)])}
    out["answers"] = {"answers": ([0.0, 1.0], [float(s.get("exact_answers") or 0),
                                               float(s.get("estimated_answers") or 0)])}
    out["seconds"] = {"seconds": ([0.0], [float(s.get("seconds") or s.get("total_seconds") or 0.0)])}
    return out


def plot_series(stats: dict) -> Series:
    """What ``plot_figure`` draws, panel by panel: ``{panel title: {label: (x, y)}}``."""
    if isinstance(stats, dict) and stats.get("command") == "count" and "algorithm" not in stats:
        return _count_series(stats)
    if not isinstance(stats, dict) or "algorithm" not in stats:
        raise UsageError(f"not smerge statistics: no 'algorithm' key (give the JSON written by {param.stats})")
    if stats["algorithm"] == "wjoin":
        return _wjoin_series(stats)
    if stats["algorithm"] in ("cgm", "rtm"):
        return _merge_series(stats)
    raise UsageError(f"statistics of algorithm {stats['algorithm']!r} cannot be plotted; cgm, rtm and wjoin can")


def plot_figure(stats: dict, *, title: str | None = None) -> tuple[Any, Series]:
    """A matplotlib figure (Agg) of the statistics, one panel per series group; and the series."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    series = plot_series(stats)
    n = len(series)
    fig = Figure(figsize=(PANEL_WIDTH_IN, PANEL_HEIGHT_IN * n))
    axes = fig.subplots(n, 1, squeeze=False)[:, 0]
    is_wjoin = stats.get("algorithm") == "wjoin"
    from matplotlib.ticker import MaxNLocator

    is_count = stats.get("command") == "count" and "algorithm" not in stats
    for ax, (panel, lines) in zip(axes, series.items()):
        ax.set_title(panel, fontsize=9, loc="left")
        ax.tick_params(labelsize=8)
        if panel in BAR_PANELS:
            (x, y), = lines.values()
            names = BAR_PANELS[panel] or (["seconds"] if is_count else ["fetch", "join" if is_wjoin else "merge",
                                                                         "write"])
            ax.barh(x, y, color=["#4c72b0", "#dd8452", "#55a868"][:len(x)])
            ax.set_yticks(x, names)
            ax.set_xlabel("seconds" if panel == "seconds" else panel.split()[0], fontsize=8)
            if panel != "seconds":
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            continue
        drawn = [label for label, (x, y) in lines.items() if x and not label.startswith("delta")]
        if not drawn:  # e.g. a run shorter than the moving average's M report windows
            ax.text(0.5, 0.5, _empty_reason(panel, stats), ha="center", va="center", fontsize=8,
                    transform=ax.transAxes, color="#555555")
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        styles = ["-", "--", ":", "-."]
        for i, (label, (x, y)) in enumerate(lines.items()):
            if label.startswith("delta"):
                style = dict(color="#c44e52", linestyle="--", linewidth=1)
            else:  # lines that coincide (equal buffers of several streams) stay visible: styles, widths
                style = dict(linestyle=styles[i % len(styles)], linewidth=2.2 - 0.4 * (i % 4), alpha=0.9)
                if len(x) <= 30:  # a short run: its few points are seen, even a single one
                    style.update(marker="os^D"[i % 4], markersize=4)
            ax.plot(x, y, label=label, **style)
        ax.set_xlabel("run" if panel == FRACTION_PANEL else ("records read" if is_wjoin else "report window"),
                      fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # windows, runs and records are whole
        xs = [v for label, (x, _) in lines.items() if not label.startswith("delta") for v in x]
        if xs and max(xs) - min(xs) < 4:  # one or a few report windows: whole-number ticks around them
            ax.set_xlim(min(xs) - 0.5, max(xs) + 0.5)
        if is_wjoin or panel.startswith("least increment"):
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        if is_wjoin:  # counts from zero; all-zero buffers still get a whole-number axis
            ys = [v for _, (_, y) in lines.items() for v in y]
            ax.set_xlim(left=0)
            ax.set_ylim(0, max(1.0, max(ys, default=0.0) * 1.05))
        if panel == FRACTION_PANEL:
            ax.set_ylim(0.0, 1.05)
        if len(lines) > 1 or panel == FRACTION_PANEL:
            ax.legend(fontsize=7, loc="best")
        ax.grid(alpha=0.3)
    head = title or _title(stats)
    fig.suptitle(head, fontsize=10)
    fig.tight_layout()
    return fig, series


def _empty_reason(panel: str, s: dict) -> str:
    if panel.startswith("moving drop rate"):
        m = s.get("params", {}).get("delta_windows", 10)
        return (f"no moving drop rate: the run has {s.get('report_windows', 0)} report windows, fewer than "
                f"M = {m} (the run's delta_windows)")
    return "nothing to draw for this run"


def _title(s: dict) -> str:
    if s.get("command") == "count" and "algorithm" not in s:
        return (f"count: {s.get('answers', 0):,} answers over {s.get('records_raw', 0):,} records "
                f"({s.get('bytes_ratio', 1.0):.3f} of the raw bytes received)")
    if s["algorithm"] == "wjoin":
        return f"wjoin ({s.get('method', '')}): {s.get('tuples', 0):,} tuples"
    return (f"{s['algorithm']}: {s.get('matched', 0):,} of {s.get('a_records', 0):,} A records matched "
            f"({s.get('match_pct', 0):.2f}%), {s.get('report_windows', 0)} report windows")


def save_plot(stats: dict, path: str, *, dpi: int = DEFAULT_DPI, title: str | None = None) -> Series:
    """Write the PNG to ``path`` (a temporary file beside it, renamed when complete); returns
    the series drawn. Its size is 800 x (220 x panels) pixels at the default dpi."""
    from smerge.datasets.output_staging import make_temp_file

    fig, series = plot_figure(stats, title=title)
    tmp = make_temp_file(path, ".png")
    try:
        fig.savefig(tmp, format="png", dpi=dpi)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return series


__all__ = ["plot_series", "plot_figure", "save_plot", "DEFAULT_DPI", "PANEL_WIDTH_IN", "PANEL_HEIGHT_IN"]
