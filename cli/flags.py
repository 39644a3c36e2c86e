"""The command line's names for the library's parameters.

Library messages name parameters (``smerge.errors.param``: "window_size is 0"); a command-line
user set an option, so the CLI shows that option instead ("--window is 0"). A parameter is shown as
``--`` and its name with dashes unless this table says otherwise.
"""

from __future__ import annotations

# library parameter -> the option that sets it, where the two names differ
FLAGS = {
    "window_size": "--window",
    "least_increment": "--increment",
    "least_increment_a": "--increment-a",
    "least_increment_b": "--increment-b",
    "pair_windows": "--pair-window",
    "out_batch_rows": "--batch-rows",
    "variables": "--vars",
    "start": "--from",
    "stop": "--to",
}


def flag(name: str) -> str:
    """The option that sets the library parameter ``name``."""
    return FLAGS.get(name) or "--" + name.replace("_", "-")
