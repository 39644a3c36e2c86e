"""Spark execution of the CGM merge: the one module (with ``smerge.spark_tasks``) that uses pyspark.

``run_cgm_spark(prep, master=...)`` runs the same engine as ``smerge.jobs.run_local`` inside
Spark tasks, one task per range of the leading key (see ``smerge.spark_tasks`` for the
co-partitioning and ownership rule), and returns the same statistics dict.

Flow: (1) planning, only when P > 1: per chunk of the outermost dimension the count and the
range of the leading key k1 -- from the file's metadata for gridded inputs keyed by their
outer coordinate, else from a scan of k1 alone on the executors; (2) the driver picks P - 1
boundaries; (3) the merge job runs one task per range; every task reads only the chunks that
can hold its records, runs the engine (reader threads and a background writer inside the
task) and writes its final pairs and unmatched records as part files (Parquet parts of the
final output when the output is Parquet, else Arrow IPC); seam pairs (with a B record near a
boundary) come back to the driver, which keeps at most one pair per record; (4) the driver
finishes the output atomically: a Parquet dataset folder is the parts renamed into place, a
single Parquet file is the parts joined byte-for-byte (``smerge.spark_parquet``), other
formats are written from the Arrow parts; the staging directory is removed also on failure.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import uuid
import warnings
from dataclasses import replace
from typing import Callable

import numpy as np
import pyarrow as pa

from smerge.errors import InputError, KeyNaNError, OutputError, SmergeError, UsageError
from smerge.jobs import PreparedMerge, masked_stats, open_outputs, write_stats
from smerge.merge import MergeStats
from smerge.datasets.outputs import host_tag, make_staging, mark_dataset, owner_pid_gone, replace_dir
from smerge.datasets.writers import DATASET_FORMAT
from smerge.spark_parquet import ParquetConcatError, concat_parquet
from smerge.spark_tasks import (PART_KINDS, ChunkStats, MergePlan, SideSpec, _PartWriter, choose_bounds,
                                coord_chunk_stats, key_columns, needed_runs, part_path, read_ipc_bytes,
                                run_partition, scan_chunks)

DEFAULT_MASTER = "local[*]"
SMERGE_CONF_PREFIX = "smerge."
_ERRORS = {c.__name__: c for c in (SmergeError, UsageError, InputError, OutputError)}

# --------------------------------------------------------------------------------------------
# Session


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
    (owner-tagged as ``smerge.datasets.outputs`` names temporary files)."""
    return os.path.join(tempfile.gettempdir(), f"smerge-spark-{host_tag()}-{os.getpid()}.log")


KEEP_FAILED_LOGS = 5  # logs of failed or killed runs kept in the temporary folder (the newest)


def discard_log() -> None:
    """Remove this process's Spark log: the CLI calls it when the run succeeded (exit 0 or 3),
    so only the logs of failed or killed runs stay (and ``remove_stale_logs`` rotates those)."""
    with contextlib.suppress(OSError):
        os.unlink(spark_log_path())


def remove_stale_logs(keep: int = KEEP_FAILED_LOGS) -> None:
    """Rotate the Spark logs of smerge processes that no longer run (this host, boot and pid
    namespace; see ``smerge.datasets.outputs.owner_pid_gone``): these are failed or killed
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


def under_spark_submit() -> bool:
    """True when this process was launched by spark-submit (its JVM is already running)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


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
    defaults = {
        "spark.ui.showConsoleProgress": "false",
        "spark.pyspark.python": os.environ["PYSPARK_PYTHON"],
        "spark.executorEnv.PYSPARK_PYTHON": os.environ["PYSPARK_PYTHON"],
    }
    if master is not None and master.startswith("local"):
        defaults["spark.ui.enabled"] = "false"
    if not verbose:
        defaults["spark.log.level"] = "ERROR"
    for k, v in {**defaults, **(conf or {})}.items():
        builder = builder.config(k, v)
    remove_stale_logs()
    quiet = contextlib.nullcontext() if verbose else quiet_stderr(spark_log_path())
    try:
        with quiet:
            spark = builder.getOrCreate()
    except Exception as e:  # the JVM did not start: say where its log is
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        where = "" if verbose else f"; Spark's log: {spark_log_path()}"
        raise UsageError(f"cannot start Spark (--master {master}): {msg}{where}; or run with --local") from None
    if not verbose:
        spark.sparkContext.setLogLevel("ERROR")
    warm_workers(spark)
    return spark


