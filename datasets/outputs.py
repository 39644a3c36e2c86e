"""The one output-safety rule of smerge (docs/data.md, "Outputs"), used by every command and writer.

- **Replacing.** An existing output is replaced only with ``overwrite``, and only when it is
  a file (file outputs) or a folder that smerge wrote itself: every dataset folder smerge
  writes carries the marker file ``MARKER``, put in the staging folder before it is renamed
  into place. An empty folder counts as absent. A folder holding anything else is never
  replaced, nor a path that is an input or (a folder) contains an input or the current
  directory. ``check_target`` says so before anything is written (``OutputError``: exit 2),
  and ``replace_dir`` checks again at the moment of the rename.
- **Distinct paths.** ``check_distinct`` refuses two outputs of one run (or of one batch file)
  with the same real path, an output that is an input, and an output inside a folder output.
- **Modes.** Temporary files and staging folders are created with ``0o666``/``0o777`` and the
  umask applied, so outputs honour the umask whichever engine wrote them.
- **Leftovers.** Temporary names carry their owner: ``.<name>.smerge-<kind>-<host>-<pid>-<rand>``
  where ``<host>`` is a digest of the host name, boot id and pid namespace. ``remove_stale``
  removes such entries whose owner is provably gone (same host, boot and pid namespace, and
  the pid no longer runs); anything else is left alone. Every run sweeps the folder it writes
  to before it creates its own temporary entries.
- **Claiming the name.** The no-overwrite rule holds at the moment an output is put in place,
  not only before the run (``claim_file``, ``replace_dir``): without ``overwrite`` the name is
  claimed atomically (``renameat2(RENAME_NOREPLACE)``; where the kernel or filesystem lacks it,
  ``link`` then ``unlink`` for files and ``mkdir`` then ``rename`` for folders), so of two runs
  racing for one output exactly one wins and the other fails (``OutputError``) with nothing
  written, and a file someone creates at the output path during a run is kept. With
  ``overwrite`` a file is replaced by one rename, and a folder by ``renameat2(RENAME_EXCHANGE)``
  (the new and the old folder swap names in one step, then the old one is removed); where the
  exchange is unsupported the old folder is renamed aside first, and a run killed between the
  two renames has its previous output restored by the next run's sweep.
- **Environment errors.** A write that fails because the disk is full, a quota is exceeded or
  the file grew past the file size limit (``ENOSPC``, ``EDQUOT``, ``EFBIG``; also when a library
  loses the errno, as HDF5 and libspatialindex do, and the disk holding the output is found full)
  becomes an ``OutputError`` naming the cause and the path (``space_errors``, ``write_error``).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import platform
import re
import secrets
import shutil
import socket
from functools import lru_cache
from typing import Iterable, Sequence

from smerge.errors import OutputError, SmergeError

MARKER = ".smerge-dataset"
MARKER_TEXT = "This folder was written by smerge; `--overwrite` may replace it as a whole.\n"
TEMP_KINDS = ("tmp", "old", "spark", "rtm", "wjoin", "index")
_TEMP_RE = re.compile(r"\.smerge-(?:%s)-(?P<host>[0-9a-f]{10})-(?P<pid>\d+)-[0-9a-f]{8}(?:\.[A-Za-z0-9]+)?$"
                      % "|".join(TEMP_KINDS))


# --------------------------------------------------------------------------------------------
# Paths


def local_real(path: str) -> str | None:
    """The real path of a local path or ``file://`` URL; None for other URLs (not comparable)."""
    if path.lower().startswith("file://"):
        path = path[len("file://"):]
    elif "://" in path:
        return None
    return os.path.realpath(os.path.expanduser(path))


def _remote(path: str) -> str | None:
    """An object-store URL (s3://, gs://, az://, https://; ``smerge.datasets.remote``) without
    its trailing slash, or None: such outputs are written locally and uploaded at the commit."""
    from smerge.datasets.remote import is_remote

    return path.rstrip("/") if is_remote(path) else None


def _local_stand_in(target: str) -> str:
    """Where the temporary file or folder of ``target`` is made: beside it, or for an object-store
    output in the local temporary folder (``TMPDIR``), named after it."""
    if not _remote(target):
        return target
    import tempfile

    return os.path.join(tempfile.gettempdir(), os.path.basename(target.rstrip("/")) or "output")


