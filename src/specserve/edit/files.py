"""The file side of an edit: which language a path holds, reading it, and writing the result
without losing anything the user had.

A file is read as UTF-8 (a byte-order mark and CRLF or lone-CR line ends are set aside, so the
model, the diff and the splice see plain '\n' lines) and written back the way it was: through a
symlink to the file it points to, with its permission bits, extended attributes (edit/xattrs.py:
ACL, SELinux label, user.*), BOM and line ends (each line the
edit kept keeps its own, so a file that mixes CRLF and LF keeps its mix; a new line takes the
file's most common one; a file the edit left as it was is the same bytes),
atomically (atomic.py: a temporary file, made afresh with O_EXCL and mode 0600, renamed over it; one a killed
edit left is removed by the next: tempfiles.py), and
only if nobody changed it while the model was answering (an edit of several minutes on a CPU
must not overwrite what the user saved meanwhile).
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import os
import re
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from .. import atomic
from ..inputs import decode_text, read_bytes
from .client import EditError
from .xattrs import copy_acl, copy_xattrs

LANGUAGES = {
    ".py": "python",
    ".ts": "typescript",
    ".tsx": "tsx",
    ".js": "javascript",
    ".jsx": "jsx",
    ".go": "go",
    ".rs": "rust",
    ".java": "java",
    ".rb": "ruby",
    ".php": "php",
    ".c": "c",
    ".h": "c",
    ".cpp": "cpp",
    ".cs": "csharp",
    ".kt": "kotlin",
    ".swift": "swift",
    ".sql": "sql",
    ".sh": "bash",
    ".yaml": "yaml",
    ".yml": "yaml",
    ".json": "json",
    ".md": "markdown",
    ".html": "html",
    ".css": "css",
}

_BOM = "\ufeff"
# chown errors that mean "this owner cannot be given here": the new file then stays the editor's
CANNOT_GIVE_OWNER = (errno.EPERM, errno.EACCES, errno.EINVAL)


def language_for(path: str | Path | None) -> str:
    return LANGUAGES.get(Path(path).suffix.lower(), "") if path else ""


@dataclass(frozen=True)
class SourceFile:
    """A file as `specserve edit` read it."""

    path: Path  # as the user named it (maybe a symlink)
    text: str  # what the model sees: '\n' line ends, no byte-order mark
    raw: bytes  # the bytes read: a write in place first checks the file still holds them
    ends: tuple[str, ...]  # each '\n' of .text as the file wrote it: '\n', '\r\n' or '\r'
    bom: bool  # it began with a UTF-8 byte-order mark

    @property
    def newline(self) -> str:
        """The end a new line written into it takes: '\r\n' or '\r' when most of its lines end so."""
        return next((end for end in ("\r\n", "\r") if 2 * self.ends.count(end) > len(self.ends)), "\n")

    def encode(self, text: str) -> bytes:
        """`text` (an edited version of .text) with this file's BOM and line ends."""
        if any(end != "\n" for end in self.ends):
            # a '\r\n' is the model's own CRLF, unless the file has a stray CR before a line end (strip_fence)
            if "\r\n" not in self.text:
                text = text.replace("\r\n", "\n")
            text = _restore_ends(self.text, self.ends, text, self.newline)
        return ((_BOM if self.bom else "") + text).encode("utf-8")


def _restore_ends(old: str, ends: tuple[str, ...], new: str, default: str) -> str:
    """`new` with each line break that follows a line kept from `old` written as `ends` had it,
    and every other break as `default`."""
    old_lines, new_lines = old.split("\n"), new.split("\n")
    chosen = [default] * (len(new_lines) - 1)
    matcher = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False)
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            i, j = block.a + k, block.b + k
            if i < len(ends) and j < len(chosen):
                chosen[j] = ends[i]
    return "".join(line + end for line, end in zip(new_lines, chosen)) + new_lines[-1]


_LONE_CR = re.compile(r"\r(?!\n)")
_ANY_END = re.compile(r"(\r\n|\r|\n)")


