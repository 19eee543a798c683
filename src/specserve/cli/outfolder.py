"""An output folder made up front and taken back when nothing was written to it.

bench makes --out before its runs, so a folder that cannot be made is refused at once rather than
after minutes of runs; a check that failed later (an unknown scenario, a missing extra, a model that
would not load) left that folder behind, empty. Only folders this process made, still empty, go:
never one the user had."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def make_folder(path: Path) -> list[Path]:
    """Makes `path` and its missing parents; returns the folders it made, innermost first."""
    missing = [folder for folder in (path, *path.parents) if not folder.exists()]
    try:
        path.mkdir(parents=True, exist_ok=True)
    except BaseException:
        remove_if_empty(missing)  # a deeper level refused: the levels above it made go too
        raise
    return missing


def remove_if_empty(made: list[Path]) -> None:
    """Removes the folders of make_folder that hold nothing, innermost first; rmdir refuses a
    folder with anything in it, so what was written stays, with the folders above it. A level that
    is not there (never made: a deeper level was refused) is passed over, not taken as full."""
    for folder in made:
        try:
            folder.rmdir()
        except OSError:
            if os.path.lexists(folder):
                return


@contextlib.contextmanager
def taken_back_if_empty(made: list[Path]):
    """Runs the block; then removes the folders in `made` still empty, however the block ended."""
    try:
        yield
    finally:
        remove_if_empty(made)