def _inside(child: str, folder: str) -> bool:
    return child == folder or child.startswith(folder.rstrip(os.sep) + os.sep)


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def is_marked(folder: str) -> bool:
    """True when ``folder`` carries smerge's dataset marker (smerge wrote it)."""
    return os.path.isfile(os.path.join(folder, MARKER))


def mark_dataset(folder: str) -> None:
    """Put the marker in a (staging) folder smerge writes, before it is moved into place."""
    with open(os.path.join(folder, MARKER), "w") as f:
        f.write(MARKER_TEXT)


def _is_empty_dir(path: str) -> bool:
    try:
        with os.scandir(path) as it:
            return next(it, None) is None
    except OSError:
        return False


def _refuse_existing_dir(path: str, opt: str) -> None:
    """The replace rule for an existing folder: only an empty one or one smerge wrote."""
    if not (_is_empty_dir(path) or is_marked(path)):
        raise OutputError(f"{opt} {path!r} is a folder smerge did not write (no {MARKER} marker in it); "
                          f"--overwrite replaces only smerge's own dataset folders: remove it yourself or "
                          f"choose another {opt}")


def check_target(path: str, *, overwrite: bool, folder: bool, inputs: Iterable[str | None] = (),
                 opt: str = "-o") -> None:
    """Raise ``OutputError`` unless ``path`` may be written now (see the module doc).

    ``folder``: the output is a folder (a Parquet dataset, an index). ``inputs``: the run's
    input paths (URLs other than ``file://`` are not compared). Nothing is touched.
    """
    label = "output" if opt == "-o" else opt
    target = path.rstrip("/" + os.sep) or path
    if _remote(target):  # an object store (s3://, gs://, ...): smerge.datasets.remote
        from smerge.datasets import remote

        if any(inp and _remote(inp) and inp.rstrip("/") == target for inp in inputs):
            raise OutputError(f"{opt} {path!r} is also an input; choose another path")
        remote.check_output(target, overwrite=overwrite, folder=folder, opt=opt)
        return
    real = local_real(target)
    if real is None:
        return  # a URL output: its store decides
    for inp in inputs:
        ri = local_real(inp) if inp else None
        if ri is None:
            continue
        if ri == real or _same_file(target, ri):
            raise OutputError(f"{opt} {path!r} is also an input; choose another path")
        if os.path.isdir(target) and _inside(ri, real):
            raise OutputError(f"{opt} {path!r} is a folder that contains the input {inp!r}; it is never "
                              f"replaced: choose another {opt}")
    if folder:
        restore_previous(target)
    exists = os.path.lexists(target)
    if folder:
        if exists and not os.path.isdir(target):
            raise OutputError(f"{label} {path!r} is a file, not a dataset directory; choose another {opt}")
        if exists and _inside(os.path.realpath(os.getcwd()), real):
            raise OutputError(f"{label} {path!r} is the current directory or contains it; it is never replaced: "
                              f"choose another {opt}")
        if exists and not _is_empty_dir(target):
            if not overwrite:
                raise OutputError(f"{label} {path!r} already exists; pass --overwrite to replace it or choose "
                                  f"another {opt}")
            _refuse_existing_dir(target, opt)
    else:
        if os.path.isdir(target):
            raise OutputError(f"{label} {path!r} is a directory; name a file")
        if exists and not overwrite:
            raise OutputError(f"{label} {path!r} already exists; pass --overwrite to replace it or choose "
                              f"another {opt}")
    check_parent(target, opt=opt)


def check_parent(path: str, *, opt: str = "-o") -> None:
    """The folder that will hold ``path`` exists, is a folder and is writable."""
    label = "output" if opt == "-o" else opt
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        up = d
        while up and not os.path.lexists(up) and os.path.dirname(up) != up:
            up = os.path.dirname(up)
        if os.path.lexists(up) and not os.path.isdir(up):
            raise OutputError(f"{label} {path!r}: {up!r} is a file, not a directory; choose another {opt}")
        raise OutputError(f"{label} directory {d!r} does not exist; create it first")
    if not os.access(d, os.W_OK | os.X_OK):
        raise OutputError(f"{label} directory {d!r} is not writable; choose another {opt}")


