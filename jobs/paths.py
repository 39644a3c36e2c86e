"""Local paths made absolute on the driver, as executors must be given them (they resolve
relative paths from their own working folder)."""

from __future__ import annotations

import os
from dataclasses import replace

JOB_PATH_FIELDS = ("a", "b", "output", "unmatched", "stats", "token_file", "tls_root_cert")


def absolute_path(path: str | None) -> str | None:
    """``path`` absolute from this process's working folder, as executors must be given it
    (they resolve relative paths from their own); a trailing ``/`` (a folder output) is kept.
    URLs (``hdfs://``, ``s3a://``, ``grpc://``, ``file://`` ...) and None are returned as they are."""
    if not path or "://" in path:
        return path
    trailing = path.endswith(("/", os.sep)) and len(path) > 1
    out = os.path.abspath(os.path.expanduser(path))
    return out + os.sep if trailing and not out.endswith(os.sep) else out


def with_absolute_paths(job):
    """A job (``CGMJob``, ``RTMJob``, ``WJoinJob``) with every local path absolute
    (``absolute_path``): inputs, output, unmatched prefix, stats, token and certificate files.
    Done on the driver before a run crosses into Spark. A missing output stays None (the
    default output, in the working folder, is made absolute by ``absolute_output``)."""
    changes = {f: absolute_path(getattr(job, f)) for f in JOB_PATH_FIELDS if hasattr(job, f)}
    if hasattr(job, "inputs"):
        changes["inputs"] = tuple(absolute_path(p) for p in job.inputs)
    return replace(job, **changes)


def absolute_output(prep):
    """A prepared run (``PreparedMerge``, ``PreparedWJoin``) whose output -- the default one
    included -- is an absolute path (``absolute_path``); the same object, changed in place."""
    prep.output = absolute_path(prep.output)
    return prep


__all__ = ["JOB_PATH_FIELDS", "absolute_path", "with_absolute_paths", "absolute_output"]
