"""Pure merge engines: iterators of ``pyarrow.RecordBatch`` in, iterators out, plus stats.

No file I/O, no Spark, no network here (the engines stay pure; tests/test_imports.py checks it). The names below load on first
use, so ``smerge.merge.values`` and ``smerge.merge.params`` (the defaults the command line's
options show) import without numpy or pyarrow.
"""

from importlib import import_module

_NAMES = {"cgm_merge": "cgm", "cgm_merge_table": "cgm", "kappa_max_pairs": "cgm", "CGMParams": "params",
          "MergeKeys": "params", "resolve_eps": "params", "MergeStats": "stats"}


def __getattr__(name: str):
    if name in _NAMES:
        value = getattr(import_module(f"smerge.merge.{_NAMES[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'smerge.merge' has no attribute {name!r}")


__all__ = ["cgm_merge", "cgm_merge_table", "kappa_max_pairs", "CGMParams", "MergeKeys", "resolve_eps", "MergeStats"]