def check_distinct(inputs: Iterable[str | None], outputs: Sequence[tuple[str, str, bool]]) -> None:
    """Refuse (``OutputError``) an output whose real path is an input, is another output's,
    or lies inside another output that is a folder. ``outputs``: (label, path, is a folder)."""
    ins = [(p, r) for p in inputs if p for r in [local_real(p) or _remote(p)] if r]
    seen: list[tuple[str, str, str, bool]] = []  # (label, path, real, folder)
    for opt, path, folder in outputs:
        real = local_real(path.rstrip("/" + os.sep) or path) or _remote(path)
        if real is None:
            continue
        for p, r in ins:
            if r == real:
                raise OutputError(f"{opt} {path!r} is also an input; choose another path")
            if folder and _inside(r, real):
                raise OutputError(f"{opt} {path!r} is a folder output that would hold the input {p!r}; "
                                  f"choose another path")
        for o2, p2, r2, f2 in seen:
            if r2 == real:
                raise OutputError(f"{opt} {path!r} is also the path of {o2}; give each output its own path")
            if (f2 and _inside(real, r2)) or (folder and _inside(r2, real)):
                inner, outer = (opt, o2) if f2 and _inside(real, r2) else (o2, opt)
                raise OutputError(f"{opt} {path!r}: {inner} would be written inside the folder output of {outer}; "
                                  "give each output its own path")
        seen.append((opt, path, real, folder))


# --------------------------------------------------------------------------------------------
# Owner-tagged temporary names and leftovers of killed runs


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


@lru_cache(maxsize=1)
def host_tag() -> str:
    """10 hex digits naming this host, boot and pid namespace (a pid means one process there)."""
    try:
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pidns = ""
    ident = "\0".join((socket.gethostname(), _read("/proc/sys/kernel/random/boot_id"), pidns))
    return hashlib.sha256(ident.encode()).hexdigest()[:10]


def temp_name(target: str, kind: str = "tmp", suffix: str = "") -> str:
    """A hidden owner-tagged path beside ``target``: ``.<name>.smerge-<kind>-<host>-<pid>-<rand>``."""
    assert kind in TEMP_KINDS
    target = os.path.abspath(target.rstrip("/" + os.sep) or target)
    name = f".{os.path.basename(target)}.smerge-{kind}-{host_tag()}-{os.getpid()}-{secrets.token_hex(4)}{suffix}"
    return os.path.join(os.path.dirname(target), name)


def owner_gone(name: str) -> bool:
    """True when ``name`` is an owner-tagged temporary name whose owner provably no longer runs."""
    m = _TEMP_RE.search(name)
    return bool(m) and owner_pid_gone(m.group("host"), int(m.group("pid")))


def owner_pid_gone(host: str, pid: int) -> bool:
    """True when process ``pid`` of ``host`` (a ``host_tag``) provably no longer runs: the tag
    is this host's, boot's and pid namespace's, and no process ``pid`` exists here."""
    if host != host_tag() or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # EPERM: it runs under another user
        return False
    return False


def remove_stale(directory: str) -> list[str]:
    """Remove the temporary files and staging folders in ``directory`` left by killed runs
    (owner provably gone); returns the removed paths. Errors are ignored (best effort)."""
    removed = []
    try:
        entries = [e for e in os.scandir(directory) if e.name.startswith(".") and ".smerge-" in e.name]
    except OSError:
        return removed
    for e in entries:
        if not owner_gone(e.name):
            continue
        try:
            if _restore_old(e):
                continue
            if e.is_dir(follow_symlinks=False):
                shutil.rmtree(e.path)
            else:
                os.unlink(e.path)
            removed.append(e.path)
        except OSError:
            pass
    return removed


def make_temp_file(target: str, suffix: str = "") -> str:
    """Create an empty owner-tagged temporary file beside ``target`` (mode 0666 minus the
    umask) after sweeping the leftovers of killed runs there; returns its path."""
    target = _local_stand_in(target)
    remove_stale(os.path.dirname(os.path.abspath(target)))
    tmp = temp_name(target, "tmp", suffix)
    try:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    except OSError as e:
        raise write_error(e, target) or OutputError(f"cannot write in {os.path.dirname(tmp)!r} ({e.strerror}); "
                                                    "choose another -o") from None
    return tmp


