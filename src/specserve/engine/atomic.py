"""Writing a cache file whole or not at all, safely in a folder others can write to.

The host cache and the price cache both write through a temporary file and rename it over the
real one, so a crash or a concurrent reader sees the old file or the new one (the data is
synced before the rename: some file systems write a rename before the data it names). The
temporary file is made by mkstemp: a random name, created with O_EXCL, so a symbolic link planted at a
guessable name is never followed and two writers of one file never share a temporary file. Its name
also says whose it is, and one a killed writer left is removed by the next write (tempfiles.py).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..tempfiles import make_temp, remove_leftovers


def write_atomic(path: Path, chunks: list[bytes]) -> None:
    """Write `chunks` to `path` through a temp file in the same folder, then rename it over
    `path`; on any failure the temp file is removed and the error raised."""
    remove_leftovers(path)  # an earlier writer's, killed while it wrote: a cache entry can be gigabytes
    fd, tmp = make_temp(path)
    try:
        with open(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename: a crash must not leave an empty file
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
