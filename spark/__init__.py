"""Spark execution: the only package that imports pyspark.

- ``session``: start a SparkSession (the JVM's log to a file, workers warmed), its logs;
  ``runner``: the skeleton every runner runs in (session, staging folders removed at the end);
  ``actions``: jobs with a progress bar, task errors mapped to smerge's; ``parts``: the tasks'
  part files (written under a temporary name, renamed when complete).
- The runners: the subpackage ``cgm`` (CGM only: ``cgm.runner``, planning in ``cgm.plan``, the
  partitions' windows in ``cgm.windows``, the partition task in ``cgm.tasks`` with its row map
  ``cgm.rows``, seam resolution in ``cgm.seams``, the final outputs in ``cgm.assemble``),
  ``rtm``, ``wjoin`` (its tasks in ``wjoin_tasks``).
- Inputs and outputs: ``frames`` (URLs read by Spark's own readers), ``netcdf`` (the
  ``smerge_netcdf`` data source), ``parquet`` (Parquet parts joined byte-for-byte).

Nothing is imported here: ``import smerge.spark.session`` etc. (executors import only what
their tasks need).
"""
