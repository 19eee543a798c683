"""Environment variables the commands read, checked as a command starts: a bad value is one line
that names the variable. SPECSERVE_HOME naming a file failed deep in a pull or a load with
"[Errno 20] Not a directory: '.../packs'", which never said where the path came from."""

from __future__ import annotations

import os
from pathlib import Path


def environment_problem() -> str | None:
    """The one-line error for a bad environment variable, else None."""
    home = os.environ.get("SPECSERVE_HOME")
    if home and Path(home).expanduser().exists() and not Path(home).expanduser().is_dir():
        return (
            f"SPECSERVE_HOME={home} is a file, not a folder: point it at a folder (the model packs and "
            "measured prices are kept there), or unset it for ~/.cache/specserve"
        )
    return None
