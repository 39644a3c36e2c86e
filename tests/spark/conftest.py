"""One SparkSession for all Spark tests (local[2,3]: 2 cores, a failed task is retried)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(scope="session")
def spark():
    from smerge.spark import start_session

    session = start_session("local[2,3]", {"spark.sql.shuffle.partitions": "4"})
    yield session
    session.stop()
