"""Library messages name parameters; the command line shows its options instead (smerge.errors.param)."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

from smerge import errors
from smerge.errors import UsageError, param
from smerge.merge import CGMParams, MergeKeys

from tests.helpers.cli_run import run_cli

ROOT = pathlib.Path(__file__).resolve().parents[1]
LIBRARY = ("smerge", "merge", "datasets", "index", "transport", "jobs", "spark", "counting")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


@pytest.fixture
def cli_naming():
    from smerge.cli.flags import flag

    errors.name_parameters(flag)
    yield
    errors.name_parameters(None)


def _params(**kw):
    return CGMParams(keys=MergeKeys(("t",), ("t",)), eps=(0.1,), **kw)


def test_library_message_names_the_parameter():
    with pytest.raises(UsageError) as e:
        _params(window_size=10, least_increment_a=20)
    assert str(e.value) == ("least_increment_a is 20 but the window size N is 10; use K <= N")


def test_cli_naming_shows_the_option(cli_naming):
    with pytest.raises(UsageError) as e:
        _params(window_size=10, least_increment_a=20)
    assert str(e.value) == "--increment-a is 20 but the window size N is 10; use K <= N"
    assert errors.render(f"lower {param.window_size} or {param.nan_keys}") == "lower --window or --nan-keys"


def test_naming_is_applied_when_the_message_is_shown():
    e = UsageError(f"{param.window_size} is 0")  # raised under one naming, shown under another
    assert str(e) == "window_size is 0"
    from smerge.cli.flags import flag

    errors.name_parameters(flag)
    try:
        assert str(e) == "--window is 0"
    finally:
        errors.name_parameters(None)


def test_command_line_error_shows_the_option(tmp_path, capsys):
    a = tmp_path / "a.csv"
    a.write_text("t\n1\n2\n")
    rc, _, err = run_cli(capsys, "cgm", "--local", a, a, "--keys", "t", "--window", "10", "--increment-a", "20",
                           "-o", tmp_path / "o.parquet")
    assert rc == 2
    assert err.strip() == "smerge: error: --increment-a is 20 but the window size N is 10; use K <= N"
    with pytest.raises(UsageError, match="^least_increment_a is 20"):  # the library's naming is back
        _params(window_size=10, least_increment_a=20)


def _string_literals(path: pathlib.Path):
    """(line, text) of every string literal that is not a docstring."""
    tree = ast.parse(path.read_text(), str(path))
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value


# Library text that is about the command line by design: the statistics' "command" hint (a command
# a user can paste), the route a run took as the summary prints it, argument lists handed to a
# child `smerge` process.
ALLOWED = {
    "merge/stats.py", "jobs/route.py",
}
# Single strings about the command line by design: the note smerge leaves in a dataset folder it
# wrote (the older versions' note, still recognised, and the first line of the current one).
ALLOWED_TEXT = {
    ("datasets/output_staging.py", "This folder was written by smerge; `--overwrite` may replace it as a whole.\n"),
    ("datasets/output_staging.py", "This folder was written by smerge; `--overwrite` replaces it only while it holds "
                                   "nothing but the entries listed below.\n"),
}


def test_library_messages_name_no_command_line_flags():
    hits = []
    for folder in LIBRARY:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel in ALLOWED:
                continue
            hits += [f"{rel}:{line}: {FLAG.search(text).group(0)}" for line, text in _string_literals(path)
                     if FLAG.search(text) and (rel, text) not in ALLOWED_TEXT]
    assert hits == [], f"{len(hits)} library strings name a command-line flag; write {{param.NAME}} instead"
