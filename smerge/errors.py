"""The one exceptions module of smerge.

Library code raises these; only the CLI maps them to exit codes (docs/cli.md):
``SmergeError`` and subclasses -> exit 2 with the message as one line on stderr.
Every message says what is wrong and how to fix it.

Messages name the parameter a user set, not a command-line flag: library code writes
``f"{param.window_size} is {n}"``, which reads "window_size is 5" from Python and "--window is 5"
from the command line (the CLI installs its flag names with ``name_parameters``).
"""

from __future__ import annotations

import re
from typing import Callable

_MARK = "\x1d"  # ASCII group separator: brackets a parameter's name inside a message
_REFERENCE = re.compile(f"{_MARK}([A-Za-z_][A-Za-z0-9_]*){_MARK}")
_naming: Callable[[str], str] | None = None


class _Parameters:
    """``param.NAME``: a reference to the parameter NAME inside a message (see ``render``)."""

    def __getattr__(self, name: str) -> str:
        if name.startswith("__"):
            raise AttributeError(name)
        return f"{_MARK}{name}{_MARK}"


param = _Parameters()


def name_parameters(naming: Callable[[str], str] | None) -> Callable[[str], str] | None:
    """How messages show parameter references from now on: ``naming(name)`` (the CLI: its
    flag), or the library's parameter name (None, the default). Returns the naming it replaces."""
    global _naming
    previous, _naming = _naming, naming
    return previous


def render(text: str, naming: Callable[[str], str] | None = None) -> str:
    """``text`` with every ``param.NAME`` reference shown as ``naming`` (default: the installed
    naming) says."""
    if _MARK not in text:
        return text
    naming = naming or _naming
    return _REFERENCE.sub(lambda m: naming(m.group(1)) if naming else m.group(1), text)


class SmergeError(Exception):
    """Base class: a problem the user can fix (exit code 2)."""

    exit_code = 2

    def __str__(self) -> str:
        return render(super().__str__())

    def message(self, naming: Callable[[str], str] | None = None) -> str:
        """The message with parameter references shown as ``naming`` says (the CLI: its options)."""
        return render(super().__str__(), naming)


class UsageError(SmergeError):
    """Bad parameters or options (negative eps, K > N, unknown key, ...)."""


class MissingKeyError(UsageError):
    """An input has no column, variable or dimension of a key's name."""

    def __init__(self, path: str, missing, names):
        self.path, self.missing = path, tuple(missing)
        names = list(names)
        hint = ""
        index = [n for n in names if n == "" or n.startswith("__index_level_")]
        if index:  # pandas' to_parquet/to_csv of an unnamed index (a DatetimeIndex of times, say)
            hint = (f" ({index[0]!r} is the unnamed index pandas wrote: name it before writing, e.g. "
                    "df.index.name = 'time', or write df.reset_index())")
        super().__init__(f"{path}: no key {', '.join(map(repr, self.missing))}; it has "
                         f"{', '.join(repr(n) if n == '' else n for n in names)}{hint}")


class InputError(SmergeError):
    """Bad input data: missing/unreadable file, unknown format, NaN keys, truncated file."""


class OutputError(SmergeError):
    """The output cannot be written (exists without --overwrite, directory not writable)."""


class KeyNaNError(InputError):
    """A merge key is NaN or missing; raised with the column and the first bad row id."""

    def __init__(self, column: str, row: int, source: str | None = None):
        self.column, self.row, self.source = column, row, source
        where = f"{source}: " if source else ""
        super().__init__(
            f"{where}key column {column!r} is NaN or missing at row {row}; "
            f"clean the input or pass {param.nan_keys} unmatched to count such records as unmatched"
        )

    def with_source(self, source: str) -> "KeyNaNError":
        return KeyNaNError(self.column, self.row, source)
