"""One SparkSession for all Spark tests (local[2,3]: 2 cores, a failed task is retried)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(scope="session")
def spark():
    from smerge.spark.session import start_session

    session = start_session("local[2,3]", {"spark.sql.shuffle.partitions": "4"})
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def cli_runs_on_spark(monkeypatch):
    """CLI runs here are Spark runs: the default route (``--master auto``) would run these small
    inputs in-process, so its threshold is 0 (tests of the auto route set their own)."""
    monkeypatch.setenv("SMERGE_AUTO_MAX_BYTES", "0")
