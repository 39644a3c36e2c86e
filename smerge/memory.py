"""Memory a run may use, checked before it allocates.

What smerge holds whole (an R-tree index of B, kappa_max's keys, the window buffers) is sized
from the inputs' metadata before anything is read; a run that cannot fit is refused (exit 2)
naming what it would need, instead of being ended by the kernel's OOM killer (which may end
other processes too) or failing half-way with MemoryError. The budget is the smaller of the
memory the kernel says is available and what the address-space limit (``ulimit -v``,
RLIMIT_AS) leaves.
"""

from __future__ import annotations

import os
import resource

from smerge.errors import UsageError


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _address_space_left() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/statm") as f:
            used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        used = 0
    return max(0, soft - used)


def budget() -> int | None:
    """Bytes a run may still allocate (None: unknown, no check)."""
    limits = [x for x in (_meminfo_available(), _address_space_left()) if x is not None]
    return min(limits) if limits else None


def human(n: float) -> str:
    for unit in ("bytes", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def check_fits(need: float, what: str, fix: str) -> None:
    """Refuse (exit 2) when ``need`` bytes exceed the budget; ``what`` says what needs them and
    ``fix`` what to do instead."""
    have = budget()
    if have is not None and need > have:
        raise UsageError(f"{what} needs about {human(need)} of memory, more than this machine allows now "
                         f"({human(have)} available{' under ulimit -v' if _address_space_left() == have else ''}); "
                         f"{fix}")


def record_bytes(schema) -> int:
    """An estimate of one record's bytes in Arrow memory (strings counted at 16 bytes)."""
    import pyarrow as pa

    total = 0
    for f in schema:
        try:
            total += max(1, f.type.bit_width // 8)
        except ValueError:  # variable width (strings, lists)
            total += 16 if not pa.types.is_nested(f.type) else 64
    return total + 1


def check_free_space(path: str, need: float, what: str) -> None:
    """Refuse (exit 2) an output that cannot fit on its filesystem: ``need`` bytes at least."""
    import shutil

    folder = os.path.dirname(os.path.abspath(path)) or "."
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return
    if need > free:
        raise UsageError(f"{path}: {what} take at least {human(need)}, more than the {human(free)} free on its "
                         "filesystem; write fewer records or to another filesystem")
