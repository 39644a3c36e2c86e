"""The one exceptions module of smerge.

Library code raises these; only the CLI maps them to exit codes (docs/cli.md):
``SmergeError`` and subclasses -> exit 2 with the message as one line on stderr.
Every message says what is wrong and how to fix it.
"""

from __future__ import annotations


class SmergeError(Exception):
    """Base class: a problem the user can fix (exit code 2)."""

    exit_code = 2


class UsageError(SmergeError):
    """Bad parameters or options (negative eps, K > N, unknown key, ...)."""


class MissingKeyError(UsageError):
    """An input has no column, variable or dimension of a key's name."""

    def __init__(self, path: str, missing, names):
        self.path, self.missing = path, tuple(missing)
        super().__init__(f"{path}: no key {', '.join(map(repr, self.missing))}; it has {', '.join(names)}")


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
            "clean the input or pass --nan-keys unmatched to count such records as unmatched"
        )

    def with_source(self, source: str) -> "KeyNaNError":
        return KeyNaNError(self.column, self.row, source)
