"""In-process jobs, one module per engine (``cgm``, ``rtm``, ``wjoin``, ``count``), and what they share:
the inputs of a prepared run (``inputs``), its outputs (``outputs``), paths made absolute for
Spark (``paths``), the route of a run (``route``), sampled archive reads (``sampling``) and the
one pipeline every command runs through (``pipeline``). The Spark runners (``smerge.spark``)
take the same prepared runs.

The names of the CGM job and the shared helpers are importable from ``smerge.jobs`` itself; they
are loaded on first use, so that ``smerge.jobs.route`` (needed by every command to decide where it
runs) costs no engine imports.
"""

from __future__ import annotations

import importlib

_NAMES = {
    "smerge.jobs.cgm": ("CGMJob", "prepare", "run_local"),
    "smerge.jobs.inputs": ("PreparedMerge", "Progress", "ProgressFactory", "masked_stats", "needs_spark_readers",
                           "open_inputs"),
    "smerge.jobs.outputs": ("abort_outputs", "check_distinct_paths", "check_outputs", "check_run_outputs",
                            "commit_outputs", "committed", "default_output", "open_outputs", "write_stats"),
    "smerge.jobs.paths": ("JOB_PATH_FIELDS", "absolute_output", "absolute_path", "with_absolute_paths"),
}
_WHERE = {name: module for module, names in _NAMES.items() for name in names}

__all__ = [name for names in _NAMES.values() for name in names]


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
