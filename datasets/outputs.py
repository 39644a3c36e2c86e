"""The one output-safety rule of smerge (DATA.md section 4), used by every command and writer.

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
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import socket
from functools import lru_cache
from typing import Iterable, Sequence

from smerge.errors import OutputError

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
    ins = [(p, r) for p in inputs if p for r in [local_real(p)] if r is not None]
    seen: list[tuple[str, str, str, bool]] = []  # (label, path, real, folder)
    for opt, path, folder in outputs:
        real = local_real(path.rstrip("/" + os.sep) or path)
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
    remove_stale(os.path.dirname(os.path.abspath(target)))
    tmp = temp_name(target, "tmp", suffix)
    try:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    except OSError as e:
        raise OutputError(f"cannot write in {os.path.dirname(tmp)!r} ({e.strerror}); choose another -o") from None
    return tmp


def make_staging(target: str, kind: str = "tmp", *, dataset: bool = False) -> str:
    """Create an owner-tagged staging folder beside ``target`` (mode 0777 minus the umask)
    after sweeping the leftovers of killed runs there; ``dataset``: put the marker in it."""
    remove_stale(os.path.dirname(os.path.abspath(target.rstrip("/" + os.sep) or target)))
    tmp = temp_name(target, kind)
    try:
        os.mkdir(tmp, 0o777)
        if dataset:
            mark_dataset(tmp)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise OutputError(f"cannot create the staging directory {tmp!r} ({e.strerror}); choose another -o") from None
    return tmp


def replace_dir(staging: str, target: str, *, opt: str = "-o") -> None:
    """Move the finished folder ``staging`` to ``target``. An existing ``target`` is replaced
    only when the rule allows it (empty, or smerge's marker in it), checked again here."""
    target = target.rstrip("/" + os.sep) or target
    old = None
    if os.path.islink(target):
        os.unlink(target)  # the link goes, never what it points to
    elif os.path.lexists(target):
        if not os.path.isdir(target):
            raise OutputError(f"output {target!r} is a file, not a dataset directory; choose another {opt}")
        _refuse_existing_dir(target, opt)
        old = temp_name(target, "old")
        os.rename(target, old)
    os.rename(staging, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


__all__ = ["MARKER", "check_target", "check_parent", "check_distinct", "is_marked", "mark_dataset", "temp_name",
           "owner_gone", "owner_pid_gone", "remove_stale", "make_temp_file", "make_staging", "replace_dir", "local_real",
           "host_tag"]