def read_source(path: Path) -> SourceFile:
    """Read a UTF-8 text file for editing; one line when it is not one: UnreadableInput for bytes
    that are not UTF-8 (as every command says it), EditError for a NUL byte.

    A lone CR ends a line only in a file that has more of them than LFs (classic Mac line ends);
    in an LF or CRLF file it is a character inside its line, as git and diff read it."""
    raw = read_bytes(path)  # unreadable or not UTF-8: inputs.py's one line, as every command words it
    text = decode_text(raw, path)
    if (nul := raw.find(b"\0")) >= 0:  # valid UTF-8, but git's sign of a binary file: no answer could keep it
        raise EditError(f"{path} holds a NUL byte (byte {nul}): it looks binary; specserve edit edits text files")
    bom = text.startswith(_BOM)
    text = text.removeprefix(_BOM)
    if len(_LONE_CR.findall(text)) > text.count("\n"):  # a classic Mac file: a lone CR ends a line
        pieces = _ANY_END.split(text)
        return SourceFile(path, "\n".join(pieces[::2]), raw, tuple(pieces[1::2]), bom)
    ends = tuple("\r\n" if line.endswith("\r") else "\n" for line in text.split("\n")[:-1])
    return SourceFile(path, text.replace("\r\n", "\n"), raw, ends, bom)


def check_writable(path: Path, follow: bool = True) -> None:
    """Fail before the model is asked (minutes on a CPU) when `path` cannot be written. `follow`:
    False for a name that is replaced rather than written through (the backup): a link there is
    checked as the name in its own folder, not as the file it points to. A name the system refuses
    (longer than its limit: FILE.bak of a 252-byte name) is the same one line."""
    try:
        _check_writable(path, follow)
    except OSError as e:
        raise EditError(f"cannot write {path}: {e.strerror or e}") from None


def _check_writable(path: Path, follow: bool) -> None:
    real = path.resolve() if follow else path.parent.resolve() / path.name
    folder = real.parent
    if not folder.is_dir():
        raise EditError(f"cannot write {path}: the folder {folder} does not exist")
    if real.is_dir() and (follow or not real.is_symlink()):
        raise EditError(f"cannot write {path}: it is a folder")
    if not follow:  # replaced by a rename: only the folder must be writable
        real = real if real.exists() and not real.is_symlink() else folder
    if not os.access(folder, os.W_OK) or (real.exists() and not os.access(real, os.W_OK)):
        raise EditError(f"cannot write {path}: {_why_not_writable(folder)}")
    if real.is_file() and not real.stat().st_mode & 0o222:  # root may write it: the user said not to
        raise EditError(f"cannot write {path}: it is read-only (chmod u+w it to let the edit write it)")


def _why_not_writable(folder: Path) -> str:
    """Why os.access refused: a read-only file system (which no chmod fixes) or the permission bits."""
    try:
        read_only = os.statvfs(folder).f_flag & os.ST_RDONLY
    except OSError:
        read_only = False
    return "read-only file system" if read_only else "permission denied"


def write_in_place(source: SourceFile, text: str, backup: Path | None = None) -> None:
    """Write `text` over the file `source` was read from, unless it changed since; first copy
    what it held to `backup`, when given."""
    try:
        now = source.path.read_bytes()
    except OSError as e:
        raise EditError(f"{source.path} cannot be read back ({e.strerror}); nothing written") from None
    if now != source.raw:
        raise EditError(
            f"{source.path} changed on disk while the model was answering; nothing written "
            "(the file keeps your changes: run the edit again)"
        )
    if backup is not None:
        write_backup(source.path, backup)
    write_atomic(source.path, source.encode(text))


def write_atomic(path: Path, data: bytes | str, mode_of: Path | None = None) -> None:
    """Write `data` through a temporary file in the same folder, renamed over the target: never a
    half-written file. A symlink is followed (the file it points to is written, the link stays),
    and an existing file keeps its permission bits, extended attributes, owner and group (where the
    user may give them: root, or a group of the user's); a new one is the user's, with `mode_of`'s bits
    and POSIX ACL (the edited file's: an executable script's edit stays executable, and those who may
    read it are those who may read the file) and no other attribute of it. A file with other hard links is
    rewritten where it is instead (a rename would leave the other names holding the old text)."""
    real = path.resolve()
    if isinstance(data, str):
        data = data.encode("utf-8")
    if real.exists() and real.stat().st_nlink > 1:
        _rewrite_where_it_is(real, data)
        return
    if real.exists():
        _replace(real, data, real.stat().st_mode & 0o7777, real)
    elif mode_of is not None and mode_of.exists():
        _replace(real, data, mode_of.stat().st_mode & 0o7777, None, acl_of=mode_of)
    else:
        _replace(real, data, 0o666 & ~_umask(), None)


