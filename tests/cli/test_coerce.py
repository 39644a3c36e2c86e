"""smerge's fast option conversion (cli/coerce.py) gives Typer's own results, and leaves every
other case (and its error message) to Typer's pydantic route."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from typer._adapters import build_adapter
from typer.models import OptionInfo

from smerge.cli.coerce import _MISS, fast_value
from smerge.cli.main import main

INTS = ["0", "5000", "-3", "007", "-0", "123456789012345678", "1e3", "1_000", " 5", "+5", "x", "", "5.0"]
FLOATS = ["0", "0.05", "-0.0", "1.", "1e5", "1E-3", "2.5e+3", "-7.25", ".5", "12345678901234567.12345678901234567",
          "inf", "nan", "1_0", " 1", "x", ""]


def typer_value(annotation, value):
    return build_adapter(annotation, OptionInfo()).validate_python(value)


@pytest.mark.parametrize("annotation, values", [(int, INTS + [5000, -1]), (float, FLOATS + [0.05, -1.5]),
                                                (str, ["", "a,b", "0.05", "über"]), (bool, [True, False])])
def test_fast_conversion_equals_typers_adapter(annotation, values):
    fast = 0
    for v in values:
        got = fast_value(annotation, v, multi=False)
        if got is _MISS:
            continue
        fast += 1
        want = typer_value(annotation, v)
        assert type(got) is type(want) and (got == want or (math.isnan(got) and math.isnan(want))), (v, got, want)
    assert fast >= 2  # the common cases do take the fast path


def test_lists_and_missing_values():
    assert fast_value(list[str], ("a=1", "b=2"), multi=True) == typer_value(list[str], ("a=1", "b=2"))
    assert fast_value(list[str], None, multi=True) == ()
    assert fast_value(int, None, multi=False) is None
    assert fast_value(list[str], "a", multi=True) is _MISS  # Typer says "Value must be an iterable."
    assert fast_value(float, 1, multi=False) is _MISS  # an int for a float: Typer's call


def test_other_values_keep_typers_errors(tmp_path, capsys):
    assert main(["cgm", "a.parquet", "b.parquet", "--window", "x", "--local"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("smerge: error: Invalid value for '--window'") and "valid integer" in err


def test_parsing_a_local_command_does_not_import_pydantic():
    probe = ("import sys\nfrom smerge.cli.main import main\n"
             "main(['cgm', 'missing-a.parquet', 'missing-b.parquet', '--keys', 'k', '--eps', '0.05', '--window', "
             "'100', '--local', '--conf', 'x=1'])\nprint('pydantic' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert r.stdout.strip() == "False", r.stderr[-2000:]
