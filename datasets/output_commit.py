"""Putting an output in place: atomic claims and exchanges (docs/data.md, "Outputs").

The no-overwrite rule holds at the moment an output is put in place, not only before the run:
without ``overwrite`` the name is claimed atomically (``atomic_rename.rename_noreplace``), so
of two runs racing for one output exactly one wins and the other fails (``OutputError``) with
nothing written, and a file someone creates at the output path during a run is kept. With
``overwrite`` a file is replaced by one rename, and a folder by ``RENAME_EXCHANGE`` (the new and
the old folder swap names in one step, then the old one is removed); where the exchange is
unsupported the old folder is renamed aside first, and a run killed between the two renames has
its previous output restored by the next run's sweep (``output_staging.remove_stale``).
Object-store targets are uploaded instead (``smerge.datasets.remote``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil

from smerge.datasets.atomic_rename import RENAME_EXCHANGE, rename_noreplace, renameat2
from smerge.datasets.output_staging import (is_empty_dir, mark_dataset, refuse_existing_dir, remote_target,
                                            replace_refusal, temp_name)
from smerge.errors import OutputError, param


def _taken(label: str, path: str, opt: str) -> OutputError:
    return OutputError(f"{label} {path!r} was created by another run or program while this one was writing; it "
                       f"is kept and nothing was written: pass {param.overwrite} to replace it or choose another {opt}")


def _label(opt: str) -> str:
    return "output" if opt == "-o" else opt


def claim_file(tmp: str, target: str, *, overwrite: bool, opt: str = "-o") -> None:
    """Move the finished temporary file ``tmp`` to ``target``. Without ``overwrite`` the name is
    claimed atomically: when ``target`` exists by now (another run won the race, or a file was
    created there during the run) ``tmp`` is removed and ``OutputError`` raised. With
    ``overwrite`` one rename replaces a file (never a folder). An object-store ``target`` is
    uploaded (``smerge.datasets.remote.upload_file``: a conditional put claims the key)."""
    if remote_target(target):
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
            rename_noreplace(tmp, target, folder=False)
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
    only when the rule allows it (empty, or smerge's marker in it and nothing but what smerge
    wrote: ``output_staging.replace_refusal``), checked again here and once more on the folder
    swapped out, by one exchange of the two folders; the old one is then removed. ``staging``'s
    marker is rewritten first to list what it holds. When this raises, ``staging`` is left to
    the caller to remove. An object-store ``target`` is uploaded, its marker last
    (``smerge.datasets.remote.upload_dir``)."""
    target = target.rstrip("/" + os.sep) or target
    mark_dataset(staging)  # what smerge wrote there: the next --overwrite may remove exactly that
    if remote_target(target):
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
            if is_empty_dir(target):
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
            refuse_existing_dir(target, opt, during=True)
            if _exchange_dirs(staging, target, opt):
                return
            continue
        try:
            rename_noreplace(staging, target, folder=True)
            return
        except FileExistsError:
            if not overwrite and not is_empty_dir(target):
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
        err = replace_refusal(staging, opt, shown=target, during=True)
        if err is not None:  # someone swapped a foreign folder in, or put something in it: give it back
            renameat2(staging, target, RENAME_EXCHANGE)
            raise err
        shutil.rmtree(staging, ignore_errors=True)
        return True
    # No exchange here: rename the old folder aside, then the new one in. A run killed between
    # the two has the old folder restored by the next run's sweep (``remove_stale``).
    old = temp_name(target, "old")
    try:
        os.rename(target, old)
    except FileNotFoundError:
        return False
    err = replace_refusal(old, opt, shown=target, during=True)
    if err is not None:
        os.rename(old, target)
        raise err
    try:
        os.rename(staging, target)
    except BaseException:
        with contextlib.suppress(OSError):
            rename_noreplace(old, target, folder=True)
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
    if remote_target(path):
        from smerge.datasets import remote

        return remote.identity(path)
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino
