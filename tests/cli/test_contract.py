"""The command-line contract, walked command by command: common options where the contract
puts them, readable help, --version, and the same statistics keys on every command."""

from __future__ import annotations

import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import typer.main

from smerge.cli.main import main, make_app

# References a user cannot follow: the project's semantics and contracts are in docs/
EXTERNAL = r"(?<![\w/])(ENGINES|DATA|CLI|STYLE)\.md\b|\bspec\s+sections?\b|\bseeds?[ /]00\d|\.\./shared"
READS = ["cgm", "rtm", "wjoin", "count", "gen", "batch", "archive append", "index build"]
ONE_OUTPUT = ["cgm", "rtm", "wjoin", "count", "gen", "index build", "plot"]
EVERY = READS + ["serve", "plot", "archive info"]
JSON = READS + ["serve", "plot", "archive info"]


def command(path: str):
    cmd = typer.main.get_command(make_app())
    for word in path.split():
        cmd = cmd.commands[word]
    return cmd


def options(path: str) -> set[str]:
    return {o for p in command(path).params for o in getattr(p, "opts", []) + getattr(p, "secondary_opts", [])}


@pytest.mark.parametrize("path", READS)
def test_commands_that_read_records_take_the_common_options(path):
    have = options(path)
    for opt in ("--progress", "--no-progress", "--json", "--stats", "--debug"):
        assert opt in have, (path, opt)


@pytest.mark.parametrize("path", JSON)
def test_every_command_prints_json_on_request(path):
    assert "--json" in options(path)


@pytest.mark.parametrize("path", ONE_OUTPUT)
def test_commands_with_one_output_take_o_and_overwrite(path):
    have = options(path)
    assert {"-o", "--overwrite"} <= have or ("--overwrite" in have and path == "gen"), (path, have)


@pytest.mark.parametrize("path", EVERY)
def test_help_is_readable(path, capsys):
    rc = main([*path.split(), "--help"])
    out = capsys.readouterr().out
    assert rc == 0
    usage = out.splitlines()[0]
    assert usage.startswith(f"Usage: smerge {path} [OPTIONS]"), usage
    assert "{" not in usage and not re.search(r"<(str|int|float|bool|list\[)", out), out[:400]  # no {a}, <str>
    assert not re.search(EXTERNAL, out), out


def test_version(capsys):
    from smerge import __version__

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"smerge {__version__}"


def test_every_command_reports_route_and_total_seconds(tmp_path, capsys, monkeypatch):
    """cgm, rtm, wjoin, count, gen, index build, archive append: the same keys with the same
    meanings in their --stats files."""
    monkeypatch.chdir(tmp_path)
    k = np.arange(2000.0)
    pq.write_table(pa.table({"t": k, "item": (k % 7).astype(np.int64), "v": k}), "a.parquet")
    runs = {
        "cgm": ["cgm", "a.parquet", "a.parquet", "--keys", "t", "--local", "-o", "o1.parquet"],
        "rtm": ["rtm", "a.parquet", "a.parquet", "--keys", "t", "--local", "-o", "o2.parquet"],
        "wjoin": ["wjoin", "a.parquet", "a.parquet", "--time", "t", "--window", "1", "--local", "-o", "o3.parquet"],
        "count": ["count", "a.parquet", "--item", "item", "--time", "t", "--every", "100", "-o", "o4.parquet"],
        "gen": ["gen", "o5.parquet", "--records", "500"],
        "index build": ["index", "build", "a.parquet", "--keys", "t", "-o", "idx"],
        "archive append": ["archive", "append", "arc", "a.parquet", "--time", "t"],
    }
    for name, args in runs.items():
        rc = main([*args, "--stats", f"{name}.json", "--no-progress"])
        assert rc == 0, (name, capsys.readouterr().err)
        text = (tmp_path / f"{name}.json").read_text()
        s = json.loads(text)
        assert s["route"].startswith("local (") and s["execution"] == "local", (name, s.get("route"))
        assert s["total_seconds"] > 0 and s["session_seconds"] == 0, name
        cap = capsys.readouterr()
        # a message's parameter references (smerge.errors.param) never reach what a run prints or writes
        assert "\x1d" not in text + cap.out + cap.err, name
    # --json prints the same statistics
    assert main(["gen", "o6.parquet", "--records", "10", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["records"] == 10
    # an existing --stats file is refused before the run without --overwrite
    rc = main(["gen", "o7.parquet", "--records", "10", "--stats", "gen.json"])
    assert rc == 2 and not (tmp_path / "o7.parquet").exists()
    err = capsys.readouterr().err
    assert "--overwrite" in err and "\x1d" not in err


def test_no_file_cites_what_users_cannot_read():
    """README, docs/, help texts and the code point inside the repository only."""
    import pathlib
    import subprocess

    root = pathlib.Path(__file__).resolve().parents[2]
    r = subprocess.run(["git", "ls-files", "*.md", "*.py", "*.c", "*.cfg", "*.sh", "Makefile"], cwd=root, capture_output=True,
                       text=True)
    files = r.stdout.split()
    if r.returncode != 0 or not files:  # no git, or git refuses the folder: walk it instead
        skip = {".git", ".venv", "build", ".hypothesis", ".pytest_cache", "__pycache__"}
        files = [str(f.relative_to(root)) for f in root.rglob("*")
                 if f.is_file() and not skip & set(f.relative_to(root).parts)
                 and (f.suffix in {".md", ".py", ".c", ".cfg", ".sh"} or f.name == "Makefile")]
    assert len(files) > 100, files  # the check saw the project
    bad = [f"{f}:{i + 1}" for f in files if f != "tests/cli/test_contract.py"
           for i, line in enumerate((root / f).read_text(errors="replace").splitlines()) if re.search(EXTERNAL, line)]
    assert not bad, bad
