"""``smerge plot`` and ``--plot``: the PNG is written, decodes at the right size, and draws the statistics."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

pytest.importorskip("matplotlib")
from PIL import Image  # noqa: E402  (a matplotlib dependency)

from smerge.cli.main import main  # noqa: E402
from smerge.merge.stats import MAX_SERIES, BoundedSeries, MergeStats, decimate, drop_rate_moving  # noqa: E402
from smerge.plot import plot_figure, plot_series  # noqa: E402


def _run(args, capsys=None) -> int:
    return main(args)


@pytest.fixture(scope="module")
def storm_stats(ncar_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("plot")
    stats = d / "run.json"
    rc = main(["cgm", "--local", os.path.join(ncar_dir, "Pstorm.cdf"), os.path.join(ncar_dir, "Tstorm.cdf"),
               "--eps", "lat=0.001,lon=0.001", "--window", "2000", "--increment", "200", "--delta", "0.05",
               "-o", str(d / "o.parquet"), "--stats", str(stats), "--plot", str(d / "run.png")])
    assert rc == 0
    return json.loads(stats.read_text()), d


def _png(path) -> tuple[int, int]:
    with Image.open(path) as im:
        im.load()
        return im.size


def _lines(fig):
    return {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata())) for ax in fig.axes for ln in ax.get_lines()}


def test_plot_command_writes_the_statistics(storm_stats, tmp_path):
    stats, d = storm_stats
    out = tmp_path / "run.png"
    assert main(["plot", str(d / "run.json"), "-o", str(out)]) == 0
    series = plot_series(stats)
    assert _png(out) == (800, 220 * len(series))
    k = series["kappa per report window"]["kappa"]
    assert k[1] == stats["kappa_per_window"] and len(k[1]) == stats["report_windows"]
    m = stats["params"]["delta_windows"]
    drop = series[f"moving drop rate (M = {m})"]
    assert drop["moving drop rate"][1] == stats["drop_rate_moving"]
    assert drop["moving drop rate"][0][0] == m - 1
    assert drop["delta = 0.05"][1] == [0.05, 0.05]
    assert series["seconds"]["seconds"][1] == [stats["fetch_seconds"], stats["merge_seconds"], stats["write_seconds"]]
    # what the figure holds is what plot_series says
    fig, _ = plot_figure(stats)
    lines = _lines(fig)
    assert lines["kappa"] == (k[0], k[1])
    bars = [p.get_width() for p in fig.axes[-1].patches]
    assert bars == pytest.approx(series["seconds"]["seconds"][1])
    # --plot on the command wrote the same picture size
    assert _png(d / "run.png") == _png(out)


def test_plot_refuses_overwrite_and_bad_input(storm_stats, tmp_path, capsys):
    stats, d = storm_stats
    out = tmp_path / "a.png"
    out.write_bytes(b"x")
    assert main(["plot", str(d / "run.json"), "-o", str(out)]) == 2
    assert out.read_bytes() == b"x"
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    assert main(["plot", str(bad), "-o", str(tmp_path / "b.png")]) == 2
    bad.write_text('{"rows": 1}')
    assert main(["plot", str(bad), "-o", str(tmp_path / "b.png")]) == 2
    assert not (tmp_path / "b.png").exists()


def test_k_per_window_and_archive_fraction_are_drawn_when_present():
    s = MergeStats("cgm")
    s.kappas = [1.0, 0.5, 0.75]
    s.params = {"delta_windows": 2, "delta": None}
    d = s.as_dict()
    assert "fraction read per run" not in plot_series(d)  # no archive input: no panel
    d["k_per_window"] = [100, 200, 400]
    # A read with --sample-a auto (one fraction per run), B with a fixed fraction (every run alike)
    d["a_sample_fraction"], d["a_sample_run_fractions"] = 0.4, [0.5, 0.25, 0.5]
    d["b_sample_fraction"] = 0.75
    series = plot_series(d)
    assert series["least increment K per report window"]["K"] == ([0.0, 1.0, 2.0], [100.0, 200.0, 400.0])
    assert series["fraction read per run"] == {"A": ([0.0, 1.0, 2.0], [0.5, 0.25, 0.5]),
                                               "B (every run)": ([0.0, 2.0], [0.75, 0.75])}
    assert series["moving drop rate (M = 2)"]["moving drop rate"] == ([1.0, 2.0], [0.25, 0.375])
    fig, _ = plot_figure(d)
    lines = _lines(fig)
    assert lines["K"][1] == [100.0, 200.0, 400.0]
    assert lines["A"] == series["fraction read per run"]["A"]
    assert lines["B (every run)"] == series["fraction read per run"]["B (every run)"]


@pytest.fixture
def archive_ab(tmp_path):
    """A as an archive folder (runs of 4 blocks), B a Parquet file: keys t, B within 0.6 of A."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = 4000
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    pq.write_table(pa.table({"t": np.arange(0, 2 * n, 2.0), "x": np.arange(n)}), a)
    pq.write_table(pa.table({"t": np.arange(0, 3 * n, 3.0) + 0.1, "y": np.arange(n)}), b)
    arch = tmp_path / "arch"
    assert main(["archive", "append", str(arch), str(a), "--time", "t", "--run-blocks", "4", "--block-rows", "300",
                 "--seed", "3"]) == 0
    return arch, b


