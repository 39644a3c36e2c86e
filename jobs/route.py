"""Which route a run takes: in-process or Spark (``--local``, ``--master``, or the size of the
inputs under ``--master auto``, the default). The rule is stated in docs/cli.md, "The route"."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Sequence

from smerge.errors import UsageError, param

# Up to this many bytes of local input a run without --master goes in-process. On the 2-core
# reference machine in-process was faster at every size measured (up to 1.56 GB: 7.6 s against
# 21.9 s on local[*]); 2 GB is where local[*] on 8 cores is modelled to catch up
# (docs/spark.md, "Which route runs").
AUTO_MAX_BYTES = 2_000_000_000
AUTO_CONF_KEY = "smerge.auto.max_bytes"
AUTO_ENV = "SMERGE_AUTO_MAX_BYTES"
AUTO_SPARK_MASTER = "local[*]"


@dataclass(frozen=True)
class Route:
    """Where a run goes: ``spark`` or not, the master (None: spark-submit's) and why."""

    spark: bool
    master: str | None
    why: str  # e.g. "local (auto: 12.3 MB <= 2.0 GB)", the statistics' "route"


def under_spark_submit() -> bool:
    """True when this process was launched by spark-submit (its JVM is already running): the one
    place smerge tells (the route, the Spark runners and the session all ask here)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def input_bytes(path: str | None) -> int | None:
    """Bytes of a local input (a file, or every file below a folder); None for a URL or a
    stream (hdfs://, grpc://, ...: size unknown here). A missing path counts 0 (the run's own
    checks report it)."""
    if not path:
        return 0
    if "://" in path:
        return None
    try:
        if not os.path.isdir(path):
            return os.path.getsize(path)
    except OSError:
        return 0
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def auto_max_bytes(conf: dict[str, str]) -> int:
    """The auto threshold: ``--conf smerge.auto.max_bytes=N``, else ``$SMERGE_AUTO_MAX_BYTES``,
    else ``AUTO_MAX_BYTES``. 0 sends every run without ``--local`` to Spark."""
    raw, what = conf.get(AUTO_CONF_KEY), f"{param.conf} {AUTO_CONF_KEY}"
    if raw is None:
        raw, what = os.environ.get(AUTO_ENV), AUTO_ENV
    if raw is None:
        return AUTO_MAX_BYTES
    try:
        value = int(float(raw))
    except ValueError:
        value = -1
    if value < 0:
        raise UsageError(f"{what}={raw!r}: give a number of bytes >= 0 (0: always Spark)")
    return value


def choose_route(*, local: bool, master: str | None, inputs: Sequence[str | None], conf: dict[str, str],
                 spark_readers: bool = False) -> Route:
    """In-process or Spark for one run (``--master auto``, the default; docs/cli.md, "The route"):

    ``--local`` runs in-process (whatever ``--master`` says); a named ``--master`` runs on Spark,
    and so does a run under spark-submit (its session) without one; otherwise inputs Spark must read
    (``spark_readers``: URLs, ``smerge.reader=spark``) run on Spark ``local[*]``, and local
    inputs run in-process when their total size is at most ``auto_max_bytes`` (URL or stream
    inputs count 0), else on Spark ``local[*]``."""
    if local:
        return Route(False, None, "local (--local)")
    if master is not None and master != "auto":
        return Route(True, master, f"spark (--master {master})")
    if under_spark_submit():  # its session, its master
        return Route(True, None, "spark (spark-submit)")
    limit = auto_max_bytes(conf)
    if spark_readers:
        return Route(True, AUTO_SPARK_MASTER, "spark (auto: inputs read by Spark's readers)")
    total = sum(input_bytes(p) or 0 for p in inputs)
    if limit == 0:
        return Route(True, AUTO_SPARK_MASTER, f"spark (auto: threshold {AUTO_CONF_KEY}=0)")
    t, m = _size(total), _size(limit)
    if t == m:  # too close to tell apart in rounded units
        t, m = f"{total:,} B", f"{limit:,} B"
    if total <= limit:
        main = sys.modules.get("smerge.cli.main")
        if main is not None:
            main.in_process_route()  # no pandas import for an in-process run (as --local)
        return Route(False, None, f"local (auto: {t} <= {m})")
    return Route(True, AUTO_SPARK_MASTER, f"spark (auto: {t} > {m})")


__all__ = ["AUTO_MAX_BYTES", "AUTO_CONF_KEY", "AUTO_ENV", "AUTO_SPARK_MASTER", "Route", "under_spark_submit",
           "input_bytes",
           "auto_max_bytes", "choose_route"]
