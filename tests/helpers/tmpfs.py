"""A small tmpfs mounted for one test (root only): a disk that fills."""

from __future__ import annotations

import contextlib
import os
import subprocess

import pytest


@contextlib.contextmanager
def mounted_tmpfs(path, size: str):
    """Mount a tmpfs of ``size`` (``1m``, ``256k``) at the new folder ``path`` for the block;
    the test is skipped where one cannot be mounted."""
    path.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
