"""Staging an output: owner-tagged temporary files and folders, smerge's folder marker, and the
sweep of what killed runs left behind.

Temporary names carry their owner: ``.<name>.smerge-<kind>-<host>-<pid>-<rand>``, where
``<host>`` digests the host name, boot id and pid namespace; ``remove_stale`` removes the
entries whose owner is provably gone (and puts back a previous folder output a killed run had
renamed aside), anything else is left alone. Every dataset folder smerge writes carries the
marker file ``MARKER``, put in the staging folder first and rewritten when the folder is put in
place to list every entry smerge wrote there (``mark_dataset``): the replace rule
(``refuse_existing_dir``) lets ``--overwrite`` replace only an empty folder or a marked one that
holds nothing but the listed entries (``foreign_entry``). A marker of an older smerge lists
nothing: such a folder may hold only the names that version wrote for its kind of folder
(``LEGACY_LAYOUTS``).
Files and folders are created with ``0o666``/``0o777`` and the umask applied.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
from functools import lru_cache

try:  # CPython's own SHA-256 (the same digest): hashlib would load OpenSSL's libcrypto, ~4 MB of
    from _sha256 import sha256  # every process's peak memory, for this one digest per run
except ImportError:  # Python >= 3.12 names it _sha2; other interpreters: hashlib
    try:
        from _sha2 import sha256
    except ImportError:
        from hashlib import sha256

from smerge.datasets.atomic_rename import rename_noreplace
from smerge.datasets.output_space import write_error
from smerge.errors import OutputError, param

MARKER = ".smerge-dataset"
# The whole marker of smerge versions before the list of entries (no longer written): such a
# marker, or any without the list, counts as an older smerge's (``LEGACY_LAYOUTS``).
MARKER_TEXT = "This folder was written by smerge; `--overwrite` may replace it as a whole.\n"
# The first line of the marker now; the second is JSON: {"entries": [...]}, every file and folder
# smerge wrote in the folder (relative paths, "/" between parts, a folder's ending with "/").
MARKER_HEAD = ("This folder was written by smerge; `--overwrite` replaces it only while it holds nothing "
               "but the entries listed below.\n")
# What smerge versions with the old marker wrote in a folder, by kind (told by a file at its top):
# relative paths, a folder's ending with "/". Anything else in such a folder keeps it.
LEGACY_LAYOUTS = (
    ("zarr.json", re.compile(r"zarr\.json|[^/]+/|[^/]+/zarr\.json|[^/]+/c/?|[^/]+/c(?:/\d+)+/?")),  # Zarr v3 store
    ("meta.json", re.compile(r"meta\.json|data\.parquet|order\.npy|rtree\.dat|rtree\.idx")),  # index build
    ("", re.compile(r"part-\d{5,}\.parquet")),  # Parquet dataset (in process and Spark)
)
TEMP_KINDS = ("tmp", "old", "spark", "rtm", "wjoin", "index")
_TEMP_RE = re.compile(r"\.smerge-(?:%s)-(?P<host>[0-9a-f]{10})-(?P<pid>\d+)-[0-9a-f]{8}(?:\.[A-Za-z0-9]+)?$"
                      % "|".join(TEMP_KINDS))


def remote_target(path: str) -> str | None:
    """An object-store URL (s3://, gs://, az://, https://; ``smerge.datasets.remote``) without
    its trailing slash, or None: such outputs are written locally and uploaded at the commit."""
    from smerge.datasets.remote import is_remote

    return path.rstrip("/") if is_remote(path) else None


def local_stand_in(target: str) -> str:
    """Where the temporary file or folder of ``target`` is made: beside it, or for an object-store
    output in the local temporary folder (``TMPDIR``), named after it."""
    if not remote_target(target):
        return target
    import tempfile

    return os.path.join(tempfile.gettempdir(), os.path.basename(target.rstrip("/")) or "output")


def is_marked(folder: str) -> bool:
    """True when ``folder`` carries smerge's dataset marker (a regular file, not a link)."""
    m = os.path.join(folder, MARKER)
    return os.path.isfile(m) and not os.path.islink(m)


def _walk(folder: str, rel: str = ""):
    """(relative path, kind) of every entry under ``folder``, sorted, parents first, links not
    followed; kind "f" (regular file), "d" (folder, its path ending with "/") or "?" (anything
    else, or a folder that cannot be read)."""
    try:
        with os.scandir(os.path.join(folder, rel)) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError:
        yield rel, "?"
        return
    for e in entries:
        path = rel + e.name
        if e.is_dir(follow_symlinks=False):
            yield path + "/", "d"
            yield from _walk(folder, path + "/")
        else:
            yield path, "f" if e.is_file(follow_symlinks=False) else "?"


def mark_dataset(folder: str) -> None:
    """Write the marker in a (staging) folder smerge writes, listing every entry it holds now:
    called when the staging folder is made and again when it is put in place."""
    entries = [p for p, _ in _walk(folder) if p != MARKER]
    with open(os.path.join(folder, MARKER), "w") as f:
        f.write(MARKER_HEAD)
        json.dump({"entries": entries}, f, separators=(",", ":"))
        f.write("\n")


def parse_marker(text: str) -> set[str] | None:
    """The entries a marker's ``text`` lists, or None for a marker without a list (an older
    smerge's, or one edited by hand)."""
    head, _, rest = text.partition("\n")
    try:
        entries = json.loads(rest)["entries"] if head + "\n" == MARKER_HEAD else None
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
        return None
    return set(entries)


def first_foreign(entries, listed: set[str] | None, has_top) -> str | None:
    """The first of ``entries`` ((relative path, kind) as ``_walk`` gives them) that smerge did
    not write: not in ``listed`` (a marker's list), or for an older marker (None) not a name
    of the ``LEGACY_LAYOUTS`` kind told by ``has_top(name)`` (a file at the folder's top).
    Kind "?" (a link, anything not a file or folder) is always foreign; the marker never."""
    layout = None
    if listed is None:
        layout = next(pat for top, pat in LEGACY_LAYOUTS if not top or has_top(top))
    for path, kind in entries:
        if path == MARKER:
            continue
        if kind == "?" or (path not in listed if layout is None else not layout.fullmatch(path)):
            return path or "."
    return None


def foreign_entry(folder: str) -> str | None:
    """The first entry (relative path, sorted, parents first) of the marked ``folder`` that smerge
    did not write there, or None (``first_foreign``)."""
    try:
        with open(os.path.join(folder, MARKER), errors="replace") as f:
            text = f.read()
    except OSError:
        text = ""
    return first_foreign(_walk(folder), parse_marker(text), lambda top: os.path.isfile(os.path.join(folder, top)))


def foreign_error(opt: str, shown: str, entry: str, *, during: bool = False) -> OutputError:
    """The refusal of a folder smerge wrote that holds ``entry``, which smerge did not write."""
    when = " (found when this run put its output in place: it is kept, this run's output discarded)" if during else ""
    return OutputError(f"{opt} {shown!r} holds {entry!r}, which smerge did not write{when}; {param.overwrite} never "
                       f"deletes a folder holding anything else: move {entry!r} out of it, or choose another {opt}")


def is_empty_dir(path: str) -> bool:
    """True for a folder with nothing in it (it counts as absent)."""
    try:
        with os.scandir(path) as it:
            return next(it, None) is None
    except OSError:
        return False


def replace_refusal(path: str, opt: str, *, shown: str | None = None, during: bool = False) -> OutputError | None:
    """Why the existing folder ``path`` may not be replaced, or None: only an empty one, or one
    smerge wrote (its marker) holding nothing but what smerge wrote there. ``shown``: the name
    to give it (``path`` by default); ``during``: found when the output is put in place (the
    run's new output is discarded)."""
    if is_empty_dir(path):
        return None
    shown = shown or path
    if not is_marked(path):
        return OutputError(f"{opt} {shown!r} is a folder smerge did not write (no {MARKER} marker in it); "
                           f"{param.overwrite} replaces only smerge's own dataset folders: remove it yourself or "
                           f"choose another {opt}")
    entry = foreign_entry(path)
    return None if entry is None else foreign_error(opt, shown, entry, during=during)


def refuse_existing_dir(path: str, opt: str, *, during: bool = False) -> None:
    """The replace rule for an existing folder (``replace_refusal``): raise ``OutputError``
    unless it is empty or smerge's own holding only what smerge wrote."""
    err = replace_refusal(path, opt, during=during)
    if err is not None:
        raise err


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
    return sha256(ident.encode()).hexdigest()[:10]


def temp_name(target: str, kind: str = "tmp", suffix: str = "") -> str:
    """A hidden owner-tagged path beside ``target``: ``.<name>.smerge-<kind>-<host>-<pid>-<rand>``."""
    assert kind in TEMP_KINDS
    target = os.path.abspath(target.rstrip("/" + os.sep) or target)
    name = f".{os.path.basename(target)}.smerge-{kind}-{host_tag()}-{os.getpid()}-{os.urandom(4).hex()}{suffix}"
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
    target = local_stand_in(target)
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
    target = local_stand_in(target)
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
        rename_noreplace(entry.path, target, folder=True)
    except OSError:
        return False
    return True
