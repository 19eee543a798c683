"""The host tier kept on disk between runs (`--host-cache-dir`; off unless a folder is given).

A server that restarts (an upgrade, a reboot, a laptop closed for the night) used to begin cold:
the next turn of every conversation it had served prefilled its whole prompt again, 10-12 ms a
token of the 1.5B model on 2 CPU cores. With a folder, the server writes its saved entries there
as they change (engine/client.py's writer thread, every HOST_SAVE_EVERY_S) and when it stops
(those still in the KV cache are copied out first), and reads them back into the host tier when
it starts, newest first, up to the tier's budget.

    one folder per model set-up  named by a hash of what the saved bytes depend on: each model
                                 file (path, size, modification time), the llama.cpp release and
                                 kernel switches, the cache's cell size (f16 or q8_0); on
                                 transformers the weight files, dtype and device. Another
                                 model or `--exact` reads a folder of its own and never another's
    one file per entry           a header line (tokens, sizes, the bytes' sha256) and the
                                 backend's own bytes: the target's, then the draft model's;
                                 written whole to a temporary name and renamed, so a crash leaves
                                 the old file or the new one
    index.json                   the entries' files, least recently used first
    .lock                        held (flock) by the one process that uses the folder

A file that cannot be read (truncated, another format, bytes that do not match their sha256: a
disk fault restored as cells gives wrong answers, not an error) is skipped with a warning, and
written afresh if its entry is saved again. llama.cpp also checks each copy's layout when it
restores it, and a copy it refuses is prefilled instead.

One process owns a folder: each save makes the folder hold exactly its own entries, so a second
server on the same folder would delete the first's. The second finds the lock taken, says so,
and keeps its host tier in memory only (FolderInUse).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import threading
from pathlib import Path

from ..atomic import write_atomic
from ..backends.base import SavedSequence
from .host_cache import Saved
from .prices import backend_key

log = logging.getLogger("specserve.host_store")

MAGIC = b"specserve-kv 2\n"  # 1: no checksum, not trusted
INDEX = "index.json"


def _identity(backend) -> dict | None:
    """What one backend's saved bytes depend on; None when nothing on disk says what model it is
    (a transformers model built in memory)."""
    if getattr(backend, "path", None) is None:  # transformers: weights folder, dtype, device
        return backend_key(backend)
    path = Path(backend.path)
    stat = path.stat() if path.is_file() else None
    return {
        "file": str(path.resolve()) if stat else None,
        "bytes": stat.st_size if stat else None,
        "mtime_ns": stat.st_mtime_ns if stat else None,
        "kernels": getattr(backend, "kernels", None),
        "cell_bytes": backend.cell_bytes() if hasattr(backend, "cell_bytes") else None,
    }


def store_key(target, draft=None) -> str | None:
    """The folder name for this target and draft model as loaded: equal only when a saved copy
    means the same cells to both runs. None when a model cannot be identified."""
    ident = {"target": _identity(target), "draft": _identity(draft) if draft is not None else None}
    if ident["target"] is None or (draft is not None and ident["draft"] is None):
        return None
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def _file_name(tokens: list[int]) -> str:
    return hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:24] + ".kv"


def _digest(chunks) -> str:
    h = hashlib.sha256()
    for chunk in chunks:
        h.update(chunk)
    return h.hexdigest()


class FolderInUse(OSError):
    """Another process holds this model set-up's folder."""


_held: dict[Path, tuple[int, int]] = {}  # folder -> (lock file descriptor, stores using it) in this process
_held_lock = threading.Lock()


def _acquire(folder: Path) -> None:
    """Hold `folder`'s lock for this process (stores of one process share it), or FolderInUse."""
    with _held_lock:
        if folder in _held:
            fd, users = _held[folder]
            _held[folder] = (fd, users + 1)
            return
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:  # a read-only folder: its entries are still read (saves will warn)
            log.warning("cannot lock %s (%s); using it unlocked", folder, e.strerror or e)
            _held[folder] = (-1, 1)
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise FolderInUse(f"{folder} is in use by another process (pid {owner})") from None
        except OSError as e:  # a file system without locks (some network mounts): used as before
            log.warning("cannot lock %s (%s); using it unlocked", folder, e.strerror or e)
        else:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        _held[folder] = (fd, 1)


