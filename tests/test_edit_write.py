"""`specserve edit` writing a user's file: who owns it afterwards, its backup, and a crash while writing."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import traceback
from pathlib import Path

import pytest
from test_edit import EDITED, ORIGINAL, edit_cli, server, src  # noqa: F401  (fixtures)

from specserve import atomic
from specserve.cli.main import build_parser, main
from specserve.edit import files


def test_in_place_keeps_the_file_s_owner_and_group(server, src, monkeypatch):  # noqa: F811
    """Run as root (sudo, a container) on a user's file, the edit replaced it with a file of root's:
    the user could no longer write their own file. The new file takes the old one's owner and group
    (given to another user here when the tests run as root; the call is checked for any user)."""
    if os.geteuid() == 0:
        os.chown(src, 1234, 5678)
    owner = (src.stat().st_uid, src.stat().st_gid)
    given = []
    real_fchown = os.fchown
    monkeypatch.setattr(os, "fchown", lambda fd, uid, gid: (given.append((uid, gid)), real_fchown(fd, uid, gid)))
    assert edit_cli(server, src, "--in-place") == 0
    assert src.read_text() == EDITED
    assert (src.stat().st_uid, src.stat().st_gid) == owner
    assert owner in given


def test_an_owner_this_system_cannot_give_leaves_the_file_the_editor_s(server, src, monkeypatch):  # noqa: F811
    """In a rootless container a file can belong to an id the container does not map, and chown to
    it fails with EINVAL, not EPERM: the edit stopped with "cannot write FILE: Invalid argument".
    Like an owner the user may not give, the new file now stays the editor's, and the edit is written."""

    def unmapped(fd, uid, gid):
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))

    monkeypatch.setattr(os, "fchown", unmapped)
    assert edit_cli(server, src, "--in-place") == 0
    assert src.read_text() == EDITED


def test_an_unexpected_chown_error_still_stops_the_write(src, monkeypatch):  # noqa: F811
    """Only the errors that mean "this owner cannot be given" are let go: an I/O error is not."""

    def broken(fd, uid, gid):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fchown", broken)
    with pytest.raises(OSError):
        files.write_atomic(src, "changed\n", mode_of=src)
    assert src.read_text() == ORIGINAL


def test_the_backup_is_not_written_through_a_link_at_its_name(server, src, tmp_path):  # noqa: F811
    """The backup was copied with shutil.copy2, which opens FILE.bak and writes through whatever is
    there: a symlink (stale, or planted in a shared folder) had the file's text written into the file
    it pointed to, and a hard link had the other name's text replaced too. FILE.bak is now a new file
    renamed into place: the link is replaced, its target and the other name keep their text."""
    victim, other = tmp_path / "victim.txt", tmp_path / "other.txt"
    victim.write_text("keep me\n")
    other.write_text("keep me too\n")
    backup = tmp_path / "greet.py.bak"
    backup.symlink_to(victim)
    assert edit_cli(server, src, "--in-place") == 0
    assert victim.read_text() == "keep me\n"
    assert not backup.is_symlink() and backup.read_text() == ORIGINAL
    backup.unlink()
    backup.hardlink_to(other)
    src.write_text(ORIGINAL)
    assert edit_cli(server, src, "--in-place") == 0
    assert other.read_text() == "keep me too\n" and backup.read_text() == ORIGINAL


def _record_syncs(monkeypatch) -> list:
    """Record os.fsync and os.replace calls, in order, and still make them."""
    calls = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(
        os, "fsync", lambda fd: (calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))), real_fsync(fd))
    )
    monkeypatch.setattr(os, "replace", lambda a, b: (calls.append(("replace", str(a))), real_replace(a, b)))
    return calls


@pytest.mark.parametrize("writer", ["edit", "cache"])
def test_the_new_text_is_on_disk_before_it_is_renamed_over_the_file(tmp_path, monkeypatch, writer):
    """The temporary file was renamed over the user's file without an fsync: after a power cut or a
    kernel crash, a file system that writes the rename before the data (XFS, btrfs, ext4 with
    noauto_da_alloc) shows an empty file where the user's was. Its data is now synced first."""
    path = tmp_path / "greet.py"
    path.write_text(ORIGINAL)
    calls = _record_syncs(monkeypatch)
    if writer == "edit":
        files.write_atomic(path, EDITED)
    else:
        atomic.write_atomic(path, [EDITED.encode()])
    assert path.read_text() == EDITED
    replaced = [i for i, (what, _) in enumerate(calls) if what == "replace"]
    assert len(replaced) == 1 and ("fsync", calls[replaced[0]][1]) in calls[: replaced[0]]


