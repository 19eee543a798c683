"""Temporary files that say whose they are, and removing the ones a killed writer left behind.

A file is written whole by writing a temporary file next to it and renaming that over it
(atomic.py, for edit/files.py and the engine's caches). A writer killed with SIGKILL, or a power cut, leaves the
temporary file there for good: a hidden copy of a user's text beside their file, or a cache entry
of gigabytes. So its name says what it is and whose: `.NAME.specserve-HOST-PID.XXXXXXXX.tmp`
(HOST: this machine's name, so a folder shared with another machine or container is not judged
by this one's processes; XXXXXXXX: mkstemp's random part, the file made with O_EXCL and mode 0600;
NAME cut short where the whole would pass the file system's limit on a name).
The next write of NAME removes the ones of this host whose process is gone: only regular files
named exactly so, for that NAME, in that folder; never a running writer's, never anything else.
In a cache's own folder (`cache`: the host cache's and the price cache's, which only specserve
writes) every name's are removed, not only NAME's: a cache entry is named for its tokens and may
never be written again, so a leftover waiting for its own name's next write stayed for good.

Older versions' names say no host or process (the edit's `.NAME.specserve-tmp`, to 2026-12-04, and
`.NAME.XXXXXXXX.specserve-tmp`, on 2026-12-05; the caches' `NAME.XXXXXXXX.tmp`, `NAME.PID-THREAD.tmp`
and `KEY.json.tmpPID`). Such a file is removed once untouched for an hour, OLD_AFTER_S: a write takes
seconds, so an older specserve still running is not writing it. The edit's names say specserve; the
caches' are plain, so they are taken as ours only in a cache's own folder (`cache`), never beside a
user's file, where another program may have made one.
"""

from __future__ import annotations

import os
import re
import socket
import stat
import sys
import tempfile
import time
from pathlib import Path

_RANDOM = r"[a-z0-9_]{8}"  # tempfile's random part: 8 of "abcdefghijklmnopqrstuvwxyz0123456789_"
OLD_AFTER_S = 3600  # an older version's temporary file untouched this long is no write under way


def make_temp(target: Path) -> tuple[int, Path]:
    """A new temporary file for `target`, in its folder: (open descriptor, path)."""
    prefix = f".{_short_name(target)}.specserve-{socket.gethostname()}-{os.getpid()}."
    fd, name = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=target.parent)
    return fd, Path(name)


def _short_name(target: Path) -> str:
    """`target`'s name, cut so the temporary file's name fits the file system's limit (255 bytes
    on most): a file whose own name fits must not fail to be written for its temporary file's."""
    try:
        limit = os.pathconf(target.parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    # the longest process id (ten digits), not this one's: every writer of NAME cuts it alike
    extra = len(os.fsencode(f"..specserve-{socket.gethostname()}-{'9' * 10}.{'x' * 8}.tmp"))
    name = os.fsencode(target.name)
    return target.name if len(name) <= limit - extra else os.fsdecode(name[: max(limit - extra, 1)])


def remove_leftovers(target: Path, cache: bool = False) -> list[tuple[Path, int | None]]:
    """Remove the temporary files for `target` that a writer on this host left when it died, and
    older versions' that are old (`cache`: `target` is a cache's file, in a folder only specserve
    writes: the leftovers of every name there go, and older names are plain): (path, its process id,
    None for an older version's) for each one removed. A folder that cannot be listed, or a file that
    cannot be removed, is left as it is: the write that follows is what matters."""
    name = r"[^/]+" if cache else re.escape(_short_name(target))
    pattern = re.compile(rf"\.{name}\.specserve-{re.escape(socket.gethostname())}-(\d+)\.{_RANDOM}\.tmp")
    old = _old_names(target, cache)
    removed = []
    try:
        entries = list(os.scandir(target.parent))
    except OSError:
        return []
    for entry in entries:
        if match := pattern.fullmatch(entry.name):
            pid = int(match.group(1))
            if _is_plain_file(entry) and not _running(pid) and _removed(entry):
                removed.append((Path(entry.path), pid))
        elif old.fullmatch(entry.name) and _is_plain_file(entry, OLD_AFTER_S) and _removed(entry):
            removed.append((Path(entry.path), None))
    return removed


def _old_names(target: Path, cache: bool) -> re.Pattern:
    """The names older versions gave `target`'s temporary files (module docstring); in a cache's
    folder, those of any name."""
    name = r"[^/]+?" if cache else re.escape(target.name)
    kinds = [rf"\.{name}(?:\.{_RANDOM})?\.specserve-tmp"]
    if cache:  # a cache's own names never start with a dot: today's hidden ones are not taken for old
        plain = rf"[^./]{name}"
        kinds += [rf"{plain}\.(?:{_RANDOM}|\d+-\d+)\.tmp", rf"{plain}\.tmp\d+"]
    return re.compile("|".join(kinds))


def _removed(entry: os.DirEntry) -> bool:
    """Unlink `entry`; whether it went."""
    try:
        os.unlink(entry.path)
    except OSError:
        return False
    return True


def _is_plain_file(entry: os.DirEntry, untouched_s: float = 0) -> bool:
    """A regular file itself, not a link or a folder (only what a writer made is removed), last
    written at least `untouched_s` seconds ago when given (a time in the future, another machine's
    clock, is not old)."""
    try:
        info = entry.stat(follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and (not untouched_s or info.st_mtime <= time.time() - untouched_s)


def _running(pid: int) -> bool:
    """Whether process `pid` exists (another user's included); unsure counts as running."""
    if pid <= 0 or sys.platform == "win32":  # on Windows signal 0 is CTRL_C_EVENT: it would interrupt the process
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):  # another user's (EPERM), or no process id at all
        return True
    return True
