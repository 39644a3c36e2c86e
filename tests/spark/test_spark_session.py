"""What smerge sets in the sessions it starts, and the workers' frozen heap ("Per-task cost" in
docs/spark.md): the JVM talks to its Python workers over a Unix socket, and a reused worker's
heap is out of the collector's reach, so PySpark's collection after every task is cheap."""

from __future__ import annotations

import gc
import os

from smerge.spark.session import freeze_worker_heap, session_settings


def test_unix_socket_by_default_and_conf_wins():
    assert session_settings("local[2]", None)["spark.python.unix.domain.socket.enabled"] == "true"
    off = session_settings("local[2]", {"spark.python.unix.domain.socket.enabled": "false"})
    assert off["spark.python.unix.domain.socket.enabled"] == "false"
    assert session_settings("local[2]", None)["spark.ui.enabled"] == "false"
    assert "spark.ui.enabled" not in session_settings("spark://h:7077", None)
    assert "spark.log.level" not in session_settings("local[2]", None, verbose=True)


def test_the_session_uses_the_unix_socket(spark):
    assert spark.sparkContext.getConf().get("spark.python.unix.domain.socket.enabled") == "true"


def _worker_state(_):
    before = gc.get_freeze_count()
    freeze_worker_heap()
    return [(os.getpid(), before, gc.get_freeze_count(), len(gc.get_objects()))]


def test_workers_heaps_are_frozen(spark):
    """Every worker that ran a warm-up or a smerge task holds its imports frozen; calling the
    freeze again changes nothing (it runs once per worker)."""
    got = spark.sparkContext.parallelize(range(4), 4).flatMap(_worker_state).collect()
    for pid, before, after, tracked in got:
        assert after > 0 and after >= before
        # the imports are frozen (smerge, pyarrow, numpy: tens of thousands of objects); modules a
        # later task imports (zarr, h5py for a store) are tracked again, so no ratio is asserted
        assert after > 10_000, after
    warmed = [g for g in got if g[1] > 0]
    assert warmed and all(b == a for _, b, a, _ in warmed)  # no second freeze
