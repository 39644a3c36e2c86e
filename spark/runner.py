"""The skeleton every Spark runner (cgm, rtm, wjoin) runs its work in.

``run_on_spark(body, ...)`` checks ``--partitions``, splits ``--conf`` into Spark's settings and
smerge's own (``smerge.*``), starts a session for ``master`` unless one is given (the JVM's
stderr goes to the Spark log, ``smerge.spark.session``), calls ``body(run)`` with a ``SparkRun``,
and at the end -- however it ends: an error, Ctrl-C, SIGTERM (the CLI turns it into Ctrl-C) --
calls what the body asked for (``run.on_end``), removes every staging folder the body asked for
(``run.staging``) and stops the session it
started (quietly unless ``verbose``). The body commits or aborts its outputs with
``smerge.jobs.outputs.committed``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from smerge.datasets.output_staging import make_staging
from smerge.errors import OutputError, UsageError, param
from smerge.spark.actions import run_job
from smerge.spark.session import (DEFAULT_MASTER, quiet_stderr, spark_log_path, split_conf, start_session,
                                  under_spark_submit)


@dataclass
class SparkRun:
    """What a runner's body works with: the session, smerge's settings, the session's start time
    (seconds), ``t0`` (the run's start, ``time.perf_counter``) and the progress factory."""

    spark: Any
    own: dict[str, str]
    session_seconds: float
    t0: float
    progress: Callable | None = None
    staged: list[str] = field(default_factory=list)
    ended: list[Callable[[], Any]] = field(default_factory=list)

    @property
    def sc(self):
        return self.spark.sparkContext

    def collect(self, rdd_fn: Callable[[], list], total: int, label: str, *, bar: bool = True) -> list:
        """Run the action ``rdd_fn()``; the progress bar (unless ``bar`` is false) counts its tasks."""
        return run_job(self.sc, rdd_fn, total, self.progress if bar else None, label)

    def staging(self, output: str, kind: str, folders: tuple[str, ...] = ()) -> str:
        """An owner-tagged staging folder beside ``output`` (leftovers of killed runs there are
        swept first; ``smerge.datasets.output_staging.make_staging``), with ``folders`` in it. It is
        removed when the run ends, whatever ends it; a folder moved into place before (a
        Parquet dataset output) is simply gone from here."""
        path = make_staging(output, kind)
        self.staged.append(path)
        try:
            for name in folders:
                os.makedirs(os.path.join(path, name))
        except OSError as e:
            raise OutputError(f"cannot create the staging directory {path!r} ({e.strerror}); choose another -o") \
                from None
        return path

    def on_end(self, fn: Callable[[], Any]) -> None:
        """Call ``fn()`` when the run ends, whatever ends it (before the staging folders go)."""
        self.ended.append(fn)

    def stats(self, **more) -> dict:
        """The statistics every Spark run reports, plus ``more``."""
        return {"execution": "spark", "master": self.sc.master, "session_start_seconds": self.session_seconds,
                **more}


def task_write_error(e: BaseException, staging: str):
    """In a task: the one-line ``OutputError`` when ``e`` is a write that failed on a full disk, a
    quota or the file size limit while writing into ``staging`` (the run's staging folder beside its
    output ``.<name>.smerge-...``), else None. Tasks return it as their error, which the driver
    reports in one line (exit 2) instead of a failed Spark job."""
    import re

    from smerge.datasets.output_space import write_error

    folder, base = os.path.split(staging.rstrip("/"))
    m = re.match(r"^\.(.+?)\.smerge-", base)
    output = os.path.join(folder, m.group(1)) if m else staging
    return write_error(e, output, where=staging)


def run_on_spark(body: Callable[[SparkRun], Any], *, master: str | None, partitions: int | None,
                 conf: dict[str, str] | None, verbose: bool, spark=None, progress=None, app_name: str = "smerge"):
    """Run ``body(run)`` in a session for ``master`` (None: the one spark-submit configured, else
    ``local[*]``), or in ``spark`` when given (batch runs, tests; it is not stopped)."""
    if partitions is not None and partitions < 1:
        raise UsageError(f"{param.partitions} is {partitions}; use an integer >= 1")
    spark_conf, own = split_conf(conf)
    if master is None and not under_spark_submit():
        master = DEFAULT_MASTER
    t0 = time.perf_counter()
    owns_session = spark is None
    if owns_session:
        spark = start_session(master, spark_conf, verbose=verbose, app_name=app_name)
    run = SparkRun(spark=spark, own=own, session_seconds=time.perf_counter() - t0, t0=t0, progress=progress)
    try:
        return body(run)
    finally:
        for fn in run.ended:
            fn()
        for path in run.staged:
            shutil.rmtree(path, ignore_errors=True)
        if owns_session:
            with quiet_stderr(spark_log_path()) if not verbose else contextlib.nullcontext():
                spark.stop()


__all__ = ["SparkRun", "run_on_spark", "task_write_error"]