def _rewrite_where_it_is(path: Path, data: bytes) -> None:
    """Write `data` over the file at `path` itself (its other hard links see it). Not atomic: a
    write that fails part way (a full disk) puts the old bytes back, which fit where they were,
    before the error is raised; a Ctrl-C waits until the file holds the new text alone."""
    with _interrupt_deferred(), open(path, "r+b", buffering=0) as f:
        old = f.read()
        try:
            _overwrite(f, data)
        except OSError as e:
            try:
                _overwrite(f, old)
            except OSError as again:
                raise OSError(
                    e.errno, f"{e.strerror}, and its old text could not be put back ({again.strerror})", str(path)
                ) from None
            raise


def _overwrite(f, data: bytes) -> None:
    """Make the unbuffered file `f` hold `data` alone, on disk."""
    f.seek(0)
    view = memoryview(data)
    while view:
        view = view[f.write(view) :]  # a raw write may take only part
    f.truncate()
    os.fsync(f.fileno())


def write_backup(path: Path, backup: Path) -> None:
    """Copy `path` to `backup` as a new file renamed over that name: whatever was at `backup` (an
    old backup, a symlink, a hard link to another file) is replaced, never written through. The copy
    keeps the file's bits, owner, times and extended attributes (ACL and SELinux label included):
    a backup is the user's file, to be put back with `mv`, and it must not grant more than the file did."""
    old = path.stat()
    _replace(backup, path.read_bytes(), old.st_mode & 0o7777, path)
    os.utime(backup, ns=(old.st_atime_ns, old.st_mtime_ns), follow_symlinks=False)


def _replace(path: Path, data: bytes, mode: int, like: Path | None, acl_of: Path | None = None) -> None:
    """Put `data` at `path` whole or not at all (atomic.py: the name itself is replaced, a symlink
    there too), with `mode` and the owner, group and extended attributes of the file `like` (None: a
    new file of the user's, with the POSIX ACL of `acl_of` when given), each set on the temporary
    file before it is renamed into place."""

    def prepare(fd: int) -> None:
        if like is not None:
            _keep_owner(fd, like.stat())
            copy_xattrs(like, fd, path)  # after the chown, which clears file capabilities
        elif acl_of is not None:
            copy_acl(acl_of, fd, path)
        os.fchmod(fd, mode)  # after the chown, which clears setuid and setgid bits; the ACL's mask is its group bits

    atomic.write_atomic(path, [data], prepare, _report_leftover)


def _report_leftover(leftover: Path, pid: int | None) -> None:
    """Tell the user a hidden copy of their text, an earlier edit's killed while it wrote, is gone
    (pid None: an older version's, whose name said no process)."""
    if pid is None:
        print(f"removed {leftover}, left by an older specserve (untouched for over an hour)", file=sys.stderr)
    else:
        print(f"removed {leftover}, left by specserve process {pid}, which is gone", file=sys.stderr)


@contextlib.contextmanager
def _interrupt_deferred():
    """Hold a Ctrl-C until the block is done, then raise it: a file rewritten where it is must not
    be left with the new text followed by the old one's tail. (A signal mask would not do: the
    process's other threads take the signal.) Only the main thread may set a handler, and only
    there does Python raise KeyboardInterrupt, so elsewhere there is nothing to hold."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught and callable(previous):
        previous(signal.SIGINT, None)  # the handler the user's Ctrl-C was for: KeyboardInterrupt by default
    elif caught and previous == signal.SIG_DFL:
        signal.raise_signal(signal.SIGINT)


def _keep_owner(fd: int, old: os.stat_result) -> None:
    """Give the new file the old one's owner and group: root editing a user's file must not leave
    the user a file of root's they cannot write. Where the user may not (another user's file in a
    folder they can write), or this system cannot give that owner at all (an id a rootless container
    does not map: EINVAL), the new file stays theirs, as an editor's save would leave it."""
    try:
        os.fchown(fd, old.st_uid, old.st_gid)
    except OSError as e:
        if e.errno not in CANNOT_GIVE_OWNER:
            raise
        try:
            os.fchown(fd, -1, old.st_gid)  # the group alone, when it is one of the user's
        except OSError as e:
            if e.errno not in CANNOT_GIVE_OWNER:
                raise


def _umask() -> int:
    """The process's umask (read by setting it, then put back): the mode a plain open() gives."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