def test_archive_input_draws_the_fraction_read_per_run(archive_ab, tmp_path):
    """cgm with A an archive read at f = 0.5: the picture has the fraction panel, A flat at the
    fraction the statistics give, and no line for B (a file, read whole)."""
    arch, b = archive_ab
    png, st = tmp_path / "c.png", tmp_path / "c.json"
    assert main(["cgm", "--local", str(arch), str(b), "--keys", "t", "--eps", "0.6", "--sample-a", "0.5",
                 "-o", str(tmp_path / "c.parquet"), "--stats", str(st), "--plot", str(png)]) == 0
    s = json.loads(st.read_text())
    assert s["a_sample_fraction"] == 0.5
    series = plot_series(s)
    assert list(series["fraction read per run"]) == ["A (every run)"]
    assert series["fraction read per run"]["A (every run)"][1] == [0.5, 0.5]
    assert _png(png) == (800, 220 * len(series))


def test_wjoin_archive_input_draws_the_fraction_read_per_run(archive_ab, tmp_path):
    arch, b = archive_ab
    png, st = tmp_path / "w.png", tmp_path / "w.json"
    assert main(["wjoin", "--local", str(arch), str(b), "--time", "t", "--window", "1", "--sample", "0.5",
                 "-o", str(tmp_path / "w.parquet"), "--stats", str(st), "--plot", str(png)]) == 0
    s = json.loads(st.read_text())
    assert s["sample_fractions"] == [0.5, None]
    series = plot_series(s)
    assert series["fraction read per run"] == {"S1 (every run)": ([0.0, 1.0], [0.5, 0.5])}
    assert _png(png) == (800, 220 * len(series))


def test_series_are_bounded():
    k = list(np.linspace(0, 1, 25_001))
    v, stride = decimate(k)
    assert stride == 3 and len(v) <= MAX_SERIES and v[1] == k[3]
    s = MergeStats("cgm")
    s.kappas = k
    s.params = {"delta_windows": 10}
    d = s.as_dict()
    assert len(d["kappa_per_window"]) <= MAX_SERIES and d["series_stride"] == 3
    assert d["drop_rate_moving"] == [float(x) for x in drop_rate_moving(k, 10)[::3]]
    b = BoundedSeries(("x",), limit=8)
    for i in range(100):
        b.append([i])
    assert len(b.rows) <= 8 and [r[0] for r in b.rows] == [i * b.stride for i in range(len(b.rows))]