def _warm(_):
    import pyarrow.parquet  # noqa: F401 - the part writer
    import smerge.datasets.netcdf  # noqa: F401 - netCDF4 and HDF5
    import smerge.datasets.parquet  # noqa: F401
    import smerge.merge._kernel  # noqa: F401 - numba and the cached kernels
    import smerge.spark_tasks  # noqa: F401
    import smerge.transport  # noqa: F401

    # pyarrow imports pandas lazily on its first conversion of a numpy masked array (~0.3 s),
    # which the netCDF reader does: pay it here, once per worker, not in the first job.
    pa.array(np.ma.masked_array(np.zeros(1), mask=[False]))
    return [os.getpid()]


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


# --------------------------------------------------------------------------------------------
# Jobs with progress


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


def _raise_task_error(err: tuple) -> None:
    name, msg = err[0], err[1]
    if name == "KeyNaNError":
        raise InputError(msg)
    raise _ERRORS.get(name, SmergeError)(msg)


# --------------------------------------------------------------------------------------------
# Planning


def _side_spec(prep: PreparedMerge, side: str) -> SideSpec:
    src = prep.src_a if side == "a" else prep.src_b
    job = prep.job
    variables = job.vars_a if side == "a" else job.vars_b
    inner = max(int(src.inner_size or 1), 1)
    step = max(1, job.batch_rows // inner)
    return SideSpec(path=src.path, keys=tuple(src.keys), variables=tuple(variables) if variables else None,
                    batch_rows=job.batch_rows, schema=src.schema, step=step, inner=inner, outer=src.outer_size)


def _outer_coordinate_k1(src) -> np.ndarray | None:
    """k1 per outer index when k1 is the coordinate variable of a gridded input's outer
    dimension (known from the file's metadata), else None."""
    grid = src.grid
    k1 = src.keys[0]
    if grid is None or not grid.dims or grid.dims[0] != k1 or k1 not in grid.coords:
        return None
    vals = np.asarray(grid.coords[k1])
    if vals.ndim != 1 or vals.size != src.outer_size:
        return None
    field = src.schema.field(k1)
    try:
        arr = pa.array(vals).cast(field.type)
    except (pa.ArrowException, TypeError, ValueError):
        return None
    return key_columns(pa.RecordBatch.from_arrays([arr], names=[k1]), (k1,))[:, 0]


def _scan_tasks(spec: SideSpec, side: str, groups: int) -> list[tuple[str, int, int | None]]:
    if spec.outer is None:
        return [(side, 0, None)]
    n_chunks = max(1, -(-spec.outer // spec.step))
    g = max(1, min(groups, n_chunks))
    edges = [round(i * n_chunks / g) for i in range(g + 1)]
    return [(side, a, b - 1) for a, b in zip(edges[:-1], edges[1:]) if b > a]


def _scan(item, specs):
    side, first, last = item
    try:
        return scan_chunks(side, specs[side], first, last)
    except SmergeError as e:
        return (type(e).__name__, str(e), None, None)


def _plan_chunks(prep: PreparedMerge, sc, specs: dict, own: dict, progress) -> tuple[dict, dict]:
    """Chunk statistics of both inputs: from metadata where the file allows it (gridded netCDF
    keyed by its outer coordinate), else from a scan of k1 on the executors."""
    stats: dict[str, list[ChunkStats]] = {}
    how: dict[str, str] = {}
    for side, src in (("a", prep.src_a), ("b", prep.src_b)):
        k1 = _outer_coordinate_k1(src)
        if k1 is not None:
            stats[side] = coord_chunk_stats(side, specs[side], k1)
            how[side] = "metadata"
    todo = [s for s in ("a", "b") if s not in stats]
    if todo:
        default_groups = max(1, -(-sc.defaultParallelism // len(todo)))
        groups = _positive_int(own, "smerge.plan.groups", default_groups)
        items = [it for s in todo for it in _scan_tasks(specs[s], s, groups)]
        scanned = run_job(sc, lambda: sc.parallelize(items, len(items)).map(lambda it: _scan(it, specs)).collect(),
                           len(items), progress if len(items) > 4 else None, "scan keys")
        for s in todo:
            stats[s] = []
            how[s] = "scan"
        for res in scanned:
            if isinstance(res, tuple):
                _raise_task_error(res)
            for st in res:
                stats[st.side].append(st)
    for side in ("a", "b"):
        stats[side].sort(key=lambda s: s.chunk)
    return stats, how


# --------------------------------------------------------------------------------------------
# The run


def run_cgm_spark(prep, *, master: str | None = DEFAULT_MASTER, partitions: int | None = None,
                  conf: dict[str, str] | None = None, progress=None, verbose: bool = False, spark=None) -> dict:
    """Run the CGM merge of ``prep`` on Spark; return the statistics dict (spec/CLI.md).

    ``prep``: a ``PreparedMerge`` (inputs opened by smerge's readers: slab pairing), or a
    ``CGMJob`` whose inputs are opened in the Spark session -- URLs by Spark's own readers
    (``smerge.spark_frames``; see ``smerge.jobs.needs_spark_readers``).
    ``spark``: an existing SparkSession (batch runs, tests); otherwise one is started for
    ``master`` and stopped at the end. ``partitions``: P, the number of key ranges (default:
    Spark's default parallelism). Settings ``smerge.*`` in ``conf`` are smerge's own (docs/spark.md).
    """
    def body(spark, own: dict, session_seconds: float, t0: float) -> dict:
        p = prep if isinstance(prep, PreparedMerge) else prepare_frames(prep, spark)
        if not _frame_sources(p):
            return _run(p, spark, partitions, own, progress, session_seconds)
        # Row ids of inputs read by Spark come from its file splits: keep their layout fixed
        # for the whole run (it depends on the default parallelism, which grows as executors
        # register on a cluster).
        pin = spark.conf.get("spark.sql.files.minPartitionNum", None) or str(max(1, spark.sparkContext.defaultParallelism))
        with _session_conf(spark, {"spark.sql.files.minPartitionNum": pin}):
            return _run(p, spark, partitions, own, progress, session_seconds)

    return run_in_session(body, master=master, partitions=partitions, conf=conf, verbose=verbose, spark=spark)


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


def prepare_frames(job, spark) -> PreparedMerge:
    """``prepare`` with the inputs opened in ``spark``: URLs (and, beside a URL, local Parquet/CSV)
    by Spark's readers, local netCDF through the ``smerge_netcdf`` data source."""
    from smerge.jobs import prepare
    from smerge.spark_frames import open_frame

    return prepare(job, opener=lambda path, **kw: open_frame(spark, path, **kw))


MIN_PARTITION_RECORDS = 1_000_000


def default_partitions(prep: PreparedMerge, parallelism: int, own: dict) -> int:
    """P when --partitions is not given: Spark's default parallelism, but no more partitions
    than the larger input has ``smerge.partition.min_records`` (default 1,000,000) records:
    below that a partition's merge takes less time than planning and one more task cost."""
    return _default_parts([prep.src_a.num_rows, prep.src_b.num_rows], parallelism, own)


def _positive_int(own: dict, key: str, default: int, *, allow_zero: bool = False) -> int:
    """The whole number ``--conf KEY=N`` (or ``default``); exit 2 naming the key otherwise."""
    raw = own.get(key, default)
    try:
        value = int(raw)
    except (TypeError, ValueError):
        value = -1
    if value < (0 if allow_zero else 1):
        least = "0 (0: no floor)" if allow_zero else "1"
        raise UsageError(f"--conf {key}={raw!r}: give a whole number >= {least}")
    return value


def _default_parts(sizes: list[int | None], parallelism: int, own: dict) -> int:
    floor = _positive_int(own, "smerge.partition.min_records", MIN_PARTITION_RECORDS, allow_zero=True)
    sizes = [n for n in sizes if n is not None]
    parts = max(1, parallelism)
    if sizes and len(sizes) == 2 and floor > 0:
        parts = min(parts, max(1, -(-max(sizes) // floor)))
    return parts


def _explicit_bounds(own: dict) -> tuple[float, ...] | None:
    if not own.get("smerge.bounds"):
        return None
    try:
        return tuple(sorted({float(x) for x in own["smerge.bounds"].split(",") if x.strip()}))
    except ValueError:
        raise UsageError(f"--conf smerge.bounds={own['smerge.bounds']!r}: give numbers separated by commas") from None


def _plan_slabs(prep: PreparedMerge, sc, specs: dict, partitions: int | None, bounds, own: dict, progress):
    """Slab pairing: (bounds, how each input was planned, chunk runs of A and B per partition)."""
    job = prep.job
    parts = partitions or default_partitions(prep, sc.defaultParallelism, own)
    if bounds == () or (bounds is None and parts == 1):
        return (), {"a": "none", "b": "none"}, (((0, specs["a"].outer),),), (((0, specs["b"].outer),),)
    chunk_stats, plan_how = _plan_chunks(prep, sc, specs, own, progress)
    if job.nan_keys == "error":
        for side, path in (("a", job.a), ("b", job.b)):
            bad = [s for s in chunk_stats[side] if s.first_nan_row >= 0]
            if bad:
                raise KeyNaNError(bad[0].first_nan_key, bad[0].first_nan_row, path)
    if bounds is None:
        sample = np.concatenate([s.sample for side in ("a", "b") for s in chunk_stats[side]] or [np.empty(0)])
        bounds = choose_bounds(sample, parts)
    eps1 = float(prep.params.eps[0])
    edges = [-np.inf, *bounds, np.inf]
    P = len(bounds) + 1
    runs_a = tuple(needed_runs(chunk_stats["a"], edges[p], edges[p + 1], False, p == 0, specs["a"].step)
                   for p in range(P))
    runs_b = tuple(needed_runs(chunk_stats["b"], edges[p] - eps1, edges[p + 1] + eps1, True, p == 0,
                               specs["b"].step) for p in range(P))
    return bounds, plan_how, runs_a, runs_b


# --------------------------------------------------------------------------------------------
# Inputs read by Spark's own readers (URLs): smerge.spark_frames


def _frame_sources(prep: PreparedMerge) -> dict | None:
    from smerge.spark_frames import FrameSource

    srcs = {"a": prep.src_a, "b": prep.src_b}
    if not any(isinstance(s, FrameSource) for s in srcs.values()):
        return None
    for side, s in srcs.items():
        if not isinstance(s, FrameSource):
            raise UsageError(f"{s.path}: open both inputs with smerge.spark_frames when one of them is a URL")
    return srcs


def _spark_action(what: str):
    """Run a Spark action; a failure inside Spark (a file it cannot read, a bad CSV row, an
    error raised by smerge in a Python task) becomes one line naming ``what``."""

    def run(fn):
        try:
            return fn()
        except SmergeError:
            raise
        except Exception as e:  # noqa: BLE001 - Py4J/PySpark exceptions carry the JVM's message
            raise _task_failure(e, what) from None

    return run


def _task_failure(e: Exception, what: str) -> SmergeError:
    import re

    text = str(e)
    for name, cls in _ERRORS.items():
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
    return InputError(f"{what}: Spark failed ({first}); check the inputs (--verbose shows Spark's log)")


def _arrow_batches(rows: int) -> dict[str, str]:
    """Arrow batches of ``rows`` records between the JVM and the Python tasks (Spark's default
    10,000 makes the per-batch work dominate)."""
    return {"spark.sql.execution.arrow.maxRecordsPerBatch": str(rows)}


def _plan_frames(spark, prep: PreparedMerge, frames: dict, partitions: int | None, bounds, own: dict, progress):
    """The k1 scans of both inputs (row-id offsets, NaN check, sample) and the bounds."""
    from smerge.spark_frames import scan_frame

    sc = spark.sparkContext
    job = prep.job
    scans = {}
    for side, src in frames.items():
        act = _spark_action(src.path)
        with _session_conf(spark, _arrow_batches(job.batch_rows)):
            scans[side] = act(lambda: scan_frame(
                src, lambda fn: run_job(sc, fn, 1, None, f"scan keys of {side.upper()}")))
        if job.nan_keys == "error" and scans[side].first_nan_row >= 0:
            raise KeyNaNError(src.keys[0], scans[side].first_nan_row, src.path)
    parts = partitions or _default_parts([scans["a"].count, scans["b"].count], sc.defaultParallelism, own)
    if bounds is None:
        bounds = choose_bounds(np.concatenate([scans["a"].sample, scans["b"].sample]), parts) if parts > 1 else ()
    return scans, bounds


def _empty_result(p: int) -> dict:
    return {"p": p, "a_records": 0, "b_records": 0, "b_visible": 0, "b_shared_owned": 0, "a_nan_keys": 0,
            "b_nan_keys": 0, "final_pairs": 0, "engine_pairs": 0, "passes": 0, "kappas": [], "windows": [],
            "merge_seconds": 0.0, "write_seconds": 0.0, "read_seconds": 0.0, "task_seconds": 0.0,
            "seam": None, "seam_owned": b"", "seam_ord": b"", "cand_b": None}


@contextlib.contextmanager
def _session_conf(spark, values: dict[str, str]):
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


def _merge_frames(spark, plan: MergePlan, frames: dict, scans: dict, progress) -> list[dict]:
    """Tag both inputs with row ids and partitions, shuffle them into P groups, merge each group."""
    from smerge.spark_frames import cogroup_merge, results_of, salts, tagged_frame

    P = plan.parts
    salt = salts(spark, P)
    ta = tagged_frame(frames["a"], "a", scans["a"], plan.bounds, plan.eps1, salt)
    tb = tagged_frame(frames["b"], "b", scans["b"], plan.bounds, plan.eps1, salt)
    sc = spark.sparkContext
    act = _spark_action(f"{plan.source_a} + {plan.source_b}")
    with _session_conf(spark, {"spark.sql.shuffle.partitions": str(P),
                               "spark.sql.adaptive.coalescePartitions.enabled": "false",
                               **_arrow_batches(plan.a.batch_rows)}):
        rows = act(lambda: run_job(sc, lambda: cogroup_merge(ta, tb, plan, salt).collect(), P, progress,
                                   "merge partitions"))
    results = {r["p"]: r for r in results_of(rows)}
    return [results.get(p) or _empty_result(p) for p in range(P)]


def _frames_kappa_max(spark, plan: MergePlan, frames: dict, scans: dict) -> float:
    """kappa_max of frame inputs, in one task that gets both inputs' keys (as ``_kappa_max``)."""
    from smerge.spark_frames import ROW, tagged_frame

    def keyed(side):
        src = frames[side]
        t = tagged_frame(src, side, scans[side], (), plan.eps1, [0], replicate=False)
        return t.select(*[f"`{k}`" for k in src.keys], ROW, "_salt")

    def task(key, left: pa.Table, right: pa.Table) -> pa.Table:
        from smerge.merge.cgm import kappa_max_pairs
        from smerge.merge.keys import key_matrix

        out = []
        for t, spec in ((left, plan.a), (right, plan.b)):
            k = key_matrix(t, spec.keys)
            r = t.column(ROW).to_numpy()
            good = ~np.isnan(k).any(axis=1)
            out.append((np.ascontiguousarray(k[good]), r[good], t.num_rows))
        (ka, ra, na), (kb, rb, _) = out
        o = np.argsort(ra, kind="stable")
        ka, ra = np.ascontiguousarray(ka[o]), ra[o]
        o = np.argsort(rb, kind="stable")
        kb, rb = np.ascontiguousarray(kb[o]), rb[o]
        pairs = kappa_max_pairs(ka, ra, kb, rb, plan.params.eps)
        return pa.table({"k": pa.array([pairs / na if na else 1.0], pa.float64())})

    a, b = keyed("a"), keyed("b")
    with _session_conf(spark, {"spark.sql.shuffle.partitions": "1"}):
        rows = _spark_action("--kappa-max")(
            lambda: a.groupBy("_salt").cogroup(b.groupBy("_salt")).applyInArrow(task, "k double").collect())
    return rows[0].k if rows else 1.0


def _run(prep: PreparedMerge, spark, partitions: int | None, own: dict, progress, session_seconds: float) -> dict:
    t0 = time.perf_counter()
    sc = spark.sparkContext
    job = prep.job
    specs = {"a": _side_spec(prep, "a"), "b": _side_spec(prep, "b")}
    eps1 = float(prep.params.eps[0])
    frames = _frame_sources(prep)
    bounds = _explicit_bounds(own)

    # (1) planning: none for one partition; metadata or a k1 scan otherwise
    if frames:
        scans, bounds = _plan_frames(spark, prep, frames, partitions, bounds, own, progress)
        plan_how = {"a": "spark-scan", "b": "spark-scan"}
        runs_a = runs_b = ((),) * (len(bounds) + 1)
    else:
        bounds, plan_how, runs_a, runs_b = _plan_slabs(prep, sc, specs, partitions, bounds, own, progress)
    P = len(bounds) + 1
    plan_seconds = time.perf_counter() - t0

    # (2) the merge job: executors write the part files
    task_threads = _task_threads(own, sc, P)  # (a bad setting fails before anything is created)
    part_format = "parquet" if prep.output_format in ("parquet", DATASET_FORMAT) else "arrow"
    kill, _, marker = own.get("smerge.test.kill_once_partition", "").partition(":")
    una_schema = unb_schema = None
    if prep.unmatched_paths:
        una_schema, unb_schema = prep.src_a.schema, prep.src_b.schema
        if prep.params.with_ids:
            una_schema = una_schema.append(pa.field("a_row", pa.int64()))
            unb_schema = unb_schema.append(pa.field("b_row", pa.int64()))
    staging = make_staging(prep.output, "spark")  # owner-tagged (leftovers of killed runs are swept), umask modes
    try:  # from here on the staging folder is removed whatever happens (SIGTERM/Ctrl-C included)
        try:
            for kind in PART_KINDS:
                os.makedirs(os.path.join(staging, kind))
        except OSError as e:
            raise OutputError(f"cannot create the staging directory {staging!r} ({e.strerror}); choose another -o") \
                from None
        plan = MergePlan(a=specs["a"], b=specs["b"], params=replace(prep.params, with_ids=True), bounds=bounds,
                         eps1=eps1, runs_a=runs_a, runs_b=runs_b, staging=staging,
                         want_unmatched=prep.unmatched_paths is not None, source_a=job.a, source_b=job.b,
                         part_format=part_format, out_schema=prep.out_schema if part_format == "parquet" else None,
                         una_schema=una_schema, unb_schema=unb_schema,
                         prefetch=task_threads,
                         kill_once_partition=int(kill) if kill else None, kill_marker=marker or None)
        t1 = time.perf_counter()
        if frames:
            results = _merge_frames(spark, plan, frames, scans, progress)
        else:
            results = run_job(sc, lambda: sc.parallelize(range(P), P).map(lambda p: run_partition(plan, p)).collect(),
                              P, progress, "merge partitions")
        job_seconds = time.perf_counter() - t1
        results.sort(key=lambda r: r["p"])
        _raise_partition_errors(results)
        t2 = time.perf_counter()
        seam = _resolve_seams(prep, results)
        if part_format == "parquet":
            _finish_parquet(prep, plan, results, seam)
        else:
            _assemble(prep, plan, results, seam)
        assemble_seconds = time.perf_counter() - t2
    finally:
        shutil.rmtree(staging, ignore_errors=True)

    stats = MergeStats("cgm")
    stats.params = prep.params.as_dict()
    stats.a_records = sum(r["a_records"] for r in results)
    stats.b_records = sum(r["b_records"] for r in results)
    if frames and (stats.a_records, stats.b_records) != (scans["a"].count, scans["b"].count):
        raise InputError(f"{job.a} + {job.b}: the merge read {stats.a_records:,} + {stats.b_records:,} records but the "
                         f"key scan counted {scans['a'].count:,} + {scans['b'].count:,}; an input changed during the "
                         "run: run it again")
    stats.matched = sum(r["final_pairs"] for r in results) + seam["kept"]
    stats.a_unmatched = stats.a_records - stats.matched
    stats.b_unmatched = stats.b_records - stats.matched
    stats.a_nan_keys = sum(r["a_nan_keys"] for r in results)
    stats.b_nan_keys = sum(r["b_nan_keys"] for r in results)
    stats.passes = sum(r["passes"] for r in results)
    stats.kappas = report_kappas(results, seam["dropped_at"])
    # The K in force per report window, aligned with the kappas (partitions in key-range order;
    # with --adapt each task adapts its own K from the starting K).
    stats.k_windows = [tuple(k) for r in results for k in r.get("k_windows", ())]
    stats.check_accounting()
    if job.kappa_max:
        stats.kappa_max = _frames_kappa_max(spark, plan, frames, scans) if frames else _kappa_max(sc, plan)
    stats.fetch_seconds = plan_seconds + sum(r.get("read_seconds", 0.0) for r in results)
    stats.merge_seconds = sum(r["merge_seconds"] for r in results)
    stats.write_seconds = sum(r["write_seconds"] for r in results) + assemble_seconds
    stats.total_seconds = time.perf_counter() - t0
    stats.extra.update({
        **masked_stats(prep, read_here=False),
        "execution": "spark", "master": sc.master, "partitions": P, "bounds": list(bounds),
        "plan": plan_how, "part_format": part_format, "task_threads": plan.prefetch,
        "session_start_seconds": session_seconds, "plan_seconds": plan_seconds, "spark_job_seconds": job_seconds,
        "assemble_seconds": assemble_seconds,
        "task_seconds": [r.get("task_seconds", 0.0) for r in results],
        "b_shared": sum(r["b_shared_owned"] for r in results),
        "seam_pairs": seam["total"], "seam_pairs_dropped": seam["total"] - seam["kept"],
        "partition_pairs": [r["final_pairs"] for r in results],
        "a": job.a, "b": job.b, "output": prep.output,
    })
    result = stats.as_dict()
    result["params"] = dict(result["params"], with_ids=prep.write_ids, output_format=prep.output_format)
    if job.stats:
        write_stats(job.stats, result)
    return result


def _task_threads(own: dict, sc, parts: int) -> bool:
    """Reader/writer threads inside the merge tasks: ``smerge.task.prefetch`` true/false, or
    ``auto`` (default): on when the tasks leave cores free (P below the cores of the machine
    for local masters, below Spark's default parallelism otherwise), off when every core
    already runs a task (measured: threads then only add contention)."""
    v = str(own.get("smerge.task.prefetch", "auto")).lower()
    if v in ("true", "1", "yes", "on"):
        return True
    if v in ("false", "0", "no", "off"):
        return False
    if v != "auto":
        raise UsageError(f"--conf smerge.task.prefetch={v!r}: use true, false or auto")
    slots = (os.cpu_count() or 1) if str(sc.master).startswith("local") else sc.defaultParallelism
    return parts < max(1, slots)


def _raise_partition_errors(results: list[dict]) -> None:
    """Report a task's error as one line; NaN keys: the first row of A, else of B (as --local reads A first)."""
    errs = [r["error"] for r in results if "error" in r]
    if not errs:
        return
    nan = [e for e in errs if e[0] == "KeyNaNError"]
    if nan:  # (name, msg, column, row, side)
        raise InputError(min(nan, key=lambda e: (e[4] != "a", e[3] if e[3] is not None else 0))[1])
    _raise_task_error(errs[0])


def _resolve_seams(prep: PreparedMerge, results: list[dict]) -> dict:
    """Keep at most one seam pair per shared B record: its owner's, else the lowest partition's."""
    tables, owned, part, ords = [], [], [], []
    for r in results:
        t = read_ipc_bytes(r["seam"])
        if t is None:
            continue
        tables.append(t)
        owned.append(np.frombuffer(r["seam_owned"], dtype=np.bool_))
        part.append(np.full(t.num_rows, r["p"], dtype=np.int64))
        ords.append(np.frombuffer(r["seam_ord"], dtype=np.int64))
    if not tables:
        return {"total": 0, "kept": 0, "pairs": None, "dropped_a": None, "kept_b": np.empty(0, np.int64),
                "dropped_at": {}}
    table = pa.concat_tables(tables)
    owned_a, part_a = np.concatenate(owned), np.concatenate(part)
    b_rows = table.column("b_row").to_numpy()
    idx = np.arange(table.num_rows)
    order = np.lexsort((idx, part_a, ~owned_a, b_rows))
    first = np.ones(order.size, dtype=bool)
    first[1:] = b_rows[order][1:] != b_rows[order][:-1]
    keep = np.zeros(table.num_rows, dtype=bool)
    keep[order[first]] = True
    kept = table.filter(pa.array(keep))  # partition order, then engine order
    dropped = table.filter(pa.array(~keep))
    n_a = len(prep.src_a.schema)
    dropped_a = pa.Table.from_arrays([dropped.column(i) for i in range(n_a)] + [dropped.column("a_row")],
                                     schema=prep.src_a.schema.append(pa.field("a_row", pa.int64())))
    part_all, ord_all = np.concatenate(part), np.concatenate(ords)
    dropped_at: dict[int, np.ndarray] = {}
    for p in np.unique(part_all[~keep]):
        dropped_at[int(p)] = ord_all[~keep & (part_all == p)]
    return {"total": table.num_rows, "kept": kept.num_rows, "pairs": kept, "dropped_a": dropped_a,
            "kept_b": kept.column("b_row").to_numpy(), "dropped_at": dropped_at}


def report_kappas(results: list[dict], dropped_at: dict[int, np.ndarray]) -> list[float]:
    """The report windows' kappas of all partitions (in key-range order) after seam resolution.

    Each partition's engine counted its pairs per report window, in the order it emitted them;
    a dropped seam pair (known by its position among the partition's pairs) is taken off the
    matched count of the window that emitted it: its A record stays retired there, unmatched.
    """
    kappas: list[float] = []
    for r in results:
        counts = np.asarray(r["windows"], dtype=np.int64).reshape(-1, 2)
        matched = counts[:, 0].copy()
        ords = dropped_at.get(r["p"])
        if ords is not None and ords.size:
            ends = np.cumsum(counts[:, 0])
            np.subtract.at(matched, np.searchsorted(ends, ords, side="right"), 1)
        kappas += [m / n for m, n in zip(matched.tolist(), counts[:, 1].tolist())]
    return kappas


def _read_part(path: str):
    if not os.path.exists(path):
        return
    with pa.memory_map(path) as src:
        reader = pa.ipc.open_file(src)
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i)


def _conform(batch, schema: pa.Schema) -> pa.RecordBatch:
    if batch.schema.names != schema.names:
        batch = pa.RecordBatch.from_arrays([batch.column(n) for n in schema.names], schema=schema)
    return batch


def _assemble(prep: PreparedMerge, plan: MergePlan, results: list[dict], seam: dict) -> None:
    """Write the final outputs atomically from the part files and the kept seam pairs."""
    out, un_a, un_b = open_outputs(prep)
    writers = [w for w in (out, un_a, un_b) if w is not None]
    try:
        for r in results:
            for b in _read_part(part_path(plan.staging, "pairs", r["p"])):
                out.write(_conform(b, out.schema))
        if seam["pairs"] is not None:
            for b in seam["pairs"].to_batches():
                out.write(_conform(b, out.schema))
        if un_a is not None:
            for r in results:
                for b in _read_part(part_path(plan.staging, "ua", r["p"])):
                    un_a.write(_conform(b, un_a.schema))
            if seam["dropped_a"] is not None:
                for b in seam["dropped_a"].to_batches():
                    un_a.write(_conform(b, un_a.schema))
        if un_b is not None:
            for r in results:
                for b in _read_part(part_path(plan.staging, "ub", r["p"])):
                    un_b.write(_conform(b, un_b.schema))
            kept_b = seam["kept_b"]
            for r in results:
                t = read_ipc_bytes(r["cand_b"])
                if t is None:
                    continue
                rows = t.column("b_row").to_numpy()
                t = t.filter(pa.array(~np.isin(rows, kept_b)))
                for b in t.to_batches():
                    un_b.write(_conform(b, un_b.schema))
        for w in writers:
            w.commit()
    except BaseException:
        for w in writers:
            w.abort()
        raise


def _finish_parquet(prep: PreparedMerge, plan: MergePlan, results: list[dict], seam: dict) -> None:
    """Executors wrote the final Parquet parts; add the driver's parts (kept seam pairs, seam
    records that became unmatched) and move everything into place.

    A dataset output is the folder of parts itself (renamed into place). A single file is the
    parts joined byte-for-byte (``smerge.spark_parquet``: row groups copied, one footer
    written), into a temporary file renamed over the target. The outputs are moved into place
    only when every one of them is complete.
    """
    P = plan.parts

    def extra(kind: str, schema: pa.Schema, tables: list) -> None:
        tables = [t for t in tables if t is not None and t.num_rows]
        if not tables:
            return
        w = _PartWriter(part_path(plan.staging, kind, P, "parquet"), schema, "parquet")
        try:
            for t in tables:
                for b in t.to_batches():
                    w.write(b)
            w.close()
        except BaseException:
            w.abort()
            raise

    extra("pairs", plan.out_schema, [seam["pairs"]])
    targets = [("pairs", prep.output, plan.out_schema)]
    if prep.unmatched_paths:
        extra("ua", plan.una_schema, [seam["dropped_a"]])
        kept_b, cands = seam["kept_b"], []
        for r in results:
            t = read_ipc_bytes(r["cand_b"])
            if t is not None:
                cands.append(t.filter(pa.array(~np.isin(t.column("b_row").to_numpy(), kept_b))))
        extra("ub", plan.unb_schema, cands)
        targets += [("ua", prep.unmatched_paths[0], plan.una_schema), ("ub", prep.unmatched_paths[1], plan.unb_schema)]
    ready: list[tuple[str, str, bool]] = []  # (finished path, target, is a directory)
    try:
        for kind, target, schema in targets:
            paths = [part_path(plan.staging, kind, p, "parquet") for p in range(P + 1)]
            if kind == "pairs" and prep.output_format == DATASET_FORMAT:
                folder = os.path.join(plan.staging, kind)
                for name in os.listdir(folder):  # leftovers of failed task attempts
                    if not name.endswith(".parquet"):
                        os.unlink(os.path.join(folder, name))
                mark_dataset(folder)  # this folder becomes the dataset: smerge's marker in it
                ready.append((folder, target, True))
                continue
            tmp = os.path.join(plan.staging, f"{kind}.joined.parquet")
            concat_parquet(paths, tmp, schema, take_first=True)
            ready.append((tmp, target, False))
    except ParquetConcatError as e:
        raise OutputError(f"cannot join the Parquet parts of {prep.output!r} ({e})") from None
    for src, target, is_dir in ready:
        if is_dir:
            replace_dir(src, target)  # checks the replace rule again (marker or empty)
        else:
            os.replace(src, target)


def _kappa_max(sc, plan: MergePlan) -> float:
    """kappa_max (spec section 4) computed in one task that reads both inputs' keys."""

    def task(_):
        from smerge.merge.cgm import kappa_max_pairs
        from smerge.spark_tasks import key_columns

        out = []
        for spec in (plan.a, plan.b):
            src = spec.open()
            ks, rs, row = [], [], 0
            for b in src.batches():
                k = key_columns(b, spec.keys)
                r = np.arange(row, row + b.num_rows, dtype=np.int64)
                row += b.num_rows
                good = ~np.isnan(k).any(axis=1)
                ks.append(k[good])
                rs.append(r[good])
            out.append((np.ascontiguousarray(np.concatenate(ks)) if ks else np.empty((0, len(spec.keys))),
                        np.concatenate(rs) if rs else np.empty(0, np.int64), row))
        (ka, ra, na), (kb, rb, _) = out
        pairs = kappa_max_pairs(ka, ra, kb, rb, plan.params.eps)
        return [pairs / na if na else 1.0]

    return sc.parallelize([0], 1).flatMap(task).collect()[0]


__all__ = ["run_cgm_spark", "run_in_session", "start_session", "under_spark_submit", "split_conf", "spark_log_path",
           "discard_log", "DEFAULT_MASTER"]
