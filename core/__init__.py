"""smerge: best-effort eps-delta merges and window joins of partially sorted data streams.

The package is assembled from the repository's top-level folders (see setup.cfg):
``smerge.merge`` (pure engines), ``smerge.datasets`` (readers/writers), ``smerge.transport``
(prefetching, Flight), ``smerge.index`` (R-tree), ``smerge.jobs`` (in-process jobs),
``smerge.spark`` (Spark execution, the only package that imports pyspark), ``smerge.cli`` (the
command line). This folder holds the package root: errors and the public API ``smerge.xarray``,
``smerge.plot``.
"""

__version__ = "0.1.0"

from smerge.errors import InputError, SmergeError, UsageError  # noqa: E402

__all__ = ["__version__", "SmergeError", "InputError", "UsageError"]
