"""`specserve edit` writing a user's file: who owns it afterwards, and its backup."""

from __future__ import annotations

import os

from test_edit import EDITED, ORIGINAL, edit_cli, server, src  # noqa: F401  (fixtures)


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
