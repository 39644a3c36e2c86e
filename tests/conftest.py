"""Shared fixtures. ``tests/helpers`` (reference implementations, data builders) is importable."""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import settings

# No per-example deadline anywhere: CI runs on a shared 2-core machine where a slow example is
# load, not a bug (timings live in bench/, never in tests). The examples are drawn from a seed
# derived from each test (derandomize): every run, a fresh clone's CI included, tests the same
# examples, so a failure reproduces (and prints its blob). SMERGE_HYPOTHESIS=explore draws new
# examples every run, to look for what the fixed ones miss.
_EXPLORE = os.environ.get("SMERGE_HYPOTHESIS") == "explore"
settings.register_profile("smerge", deadline=None, derandomize=not _EXPLORE, print_blob=True)
settings.load_profile("smerge")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "helpers"))

NCAR = "/usr/share/ncarg/data/cdf"


@pytest.fixture(scope="session")
def ncar_dir() -> str:
    if not os.path.exists(os.path.join(NCAR, "Pstorm.cdf")):
        pytest.fail("NCAR sample data missing: run `make setup` (installs Debian's libncarg-data)")
    return NCAR


# One SparkSession for every test that needs one (local[2,3]: 2 cores, a failed task is retried),
# in tests/spark/ and elsewhere (an in-process CLI run on Spark): started when first asked for.
@pytest.fixture(scope="session")
def spark():
    from smerge.spark.session import start_session

    session = start_session("local[2,3]", {"spark.sql.shuffle.partitions": "4"})
    yield session
    session.stop()


@pytest.fixture
def spark_cli(spark, monkeypatch, capsys):
    """``run(*args, cwd=...) -> (exit code, stdout, stderr)``: ``smerge ARGS...`` in this process,
    on the shared session. The CLI's own session start (``start_session``, as every Spark command
    and ``batch`` call it) returns that session and records the master it was asked for in
    ``run.masters``; the CLI's stop at the end of its run leaves the session running. Starting a
    fresh JVM per CLI run is tested by tests/spark/test_spark_cli.py, in real processes."""
    from smerge.spark import runner, session
    from cli_run import run_cli

    masters = []

    def start_session(master=session.DEFAULT_MASTER, conf=None, *, verbose=False, app_name="smerge"):
        masters.append(master)
        return spark

    monkeypatch.setattr(runner, "start_session", start_session)
    monkeypatch.setattr(session, "start_session", start_session)
    monkeypatch.setattr(spark, "stop", lambda: None)

    def run(*args, cwd=None):
        if cwd is not None:
            monkeypatch.chdir(cwd)
        return run_cli(capsys, *args)

    run.masters = masters
    return run
