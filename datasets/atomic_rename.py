"""Atomic renames: Linux ``renameat2`` (``RENAME_NOREPLACE``, ``RENAME_EXCHANGE``) with fallbacks.

``rename_noreplace`` claims a name only if nobody holds it, in one step: ``renameat2``, else a
hard link then unlink (files), else an exclusive placeholder renamed over. Where the kernel,
C library or filesystem lacks ``renameat2``, ``renameat2`` says so (False) instead of failing.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
from functools import lru_cache

RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2
_AT_FDCWD = -100
_SYS_RENAMEAT2 = {"x86_64": 316, "amd64": 316, "aarch64": 276, "arm64": 276, "riscv64": 276, "i386": 353,
                  "i686": 353, "armv7l": 382, "ppc64le": 357, "ppc64": 357, "s390x": 347}
_UNSUPPORTED = {errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM}


@lru_cache(maxsize=1)
def _renameat2_fn():
    """A callable (src bytes, dst bytes, flags) -> int (0, or -1 with errno set), or None."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    fn = getattr(libc, "renameat2", None)  # glibc >= 2.28
    if fn is not None:
        fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        fn.restype = ctypes.c_int
        return lambda a, b, flags: fn(_AT_FDCWD, a, _AT_FDCWD, b, flags)
    nr = _SYS_RENAMEAT2.get(platform.machine().lower())
    sysc = getattr(libc, "syscall", None)
    if nr is None or sysc is None:
        return None
    sysc.restype = ctypes.c_long
    return lambda a, b, flags: sysc(ctypes.c_long(nr), ctypes.c_int(_AT_FDCWD), ctypes.c_char_p(a),
                                    ctypes.c_int(_AT_FDCWD), ctypes.c_char_p(b), ctypes.c_uint(flags))


def renameat2(src: str, dst: str, flags: int) -> bool:
    """``renameat2(src, dst, flags)``: True when done; False when this kernel, C library or
    filesystem does not support it (``ENOSYS``, ``EINVAL``, ...); other failures raise ``OSError``
    (``FileExistsError`` for ``RENAME_NOREPLACE`` onto an existing name)."""
    fn = _renameat2_fn()
    if fn is None:
        return False
    if fn(os.fsencode(src), os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in _UNSUPPORTED:
        return False
    raise OSError(err, os.strerror(err), src, None, dst)


def rename_noreplace(src: str, dst: str, *, folder: bool) -> None:
    """Rename ``src`` to ``dst`` unless ``dst`` exists (``FileExistsError``), atomically:
    ``RENAME_NOREPLACE``, else a hard link then unlink (files; ``EEXIST`` when taken), else an
    exclusive placeholder (``O_EXCL`` file or ``mkdir``) renamed over."""
    if renameat2(src, dst, RENAME_NOREPLACE):
        return
    if not folder:
        try:
            os.link(src, dst, follow_symlinks=False)
        except FileExistsError:
            raise
        except OSError as e:
            if e.errno not in _UNSUPPORTED | {errno.EMLINK}:
                raise
        else:
            os.unlink(src)
            return
        os.close(os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))  # the name is ours from here
        os.replace(src, dst)
        return
    os.mkdir(dst, 0o700)  # the name is ours; renaming a folder over an empty folder is atomic
    try:
        os.rename(src, dst)
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST):  # someone wrote into our placeholder
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst) from None
        os.rmdir(dst)
        raise
