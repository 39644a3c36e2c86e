"""The Spark session: start it (the JVM's log to a file, workers warmed), stop it, its logs.

The session start, the log rotation and ``split_conf`` are shared by the cgm, rtm and wjoin
runners (``smerge.spark.runner``).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import warnings

import numpy as np
import pyarrow as pa

from smerge.datasets.output_staging import host_tag, owner_pid_gone
from smerge.errors import UsageError, param

DEFAULT_MASTER = "local[*]"
SMERGE_CONF_PREFIX = "smerge."


def quiet_stderr(log_path: str):
    """Redirect fd 2 to ``log_path`` while the JVM starts (it keeps that stderr for its life)."""

    @contextlib.contextmanager
    def cm():
        sys.stderr.flush()
        saved = os.dup(2)
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.dup2(fd, 2)
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            os.close(fd)

    return cm()


def spark_log_path() -> str:
    """This process's Spark log: ``smerge-spark-<host>-<pid>.log`` in the temporary folder
    (owner-tagged as ``smerge.datasets.output_staging`` names temporary files)."""
    return os.path.join(tempfile.gettempdir(), f"smerge-spark-{host_tag()}-{os.getpid()}.log")


KEEP_FAILED_LOGS = 5  # logs of failed or killed runs kept in the temporary folder (the newest)


def discard_log() -> None:
    """Remove this process's Spark log: the CLI calls it when the run succeeded (exit 0 or 3),
    so only the logs of failed or killed runs stay (and ``remove_stale_logs`` rotates those)."""
    with contextlib.suppress(OSError):
        os.unlink(spark_log_path())


def remove_stale_logs(keep: int = KEEP_FAILED_LOGS) -> None:
    """Rotate the Spark logs of smerge processes that no longer run (this host, boot and pid
    namespace; see ``smerge.datasets.output_staging.owner_pid_gone``): these are failed or killed
    runs (a run that succeeds removes its own, ``discard_log``); the ``keep`` newest stay for a
    look, older ones are removed. Untagged logs of older smerge versions last written before
    this boot are removed too."""
    d = tempfile.gettempdir()
    try:
        names = [n for n in os.listdir(d) if n.startswith("smerge-spark-") and n.endswith(".log")]
    except OSError:
        return
    boot = _boot_time()
    gone = []
    for n in names:
        path = os.path.join(d, n)
        m = _LOG_RE.fullmatch(n)
        with contextlib.suppress(OSError):
            if m and owner_pid_gone(m.group(1), int(m.group(2))):
                gone.append((os.stat(path).st_mtime, path))
            elif boot and _OLD_LOG_RE.fullmatch(n) and os.stat(path).st_mtime < boot:
                os.unlink(path)  # an untagged log of an older smerge, last written before this boot
    for _, path in sorted(gone, reverse=True)[max(keep, 0):]:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _boot_time() -> float | None:
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    return None


_LOG_RE = re.compile(r"smerge-spark-([0-9a-f]{10})-(\d+)\.log")
_OLD_LOG_RE = re.compile(r"smerge-spark-\d+\.log")


from smerge.jobs.route import under_spark_submit  # noqa: E402 (the one test, re-exported)


FORWARDED_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE",
                 "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "SMERGE_ANON",
                 "SMERGE_REMOTE_TIMEOUT")


def session_settings(master: str | None, conf: dict[str, str] | None, *, verbose: bool = False) -> dict[str, str]:
    """The Spark settings of a session smerge starts: its defaults, then ``conf`` (which wins)."""
    python = os.environ.get("PYSPARK_PYTHON", sys.executable)
    defaults = {
        "spark.ui.showConsoleProgress": "false",
        "spark.pyspark.python": python,
        "spark.executorEnv.PYSPARK_PYTHON": python,
        # Times without a zone are UTC (as smerge's own readers take them): Spark's CSV reader
        # would otherwise read "2000-01-01T06:00" in the JVM's local zone.
        "spark.sql.session.timeZone": "UTC",
    }
    if os.name == "posix":
        # The JVM talks to its Python workers over a Unix socket instead of TCP on loopback:
        # measured 50-60 ms of every task's run time over TCP (a small write waiting for the
        # peer's delayed ACK before the task's input arrives), 3-12 ms over the Unix socket
        # (docs/spark.md, "Per-task cost"). ``--conf spark.python.unix.domain.socket.enabled=false``
        # restores TCP.
        defaults["spark.python.unix.domain.socket.enabled"] = "true"
    # Object-store inputs (s3://, ...) are read by the Python workers themselves: the driver's
    # endpoint, region, credentials and smerge's remote settings go with them (Spark redacts
    # the secret and the token in its UI). In local mode the workers inherit them anyway.
    for name in FORWARDED_ENV:
        if os.environ.get(name):
            defaults[f"spark.executorEnv.{name}"] = os.environ[name]
    if master is not None and master.startswith("local"):
        defaults["spark.ui.enabled"] = "false"
    if not verbose:
        defaults["spark.log.level"] = "ERROR"
    return {**defaults, **(conf or {})}


def start_session(master: str | None = DEFAULT_MASTER, conf: dict[str, str] | None = None, *, verbose: bool = False,
                  app_name: str = "smerge"):
    """A SparkSession for ``master`` (None: the one spark-submit configured) with ``conf``.

    Workers run this interpreter. Without ``verbose`` the JVM's own log goes to
    ``spark_log_path()``, not the terminal.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    for k, v in session_settings(master, conf, verbose=verbose).items():
        builder = builder.config(k, v)
    remove_stale_logs()
    quiet = contextlib.nullcontext() if verbose else quiet_stderr(spark_log_path())
    try:
        with quiet:
            spark = builder.getOrCreate()
    except Exception as e:  # the JVM did not start: say where its log is
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        where = "" if verbose else f"; Spark's log: {spark_log_path()}"
        raise UsageError(f"cannot start Spark ({param.master} {master}): {msg}{where}; or run with {param.local}") from None
    if not verbose:
        spark.sparkContext.setLogLevel("ERROR")
    warm_workers(spark)
    return spark