def test_help_says_the_backup_replaces_an_earlier_one(capsys):
    """A second `edit --in-place` replaces FILE.bak with the first edit's result: the file as it was
    before both edits is gone, as with `sed -i.bak`, and --help did not say so."""
    assert main(["edit", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "the original is kept as FILE.bak, replacing an earlier FILE.bak" in text


def test_a_dangling_link_at_the_backup_s_name_does_not_stop_the_edit(server, src, tmp_path):  # noqa: F811
    """The backup replaces what is at FILE.bak, but the check before the model is asked followed a
    link there: one to a removed file's folder refused the edit ("the folder ... does not exist")."""
    backup = tmp_path / "greet.py.bak"
    backup.symlink_to(tmp_path / "gone" / "greet.py.bak")
    assert edit_cli(server, src, "--in-place") == 0
    assert src.read_text() == EDITED and not backup.is_symlink() and backup.read_text() == ORIGINAL


def test_an_html_report_that_cannot_be_written_whole_leaves_the_earlier_one(server, src, tmp_path):  # noqa: F811
    """`edit --html` (and bench's and generate's) wrote the report with Path.write_text, which empties
    the file first: a full disk (here a file size limit, which fails the same way) left the earlier
    report truncated. It is now written whole or not at all."""
    report = tmp_path / "edit.html"
    report.write_text("<p>earlier report</p>\n")
    script = textwrap.dedent(
        f"""
        import resource, signal, sys
        from specserve.cli.main import build_parser, main
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))
        sys.exit(main(["edit", {str(src)!r}, "-i", "Add type hints to greet", "--base-url", {server.base_url!r},
                       "--html", {str(report)!r}]))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert report.read_text() == "<p>earlier report</p>\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["edit.html", "greet.py"]


def test_ctrl_c_while_a_hard_linked_file_is_rewritten_leaves_the_whole_new_text(tmp_path, monkeypatch):
    """A file with other hard links is rewritten where it is (write, then truncate): a Ctrl-C that
    landed between the two left the new text followed by the old text's tail. The interrupt now
    waits until the file holds the new text alone, then stops the command."""
    path, other = tmp_path / "greet.py", tmp_path / "also_greet.py"
    path.write_text(ORIGINAL + "# a long tail the edit removes\n" * 5)
    other.hardlink_to(path)
    real_open = open

    class Interrupted:
        """The file, with a Ctrl-C arriving just as the write returns."""

        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

        def write(self, data):
            n = self.f.write(data)
            os.kill(os.getpid(), signal.SIGINT)
            return n

        def __getattr__(self, name):
            return getattr(self.f, name)

    monkeypatch.setattr(files, "open", lambda *a, **k: Interrupted(real_open(*a, **k)), raising=False)
    with pytest.raises(KeyboardInterrupt):
        files.write_atomic(path, EDITED)
    assert path.read_text() == EDITED and other.read_text() == EDITED


@pytest.mark.parametrize("where", [["--in-place"], ["--output", "NEW"]])
def test_a_write_that_fails_names_the_file_it_could_not_write(server, src, tmp_path, monkeypatch, capsys, where):  # noqa: F811
    """A full disk while the edit was written said only "[Errno 28] No space left on device": the
    user could not tell which file, nor that theirs was left as it was. The one line names the file
    that could not be written and the reason; the user's file keeps its text."""
    dest = tmp_path / "greet_new.py"
    args = [str(dest) if a == "NEW" else a for a in where]

    def full_disk(path, data, mode, owner, acl_of=None):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files, "_replace", full_disk)
    assert edit_cli(server, src, *args) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    target = src if where == ["--in-place"] else dest
    assert err.startswith("specserve: error: cannot write ") and str(target.name) in err, err
    assert "No space left on device" in err and src.read_text() == ORIGINAL


def test_a_read_only_file_system_is_named_as_the_reason(server, src, monkeypatch, capsys):  # noqa: F811
    """A file on a read-only file system (a mount, a remount after disk errors) was refused with
    "permission denied", which no chmod fixes. The one line now says why, before the model is asked.
    (A real read-only mount needs privileges the tests may not have: os.access and os.statvfs answer
    as they do on one.)"""
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: False)
    monkeypatch.setattr(os, "statvfs", lambda path: os.statvfs_result((4096,) * 8 + (os.ST_RDONLY, 255)))
    assert edit_cli(server, src, "--in-place") == 2
    err = capsys.readouterr().err.strip()
    assert err == f"specserve: error: cannot write {src}: read-only file system", err
    assert src.read_text() == ORIGINAL and server.requests == []


def test_a_temporary_file_that_cannot_be_made_names_the_file_being_written(server, src, monkeypatch, capsys):  # noqa: F811
    """When the folder stopped taking new files after the check (remounted read-only while the model
    answered), the error named the temporary file, a hidden name the user never gave
    ("cannot write .../.greet.py.k2j3.specserve-tmp"). It names the file the edit was writing (here
    the backup, written first)."""

    def read_only(target):
        raise OSError(30, "Read-only file system", f"{target.parent}/.{target.name}.x1y2z3.tmp")

    monkeypatch.setattr(atomic, "make_temp", read_only)
    assert edit_cli(server, src, "--in-place") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == f"specserve: error: cannot write {src}.bak: Read-only file system", err
    assert src.read_text() == ORIGINAL and sorted(p.name for p in src.parent.iterdir()) == ["greet.py"]


@pytest.mark.parametrize("where", [["--in-place"], ["--output", "FILE"]])
def test_a_hard_linked_file_that_cannot_be_written_whole_keeps_its_text(server, src, tmp_path, where):  # noqa: F811
    """A file with other hard links is rewritten where it is. A write that failed part way (a full
    disk; here a file size limit, which fails the same way) left the first bytes of the new text and
    lost the rest of the old, in the file and its other names, while the error said only "cannot
    write": with --output FILE there was no backup at all. The old text is put back."""
    other = tmp_path / "also_greet.py"
    other.hardlink_to(src)
    args = [str(src) if a == "FILE" else a for a in where]
    script = textwrap.dedent(
        f"""
        import resource, signal, sys
        from specserve.cli.main import build_parser, main
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, ({len(ORIGINAL) + 5}, {len(ORIGINAL) + 5}))
        sys.exit(main(["edit", {str(src)!r}, "-i", "Add type hints to greet", "--base-url", {server.base_url!r},
                       *{args!r}]))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == f"specserve: error: cannot write {src}: File too large"
    assert src.read_text() == ORIGINAL and other.read_text() == ORIGINAL


def test_a_file_that_is_a_link_to_its_own_backup_name_is_refused(server, tmp_path, capsys):  # noqa: F811
    """greet.py a link to greet.py.bak: the backup replaced greet.py.bak with the original, then the
    edit was written through the link into that same greet.py.bak. The original was gone while the
    tool said "backup: greet.py.bak". Refused before the model is asked; nothing changes."""
    real, link = tmp_path / "greet.py.bak", tmp_path / "greet.py"
    real.write_text(ORIGINAL)
    link.symlink_to("greet.py.bak")
    assert edit_cli(server, link, "--in-place") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"specserve: error: cannot keep a backup of {link}: ") and "\n" not in err, err
    assert real.read_text() == ORIGINAL and link.is_symlink() and server.requests == []


def _edit_as_a_user(server, path, *extra) -> tuple[int, str]:  # noqa: F811
    """`edit_cli` with the permissions of a user who is not root (root may write any folder): run
    as is when the tests are not root, else in a forked child that has become `nobody` (the code is
    already loaded: nobody may not read this Python's files). (exit code, stderr)."""
    if os.geteuid() != 0:
        with tempfile.TemporaryFile("w+") as err, contextlib.redirect_stderr(err):
            code = edit_cli(server, path, *extra)
            err.seek(0)
            return code, err.read()
    build_parser()  # every module the command line loads, loaded while this Python's files may be read
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, and never return into pytest
        code = 70
        try:
            os.close(read_end)
            os.setgid(65534)
            os.setuid(65534)
            with tempfile.TemporaryFile("w+", dir="/dev/shm") as err, contextlib.redirect_stderr(err):
                code = edit_cli(server, path, *extra)
                err.seek(0)
                os.write(write_end, err.read().encode())
        except Exception:  # noqa: BLE001  (any failure in the child is shown in the parent's assertion)
            os.write(write_end, traceback.format_exc().encode())
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as f:
        err = f.read()
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), err


def test_a_folder_the_user_may_not_write_is_refused_before_the_model_is_asked(server):  # noqa: F811
    """`--in-place` replaces the file by a new one in its folder: in a folder the user may not write
    (0555, theirs), the temporary file cannot be made. One line, exit 2, nothing sent, nothing lost."""
    folder = Path(tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    try:
        path = folder / "greet.py"
        path.write_text(ORIGINAL)
        if os.geteuid() == 0:
            os.chown(folder, 65534, 65534)
            os.chown(path, 65534, 65534)
        folder.chmod(0o555)
        code, err = _edit_as_a_user(server, path, "--in-place")
        assert code == 2 and err.strip() == f"specserve: error: cannot write {path}: permission denied", err
        assert path.read_text() == ORIGINAL and sorted(p.name for p in folder.iterdir()) == ["greet.py"]
        assert server.requests == []
    finally:
        folder.chmod(0o755)
        shutil.rmtree(folder)
