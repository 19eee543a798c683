"""Faults while a file is written whole (atomic.py, for the edit tool and the caches): a full disk, a
failing hook, a failing clean-up, a crash after the rename. The user's file and its backup keep their
text, no temporary file is left beside them, and the error names the user's file and the real reason."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_edit import EDITED, ORIGINAL, edit_cli, server, src  # noqa: F401  (fixtures)

from specserve import atomic
from specserve.edit import files


def _fd_name(fd: int) -> str:
    """The path the descriptor `fd` is open on."""
    return os.readlink(f"/proc/self/fd/{fd}")


def _fail_fsync_of(monkeypatch, prefix: str, code: int) -> None:
    """os.fsync fails with `code` for a temporary file whose name starts with `prefix`."""
    real_fsync = os.fsync

    def fsync(fd):
        if os.path.basename(_fd_name(fd)).startswith(prefix):
            raise OSError(code, os.strerror(code))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def test_a_full_disk_while_the_file_is_synced_keeps_it_and_its_backup(server, src, monkeypatch, capsys):  # noqa: F811
    """The backup is written, then the file's new text fails to reach the disk (ENOSPC at the
    fsync, where a delayed allocation reports it): the file keeps its text, FILE.bak holds it too,
    no temporary file stays beside them, and one line names the file and the reason."""
    _fail_fsync_of(monkeypatch, ".greet.py.specserve-", errno.ENOSPC)
    assert edit_cli(server, src, "--in-place") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == f"specserve: error: cannot write {src}: No space left on device", err
    assert src.read_text() == ORIGINAL and src.with_name("greet.py.bak").read_text() == ORIGINAL
    assert sorted(p.name for p in src.parent.iterdir()) == ["greet.py", "greet.py.bak"]


def test_a_file_size_limit_part_way_through_is_no_success_and_leaves_the_file(server, src):  # noqa: F811
    """A real write cut short by the kernel (RLIMIT_FSIZE: the first bytes written, then EFBIG, as
    a full disk does) must not be reported as written nor leave part of the text anywhere."""
    script = textwrap.dedent(
        f"""
        import resource, signal, sys
        from specserve.cli.main import main
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, ({len(ORIGINAL) + 5}, {len(ORIGINAL) + 5}))
        sys.exit(main(["edit", {str(src)!r}, "-i", "Add type hints to greet", "--base-url", {server.base_url!r},
                       "--in-place"]))
        """
    )
    assert len(EDITED.encode()) > len(ORIGINAL) + 5
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == f"specserve: error: cannot write {src}: File too large"
    assert src.read_text() == ORIGINAL and src.with_name("greet.py.bak").read_text() == ORIGINAL
    assert sorted(p.name for p in src.parent.iterdir()) == ["greet.py", "greet.py.bak"]


@pytest.mark.parametrize("where", ["prepare", "chunks"])
def test_a_failure_after_data_is_written_leaves_the_file_and_no_temporary(tmp_path, where):
    """`prepare` (the edit's owner, attributes and mode) failing once the new bytes are written, or
    a cache's chunks failing part way: the file keeps its old bytes and the temporary file goes."""
    path = tmp_path / "greet.py"
    path.write_text(ORIGINAL)

    def refuse(fd):
        raise PermissionError(errno.EPERM, "Operation not permitted")

    def chunks():
        yield EDITED.encode()
        raise OSError(errno.EIO, "Input/output error")

    with pytest.raises(OSError):
        if where == "prepare":
            atomic.write_atomic(path, [EDITED.encode()], prepare=refuse)
        else:
            atomic.write_atomic(path, chunks())
    assert path.read_text() == ORIGINAL and [p.name for p in tmp_path.iterdir()] == ["greet.py"]


def _fail_unlink_of(monkeypatch, prefix: str, code: int) -> None:
    """os.unlink fails with `code` for a temporary file whose name starts with `prefix` (a file system
    gone read-only: Linux answers EROFS to an unlink on one even for a name that is not there)."""
    real_unlink = os.unlink

    def unlink(path, *args, **kwargs):
        if os.path.basename(os.fspath(path)).startswith(prefix):
            raise OSError(code, os.strerror(code), os.fspath(path))
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)


def test_an_error_removing_the_temporary_file_does_not_hide_the_write_s(server, src, monkeypatch, capsys):  # noqa: F811
    """An I/O error while the new text was synced often remounts the file system read-only, so the
    temporary file could not be removed either: that second error replaced the first, and the line
    named the hidden temporary file ("cannot write .../.greet.py.specserve-...tmp: Read-only file
    system"). It names the user's file and the write's own reason."""
    _fail_fsync_of(monkeypatch, ".greet.py.specserve-", errno.EIO)
    _fail_unlink_of(monkeypatch, ".greet.py.specserve-", errno.EROFS)
    assert edit_cli(server, src, "--in-place") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == f"specserve: error: cannot write {src}: Input/output error", err
    assert src.read_text() == ORIGINAL


def test_a_write_that_succeeded_is_not_reported_failed_by_its_clean_up(tmp_path, monkeypatch):
    """After the rename the temporary name is gone, yet it was unlinked again: on a file system
    remounted read-only just then, that unlink fails (EROFS), and a file already written in full
    was reported as not written. Nothing is removed after a rename."""
    path = tmp_path / "greet.py"
    path.write_text(ORIGINAL)
    _fail_unlink_of(monkeypatch, ".greet.py.specserve-", errno.EROFS)
    atomic.write_atomic(path, [EDITED.encode()])
    assert path.read_text() == EDITED


