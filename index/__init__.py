"""smerge.index: an R-tree (libspatialindex) over stream B's keys, kept beside B's records.

``BIndex`` answers ``range_query`` and ``symdiff_query`` sorted by (key, row id) with paging
(docs/semantics.md section 5); ``build_index`` persists one for ``smerge serve --index DIR``.
Queries take ``smerge.merge.range_source.Box`` boxes. Modules: ``bindex`` (the index and its
queries), ``tree`` (key order and R-tree), ``format`` (the persisted files and their checks),
``paging`` (pages and continuation tokens).
"""

from smerge.index.bindex import BIndex, LocalSource, build_index
from smerge.index.paging import Page

__all__ = ["BIndex", "LocalSource", "Page", "build_index"]
