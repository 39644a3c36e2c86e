"""smerge count: local exact counts, a plain server stream and a summarised one (equal with c = 0),
statistics, bad input (exit 2, one line)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli_run import run_cli  # noqa: E402 (tests/helpers: the shared CLI test helper)

SMERGE = [sys.executable, "-m", "smerge"]
TOKEN = "count-token-0123456789"


@pytest.fixture
def zipf(tmp_path):
    rng = np.random.default_rng(0)
    n = 50_000
    path = tmp_path / "z.parquet"
    pq.write_table(pa.table({"item": rng.zipf(1.3, n) % 3000, "t": np.arange(n), "v": rng.random(n)}), path)
    return path


def test_local_counts_every_and_range(zipf, tmp_path, capsys):
    out = tmp_path / "c.parquet"
    rc, so, err = run_cli(capsys, "count", zipf, "--item", "item", "--time", "t", "--every", 10_000, "-o", out,
                          "--json")
    assert rc == 0, err
    s = json.loads(so)
    got = pq.read_table(out)
    t = pq.read_table(zipf)
    assert sum(got.column("count").to_pylist()) == t.num_rows and all(got.column("exact").to_pylist())
    assert s["records_received"] == s["records_raw"] == t.num_rows and s["bytes_received"] == s["bytes_raw"] > 0
    assert s["estimated_answers"] == 0
    rc, so, _ = run_cli(capsys, "count", zipf, "--item", "item", "--time", "t", "--from", 100, "--to", 200)
    assert rc == 0 and "answers" in so and "(estimate)" not in so


@pytest.mark.parametrize("args, words", [
    (["--every", "1h"], "has a unit"),
    ([], "either --every"),
    (["--from", "1"], "either --every"),
    (["--every", "10", "--from", "1", "--to", "5"], "either --every"),
    (["--from", "9", "--to", "5"], "before --to"),
    (["--every", "-3"], "not a duration"),
    (["--every", "0"], "> 0"),
])
def test_bad_input_is_exit_2_one_line(zipf, capsys, args, words):
    rc, _, err = run_cli(capsys, "count", zipf, "--item", "item", "--time", "t", *args)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and words in err, err


def test_bad_columns_and_missing_file(zipf, tmp_path, capsys):
    rc, _, err = run_cli(capsys, "count", zipf, "--item", "nope", "--time", "t", "--every", "10")
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    rc, _, err = run_cli(capsys, "count", tmp_path / "missing.parquet", "--item", "i", "--time", "t", "--every", "1")
    assert rc == 2 and len(err.strip().splitlines()) == 1, err


def _serve(path, *extra):
    tok = path.parent / "token"
    tok.write_text(TOKEN)
    p = subprocess.Popen([*SMERGE, "serve", str(path), "--port", "0", "--token-file", str(tok), *extra],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = p.stdout.readline().strip()
    assert url.startswith("grpc"), p.stderr.read()
    return p, url


@pytest.mark.slow
def test_summarised_and_plain_streams_equal_the_local_counts(zipf, tmp_path, monkeypatch, capsys):
    p, url = _serve(zipf, "--summarize", "item", "--time", "t", "--lifetime", "5000")
    try:
        monkeypatch.setenv("SMERGE_TOKEN", TOKEN)
        outs = {}
        for name, src in (("local", zipf), ("summary", url)):
            out = tmp_path / f"{name}.parquet"
            rc, so, err = run_cli(capsys, "count", src, "--item", "item", "--time", "t", "--every", 10_000,
                                  "-o", out, "--stats", tmp_path / f"{name}.json")
            assert rc == 0, err
            outs[name] = (pq.read_table(out), json.loads((tmp_path / f"{name}.json").read_text()))
        assert outs["summary"][0].equals(outs["local"][0])
        s = outs["summary"][1]
        assert s["mode"] == "summary" and s["records_raw"] == 50_000
        assert s["records_received"] < s["records_raw"] and s["bytes_received"] < s["bytes_raw"]
        # a range cutting a lifetime: frequent items flagged as estimates
        rc, so, _ = run_cli(capsys, "count", url, "--item", "item", "--time", "t", "--from", 1000, "--to", 7000,
                            "--json")
        s = json.loads(so)
        assert rc == 0 and s["estimated_answers"] > 0 and s["exact_answers"] > 0
        # another column than the summarised one: the plain stream, exact
        rc, so, _ = run_cli(capsys, "count", url, "--item", "v", "--time", "t", "--from", 0, "--to", 100, "--json")
        assert rc == 0 and json.loads(so)["mode"] == "stream"
        # without the token: exit 2, one line
        monkeypatch.delenv("SMERGE_TOKEN")
        rc, _, err = run_cli(capsys, "count", url, "--item", "item", "--time", "t", "--every", 10_000)
        assert rc == 2 and "token" in err and len(err.strip().splitlines()) == 1
    finally:
        p.terminate()
        p.wait(30)


def test_serve_summarize_needs_all_three(zipf, capsys):
    rc, _, err = run_cli(capsys, "serve", zipf, "--port", "0", "--summarize", "item")
    assert rc == 2 and "--lifetime" in err


def test_count_process_does_not_import_pandas(zipf, tmp_path):
    """pandas costs ~0.7 s of start-up, inside a --budget; count never needs it."""
    out = tmp_path / "c.parquet"
    code = ("import sys; from smerge.cli.main import main\n"
            "sys.argv = ['smerge'] + sys.argv[1:]\n"
            "rc = main(); print('pandas' in sys.modules); sys.exit(rc)\n")
    p = subprocess.run([sys.executable, "-c", code, "count", str(zipf), "--item", "item", "--time", "t",
                        "--every", "10000", "-o", str(out)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "False"
    assert pq.read_table(out).num_rows > 0
