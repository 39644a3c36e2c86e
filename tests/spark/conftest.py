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
