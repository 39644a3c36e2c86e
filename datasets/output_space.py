"""Write failures of the environment: a full disk, a quota, the file size limit.

A write that fails with ``ENOSPC``, ``EDQUOT`` or ``EFBIG`` (also when a library loses the
errno, as HDF5 and libspatialindex do, and the disk holding the output is found full) becomes
one ``OutputError`` line naming the cause and the path (``space_errors``, ``write_error``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re

from smerge.errors import OutputError, SmergeError

_SPACE_ERRNOS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
                 errno.EFBIG: "file too large (over the file size limit, `ulimit -f`, or the filesystem's largest file)"}
_ERRNO_IN_TEXT = re.compile(r"\[errno (\d+)\]", re.IGNORECASE)
FULL_BELOW = 4 << 20  # a disk with less free space than this (bytes) is full for a writer that lost the errno


def _errno_of(e: BaseException) -> int | None:
    if isinstance(e, OSError) and e.errno:
        return e.errno
    m = _ERRNO_IN_TEXT.search(str(e))  # pyarrow and others put it in the text
    return int(m.group(1)) if m else None


def _largest_file(path: str) -> int:
    try:
        if os.path.isdir(path):
            return max((e.stat(follow_symlinks=False).st_size for e in os.scandir(path) if e.is_file()), default=0)
        return os.path.getsize(path)
    except OSError:
        return 0


def space_errno(e: BaseException, where: str) -> int | None:
    """``ENOSPC``, ``EDQUOT`` or ``EFBIG`` when ``e`` is a write failure of a full disk, an exceeded
    quota or the file size limit, else None. An error without an errno (HDF5, libspatialindex)
    counts when the filesystem holding ``where`` (a file or folder being written) has less than
    ``FULL_BELOW`` bytes or no inode left (``ENOSPC``), or a file there has reached the
    process's file size limit (``EFBIG``)."""
    if isinstance(e, (SmergeError, MemoryError)):
        return None
    err = _errno_of(e)
    if err is not None:
        return err if err in _SPACE_ERRNOS else None
    probe = where if os.path.exists(where) else os.path.dirname(os.path.abspath(where))
    try:
        st = os.statvfs(probe)
        if st.f_bavail * st.f_frsize < FULL_BELOW or (st.f_files and st.f_favail == 0):
            return errno.ENOSPC
    except OSError:
        pass
    import resource

    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if soft != resource.RLIM_INFINITY and _largest_file(where) + FULL_BELOW >= soft:
        return errno.EFBIG
    return None


def space_cause(e: BaseException, where: str) -> str | None:
    """The words for ``space_errno(e, where)`` ("no space left on device", ...), or None."""
    err = space_errno(e, where)
    return None if err is None else _SPACE_ERRNOS[err]


def write_error(e: BaseException, path: str, *, where: str | None = None, opt: str = "-o") -> OutputError | None:
    """The one-line ``OutputError`` for a write of ``path`` that failed on a full disk, a quota or
    the file size limit (``space_cause``; ``where``: the temporary file or folder written), or None."""
    cause = space_cause(e, where or path)
    if cause is None:
        return None
    label = "output" if opt == "-o" else opt
    return OutputError(f"{label} {path!r}: {cause}; nothing was written (the partial output is removed): "
                       f"free some space or choose another {opt}")


@contextlib.contextmanager
def space_errors(path: str, *, where: str | None = None, opt: str = "-o", cleanup=None):
    """Turn a write failure of a full disk, quota or file size limit inside the block into
    ``write_error``'s ``OutputError`` (after ``cleanup()``, when given); others pass unchanged."""
    try:
        yield
    except Exception as e:
        err = write_error(e, path, where=where, opt=opt)
        if err is None:
            raise
        if cleanup is not None:
            with contextlib.suppress(Exception):
                cleanup()
        raise err from None
