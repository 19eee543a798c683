"""The temporary file a write renames over the user's file: named for what it is, and removed by
the next write when a killed writer left it (tempfiles.py)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from test_edit import EDITED, ORIGINAL, edit_cli, server, src  # noqa: F401  (fixtures)

from specserve import atomic, tempfiles
from specserve.backends.base import SavedSequence
from specserve.edit import files
from specserve.engine import prices
from specserve.engine.governor import CostModel
from specserve.engine.host_cache import Saved
from specserve.engine.host_store import INDEX, HostStore

HOST = socket.gethostname()


def _dead_pid() -> int:
    """The id of a process that has ended (and been reaped)."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def _killed_while_writing(path) -> str:
    """Run a write of `path` in another process and SIGKILL it once the temporary file holds the
    new text, before the rename: what `kill -9` during an edit leaves. The leftover's name."""
    script = textwrap.dedent(
        f"""
        import os, sys, time
        from pathlib import Path
        from specserve.edit import files
        def stop(fd):
            print(os.readlink(f"/proc/self/fd/{{fd}}"), flush=True)
            time.sleep(60)
        os.fsync = stop
        files.write_atomic(Path({str(path)!r}), {EDITED!r})
        """
    )
    writer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    leftover = writer.stdout.readline().strip()
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    writer.stdout.close()
    return os.path.basename(leftover)


def test_a_temporary_file_left_by_kill_9_is_named_for_what_it_is_and_removed_by_the_next_edit(server, src, capsys):  # noqa: F811
    """`kill -9` during a write left `.greet.py.k2j3x9aa.specserve-tmp` beside the file for good: a
    hidden copy of the text that nothing ever removed. Its name now says whose it is, and the next
    edit of the file removes it, saying so; the user's file was never touched."""
    leftover = _killed_while_writing(src)
    assert re.fullmatch(rf"\.greet\.py\.specserve-{re.escape(HOST)}-\d+\.[a-z0-9_]{{8}}\.tmp", leftover), leftover
    assert (src.parent / leftover).exists() and src.read_text() == ORIGINAL
    assert edit_cli(server, src, "--in-place") == 0
    assert sorted(p.name for p in src.parent.iterdir()) == ["greet.py", "greet.py.bak"]
    assert f"removed {src.parent / leftover}, left by specserve process" in capsys.readouterr().err


def test_only_a_dead_writer_s_own_leftovers_are_removed(server, src):  # noqa: F811
    """A running writer's temporary file (another edit of the same file, under way), another
    machine's (a shared folder: its process ids are not ours), another file's, a link or a folder
    with a leftover's name, and a recent file under an older version's name are all kept."""
    dead, folder = _dead_pid(), src.parent
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        gone = [
            f".greet.py.specserve-{HOST}-{dead}.abcd_123.tmp",
            f".greet.py.bak.specserve-{HOST}-{dead}.zzzzzzzz.tmp",
        ]
        kept = [
            f".greet.py.specserve-{HOST}-{live.pid}.abcd_123.tmp",
            f".greet.py.specserve-other-{HOST}-{dead}.abcd_123.tmp",
            f".greet.pyc.specserve-{HOST}-{dead}.abcd_123.tmp",
            f".greet.py.specserve-{HOST}-{dead}.abcd_123.tmp~",
            f"greet.py.specserve-{HOST}-{dead}.abcd_123.tmp",
            ".greet.py.k2j3x9aa.specserve-tmp",
            "notes.txt",
        ]
        for name in gone + kept:
            (folder / name).write_text("x\n")
        link = folder / f".greet.py.specserve-{HOST}-{dead}.linklink.tmp"
        link.symlink_to(folder / "notes.txt")
        (folder / f".greet.py.specserve-{HOST}-{dead}.a_folder.tmp").mkdir()
        assert edit_cli(server, src, "--in-place") == 0
    finally:
        live.kill()
        live.wait()
    names = {p.name for p in folder.iterdir()}
    assert not names & set(gone)
    assert names == set(kept) | {
        "greet.py",
        "greet.py.bak",
        link.name,
        f".greet.py.specserve-{HOST}-{dead}.a_folder.tmp",
    }
    assert src.read_text() == EDITED and (folder / "notes.txt").read_text() == "x\n"