def _release(folder: Path) -> None:
    with _held_lock:
        if folder not in _held:
            return
        fd, users = _held.pop(folder)
        if users > 1:
            _held[folder] = (fd, users - 1)
        elif fd >= 0:
            os.close(fd)  # also releases the flock


class HostStore:
    """A folder of saved entries for one model set-up, held by this process while it is open
    (FolderInUse when another process holds it)."""

    def __init__(self, root: str | Path, key: str):
        self.folder = Path(root).expanduser() / key
        _acquire(self.folder)
        self._open = True
        self._good: set[str] = set()  # files read back whole or written by this store: not rewritten

    def close(self) -> None:
        """Let another process use the folder (the process exiting does the same)."""
        if self._open:
            self._open = False
            _release(self.folder)

    def save(self, entries: list[Saved]) -> int:
        """Make the folder hold exactly these entries (least recently used first), writing only
        the files it lacks. Returns how many entries it holds."""
        self.folder.mkdir(parents=True, exist_ok=True)
        names = []
        for e in entries:
            name = _file_name(e.tokens)
            names.append(name)
            if name in self._good and (self.folder / name).exists():
                continue  # the same tokens: the same cells
            chunks = [memoryview(e.copy.data).cast("B")]
            header = {"tokens": e.tokens, "length": e.copy.length, "size": e.copy.size}
            if e.draft is not None:
                header |= {"draft_tokens": e.draft[1], "draft_length": e.draft[0].length, "draft_size": e.draft[0].size}
                chunks.append(memoryview(e.draft[0].data).cast("B"))
            header["sha256"] = _digest(chunks)
            write_atomic(self.folder / name, [MAGIC, json.dumps(header).encode() + b"\n", *chunks], cache=True)
            self._good.add(name)
        write_atomic(self.folder / INDEX, [json.dumps({"entries": names}).encode()], cache=True)
        for stale in self.folder.glob("*.kv"):
            if stale.name not in names:
                stale.unlink(missing_ok=True)
                self._good.discard(stale.name)
        return len(names)

    def load(self, budget: int) -> list[Saved]:
        """The saved entries, most recently used ones first until `budget` bytes, returned least
        recently used first (the order to put them in the host tier). A file that does not fit
        is not read past its header."""
        try:
            names = json.loads((self.folder / INDEX).read_text())["entries"]
        except (OSError, ValueError, KeyError, TypeError):
            return []
        kept, room = [], budget
        for name in reversed(names):
            entry = self._read(self.folder / str(name), room)
            if entry is not None:
                room -= entry.size
                kept.append(entry)
                self._good.add(str(name))
        return kept[::-1]

    @staticmethod
    def _read(path: Path, room: int) -> Saved | None:
        """The entry in `path` (its LRU clock left at 0), or None when its copies take more than
        `room` bytes or the file cannot be read whole."""
        try:
            with open(path, "rb") as f:
                magic = f.readline()
                if magic != MAGIC:
                    old = magic.startswith(b"specserve-kv ")
                    raise ValueError("an older format, without a checksum" if old else "not a specserve KV file")
                h = json.loads(f.readline())
                if h["size"] + h.get("draft_size", 0) > room:
                    return None
                copy = SavedSequence(bytearray(f.read(h["size"])), h["length"])
                draft = None
                if "draft_size" in h:
                    draft = (
                        SavedSequence(bytearray(f.read(h["draft_size"])), h["draft_length"]),
                        list(h["draft_tokens"]),
                    )
                if copy.size != h["size"] or (draft is not None and draft[0].size != h["draft_size"]):
                    raise ValueError("truncated")
                if _digest([copy.data] + ([draft[0].data] if draft else [])) != h["sha256"]:
                    raise ValueError("its bytes do not match their checksum")
            return Saved(list(h["tokens"]), copy, 0, draft)
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("skipping saved KV file %s: %s", path.name, e)
            return None
