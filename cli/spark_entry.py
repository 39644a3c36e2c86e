"""Entry to Spark execution from the CLI (the Spark adapter lives in ``smerge.spark``)."""

from __future__ import annotations

from smerge.errors import UsageError


def run_on_spark(prep, *, master: str, partitions: int | None, conf: dict, progress, verbose: bool) -> dict:
    try:
        from smerge.spark.cgm.runner import run_cgm_spark
    except ImportError:
        raise UsageError(
            f"Spark execution (--master {master}) is not available yet in this version; run with --local"
        ) from None
    from smerge.spark.session import DEFAULT_MASTER, under_spark_submit

    if under_spark_submit() and master == DEFAULT_MASTER:
        master = None  # use the master and settings that spark-submit configured
    return run_cgm_spark(prep, master=master, partitions=partitions, conf=conf, progress=progress, verbose=verbose)