def make_staging(target: str, kind: str = "tmp", *, dataset: bool = False) -> str:
    """Create an owner-tagged staging folder beside ``target`` (mode 0777 minus the umask)
    after sweeping the leftovers of killed runs there; ``dataset``: put the marker in it."""
    target = _local_stand_in(target)
    remove_stale(os.path.dirname(os.path.abspath(target.rstrip("/" + os.sep) or target)))
    tmp = temp_name(target, kind)
    try:
        os.mkdir(tmp, 0o777)
        if dataset:
            mark_dataset(tmp)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise write_error(e, target) or OutputError(f"cannot create the staging directory {tmp!r} ({e.strerror}); "
                                                    "choose another -o") from None
    return tmp


def restore_previous(target: str) -> None:
    """Put back the previous folder output ``target`` that a killed run had renamed aside (where
    folders cannot be exchanged in one step) when no output took its place."""
    if os.path.lexists(target):
        return
    prefix = f".{os.path.basename(target)}.smerge-old-"
    try:
        entries = [e for e in os.scandir(os.path.dirname(os.path.abspath(target))) if e.name.startswith(prefix)]
    except OSError:
        return
    for e in entries:
        if owner_gone(e.name):
            with contextlib.suppress(OSError):
                if _restore_old(e):
                    return


def _restore_old(entry: os.DirEntry) -> bool:
    """A previous output renamed aside (``.<name>.smerge-old-...``) by a run killed before its new
    output took the name: put it back under ``<name>`` (True). When ``<name>`` exists the new
    output is complete and the old copy is only swept (False)."""
    m = _TEMP_RE.search(entry.name)
    if not m or ".smerge-old-" not in entry.name or not entry.is_dir(follow_symlinks=False):
        return False
    target = os.path.join(os.path.dirname(entry.path), entry.name[1:m.start()])
    if os.path.lexists(target):
        return False
    try:
        _rename_noreplace(entry.path, target, folder=True)
    except OSError:
        return False
    return True


# --------------------------------------------------------------------------------------------
# Putting an output in place: atomic claims and exchanges (Linux renameat2, with fallbacks)

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


def _rename_noreplace(src: str, dst: str, *, folder: bool) -> None:
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


def _taken(label: str, path: str, opt: str) -> OutputError:
    return OutputError(f"{label} {path!r} was created by another run or program while this one was writing; it "
                       f"is kept and nothing was written: pass --overwrite to replace it or choose another {opt}")


def _label(opt: str) -> str:
    return "output" if opt == "-o" else opt