def test_wjoin_timeline_plot(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    for name, off in (("s1", 0), ("s2", 1)):
        t = np.arange(0, 2000, 2, dtype=np.int64) + off
        pq.write_table(pa.table({"t": t, "v": np.arange(t.size, dtype=np.float64)}), tmp_path / f"{name}.parquet")
    stats, png = tmp_path / "w.json", tmp_path / "w.png"
    rc = main(["wjoin", "--local", str(tmp_path / "s1.parquet"), str(tmp_path / "s2.parquet"), "--time", "t",
               "--window", "3", "--batch-rows", "100", "-o", str(tmp_path / "w.parquet"), "--stats", str(stats),
               "--plot", str(png)])
    assert rc == 0
    s = json.loads(stats.read_text())
    tl = s["timeline"]
    assert tl["columns"] == ["records_read", "tuples", "buffered_S1", "buffered_S2"]
    assert tl["rows"][-1][1] == s["tuples"] and tl["rows"][-1][0] == sum(s["records_read"].values())
    series = plot_series(s)
    # the timeline as written, from the run's start (0 records read, 0 tuples, nothing buffered)
    assert tl["rows"][0][0] > 0
    assert series["tuples emitted"]["tuples"][0] == [0.0] + [r[0] for r in tl["rows"]]
    assert series["tuples emitted"]["tuples"][1] == [0.0] + [r[1] for r in tl["rows"]]
    assert series["records buffered"]["S2"][1] == [0.0] + [r[3] for r in tl["rows"]]
    assert _png(png) == (800, 220 * len(series))


def test_plot_prints_what_it_wrote_and_draws_count_and_short_runs(tmp_path, capsys):
    """`smerge plot` says what it wrote; count statistics are drawn; a run shorter than M report
    windows says why it has no moving drop rate instead of an empty panel."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"k": np.arange(300.0), "v": np.arange(300)}), tmp_path / "a.parquet")
    rc = main(["cgm", str(tmp_path / "a.parquet"), str(tmp_path / "a.parquet"), "--keys", "k", "--local",
               "-o", str(tmp_path / "o.parquet"), "--stats", str(tmp_path / "s.json")])
    assert rc == 0
    capsys.readouterr()
    rc = main(["plot", str(tmp_path / "s.json"), "-o", str(tmp_path / "s.png")])
    out = capsys.readouterr().out
    assert rc == 0 and "s.png" in out and "3 panels" in out and "800 x 660 pixels" in out
    from smerge.plot import plot_figure

    fig, series = plot_figure(json.loads((tmp_path / "s.json").read_text()))
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert any("fewer than M = 10" in t for t in texts)
    rc = main(["count", str(tmp_path / "a.parquet"), "--item", "v", "--time", "k", "--every", "100",
               "-o", str(tmp_path / "c.parquet"), "--stats", str(tmp_path / "c.json")])
    assert rc == 0
    capsys.readouterr()
    rc = main(["plot", str(tmp_path / "c.json"), "-o", str(tmp_path / "c.png")])
    assert rc == 0 and "bytes received" in capsys.readouterr().out
    assert _png(tmp_path / "c.png") == (800, 660)


def test_engines_import_neither_matplotlib_nor_xarray():
    import subprocess
    import sys

    code = ("import sys, smerge.merge, smerge.merge.wjoin, smerge.merge.stats\n"
            "print([m for m in ('matplotlib', 'xarray') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_rtm_plot_and_existing_png_refused_before_the_run(ncar_dir, tmp_path):
    u, v = os.path.join(ncar_dir, "Ustorm.cdf"), os.path.join(ncar_dir, "Vstorm.cdf")
    png, stats = tmp_path / "r.png", tmp_path / "r.json"
    assert main(["rtm", "--local", u, v, "--eps", "lat=0.001,lon=0.001", "-o", str(tmp_path / "r.parquet"),
                 "--stats", str(stats), "--plot", str(png)]) == 0
    s = json.loads(stats.read_text())
    assert s["algorithm"] == "rtm" and len(s["kappa_per_window"]) == s["report_windows"]
    assert _png(png) == (800, 220 * len(plot_series(s)))
    # the PNG exists now: without --overwrite the run stops before writing anything
    out2 = tmp_path / "r2.parquet"
    assert main(["cgm", "--local", u, v, "-o", str(out2), "--plot", str(png)]) == 2
    assert not out2.exists()


def test_archive_input_read_with_sample_auto_draws_each_run(archive_ab, tmp_path):
    """--sample-a auto --budget: the statistics give one fraction per run, drawn run by run."""
    arch, b = archive_ab
    png, st = tmp_path / "auto.png", tmp_path / "auto.json"
    assert main(["cgm", "--local", str(arch), str(b), "--keys", "t", "--eps", "0.6", "--sample-a", "auto",
                 "--budget", "60", "-o", str(tmp_path / "auto.parquet"), "--stats", str(st), "--plot", str(png)]) == 0
    s = json.loads(st.read_text())
    runs = s["a_sample_run_fractions"]
    assert len(runs) >= 2 and all(0 < f <= 1 for f in runs)
    series = plot_series(s)
    assert series["fraction read per run"] == {"A": ([float(i) for i in range(len(runs))], runs)}
    fig, _ = plot_figure(s)
    assert _lines(fig)["A"] == series["fraction read per run"]["A"]
    assert _png(png) == (800, 220 * len(series))


@pytest.mark.parametrize("cmd, extra, clash", [
    ("cgm", ["--keys", "k", "-o", "out.parquet"], "out.parquet"),
    ("cgm", ["--keys", "k"], "a+b.parquet"),  # the default -o
    ("rtm", ["--keys", "k", "-o", "o.parquet", "--stats", "s.json"], "s.json"),
    ("cgm", ["--keys", "k", "-o", "o.parquet", "--unmatched", "u"], "u.b.parquet"),
    ("wjoin", ["--time", "k", "--window", "0", "-o", "w.parquet"], "w.parquet"),
    ("cgm", ["--keys", "k", "-o", "ds/"], "ds/plot.png"),  # inside the folder output
])
def test_plot_path_may_not_be_another_output_of_the_run(tmp_path, monkeypatch, capsys, cmd, extra, clash):
    """--plot at the path of -o, --stats or an --unmatched file (or inside a folder output) is
    exit 2 before the run, naming both options; nothing is written (the PNG used to replace
    the merge's output with exit 0)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.chdir(tmp_path)
    pq.write_table(pa.table({"k": [0.0, 1.0, 2.0], "x": [1.0, 2.0, 3.0]}), "a.parquet")
    pq.write_table(pa.table({"k": [0.0, 1.0, 2.0], "y": [1.0, 2.0, 3.0]}), "b.parquet")
    before = sorted(os.listdir(tmp_path))
    assert main([cmd, "a.parquet", "b.parquet", "--local", *extra, "--plot", clash]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--plot" in err[0] and "give each output its own path" in err[0], err
    assert sorted(os.listdir(tmp_path)) == before
