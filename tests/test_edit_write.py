"""`specserve edit` writing a user's file: who owns it afterwards, and its backup."""

from __future__ import annotations

import os

from test_edit import EDITED, edit_cli, server, src  # noqa: F401  (fixtures)


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
