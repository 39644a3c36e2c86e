"""What every Spark runner (cgm, rtm, wjoin) does around its work."""

from __future__ import annotations

import contextlib
import time
from typing import Callable

from smerge.errors import UsageError
from smerge.spark.session import (DEFAULT_MASTER, quiet_stderr, spark_log_path, split_conf, start_session,
                                  under_spark_submit)


def run_in_session(body: Callable, *, master: str | None, partitions: int | None, conf: dict[str, str] | None,
                   verbose: bool, spark=None, app_name: str = "smerge"):
    """What every Spark runner does around its work: check ``--partitions``, start a session
    for ``master`` (None: the one spark-submit configured, else ``local[*]``) unless ``spark``
    is given, call ``body(spark, smerge_conf, session_seconds, t0)``, stop the session it started
    (quietly unless ``verbose``)."""
    if partitions is not None and partitions < 1:
        raise UsageError(f"--partitions is {partitions}; use an integer >= 1")
    spark_conf, own = split_conf(conf)
    if master is None and not under_spark_submit():
        master = DEFAULT_MASTER
    t0 = time.perf_counter()
    owns_session = spark is None
    if owns_session:
        spark = start_session(master, spark_conf, verbose=verbose, app_name=app_name)
    session_seconds = time.perf_counter() - t0
    try:
        return body(spark, own, session_seconds, t0)
    finally:
        if owns_session:
            with quiet_stderr(spark_log_path()) if not verbose else contextlib.nullcontext():
                spark.stop()


__all__ = ["run_in_session"]
