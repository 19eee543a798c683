"""A file written whole or not at all, safely in a folder others can write to: the one writer of
the cache files (engine/host_store.py, engine/prices.py) and of the edit tool's files (edit/files.py).

The data goes to a temporary file in the same folder, which is renamed over the real one, so a crash
or a concurrent reader sees the old file or the new one (the data is synced before the rename: some
file systems write a rename before the data it names; the folder after it, so the rename is on disk
when the write returns). The temporary file is made by mkstemp: a random
name, created with O_EXCL and mode 0600, so a symbolic link planted at a guessable name is never
followed, two writers of one file never share a temporary file, and the text is never readable by
all on its way. Its name also says whose it is, and one a killed writer left is removed by the next
write (tempfiles.py). A caller that must set more on the new file than its bytes (the edit keeps the
user's owner, mode and extended attributes) does so through `prepare`, on the open descriptor, before
the sync and the rename: the file is never in place without them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from .tempfiles import make_temp, remove_leftovers


def write_atomic(
    path: Path,
    chunks: Iterable[bytes],
    prepare: Callable[[int], None] | None = None,
    on_leftover: Callable[[Path, int | None], None] | None = None,
    cache: bool = False,
) -> None:
    """Write `chunks` to `path` through a temporary file in the same folder, then rename it over
    `path` (the name itself: a symlink there is replaced); on any failure the temporary file is
    removed and the write's own error raised. `prepare(fd)` runs once the data is written and flushed;
    `on_leftover(path, pid)` hears of each temporary file a killed writer left, removed first (pid
    None: an older version's, old). `cache`: `path` is a cache's file (tempfiles.remove_leftovers)."""
    for leftover, pid in remove_leftovers(path, cache):  # a cache entry can be gigabytes, an edit the user's text
        if on_leftover is not None:
            on_leftover(leftover, pid)
    try:
        fd, tmp = make_temp(path)
    except OSError as e:  # the error named the temporary file, a name the caller never gave
        raise OSError(e.errno, e.strerror, str(path)) from None
    try:
        with open(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()  # before `prepare`: a write clears setuid bits and file capabilities
            if prepare is not None:
                prepare(f.fileno())
            os.fsync(f.fileno())  # on disk before the rename: a crash must not leave an empty file
        os.replace(tmp, path)
    except BaseException:  # Ctrl-C too; after the rename nothing is removed: the name is the file's now
        _discard(tmp)
        raise
    _sync_folder(path.parent)  # the rename on disk too: a crash must not bring back the old text, reported replaced


def _discard(tmp: Path) -> None:
    """Remove the temporary file of a write that failed. An error doing so (the file system remounted
    read-only by the very I/O error that failed the write) must not replace the write's own error,
    which names the file being written; the file stays, named for this process, for the next write."""
    with contextlib.suppress(OSError):
        tmp.unlink(missing_ok=True)


def _sync_folder(folder: Path) -> None:
    """Put `folder`'s entries, the rename just made, on disk: until then a power cut may bring back the
    old name's file though the write returned (and `edit --in-place` goes on to replace FILE once
    FILE.bak is made). Where a folder cannot be opened or synced (Windows, some network file systems)
    nothing more can be done, and the file is in place: no error for a write that was made."""
    if not hasattr(os, "O_DIRECTORY"):
        return
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
