"""The one output-safety rule of smerge (docs/data.md, "Outputs"), used by every command and writer.

This module checks a run's output paths before anything is written (``check_target``,
``check_parent``, ``check_distinct``); the rest of the rule lives beside it:
``output_staging`` (temporary names, the marker, leftovers), ``output_commit`` (claiming the
name, replacing a folder), ``atomic_rename`` (``renameat2`` and its fallbacks) and
``output_space`` (a full disk, a quota, the file size limit).

- **Replacing.** An existing output is replaced only with ``overwrite``, and only when it is
  a file (file outputs) or a folder that smerge wrote itself and that holds nothing else:
  every dataset folder smerge writes carries the marker file ``MARKER``, put in the staging
  folder before it is renamed into place and listing every entry smerge wrote there; any
  other entry, at any depth, keeps the folder (``output_staging.replace_refusal`` names the
  first). An empty folder counts as absent. A folder holding anything else is never
  replaced, nor a path that is an input or (a folder) contains an input or the current
  directory. ``check_target`` says so before anything is written (``OutputError``: exit 2),
  and ``replace_dir`` checks again at the moment of the rename and on the folder it swapped
  out before removing it (a file added during the run: the swap is undone, exit 2).
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

import os
from typing import Iterable, Sequence

from smerge.datasets.output_staging import is_empty_dir, refuse_existing_dir, remote_target, restore_previous
from smerge.errors import OutputError, param


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


def check_target(path: str, *, overwrite: bool, folder: bool, inputs: Iterable[str | None] = (),
                 opt: str = "-o") -> None:
    """Raise ``OutputError`` unless ``path`` may be written now (see the module doc).

    ``folder``: the output is a folder (a Parquet dataset, an index). ``inputs``: the run's
    input paths (URLs other than ``file://`` are not compared). Nothing is touched.
    """
    label = "output" if opt == "-o" else opt
    target = path.rstrip("/" + os.sep) or path
    if remote_target(target):  # an object store (s3://, gs://, ...): smerge.datasets.remote
        from smerge.datasets import remote

        if any(inp and remote_target(inp) and inp.rstrip("/") == target for inp in inputs):
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
        if exists and not is_empty_dir(target):
            if not overwrite:
                raise OutputError(f"{label} {path!r} already exists; pass {param.overwrite} to replace it or choose "
                                  f"another {opt}")
            refuse_existing_dir(target, opt)
    else:
        if os.path.isdir(target):
            raise OutputError(f"{label} {path!r} is a directory; name a file")
        if exists and not overwrite:
            raise OutputError(f"{label} {path!r} already exists; pass {param.overwrite} to replace it or choose "
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
    ins = [(p, r) for p in inputs if p for r in [local_real(p) or remote_target(p)] if r]
    seen: list[tuple[str, str, str, bool]] = []  # (label, path, real, folder)
    for opt, path, folder in outputs:
        real = local_real(path.rstrip("/" + os.sep) or path) or remote_target(path)
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
