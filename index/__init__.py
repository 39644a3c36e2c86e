"""smerge.index: an R-tree (libspatialindex) over stream B's keys, kept beside B's records.

``BIndex`` answers ``range_query`` and ``symdiff_query`` sorted by (key, row id) with paging
(docs/semantics.md section 5); ``build_index`` persists one for ``smerge serve --index DIR``.
"""

from smerge.index.rtree_index import ROW_ID_COLUMN, BIndex, Box, LocalSource, Page, build_index

__all__ = ["BIndex", "Box", "LocalSource", "Page", "build_index", "ROW_ID_COLUMN"]
