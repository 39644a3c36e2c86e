"""Spark actions run by the driver: a job with a progress bar, task errors mapped to smerge's.

``run_job`` runs an RDD/DataFrame action in a thread and counts finished tasks on the bar;
``spark_action``/``task_failure`` turn a failure inside Spark into one ``SmergeError`` line;
``session_conf`` sets SQL settings for the queries planned inside a block.
"""

from __future__ import annotations

import contextlib
import re
import threading
import uuid
from typing import Callable

from smerge.errors import InputError, OutputError, SmergeError, UsageError, param

ERRORS = {c.__name__: c for c in (SmergeError, UsageError, InputError, OutputError)}


def result_tasks_done(tracker, group: str) -> int:
    """Finished result tasks (partitions) of the jobs in ``group``: a job's last stage holds its
    result tasks; earlier stages of a shuffle (reading and tagging the inputs) are not counted."""
    done = 0
    for jid in tracker.getJobIdsForGroup(group):
        info = tracker.getJobInfo(jid)
        st = tracker.getStageInfo(max(info.stageIds)) if info and info.stageIds else None
        if st is not None:
            done += st.numCompletedTasks
    return done


def run_job(sc, rdd_fn: Callable[[], list], total: int, progress, label: str) -> list:
    """Run ``rdd_fn()`` (an RDD action) in a thread; the bar counts finished tasks."""
    group = f"smerge-{uuid.uuid4().hex[:12]}"
    box: dict = {}

    def work():
        try:
            sc.setJobGroup(group, label)
            box["result"] = rdd_fn()
        except BaseException as e:  # re-raised in the caller's thread
            box["error"] = e

    th = threading.Thread(target=work, name="smerge-spark-job", daemon=True)
    th.start()
    bar = progress(total, label) if progress else None
    done = 0
    try:
        while th.is_alive():
            th.join(0.2)
            if bar is None:
                continue
            now = min(result_tasks_done(sc.statusTracker(), group), total)
            if now > done:
                bar.update(now - done)
                done = now
        if bar is not None and "result" in box and total > done:
            bar.update(total - done)
    finally:
        if bar is not None:
            bar.close()
    if "error" in box:
        raise box["error"]
    return box["result"]


def raise_task_error(err: tuple) -> None:
    name, msg = err[0], err[1]
    if name == "KeyNaNError":
        raise InputError(msg)
    raise ERRORS.get(name, SmergeError)(msg)


def spark_action(what: str):
    """Run a Spark action; a failure inside Spark (a file it cannot read, a bad CSV row, an
    error raised by smerge in a Python task) becomes one line naming ``what``."""

    def run(fn):
        try:
            return fn()
        except SmergeError:
            raise
        except Exception as e:  # noqa: BLE001 - Py4J/PySpark exceptions carry the JVM's message
            raise task_failure(e, what) from None

    return run


def task_failure(e: Exception, what: str) -> SmergeError:
    text = str(e)
    for name, cls in ERRORS.items():
        m = re.search(rf"(?:smerge\.errors\.)?\b{name}: (.+)", text)
        if m:
            return cls(m.group(1).strip())
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    classed = [ln for ln in lines if re.search(r"\[[A-Z][A-Z0-9_.]+\]", ln)]
    if classed and not any("Traceback (most recent call last)" in ln for ln in lines):
        # a JVM error: the deepest line with Spark's error class ([MALFORMED_CSV_RECORD] ...)
        first = re.sub(r"^(Caused by: )?[\w.$]+(Exception|Error): ", "", classed[-1])
    elif any("Traceback (most recent call last)" in ln for ln in lines):  # a Python task failed
        tb = lines[next(i for i, ln in enumerate(lines) if "Traceback (most recent call last)" in ln) + 1:]
        tb = tb[:next((i for i, ln in enumerate(tb) if ln.startswith("JVM stacktrace")), len(tb))]
        errs = [ln for ln in tb if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b", ln)]
        first = errs[-1] if errs else tb[-1]
    else:
        useful = [ln for ln in lines if not ln.startswith("An error occurred while calling")]
        causes = [ln for ln in useful if ln.startswith("Caused by:")]
        first = causes[-1][len("Caused by: "):] if causes else (useful or [type(e).__name__])[0]
    first = re.sub(r"\s*SQLSTATE:.*$", "", first)
    return InputError(f"{what}: Spark failed ({first}); check the inputs ({param.verbose} shows Spark's log)")


def arrow_batches(rows: int) -> dict[str, str]:
    """Arrow batches of ``rows`` records between the JVM and the Python tasks (Spark's default
    10,000 makes the per-batch work dominate)."""
    return {"spark.sql.execution.arrow.maxRecordsPerBatch": str(rows)}


@contextlib.contextmanager
def session_conf(spark, values: dict[str, str]):
    """Set SQL settings for the queries planned inside the block, then restore them."""
    old = {k: spark.conf.get(k, None) for k in values}
    for k, v in values.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


__all__ = ["run_job", "result_tasks_done", "raise_task_error", "spark_action", "task_failure", "arrow_batches",
           "session_conf", "ERRORS"]