def test_the_cache_writer_names_and_removes_its_leftovers_too(tmp_path):
    """The host cache and the price cache write the same way: a server killed while it wrote a
    KV entry (gigabytes) left `entry.kv.k2j3x9aa.tmp` for good."""
    dead, entry = _dead_pid(), tmp_path / "entry.kv"
    left = tmp_path / f".entry.kv.specserve-{HOST}-{dead}.abcdefgh.tmp"
    left.write_bytes(b"half an entry")
    atomic.write_atomic(entry, [b"whole entry"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry.kv"] and entry.read_bytes() == b"whole entry"


def test_a_cache_entry_never_written_again_loses_its_leftover_on_the_next_save(tmp_path):
    """A host-cache entry is named for its tokens: a server killed while it wrote one left that
    entry's temporary file, and only a later write of the very same entry removed it, so most
    stayed for good (gigabytes of KV). Any save into the cache's folder now removes every dead
    writer's leftover there; a running writer's, another host's and other files stay."""
    dead, live = _dead_pid(), subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    store = HostStore(tmp_path / "host", "key")
    try:
        gone = [
            f".{'a' * 24}.kv.specserve-{HOST}-{dead}.abcdefgh.tmp",
            f".{INDEX}.specserve-{HOST}-{dead}.zzzzzzzz.tmp",
        ]
        kept = [
            f".{'b' * 24}.kv.specserve-{HOST}-{live.pid}.abcdefgh.tmp",
            f".{'c' * 24}.kv.specserve-elsewhere-{dead}.abcdefgh.tmp",
            "notes.txt",
        ]
        for name in gone + kept:
            (store.folder / name).write_bytes(b"half an entry")
        entry = Saved([1, 2], SavedSequence(bytearray(200), 2), 0, None)
        assert store.save([entry]) == 1
    finally:
        store.close()
        live.kill()
        live.wait()
    names = {p.name for p in store.folder.iterdir()}
    assert not names & set(gone) and names >= set(kept), names


def test_a_user_s_folder_keeps_other_files_leftovers(tmp_path):
    """Beside a user's file (not a cache's folder) only the written file's own leftovers go: the
    folder is theirs, and another file's temporary file may be another tool's write under way."""
    dead = _dead_pid()
    other = tmp_path / f".notes.txt.specserve-{HOST}-{dead}.abcdefgh.tmp"
    other.write_text("x\n")
    files.write_atomic(tmp_path / "greet.py", EDITED)
    assert other.exists()


def test_the_file_being_written_is_never_taken_for_a_leftover(tmp_path, monkeypatch):
    """This process's own temporary file, of a write under way in another thread, is kept."""
    path = tmp_path / "greet.py"
    mine = tmp_path / f".greet.py.specserve-{HOST}-{os.getpid()}.abcdefgh.tmp"
    mine.write_text("another thread's write\n")
    files.write_atomic(path, EDITED)
    assert mine.exists() and path.read_text() == EDITED


@pytest.mark.parametrize("length", [230, 251])
def test_a_long_file_name_is_edited(server, tmp_path, length):  # noqa: F811
    """A file whose name fits the 255-byte limit could not be written once the model had answered
    (minutes lost): its temporary file's name, the name and a suffix, did not fit ("cannot write
    ...: File name too long"). The name in the temporary file's is cut to fit, and a killed edit's
    leftover is still found by the next."""
    path = tmp_path / ("g" * (length - 3) + ".py")
    path.write_text(ORIGINAL)
    assert len(_killed_while_writing(path)) <= 255
    assert edit_cli(server, path, "--in-place") == 0
    assert path.read_text() == EDITED and path.with_name(path.name + ".bak").read_text() == ORIGINAL
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name, path.name + ".bak"]


def test_a_name_too_long_for_its_backup_is_refused_in_one_line(server, tmp_path, capsys):  # noqa: F811
    """FILE.bak of a 253-byte name is longer than the file system allows: the check before the model
    was asked stopped on Python's "[Errno 36] File name too long: '...'". It is the usual one line."""
    path = tmp_path / ("g" * 250 + ".py")
    path.write_text(ORIGINAL)
    assert edit_cli(server, path, "--in-place") == 2
    err = capsys.readouterr().err.strip()
    assert err == f"specserve: error: cannot write {path}.bak: File name too long", err
    assert path.read_text() == ORIGINAL and server.requests == []


def test_on_windows_no_process_is_signalled_and_nothing_removed(tmp_path, monkeypatch):
    """os.kill(pid, 0) tests a process on POSIX, but on Windows signal 0 is CTRL_C_EVENT: asking
    whether a leftover's writer still ran would have sent a Ctrl-C to whatever process has that id
    now. There, leftovers are kept and no process is signalled."""
    dead, path = _dead_pid(), tmp_path / "greet.py"
    left = tmp_path / f".greet.py.specserve-{HOST}-{dead}.abcdefgh.tmp"
    left.write_text("x\n")
    signalled = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: signalled.append((pid, sig)))
    monkeypatch.setattr(sys, "platform", "win32")
    assert tempfiles.remove_leftovers(path) == []
    assert left.exists() and signalled == []


