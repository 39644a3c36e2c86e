"""Transport: background prefetching (dual buffering) and, later, Arrow Flight.

Only this package imports ``pyarrow.flight`` and threads (STYLE.md convention 2).
"""

from smerge.transport.prefetch import BackgroundWriter, Prefetcher

__all__ = ["BackgroundWriter", "Prefetcher"]
