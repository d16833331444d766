"""How sandboxes graded at once share the CPUs, and what a CPU did while a limit ran out.

Each sandbox gets a cgroup of equal weight when the grader runs as root on a machine that
offers one (cgroup v2's ``cpu.weight``, else v1's ``cpu.shares``); otherwise the kernel's
scheduler shares per thread. :func:`load_note` tells a limit that fired because the machine
was busy from one the learner's own code ran into.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

CGROUP_PARENT = "minillm-grader"
CPU_WEIGHT = 100      # cgroup v2's default weight: every sandbox the same
CPU_SHARES = 1024     # cgroup v1's default shares: every sandbox the same


def _mount_of(path: str) -> tuple[str, str] | None:
    """(file system type, options) of the mount at ``path``, from /proc/self/mountinfo."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    found = None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and len(tail) >= 3 and fields[4] == path:
            found = (tail[0], tail[2] + "," + (fields[5] if len(fields) > 5 else ""))
    return found


@dataclass
class CpuShare:
    """How sandboxes share the CPUs: ``kind`` is ``cgroup2`` (``cpu.weight``), ``cgroup1``
    (``cpu.shares``) or ``none`` (the kernel's scheduler shares per thread: a sandbox running
    more threads gets more), with the reason when there is no cgroup."""

    kind: str
    parent: str = ""
    reason: str = ""

    def create(self, name: str) -> str:
        """A child cgroup of equal weight for one sandbox ("" when there is none)."""
        if self.kind == "none":
            return ""
        folder = Path(self.parent) / name
        folder.mkdir(exist_ok=True)
        if self.kind == "cgroup2":
            (folder / "cpu.weight").write_text(str(CPU_WEIGHT))
        else:
            (folder / "cpu.shares").write_text(str(CPU_SHARES))
        return str(folder)


@lru_cache(maxsize=1)
def cpu_share() -> CpuShare:
    """Probe once: cgroup v2 at /sys/fs/cgroup when it is writable and offers the ``cpu``
    controller, else cgroup v1's ``cpu`` hierarchy, else none."""
    if os.environ.get("MINILLM_GRADER_NO_NAMESPACES") or not hasattr(os, "geteuid") or os.geteuid() != 0:
        return CpuShare("none", reason="the grader does not run as root with namespaces")
    reasons = []
    mount = _mount_of("/sys/fs/cgroup")
    if mount and mount[0] == "cgroup2":
        root = Path("/sys/fs/cgroup")
        try:
            if "cpu" not in (root / "cgroup.controllers").read_text().split():
                raise OSError("the cpu controller is not offered")
            parent = root / CGROUP_PARENT
            (root / "cgroup.subtree_control").write_text("+cpu")
            parent.mkdir(exist_ok=True)
            (parent / "cgroup.subtree_control").write_text("+cpu")
            CpuShare("cgroup2", str(parent)).create("probe")
            (parent / "probe").rmdir()
            return CpuShare("cgroup2", str(parent))
        except OSError as error:
            reasons.append(f"cgroup v2 at /sys/fs/cgroup is not usable ({error})")
    else:
        reasons.append("/sys/fs/cgroup is not cgroup v2")
    for candidate in ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"):
        mount = _mount_of(candidate)
        if mount and mount[0] == "cgroup" and "cpu" in mount[1].split(","):
            try:
                parent = Path(candidate) / CGROUP_PARENT
                parent.mkdir(exist_ok=True)
                CpuShare("cgroup1", str(parent)).create("probe")
                (parent / "probe").rmdir()
                return CpuShare("cgroup1", str(parent))
            except OSError as error:
                reasons.append(f"cgroup v1 at {candidate} is not usable ({error})")
    return CpuShare("none", reason="; ".join(reasons) or "no cgroup")


def remove_cgroup(folder: str) -> None:
    if not folder:
        return
    for attempt in range(40):
        try:
            os.rmdir(folder)
            return
        except FileNotFoundError:
            return
        except OSError:  # still busy: its last processes are being reaped
            time.sleep(0.05)


@dataclass
class CpuSample:
    """Wall clock, and the CPU time the sandbox's threads got and spent waiting for a CPU
    (run-queue delay, from /proc/PID/task/TID/schedstat), in seconds."""

    wall: float
    on_cpu: float
    waiting: float


def cpu_sample(pids) -> CpuSample:
    on_cpu = waiting = 0
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/schedstat") as stream:
                    fields = stream.read().split()
                on_cpu += int(fields[0])
                waiting += int(fields[1])
            except (OSError, ValueError, IndexError):
                continue
    return CpuSample(time.monotonic(), on_cpu / 1e9, waiting / 1e9)


# Waiting for a CPU for a quarter of the wall time or more means the machine was loaded.
UNDER_LOAD_WAITING = 0.25


def load_note(start: CpuSample | None, end: CpuSample | None) -> tuple[str, bool]:
    """What the CPU did while a wall-clock limit ran out, and whether it fired under load
    (the learner's code was ready to run but waited for a CPU) rather than because of the
    learner's own code (busy on its CPU, or waiting on a sleep or a lock)."""
    if start is None or end is None or end.wall <= start.wall:
        return "", False
    wall = end.wall - start.wall
    got = max(0.0, end.on_cpu - start.on_cpu) / wall
    waited = max(0.0, end.waiting - start.waiting) / wall
    if waited >= UNDER_LOAD_WAITING:
        return (f"limit fired under load: the kernel got {got:.0%} of a core and waited for a CPU "
                f"{waited:.0%} of the time (the machine was busy: grade again with fewer --jobs)"), True
    if got >= 0.5:
        return f"the kernel got {got:.0%} of a core and hardly waited for one: its own code kept it busy", False
    return (f"the kernel got {got:.0%} of a core and hardly waited for one: it was waiting on something "
            "(a sleep, a lock, input)"), False
