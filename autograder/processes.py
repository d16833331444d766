"""The sandboxes' user ids and PID namespaces, and what a killed grader left behind.

A sandbox runs under a user id drawn from :data:`UID_RANGE` that nothing on the machine
uses, in a PID namespace of its own whose processes are killed with it. Each sandbox and
judge folder names the grading process that owns it (:func:`claim`); :func:`sweep_stale`
removes those whose owner is gone, with whatever they left running, and the System V IPC
objects and ``/dev/shm`` files that a sandbox's user id left in the grader's own namespace
(each sandbox has an IPC namespace of its own, so only a killed grader of an older version,
or one without namespaces, leaves any there).
"""
from __future__ import annotations

import grp
import os
import pwd
import random
import shutil
import signal
import tempfile
import time
from pathlib import Path

from .cpu import cpu_share, remove_cgroup
from .isolation import isolation

# The sandboxes' user ids: above the ranges that systems, containers (subordinate ids from
# 100000), systemd (up to 65535) and directory services (SSSD's and winbind's id mapping,
# 200000 to about 2,000,200,000) hand out, below 2**31. Each one drawn is checked to be
# unused (no passwd or group entry, no running process) before it is used.
UID_RANGE = (2_100_000_000, 2_140_000_000)
_uids_in_use: set[int] = set()


def uid_in_use(uid: int) -> bool:
    """Whether ``uid`` names a user or group here (passwd, group, directory services through
    NSS) or owns a running process."""
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(uid)
            return True
        except KeyError:
            pass
        except OverflowError:
            return True
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    return True
            except OSError:
                continue
    return False


def draw_uid(attempts: int = 64) -> int:
    """A user id of :data:`UID_RANGE` that nothing on this machine uses (nor another sandbox
    of this grader)."""
    low, high = UID_RANGE
    for _ in range(attempts):
        uid = random.randrange(low, high)
        if uid not in _uids_in_use and not uid_in_use(uid):
            _uids_in_use.add(uid)
            return uid
    raise RuntimeError(f"no unused user id found in {low}-{high} after {attempts} tries")


def pid_namespace_members(namespace: str) -> list[int]:
    """The processes that run in the PID namespace ``namespace`` (as ``readlink`` of
    ``/proc/PID/ns/pid`` names it: ``pid:[INODE]``), never in the grader's own."""
    if not namespace or namespace == os.readlink("/proc/self/ns/pid"):
        return []
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "ns" / "pid") == namespace:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def kill_namespace(namespace: str) -> None:
    """Kill every process of the PID namespace ``namespace`` (and only those)."""
    for attempt in range(20):
        members = pid_namespace_members(namespace)
        if not members:
            return
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except (OSError, ProcessLookupError):
                continue
        time.sleep(0.05)


def release_uid(uid: int | None) -> None:
    """``uid`` may be drawn again (its sandbox is removed)."""
    _uids_in_use.discard(uid)


def start_time(pid: int) -> str:
    """When process ``pid`` started (clock ticks since boot, from /proc), or "" when it is gone:
    with the pid it names one process, even after the pid is reused."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def claim(folder: Path) -> None:
    """Mark ``folder`` as this process's, so that a later run can sweep it if we are killed."""
    (Path(folder) / ".owner").write_text(f"{os.getpid()} {start_time(os.getpid())}")


def sweep_stale(parent: Path | None = None) -> list[Path]:
    """Remove the sandbox and judge folders of grading processes that no longer exist."""
    parent = Path(parent or tempfile.gettempdir())
    removed = []
    for folder in list(parent.glob("mg-*")) + list(parent.glob("mj-*")):
        try:
            pid, started = (folder / ".owner").read_text().split()
        except (OSError, ValueError):
            continue
        if start_time(int(pid)) != started:
            _kill_processes_mentioning(folder)
            try:
                kill_namespace((folder / "pidns").read_text().strip())
            except OSError:
                pass
            share = cpu_share() if isolation().namespaces else None
            if share is not None and share.parent:
                remove_cgroup(str(Path(share.parent) / folder.name))
            if os.path.ismount(folder / "share"):
                unmount(folder / "share")
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    sweep_shared_memory()
    return removed


def _sandbox_uid(uid: int) -> bool:
    """Whether ``uid`` is a sandbox's user id that nothing runs as now."""
    return UID_RANGE[0] <= uid < UID_RANGE[1] and not uid_in_use(uid)


def sweep_shared_memory() -> None:
    """Remove the System V segments, semaphores and message queues (in the grader's own IPC
    namespace) and the ``/dev/shm`` entries that belong to a sandbox's user id no process runs as."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    ipc_rmid = 0
    remove = {"shm": lambda i: libc.shmctl(i, ipc_rmid, None), "sem": lambda i: libc.semctl(i, 0, ipc_rmid),
              "msg": lambda i: libc.msgctl(i, ipc_rmid, None)}
    for kind, rmid in remove.items():
        try:
            header, *rows = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()
        except OSError:
            continue
        columns = header.split()
        for row in rows:
            entry = dict(zip(columns, row.split()))
            if any(_sandbox_uid(int(entry[field])) for field in ("uid", "cuid")):
                rmid(int(entry[columns[1]]))  # the id column: shmid, semid or msqid
    shm = Path("/dev/shm")
    for entry in shm.iterdir() if shm.is_dir() else ():
        try:
            if not _sandbox_uid(entry.lstat().st_uid):
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink()
        except OSError:
            continue


def _kill_processes_mentioning(folder: Path) -> None:
    """Kill what a killed grader left running in ``folder`` (a kernel that changed user loses
    its parent-death signal, so it can outlive the grader)."""
    needle = str(folder).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "cmdline").read_bytes():
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            continue


def unmount(path: Path) -> None:
    import ctypes

    ctypes.CDLL(None, use_errno=True).umount2(str(path).encode(), 2)  # MNT_DETACH
