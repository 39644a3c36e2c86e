"""smerge: best-effort eps-delta merges and window joins of partially sorted data streams.

The package is assembled from the repository's top-level folders (see setup.cfg):
``smerge.merge`` (pure engines), ``smerge.datasets`` (readers/writers), ``smerge.transport``
(prefetching, Flight), ``smerge.index`` (R-tree), ``smerge.jobs`` (in-process jobs),
``smerge.spark`` (Spark execution, the only package that imports pyspark), ``smerge.cli`` (the
command line). This folder, ``smerge/``, holds the package root: errors, ``smerge.memory`` and the
public API ``smerge.xarray``, ``smerge.plot``.
"""

# The subpackages live in sibling folders (setup.cfg's package_dir). When this folder is imported
# from a checkout (the repository root first on sys.path, e.g. ``python -m smerge`` run there),
# extend_path adds the installed ``smerge`` directories so that ``smerge.cli`` etc. still resolve.
from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)

__version__ = "0.1.0"

from smerge.errors import InputError, SmergeError, UsageError  # noqa: E402

__all__ = ["__version__", "SmergeError", "InputError", "UsageError"]
