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
"""

from __future__ import annotations

import os
import re
import socket
import stat
import sys
import tempfile
from pathlib import Path

_RANDOM = r"[a-z0-9_]{8}"  # tempfile's random part: 8 of "abcdefghijklmnopqrstuvwxyz0123456789_"


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


def remove_leftovers(target: Path) -> list[tuple[Path, int]]:
    """Remove the temporary files for `target` that a writer on this host left when it died:
    (path, its process id) for each one removed. A folder that cannot be listed, or a file that
    cannot be removed, is left as it is: the write that follows is what matters."""
    pattern = re.compile(
        rf"\.{re.escape(_short_name(target))}\.specserve-{re.escape(socket.gethostname())}-(\d+)\.{_RANDOM}\.tmp"
    )
    removed = []
    try:
        entries = list(os.scandir(target.parent))
    except OSError:
        return []
    for entry in entries:
        match = pattern.fullmatch(entry.name)
        if match and _is_plain_file(entry) and not _running(int(match.group(1))):
            try:
                os.unlink(entry.path)
            except OSError:
                continue
            removed.append((Path(entry.path), int(match.group(1))))
    return removed


def _is_plain_file(entry: os.DirEntry) -> bool:
    """A regular file itself, not a link or a folder: only what make_temp made is removed."""
    try:
        return stat.S_ISREG(entry.stat(follow_symlinks=False).st_mode)
    except OSError:
        return False


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