@pytest.mark.parametrize("writer", ["edit", "cache"])
def test_the_rename_is_on_disk_before_the_write_returns(tmp_path, monkeypatch, writer):
    """The rename was never synced: after `specserve edit` said the file was written (and FILE.bak
    made), a power cut could bring back the old name's entry, the old text, though the new one was
    reported. The folder is synced after the rename."""
    path = tmp_path / "greet.py"
    path.write_text(ORIGINAL)
    calls, real_fsync, real_replace = [], os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(("fsync", _fd_name(fd))), real_fsync(fd)))
    monkeypatch.setattr(os, "replace", lambda a, b: (calls.append(("replace", str(b))), real_replace(a, b)))
    if writer == "edit":
        files.write_atomic(path, EDITED)
    else:
        atomic.write_atomic(path, [EDITED.encode()])
    assert path.read_text() == EDITED
    assert calls[-2:] == [("replace", str(path)), ("fsync", str(tmp_path))], calls


def test_an_older_name_is_matched_exactly_never_as_a_pattern(tmp_path):
    """Older versions' names are removed once old, and only those exact names: a name with regex
    characters (`.` `+` `[`) matches itself alone, and another file's older name, a cache's plain
    name beside a user's file, or a name with more around it is kept however old."""
    target = tmp_path / "a+b[1].py"
    gone = [".a+b[1].py.specserve-tmp", ".a+b[1].py.abcdefgh.specserve-tmp"]
    kept = [
        ".aab[1].py.specserve-tmp",
        ".a+b1.py.specserve-tmp",
        ".a+b[1]Xpy.specserve-tmp",
        ".a+b[1].py.specserve-tmpX",
        "x.a+b[1].py.specserve-tmp",
        ".a+b[1].py.abcdefgh.specserve-tmp.bak",
        ".a+b[1].py.ABCDEFGH.specserve-tmp",
        "a+b[1].py.abcdefgh.tmp",
        "a+b[1].py.tmp4242",
        "a+b[1].py.1-2.tmp",
    ]
    old = 0
    for name in gone + kept:
        (tmp_path / name).write_text("user's\n")
        os.utime(tmp_path / name, (old, old))
    removed = atomic.remove_leftovers(target)
    assert sorted(p.name for p, _ in removed) == sorted(gone)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)


def test_a_recent_file_under_an_older_name_is_kept_for_the_caches_too(tmp_path):
    """In a cache's folder the plain older names are ours, but a recent one may be an older
    specserve's write under way: kept until untouched for an hour."""
    target = tmp_path / "k.json"
    names = ["k.json.abcdefgh.tmp", "k.json.tmp4242", "k.json.1-2.tmp", ".k.json.specserve-tmp"]
    for name in names:
        (tmp_path / name).write_text("writing\n")
    atomic.write_atomic(target, [b"{}"], cache=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*names, "k.json"])


def test_a_symlinked_file_keeps_its_link_and_its_target_is_written_whole(server, tmp_path):  # noqa: F811
    """FILE a symlink into another folder: the target takes the new text through a temporary file in
    the target's folder (a rename across folders would fail or copy), the link stays a link, and
    no temporary file is left in either folder."""
    real_dir, link_dir = tmp_path / "real", tmp_path / "links"
    real_dir.mkdir()
    link_dir.mkdir()
    target, link = real_dir / "greet.py", link_dir / "greet.py"
    target.write_text(ORIGINAL)
    link.symlink_to(target)
    assert edit_cli(server, link, "--in-place") == 0
    assert link.is_symlink() and Path(os.readlink(link)) == target and target.read_text() == EDITED
    assert sorted(p.name for p in real_dir.iterdir()) == ["greet.py"]
    assert sorted(p.name for p in link_dir.iterdir()) == ["greet.py", "greet.py.bak"]
    assert (link_dir / "greet.py.bak").read_text() == ORIGINAL and not (link_dir / "greet.py.bak").is_symlink()


def test_a_folder_that_cannot_be_synced_does_not_fail_a_write_that_was_made(tmp_path, monkeypatch):
    """Some file systems refuse an fsync of a folder (EINVAL): the file is in place by then, so the
    write is not reported failed."""
    path, real_fsync = tmp_path / "greet.py", os.fsync

    def fsync(fd):
        if os.path.isdir(_fd_name(fd)):
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    atomic.write_atomic(path, [EDITED.encode()])
    assert path.read_text() == EDITED and [p.name for p in tmp_path.iterdir()] == ["greet.py"]


def test_the_file_s_mode_is_on_the_new_file_before_it_takes_the_name(server, src, monkeypatch):  # noqa: F811
    """The temporary file is made 0600; an executable, group-readable FILE (0750) must have its mode
    back before the rename, or for a moment (for good, after a crash) the script cannot be run by
    its group, nor FILE.bak read by it."""
    src.chmod(0o750)
    at_rename, real_replace = {}, os.replace

    def replace(tmp, target):
        at_rename[Path(target).name] = os.stat(tmp).st_mode & 0o7777
        return real_replace(tmp, target)

    monkeypatch.setattr(os, "replace", replace)
    assert edit_cli(server, src, "--in-place") == 0
    assert at_rename == {"greet.py.bak": 0o750, "greet.py": 0o750} and src.read_text() == EDITED
