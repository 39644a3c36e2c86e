"""Opening smerge's compiled kernels (C extensions built by setup.py) through ctypes."""

from __future__ import annotations

import ctypes
import importlib.util


def open_extension(module: str, what: str) -> ctypes.CDLL:
    """The compiled extension ``module`` opened through ctypes; an ImportError saying how to
    build it when it is missing."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin:
        raise ImportError(f"smerge's {what} ({module}) is not built: reinstall with `pip install -e .` "
                          "(needs a C compiler)")
    return ctypes.CDLL(spec.origin)
