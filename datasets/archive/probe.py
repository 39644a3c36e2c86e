"""Whether a path is an archive folder, without importing the archive modules (numpy, pyarrow,
hashlib, ...): the CLI asks this of every input, and most inputs are files."""

from __future__ import annotations

import os

MANIFEST = "manifest.json"


def is_archive(path: str) -> bool:
    """True when ``path`` is a folder with an archive manifest (not checked further)."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, MANIFEST))
