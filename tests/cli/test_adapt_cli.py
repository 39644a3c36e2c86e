"""`smerge cgm --delta D --adapt` and `adapt = true` in batch files (docs/semantics.md section 10)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli_run import run_cli  # noqa: E402 (tests/helpers: the shared CLI test helper)


@pytest.fixture
def ab(tmp_path):
    """Sorted keys with 30% of each stream displaced out of a window of 20."""
    out = []
    for name, seed in (("a", 1), ("b", 2)):
        rng = np.random.default_rng(seed)
        k = np.arange(4000, dtype=np.float64)
        idx = rng.choice(k.size, 1200, replace=False)
        k[idx] += rng.integers(-100, 100, idx.size)
        path = tmp_path / f"{name}.parquet"
        pq.write_table(pa.table({"k": k, f"v{name}": np.arange(k.size)}), path)
        out.append(str(path))
    return out


def test_adapt_without_delta_is_exit_2_and_writes_nothing(ab, tmp_path, capsys):
    a, b = ab
    rc, out, err = run_cli(capsys, "cgm", a, b, "--keys", "k", "--adapt", "--local", "-o", tmp_path / "o.parquet")
    assert rc == 2 and "--delta" in err
    assert not (tmp_path / "o.parquet").exists()


def test_adapt_writes_k_per_window_and_params(ab, tmp_path, capsys):
    a, b = ab
    st = tmp_path / "s.json"
    rc, out, err = run_cli(capsys, "cgm", a, b, "--keys", "k", "--window", "20", "--increment", "10", "--delta", "0.2",
                           "--delta-windows", "3", "--adapt", "--local", "-o", tmp_path / "o.parquet", "--stats", st)
    assert rc in (0, 3), err
    s = json.loads(st.read_text())
    assert s["params"]["adapt"] is True and s["params"]["adapt_k_range"] == [1, 20]
    assert s["params"]["least_increment_a"] == 10  # the given K: K starts at min(it, N / 32)
    ks = s["k_per_window"]
    assert len(ks) == len(s["kappa_per_window"]) == s["report_windows"]
    assert ks[0] == [1, 1] and all(1 <= x <= 20 for k in ks for x in k)
    assert rc == (0 if s["delta_ok"] else 3)


def test_fixed_k_stats_have_no_k_series(ab, tmp_path, capsys):
    a, b = ab
    st = tmp_path / "s.json"
    rc, _, err = run_cli(capsys, "cgm", a, b, "--keys", "k", "--window", "20", "--increment", "5", "--delta", "1", "--local",
                         "-o", tmp_path / "o.parquet", "--stats", st)
    assert rc == 0, err
    s = json.loads(st.read_text())
    assert "k_per_window" not in s and "adapt" not in s["params"]


def test_batch_adapt_without_delta_is_exit_2(ab, tmp_path, capsys):
    a, b = ab
    jf = tmp_path / "jobs.toml"
    jf.write_text(f'[[job]]\nname = "j"\na = "{a}"\nb = "{b}"\nkeys = "k"\nadapt = true\n')
    rc, out, err = run_cli(capsys, "batch", jf, "--local")
    assert rc == 2 and "delta" in err


def test_batch_adapt_job(ab, tmp_path, capsys):
    a, b = ab
    jf = tmp_path / "jobs.toml"
    jf.write_text(f'[[job]]\nname = "j"\na = "{a}"\nb = "{b}"\nkeys = "k"\nwindow = 20\nincrement = 10\n'
                  f'delta = 0.5\nadapt = true\noutput = "{tmp_path / "o.parquet"}"\n'
                  f'stats = "{tmp_path / "j.json"}"\n')
    rc, out, err = run_cli(capsys, "batch", jf, "--local")
    assert rc in (0, 3), err
    s = json.loads((tmp_path / "j.json").read_text())
    assert s["params"]["adapt"] is True and len(s["k_per_window"]) == s["report_windows"]


def test_plot_draws_k_a_and_k_b(ab, tmp_path, capsys):
    """`smerge plot` draws the [K_A, K_B] pairs of an adapted run, one line each."""
    from smerge.plot import plot_series

    a, b = ab
    st = tmp_path / "s.json"
    rc, _, err = run_cli(capsys, "cgm", a, b, "--keys", "k", "--window", "20", "--increment", "10", "--increment-b",
                         "6", "--delta", "0.2", "--delta-windows", "3", "--adapt", "--local",
                         "-o", tmp_path / "o.parquet", "--stats", st)
    assert rc in (0, 3), err
    s = json.loads(st.read_text())
    panel = plot_series(s)["least increment K per report window"]
    assert panel["K_A"][1] == [float(k[0]) for k in s["k_per_window"]]
    assert panel["K_B"][1] == [float(k[1]) for k in s["k_per_window"]]
    assert panel["K_A"][0] == [float(i) for i in range(len(s["k_per_window"]))]
    rc, _, err = run_cli(capsys, "plot", st, "-o", tmp_path / "run.png")
    assert rc == 0, err
    assert (tmp_path / "run.png").stat().st_size > 0
