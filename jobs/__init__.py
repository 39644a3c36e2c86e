"""In-process jobs, one module per engine (``cgm``, ``rtm``, ``wjoin``), and what they share:
the inputs of a prepared run (``inputs``), its outputs (``outputs``), paths made absolute for
Spark (``paths``). The Spark runners (``smerge.spark``) take the same prepared runs.

The names of the CGM job and the shared helpers are importable from ``smerge.jobs`` itself.
"""

from smerge.jobs.cgm import CGMJob, prepare, run_local
from smerge.jobs.inputs import PreparedMerge, Progress, ProgressFactory, masked_stats, needs_spark_readers, open_inputs
from smerge.jobs.outputs import (abort_outputs, check_distinct_paths, check_outputs, check_run_outputs, commit_outputs,
                                 committed, default_output, open_outputs, write_stats)
from smerge.jobs.paths import JOB_PATH_FIELDS, absolute_output, absolute_path, with_absolute_paths

__all__ = ["CGMJob", "PreparedMerge", "prepare", "run_local", "Progress", "ProgressFactory", "open_inputs",
           "masked_stats", "needs_spark_readers", "default_output", "check_outputs", "check_run_outputs",
           "check_distinct_paths", "open_outputs", "commit_outputs", "abort_outputs", "committed", "write_stats",
           "JOB_PATH_FIELDS", "absolute_path", "with_absolute_paths", "absolute_output"]
