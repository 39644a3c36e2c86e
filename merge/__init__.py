"""Pure merge engines: iterators of ``pyarrow.RecordBatch`` in, iterators out, plus stats.

No file I/O, no Spark, no network here (STYLE.md convention 1).
"""

from smerge.merge.cgm import cgm_merge, cgm_merge_table, kappa_max_pairs
from smerge.merge.params import CGMParams, MergeKeys, resolve_eps
from smerge.merge.stats import MergeStats

__all__ = ["cgm_merge", "cgm_merge_table", "kappa_max_pairs", "CGMParams", "MergeKeys", "resolve_eps", "MergeStats"]
