"""The reaper of the local Ray cluster that `specserve serve --ray` starts: once the command's
process is gone, however it ended (SIGKILL included), every process of its cluster ends too.

Ray ends its GCS and raylet with the process that started them, but the raylet's dashboard and
runtime-env agents, told their raylet died, hung in their exit for about a minute (Ray's GCS
reconnect timeout), holding ~230 MB and their ports: a cluster started meanwhile found port
52365 taken and ran its dashboard agent without its HTTP service.

How: `start()` puts a marker in the command's environment before Ray starts, so every process of
the cluster inherits it (the raylet's agents and workers too), and starts this file as a small
process of its own session (a terminal's Ctrl-C or hang-up does not reach it). It waits on a pipe
whose only write end the command holds, so the pipe closes when the command's process ends, and
meanwhile notes every SCAN_S seconds the processes under the command and those with the marker
(with their start times: a pid used again later is another process). Once the command is gone it
SIGTERMs those still running, and the marked ones, and SIGKILLs those still there after a grace.
Another command's cluster has another marker, and processes of its own, and is never touched.

Run as a script, `python -I ray_reaper.py MARKER FD`: it imports only the standard library.
"""

from __future__ import annotations

import os
import secrets
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

ENV = "SPECSERVE_RAY_CLUSTER"  # the marker's variable: ENV=<command pid>-<random>
TERM_GRACE_S = 3.0  # SIGTERM, then SIGKILL for those still running
GIVE_UP_S = 15.0  # the reaper ends even if some process keeps coming back
SCAN_S = 2.0  # how often the reaper notes the cluster's processes while the command runs
_write_end: int | None = None  # held (never closed) by the command for as long as it runs
reaper_pid: int | None = None  # the command's reaper (the command's own clean stop leaves it be)


def start() -> str:
    """Start the reaper of this process's cluster and mark this process's environment (so call it
    before ray.init starts the cluster); returns the marker."""
    global _write_end, reaper_pid
    marker = f"{os.getpid()}-{secrets.token_hex(8)}"
    read_end, _write_end = os.pipe()  # not inherited by Ray's processes (O_CLOEXEC), so only we hold it
    reaper_pid = subprocess.Popen(
        [sys.executable, "-I", str(Path(__file__).resolve()), marker, str(read_end)],
        pass_fds=(read_end,),
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        env={k: v for k, v in os.environ.items() if k != ENV},
    ).pid
    os.close(read_end)
    os.environ[ENV] = marker
    return marker


def marked(marker: str) -> set[int]:
    """The running processes whose environment carries the marker (ours; zombies have none)."""
    needle = f"\0{ENV}={marker}\0".encode()
    found = set()
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if needle in b"\0" + environ.read_bytes():
                found.add(int(environ.parent.name))
        except (OSError, ValueError):  # gone meanwhile, or not ours to read
            continue
    found.discard(os.getpid())
    return found


def started(pid: int) -> str | None:
    """pid's start time (/proc/PID/stat field 22); None when it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]


def descendants(pid: int) -> set[int]:
    """The processes under pid, read from /proc (none where there is no /proc); the command's own
    stop sweeps them with it too (ray_serve._cluster_processes)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            children.setdefault(int(stat.read_text().rsplit(") ", 1)[1].split()[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def note(known: dict[int, str], command: int, marker: str) -> None:
    """Add the processes under the command and the marked ones to known (pid: start time)."""
    for pid in (descendants(command) | marked(marker)) - {os.getpid()}:
        if (when := started(pid)) is not None:
            known.setdefault(pid, when)


def reap(marker: str, known: dict[int, str]) -> None:
    """SIGTERM the cluster's processes (known ones still running, and marked ones), SIGKILL those
    still running after TERM_GRACE_S."""
    began = time.monotonic()
    while True:
        pids = marked(marker) | {pid for pid, when in known.items() if started(pid) == when}
        if not pids or time.monotonic() - began >= GIVE_UP_S:
            return
        sig = signal.SIGTERM if time.monotonic() - began < TERM_GRACE_S else signal.SIGKILL
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        time.sleep(0.2)


def main(argv: list[str]) -> None:
    """Note the cluster's processes until the command ends (EOF on the pipe), then end them."""
    marker, read_end, command = argv[1], int(argv[2]), os.getppid()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # outlive whatever ends the command's process group
    known: dict[int, str] = {}
    while True:
        note(known, command, marker)
        if select.select([read_end], [], [], SCAN_S)[0] and not os.read(read_end, 1):
            break
    reap(marker, known)


if __name__ == "__main__":
    main(sys.argv)