def _warm(_):
    import pyarrow.parquet as pq  # the part writer
    import smerge.datasets.netcdf_classic  # noqa: F401 - the size check of a netCDF open
    import smerge.merge._kernel  # noqa: F401 - the C kernels
    import smerge.spark.parquet  # noqa: F401 - the parts' footers
    import smerge.spark.cgm.tasks  # noqa: F401
    import smerge.transport  # noqa: F401
    from smerge.datasets.base import backends
    from smerge.datasets.netcdf_file import _netcdf4

    # What a merge task's first open_input imports otherwise (measured: netCDF4 and cftime, the
    # whole backend registry, the archive reader), in the first task of every worker.
    backends()
    _netcdf4()
    import smerge.spark.archive  # noqa: F401

    # The first netCDF-4 open and the first Parquet write of a process initialise their
    # libraries (HDF5; Parquet's writer): measured 0.1-0.2 s more in the first merge task
    # than in the others. Pay them here, in memory.
    _netcdf4().Dataset("smerge-warm.nc", "w", diskless=True, persist=False, format="NETCDF4").close()
    pq.write_table(pa.table({"x": pa.array([0.0])}), pa.BufferOutputStream())
    # glibc serves blocks above its mmap threshold (128 KiB at start) by fresh mmaps, faulted in
    # page by page on every use, and raises the threshold to the size of a freed mmapped block
    # (mallopt(3)): freeing one 32 MiB block now lets the tasks' batch-sized arrays (1-8 MiB) reuse
    # heap memory from their first batch on. Measured: the first k1 scan of a worker 0.16 s, 0.10 s
    # after this.
    block = np.ones(32 << 20, dtype=np.uint8)
    del block

    # pyarrow imports pandas lazily on its first conversion of a numpy masked array (~0.3 s),
    # which the netCDF reader does: pay it here, once per worker, not in the first job.
    pa.array(np.ma.masked_array(np.zeros(1), mask=[False]))
    freeze_worker_heap()
    return [os.getpid()]


def freeze_worker_heap() -> None:
    """Move what the worker holds now (the imported modules: a few hundred thousand objects)
    out of the garbage collector's reach. PySpark's daemon runs a full ``gc.collect()`` in a
    reused worker after every task, before it takes the next one: 44-60 ms each time with
    smerge's imports, paid by the next task's run time; after the freeze, under 1 ms. Called by
    the warm-up and at the start of the merge and scan tasks: a worker Spark starts after the
    warm-up (a killed one replaced, a busier session) pays one collection, once."""
    global _heap_frozen
    if _heap_frozen:  # (gc.get_freeze_count() walks the frozen objects: 6 ms)
        return
    import gc

    gc.collect()
    gc.freeze()
    _heap_frozen = True


_heap_frozen = False  # this process froze its heap (freeze_worker_heap)


def warm_workers(spark) -> None:
    """Start the Python workers and import smerge in them (a per-session cost, like the JVM's)."""
    sc = spark.sparkContext
    n = max(1, sc.defaultParallelism)
    sc.parallelize(range(n), n).flatMap(_warm).collect()


def split_conf(conf: dict[str, str] | None) -> tuple[dict[str, str], dict[str, str]]:
    """(Spark settings, smerge settings ``smerge.*``)."""
    spark_conf, own = {}, {}
    for k, v in (conf or {}).items():
        (own if k.startswith(SMERGE_CONF_PREFIX) else spark_conf)[k] = v
    return spark_conf, own


__all__ = ["start_session", "session_settings", "freeze_worker_heap", "under_spark_submit", "split_conf",
           "spark_log_path", "discard_log", "remove_stale_logs", "KEEP_FAILED_LOGS", "DEFAULT_MASTER", "SMERGE_CONF_PREFIX"]
