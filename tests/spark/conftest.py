"""Spark tests: CLI runs go to Spark (the shared session and ``spark_cli`` are in tests/conftest.py)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(autouse=True)
def cli_runs_on_spark(monkeypatch):
    """CLI runs here are Spark runs: the default route (``--master auto``) would run these small
    inputs in-process, so its threshold is 0 (tests of the auto route set their own)."""
    monkeypatch.setenv("SMERGE_AUTO_MAX_BYTES", "0")
