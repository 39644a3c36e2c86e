"""Shared fixtures. ``tests/helpers`` (reference implementations, data builders) is importable."""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import settings

# No per-example deadline anywhere: CI runs on a shared 2-core machine where a slow example is
# load, not a bug (timings live in bench/, never in tests).
settings.register_profile("smerge", deadline=None)
settings.load_profile("smerge")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "helpers"))

NCAR = "/usr/share/ncarg/data/cdf"


@pytest.fixture(scope="session")
def ncar_dir() -> str:
    if not os.path.exists(os.path.join(NCAR, "Pstorm.cdf")):
        pytest.fail("NCAR sample data missing: run `make setup` (installs Debian's libncarg-data)")
    return NCAR
