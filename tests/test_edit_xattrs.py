"""`specserve edit --in-place` keeps the file's extended attributes (user.*, its ACL), and its backup gets them too."""

from __future__ import annotations

import errno
import os
import shutil
import struct
import tempfile
from pathlib import Path

import pytest
from test_edit import EDITED, ORIGINAL, edit_cli, server  # noqa: F401  (fixture)


@pytest.fixture
def folder(tmp_path):
    """A folder on a file system that keeps user.* extended attributes: the test's own, else one
    in /dev/shm (tmpfs keeps them). Only where neither does is the test skipped: that is the
    machine's limit, not the edit's."""
    if not hasattr(os, "setxattr"):
        pytest.skip("this platform has no os.setxattr (extended attributes are Linux only here)")
    made = None
    for where in (tmp_path, Path("/dev/shm")):
        if where != tmp_path:
            if not where.is_dir():
                continue
            where = made = Path(tempfile.mkdtemp(dir=where))
        probe = where / "probe"
        probe.write_text("")
        try:
            os.setxattr(probe, "user.specserve.probe", b"1")
        except OSError:
            continue
        finally:
            probe.unlink()
        yield where
        break
    else:
        pytest.skip("neither the test's folder nor /dev/shm keeps user.* extended attributes")
    if made is not None:
        shutil.rmtree(made)


@pytest.fixture
def src(folder):
    path = folder / "greet.py"
    path.write_text(ORIGINAL)
    os.setxattr(path, "user.origin", b"https://example.com/greet.py")
    os.setxattr(path, "user.reviewed", b"")
    return path


def test_an_edit_in_place_keeps_the_file_s_extended_attributes(server, src):  # noqa: F811
    """The new file renamed over the user's had none of its extended attributes: `user.*` marks
    were lost (and so were a SELinux label and an ACL). The file keeps them, and FILE.bak, a copy
    of the user's file to put back, has them too."""
    assert edit_cli(server, src, "--in-place") == 0
    backup = src.with_name("greet.py.bak")
    assert src.read_text() == EDITED and backup.read_text() == ORIGINAL
    for path in (src, backup):
        assert os.getxattr(path, "user.origin") == b"https://example.com/greet.py"
        assert os.getxattr(path, "user.reviewed") == b""


def _acl(*entries: tuple[int, int, int]) -> bytes:
    """A POSIX ACL as the kernel stores it in system.posix_acl_access: (tag, permissions, id) entries."""
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", tag, perm, ident) for tag, perm, ident in entries)


USER_OBJ, USER, GROUP_OBJ, MASK, OTHER = 0x01, 0x02, 0x04, 0x10, 0x20
UNDEFINED = 0xFFFFFFFF


def _share_with_one_user(path) -> bytes:
    """Give `path` an ACL by which one named user (uid 1234) may read and write it and its group
    nothing (its mode then shows 0660, the mask); the ACL. Skips where the file system keeps none."""
    acl = _acl(
        (USER_OBJ, 6, UNDEFINED),
        (USER, 6, 1234),
        (GROUP_OBJ, 0, UNDEFINED),
        (MASK, 6, UNDEFINED),
        (OTHER, 0, UNDEFINED),
    )
    try:
        os.setxattr(path, "system.posix_acl_access", acl)
    except OSError as e:
        pytest.skip(f"this file system keeps no POSIX ACL: {e.strerror}")
    return acl


def test_an_acl_is_kept_and_the_group_gains_nothing(server, src):  # noqa: F811
    """Under an ACL the mode's group bits are the mask: a file readable and writable by one named
    user (uid 1234) and not by its group shows 0660. Without the ACL the rewritten file had mode
    0660 and nothing else, so the group could read and write it. The ACL is kept."""
    acl = _share_with_one_user(src)
    assert edit_cli(server, src, "--in-place") == 0
    for path in (src, src.with_name("greet.py.bak")):
        assert os.getxattr(path, "system.posix_acl_access") == acl
        assert path.stat().st_mode & 0o777 == 0o660


def test_a_new_output_file_takes_the_file_s_acl_and_no_other_attribute(server, src):  # noqa: F811
    """`--output NEW` gave the new file FILE's mode and nothing else: under FILE's ACL (one named
    user may read and write, the group nothing) the mode shows 0660, so NEW let the owning group
    read and write the edit. A new file now takes FILE's ACL with its mode: the same people may
    read it as FILE. It takes no other attribute (its folder decides a label, as for any new file)
    and stays the user's."""
    acl = _share_with_one_user(src)
    if os.geteuid() == 0:  # another user's file, edited by root: the new file is still root's
        os.chown(src, 1234, 5678)
    new = src.with_name("greet_new.py")
    assert edit_cli(server, src, "--output", str(new)) == 0
    assert new.read_text() == EDITED and src.read_text() == ORIGINAL
    assert os.getxattr(new, "system.posix_acl_access") == acl
    assert new.stat().st_mode & 0o777 == 0o660
    assert [name for name in os.listxattr(new) if name.startswith("user.")] == []
    assert new.stat().st_uid == os.geteuid()


def test_an_attribute_that_cannot_be_set_is_said_and_the_edit_is_made(server, src, monkeypatch, capsys):  # noqa: F811
    """A label the user may not give (EPERM) or a full attribute block must not lose the edit: the
    file is written, the others are kept, and one line says which attribute was not."""
    real_setxattr = os.setxattr

    def refuse_origin(target, name, value, *args, **kwargs):
        if name == "user.origin":
            raise OSError(errno.EPERM, "Operation not permitted")
        return real_setxattr(target, name, value, *args, **kwargs)

    monkeypatch.setattr(os, "setxattr", refuse_origin)
    assert edit_cli(server, src, "--in-place") == 0
    assert src.read_text() == EDITED and os.getxattr(src, "user.reviewed") == b""
    warnings = [line for line in capsys.readouterr().err.splitlines() if "extended attributes" in line]
    assert warnings == [
        f"warning: {src}.bak was written without these extended attributes: user.origin (Operation not permitted)",
        f"warning: {src} was written without these extended attributes: user.origin (Operation not permitted)",
    ]


def test_no_extended_attributes_to_copy_is_no_error(server, src, monkeypatch, capsys):  # noqa: F811
    """A file system without extended attributes (ENOTSUP) or a platform without os.listxattr: the
    edit is made as before, and nothing is said."""

    def unsupported(path):
        raise OSError(errno.ENOTSUP, "Operation not supported")

    monkeypatch.setattr(os, "listxattr", unsupported)
    assert edit_cli(server, src, "--in-place") == 0
    src.write_text(ORIGINAL)
    monkeypatch.delattr(os, "listxattr")
    assert edit_cli(server, src, "--in-place") == 0
    assert src.read_text() == EDITED and "extended attributes" not in capsys.readouterr().err


def test_file_capabilities_survive_the_write_and_the_chown(server, src):  # noqa: F811
    """The kernel drops `security.capability` when a file is written to or given an owner, so
    attributes copied before either were lost again: they are copied after both."""
    capability = struct.pack("<5I", 0x02000001, 1 << 10, 0, 0, 0)  # cap_net_bind_service, effective
    try:
        os.setxattr(src, "security.capability", capability)
    except OSError as e:
        pytest.skip(f"setting a file capability needs CAP_SETFCAP: {e.strerror}")
    assert edit_cli(server, src, "--in-place") == 0
    for path in (src, src.with_name("greet.py.bak")):
        assert os.getxattr(path, "security.capability") == capability
