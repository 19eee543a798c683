"""Keeping a file's extended attributes when an edit replaces it with a new file.

An edit writes a new file and renames it over the user's (edit/files.py), and a new file has
none of the old one's extended attributes: `user.*` attributes (a download's origin, a backup
tool's marks), its SELinux label (`security.selinux`) and its POSIX ACL (`system.posix_acl_access`).
Losing an ACL also widens access: under an ACL the mode's group bits are the mask (the most any
named user or group may have), and without the ACL they become the owning group's own rights.
So the new file gets each of them before the rename. A file new at another name (`edit --output
NEW`) gets the ACL alone: it takes the file's mode, whose group bits are the ACL's mask. Linux only:
where the platform has no os.listxattr, or the file system keeps none, there is nothing to copy. One that cannot be set
(a label the user may not give, a full disk) does not stop the edit; it is said in one line.
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

_NONE_KEPT = {errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS}  # a file system without extended attributes
ACL = "system.posix_acl_access"


def copy_xattrs(source: Path, fd: int, shown: Path) -> None:
    """Give the file open as `fd` every extended attribute of `source`; `shown`: the name the
    one-line warning gives for attributes that could not be kept. Call it after the data is
    written and the owner set: the kernel removes `security.capability` on a write or a chown."""
    if not hasattr(os, "listxattr"):
        return
    try:
        names = os.listxattr(source)
    except OSError as e:
        if e.errno not in _NONE_KEPT:
            _warn(shown, [f"all ({e.strerror})"])
        return
    lost = [f"{name} ({why})" for name in names if (why := _copy_one(source, fd, name))]
    if lost:
        _warn(shown, lost)


def copy_acl(source: Path, fd: int, shown: Path) -> None:
    """Give the file open as `fd` the POSIX ACL of `source`, when it has one, and no other attribute:
    a new file (`edit --output NEW`) that takes `source`'s mode must take the ACL its group bits are
    the mask of, or the owning group gains what only the named users had."""
    if not hasattr(os, "getxattr"):
        return
    try:
        os.getxattr(source, ACL)
    except OSError as e:  # no ACL (ENODATA), or a file system without any
        if e.errno not in _NONE_KEPT | {errno.ENODATA}:
            _warn(shown, [f"{ACL} ({e.strerror})"])
        return
    if why := _copy_one(source, fd, ACL):
        _warn(shown, [f"{ACL} ({why})"])


def _copy_one(source: Path, fd: int, name: str) -> str | None:
    """Copy attribute `name`; None when done (or already there: a label the new file was given
    by the policy needs no permission to keep), else why not."""
    try:
        value = os.getxattr(source, name)
        if _value(fd, name) != value:
            os.setxattr(fd, name, value)
    except OSError as e:
        return e.strerror or str(e)
    return None


def _value(fd: int, name: str) -> bytes | None:
    """The file's attribute `name`, or None when it has none."""
    try:
        return os.getxattr(fd, name)
    except OSError:
        return None


def _warn(shown: Path, lost: list[str]) -> None:
    print(f"warning: {shown} was written without these extended attributes: {', '.join(lost)}", file=sys.stderr)