def _made(folder, names, hours_ago: float) -> None:
    """Files `names` in `folder`, last written `hours_ago` hours ago."""
    then = time.time() - hours_ago * 3600
    for name in names:
        (folder / name).write_text("x\n")
        os.utime(folder / name, (then, then))


def test_an_older_version_s_leftovers_are_removed_once_they_are_old(server, src, capsys):  # noqa: F811
    """Before 2026-12-05 an edit's temporary file was `.NAME.specserve-tmp`, then for a day
    `.NAME.XXXXXXXX.specserve-tmp`: a name that says no process, so the one a killed edit left was
    never removed (a hidden copy of the user's text, for good). Such a file untouched for over an
    hour (a write takes seconds) is removed by the next write of NAME; a recent one (an older
    specserve's edit may be under way), a link, another file's, and a cache's plain `NAME.XXXXXXXX.tmp`
    beside a user's file (another program's, maybe) are kept."""
    folder = src.parent
    gone = [".greet.py.specserve-tmp", ".greet.py.k2j3x9aa.specserve-tmp", ".greet.py.bak.ab_12cd3.specserve-tmp"]
    kept_old = [".greet.pyc.specserve-tmp", "greet.py.k2j3x9aa.tmp", ".greet.py.k2j3x9aa.specserve-tmp~"]
    kept_new = [".greet.py.zz99zz99.specserve-tmp"]
    _made(folder, gone + kept_old, hours_ago=2)
    _made(folder, kept_new, hours_ago=0.5)
    dead = f".greet.py.specserve-{HOST}-{_dead_pid()}.abcdefgh.tmp"  # today's name: its writer is checked, not its age
    _made(folder, [dead], hours_ago=-1)  # written by a clock an hour ahead
    link = folder / ".greet.py.linklink.specserve-tmp"
    link.symlink_to(folder / kept_new[0])
    os.utime(link, (time.time() - 7200,) * 2, follow_symlinks=False)
    assert edit_cli(server, src, "--in-place") == 0
    assert {p.name for p in folder.iterdir()} == {"greet.py", "greet.py.bak", link.name, *kept_old, *kept_new}
    err = capsys.readouterr().err
    assert f"removed {folder / gone[0]}, left by an older specserve (untouched for over an hour)" in err, err


def test_an_older_version_s_cache_leftovers_are_removed_once_they_are_old(tmp_path, monkeypatch):
    """The caches' temporary files were `NAME.XXXXXXXX.tmp` (mkstemp), before that
    `NAME.PID-THREAD.tmp` (the host cache) and `KEY.json.tmpPID` (the price cache): a server killed
    while it wrote a KV entry left gigabytes there for good. In a cache's own folder those names
    are ours, whatever file they were for: untouched for over an hour, the next write removes them;
    recent ones stay, and so do today's hidden names (another host's, however old)."""
    monkeypatch.setenv("SPECSERVE_HOME", str(tmp_path / "home"))
    folder = prices.cache_dir()
    folder.mkdir(parents=True)
    gone = ["k.json.abcdefgh.tmp", "k.json.tmp4242", "other.json.abcdefgh.tmp", ".other.json.specserve-tmp"]
    kept = ["k.json.zz99zz99.tmp", f".other.json.specserve-elsewhere-{os.getpid()}.abcdefgh.tmp"]
    _made(folder, gone + kept[1:], hours_ago=2)
    _made(folder, kept[:1], hours_ago=0.5)
    prices.save("k", CostModel(((1, 1.0), (2, 1.5), (128, 40.0)), 0.0, True))
    assert sorted(p.name for p in folder.iterdir()) == sorted(["k.json", *kept])

    store = HostStore(tmp_path / "host", "key")  # makes its folder
    gone, kept = [f"{INDEX}.abcdefgh.tmp", f"{INDEX}.4242-1234.tmp"], [f"{INDEX}.zz99zz99.tmp"]
    _made(store.folder, gone, hours_ago=2)
    _made(store.folder, kept, hours_ago=0.5)
    entry = Saved([1, 2], SavedSequence(bytearray(200), 2), 0, None)
    assert store.save([entry]) == 1
    store.close()
    assert {p.name for p in store.folder.iterdir()} >= set(kept) and not {p.name for p in store.folder.iterdir()} & set(
        gone
    )