def claim_file(tmp: str, target: str, *, overwrite: bool, opt: str = "-o") -> None:
    """Move the finished temporary file ``tmp`` to ``target``. Without ``overwrite`` the name is
    claimed atomically: when ``target`` exists by now (another run won the race, or a file was
    created there during the run) ``tmp`` is removed and ``OutputError`` raised. With
    ``overwrite`` one rename replaces a file (never a folder). An object-store ``target`` is
    uploaded (``smerge.datasets.remote.upload_file``: a conditional put claims the key)."""
    if _remote(target):
        from smerge.datasets import remote

        remote.upload_file(tmp, target, overwrite=overwrite, opt=opt)
        return
    try:
        if overwrite:
            if os.path.isdir(target) and not os.path.islink(target):
                raise OutputError(f"{_label(opt)} {target!r} is a directory by now; name a file")
            os.replace(tmp, target)
            return
        try:
            _rename_noreplace(tmp, target, folder=False)
        except FileExistsError:
            raise _taken(_label(opt), target, opt) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def replace_dir(staging: str, target: str, *, overwrite: bool, opt: str = "-o") -> None:
    """Move the finished folder ``staging`` to ``target`` (see the module doc). Without
    ``overwrite`` the name is claimed atomically (an empty folder there counts as absent);
    losing it raises ``OutputError``. With ``overwrite`` an existing ``target`` is replaced
    only when the rule allows it (empty, or smerge's marker in it), checked again here, by
    one exchange of the two folders; the old one is then removed. When this raises, ``staging``
    is left to the caller to remove. An object-store ``target`` is uploaded, its marker last
    (``smerge.datasets.remote.upload_dir``)."""
    target = target.rstrip("/" + os.sep) or target
    if _remote(target):
        from smerge.datasets import remote

        remote.upload_dir(staging, target, overwrite=overwrite, opt=opt)
        return
    label = _label(opt)
    for _ in range(3):  # the folder may come and go while we look at it
        if os.path.islink(target):
            if not overwrite:
                raise _taken(label, target, opt)
            os.unlink(target)  # the link goes, never what it points to
        if os.path.lexists(target):
            if not os.path.isdir(target):
                raise OutputError(f"{label} {target!r} is a file, not a dataset directory; choose another {opt}")
            if _is_empty_dir(target):
                try:
                    os.rename(staging, target)  # atomic over an empty folder; fails once it holds anything
                    return
                except OSError as e:
                    if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                        raise
                    if not overwrite:
                        raise _taken(label, target, opt) from None
                    continue
            if not overwrite:
                raise _taken(label, target, opt)
            _refuse_existing_dir(target, opt)
            if _exchange_dirs(staging, target, opt):
                return
            continue
        try:
            _rename_noreplace(staging, target, folder=True)
            return
        except FileExistsError:
            if not overwrite and not _is_empty_dir(target):
                raise _taken(label, target, opt) from None
    raise OutputError(f"{label} {target!r} keeps changing while this run puts its output in place; "
                      f"nothing was written: try again or choose another {opt}")


def _exchange_dirs(staging: str, target: str, opt: str) -> bool:
    """Replace the folder ``target`` by ``staging``; False when ``target`` vanished meanwhile."""
    try:
        swapped = renameat2(staging, target, RENAME_EXCHANGE)
    except FileNotFoundError:
        return False
    if swapped:  # staging's name now holds the old folder: it must be one the rule lets go
        if not (_is_empty_dir(staging) or is_marked(staging)):
            renameat2(staging, target, RENAME_EXCHANGE)  # someone swapped a foreign folder in: give it back
            _refuse_existing_dir(target, opt)
        shutil.rmtree(staging, ignore_errors=True)
        return True
    # No exchange here: rename the old folder aside, then the new one in. A run killed between
    # the two has the old folder restored by the next run's sweep (``remove_stale``).
    old = temp_name(target, "old")
    try:
        os.rename(target, old)
    except FileNotFoundError:
        return False
    if not (_is_empty_dir(old) or is_marked(old)):
        os.rename(old, target)
        _refuse_existing_dir(target, opt)
    try:
        os.rename(staging, target)
    except BaseException:
        with contextlib.suppress(OSError):
            _rename_noreplace(old, target, folder=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
    return True


def retract(target: str, ident: tuple[int, int] | None) -> None:
    """Undo a claim of this run (a later output of the run lost its race): remove ``target``
    when it is still the file or folder this run put there (``ident``: its device and inode)."""
    if ident is None:
        return
    if ident[0] in ("remote", "remote-dir"):
        from smerge.datasets import remote

        remote.retract(ident)
        return
    try:
        st = os.lstat(target)
    except OSError:
        return
    if (st.st_dev, st.st_ino) != ident:
        return
    if os.path.isdir(target) and not os.path.islink(target):
        shutil.rmtree(target, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.unlink(target)


def identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of ``path``, or None; for an object-store output what ``retract`` needs."""
    if _remote(path):
        from smerge.datasets import remote

        return remote.identity(path)
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


# --------------------------------------------------------------------------------------------
# A full disk, a quota, the file size limit

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
    return OutputError(f"{_label(opt)} {path!r}: {cause}; nothing was written (the partial output is removed): "
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


__all__ = ["MARKER", "check_target", "check_parent", "check_distinct", "is_marked", "mark_dataset", "temp_name",
           "owner_gone", "owner_pid_gone", "remove_stale", "make_temp_file", "make_staging", "replace_dir", "local_real",
           "host_tag", "restore_previous", "renameat2", "claim_file", "retract", "identity", "space_errno", "space_cause", "write_error", "space_errors"]
