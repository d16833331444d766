"""The learner's sandbox: a fresh folder, limits, and (as root) namespaces and a new root.

What the sandbox gives the learner's process, strongest first:

- always: its own temporary folder as the working directory (outside the course
  repository, holding only the reconstructed notebook), a clean environment (no grader
  variables, no ``NBGRADER_EXECUTION``), resource limits (address space, file size,
  processes, no core files, open files), and its standard streams sent nowhere;
- when the grader runs as root and the kernel allows namespaces (``unshare``): no network
  (a new network namespace whose only interface is its own loopback, up: the learner's
  processes can talk to each other on 127.0.0.1 and reach nothing else), its own PID namespace (it sees
  only its own processes, and all of them die with it), a new root file system holding
  only the system, the Python installation, the course package (as the graded chapter's
  view of it, `autograder.view`) and data and the sandbox
  folder (no solutions, hidden tests, gradebook, other submissions or results), and an
  unprivileged user id of its own.

Where the stronger isolation is not available the grader says so with a flag in every
result (``no-network-isolation``, ``no-filesystem-isolation``).
"""
from __future__ import annotations

import json
import os
import pwd
import grp
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

LAUNCHER = Path(__file__).with_name("_launch.py")
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/sys")
GiB, MiB = 2**30, 2**20
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


@dataclass
class Limits:
    """Limits on one learner's notebook. Times in seconds, sizes in bytes."""

    cell_timeout: float = 60.0       # one cell of the learner's notebook
    notebook_timeout: float = 300.0  # the whole notebook
    call_timeout: float = 60.0       # one call from a check into the learner's code
    check_timeout: float | None = None  # one check cell in the judge, its calls included (default: 2 calls' worth)
    memory: int = 3 * GiB            # address space allowed above what the kernel maps at start
    file_size: int = 64 * MiB        # largest file the learner's code may write
    processes: int = 256             # processes and threads of the learner's user
    output: int = 2 * MiB            # notebook output kept (text and images); the rest is dropped
    tmp: int = 256 * MiB             # the sandbox's /tmp and /dev/shm
    threads: int | None = None       # torch/OpenMP threads (default: the CPUs / jobs)

    @property
    def check_budget(self) -> float:
        """The time budget of one cell the judge runs (its own code and the learner's calls)."""
        return float(self.check_timeout or 2 * max(self.cell_timeout, self.call_timeout))

    def __post_init__(self):
        for name, value in asdict(self).items():
            if value is not None and (not isinstance(value, (int, float)) or value <= 0):
                raise ValueError(f"limit {name} must be a positive number, got {value!r}")


@dataclass
class Isolation:
    """What this machine lets the sandbox do."""

    namespaces: bool
    reason: str = ""

    @property
    def flags(self) -> list[dict]:
        if self.namespaces:
            return []
        detail = f"the learner's code ran without {{}} ({self.reason})"
        return [{"kind": "no-network-isolation", "detail": detail.format("network isolation")},
                {"kind": "no-filesystem-isolation", "detail": detail.format("a separate root file system")}]

    def statement(self, own_work: bool) -> str:
        """One plain sentence on what isolation the notebooks get here ("" when they get it all).
        ``own_work``: a learner checking their own notebook, who needs no isolation from themselves."""
        if self.namespaces:
            return ""
        if own_work:
            return (f"Your notebook runs as you, with time and memory limits but without the grader's sandbox "
                    f"({self.reason}). A self-check needs none: it runs only your own code, on your own machine.")
        return (f"isolation: none ({self.reason}): each notebook runs as this user, with time, memory and process "
                "limits only, and can read what this user can read and reach the network. Grade as root on a "
                "machine that allows namespaces (unshare) to isolate submissions.")


@lru_cache(maxsize=1)
def isolation() -> Isolation:
    """Probe once whether namespaces work here (they need root)."""
    if os.environ.get("MINILLM_GRADER_NO_NAMESPACES"):
        return Isolation(False, "turned off by MINILLM_GRADER_NO_NAMESPACES")
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return Isolation(False, "the grader does not run as root")
    unshare = shutil.which("unshare")
    if unshare is None:
        return Isolation(False, "the unshare command is missing")
    try:
        probe = subprocess.run([unshare, "--net", "--mount", "--pid", "--fork", "--kill-child",
                                "--propagation", "private", "true"], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as error:
        return Isolation(False, f"unshare failed: {error}")
    if probe.returncode != 0:
        return Isolation(False, f"unshare failed: {probe.stderr.decode(errors='replace').strip()[:200]}")
    return Isolation(True)


# ----------------------------------------------------------------------- CPU share
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


def _measure_script() -> str:
    return (
        "import re, threading\n"
        "import torch, numpy, matplotlib.pyplot, ipykernel.kernelapp, safetensors.torch\n"
        "torch.randn(64, 64) @ torch.randn(64, 64)\n"
        "print(int(re.search(r'VmPeak:\\s+(\\d+)', open('/proc/self/status').read()).group(1)) * 1024)\n"
    )


@lru_cache(maxsize=1)
def baseline_virtual_bytes() -> int:
    """Address space a kernel maps once torch and friends are imported (measured once).

    ``import torch`` maps far more address space than it uses, so ``RLIMIT_AS`` must sit
    above this, with the memory the learner may use on top. The measurement is cached on
    disk per Python and torch installation.
    """
    cache = Path(tempfile.gettempdir()) / f"minillm-grader-vm-{abs(hash((sys.executable, _torch_version())))}.json"
    try:
        return int(json.loads(cache.read_text())["bytes"])
    except (OSError, ValueError, KeyError):
        pass
    run = subprocess.run([sys.executable, "-c", _measure_script()], capture_output=True, text=True,
                         env={**os.environ, "MALLOC_ARENA_MAX": "2"}, timeout=300)
    measured = int(run.stdout.strip().splitlines()[-1]) if run.returncode == 0 else 2 * GiB
    # ipykernel adds threads (each with a stack) and sockets: leave room for them.
    measured += 512 * MiB
    try:
        cache.write_text(json.dumps({"bytes": measured}))
    except OSError:
        pass
    return measured


def _torch_version() -> str:
    try:
        from importlib.metadata import version
        return version("torch")
    except Exception:
        return "?"


def _package_paths() -> list[str]:
    """The course package, the notebook runtime and the data, wherever they are installed."""
    import course_runtime
    import minillm

    package = Path(minillm.__file__).resolve().parent
    paths = [str(package), str(Path(course_runtime.__file__).resolve().parent)]
    data = package.parent / "data"
    try:
        from minillm import data as data_module
        data = Path(data_module.data_dir())
    except Exception:
        pass
    if data.exists():
        paths.append(str(data.resolve()))
    return paths


def read_only_paths() -> list[str]:
    """What the sandbox's root holds besides its own folder."""
    paths = [p for p in SYSTEM_PATHS if os.path.lexists(p)]
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}:
        resolved = str(Path(prefix).resolve())
        for candidate in {prefix, resolved}:
            if not any(candidate == p or candidate.startswith(p + "/") for p in paths):
                paths.append(candidate)
    for path in _package_paths():
        if not any(path == p or path.startswith(p + "/") for p in paths):
            paths.append(path)
    return paths


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
    return removed


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


class Sandbox:
    """One learner's sandbox: its folders, its user, its limits and how to start in it.

    Layout (``base`` is root's, ``share`` is what the learner's process sees)::

        base/spec.json           the launcher's instructions (root only)
        base/rootfs/             mount point of the new root
        base/share/work/         the learner's working directory (the notebook lives here)
        base/share/req/          call requests (written by the grader only)
        base/share/rep/          call replies (written by the learner's process)
        base/share/kernel/       the kernel's connection file and sockets
    """

    def __init__(self, limits: Limits, *, jobs: int = 1, parent: Path | None = None):
        self.limits = limits
        self.jobs = jobs
        self.isolation = isolation()
        self.base = Path(tempfile.mkdtemp(prefix="mg-", dir=parent))
        os.chmod(self.base, 0o711)
        claim(self.base)
        self.share = self.base / "share"
        self.work, self.req, self.rep, self.kernel_dir = (self.share / n for n in ("work", "req", "rep", "kernel"))
        self.share.mkdir(mode=0o755)
        (self.base / "rootfs").mkdir(mode=0o700)
        self.mounted = False
        if self.isolation.namespaces:
            # Everything the learner's process can write lies on a size-limited tmpfs.
            from ._launch import MS_NODEV, MS_NOSUID, mount

            mount("tmpfs", self.share, "tmpfs", MS_NOSUID | MS_NODEV,
                  f"size={limits.tmp},nr_inodes=20000,mode=755")
            self.mounted = True
        for folder in (self.work, self.req, self.rep, self.kernel_dir):
            folder.mkdir(mode=0o755 if folder == self.req else 0o700)
        self.uid = self.gid = None
        self.overlays: list[tuple[str, str]] = []
        self.pid = None  # the kernel's process, set by whoever starts it
        self.share_kind = cpu_share() if self.isolation.namespaces and jobs > 1 else CpuShare("none", reason="one job")
        self.cgroup = ""
        if self.share_kind.kind != "none":
            try:
                self.cgroup = self.share_kind.create(self.base.name)
            except OSError as error:
                self.share_kind = CpuShare("none", reason=f"the sandbox's cgroup could not be made ({error})")
        if self.isolation.namespaces:
            self.uid = self.gid = draw_uid()
            for folder in (self.work, self.rep, self.kernel_dir):
                os.chown(folder, self.uid, self.gid)
        threads = limits.threads or max(1, (os.cpu_count() or 1) // max(1, jobs))
        self.env = {
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"]),
            "HOME": str(self.work),
            "LANG": "C.UTF-8",
            "TMPDIR": "/tmp" if self.isolation.namespaces else str(self.work),
            "COURSE_QUICK": "1",
            "MPLCONFIGDIR": str(self.work / ".matplotlib"),
            "IPYTHONDIR": str(self.work / ".ipython"),
            "JUPYTER_CONFIG_DIR": str(self.work / ".jupyter"),
            "JUPYTER_DATA_DIR": str(self.work / ".jupyter"),
            "MALLOC_ARENA_MAX": "2",
            "OMP_NUM_THREADS": str(threads),
            "MKL_NUM_THREADS": str(threads),
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONNOUSERSITE": "1",
            "PYDEVD_DISABLE_FILE_VALIDATION": "1",
            # The learner's kernel imports the very minillm (and notebook runtime) the grader
            # bound into the sandbox, however the course was installed (a clone, a student
            # bundle, PYTHONPATH).
            "PYTHONPATH": os.pathsep.join(dict.fromkeys(str(Path(p).parent) for p in _package_paths()[:2])),
        }
        self._seed_matplotlib_cache()

    def show_package_view(self, chapter, answers: dict[str, str], references: frozenset[str] = frozenset()) -> None:
        """Lay the package as :mod:`autograder.view` builds it for grading ``chapter`` (its
        ``answers`` exported, its ``references`` shown) over the real package, so the real
        files are out of the learner's reach. Without namespaces there is no private root to
        lay it in (``no-filesystem-isolation``): the view then comes first on the kernel's
        path instead, so that the package's own code still runs the answers it exports. A
        self-check without namespaces (the learner's own machine) keeps the learner's own
        package."""
        from . import view

        package, _, *data = _package_paths()
        if self.isolation.namespaces:
            self.overlays = [(str(view.write(chapter, Path(package), self.base / "view", answers, references)), package)]
        elif not chapter.release:
            view.write(chapter, Path(package), self.base / "view", answers, references)
            self.env["PYTHONPATH"] = os.pathsep.join([str(self.base / "view"), self.env["PYTHONPATH"]])
            if data:
                self.env["MINILLM_DATA"] = data[0]

    def _seed_matplotlib_cache(self) -> None:
        """Copy the grader's matplotlib font list, so each sandbox need not rebuild it (seconds)."""
        try:
            import matplotlib
            cache = Path(matplotlib.get_cachedir())
        except Exception:
            return
        target = self.work / ".matplotlib"
        target.mkdir(exist_ok=True)
        for font_list in cache.glob("fontlist-*.json"):
            shutil.copyfile(font_list, target / font_list.name)
        if self.uid is not None:
            for path in [target, *target.iterdir()]:
                os.chown(path, self.uid, self.gid)

    def rlimits(self) -> dict:
        limits = self.limits
        return {
            "AS": baseline_virtual_bytes() + limits.memory,
            "FSIZE": limits.file_size,
            "NPROC": limits.processes if self.uid is not None else None,
            "CORE": 0,
            "NOFILE": 1024,
        }

    def command(self, argv: list[str], *, connection_file: str | None = None) -> list[str]:
        """``argv`` wrapped so that it starts inside this sandbox."""
        spec = {
            "uid": self.uid, "gid": self.gid, "cwd": str(self.work), "env": self.env,
            "rlimits": self.rlimits(), "connection_file": connection_file,
            "isolate_files": self.isolation.namespaces, "loopback": self.isolation.namespaces, "root": str(self.base / "rootfs"),
            "read_only": read_only_paths(), "overlays": self.overlays, "writable": [str(self.share)], "tmp_bytes": self.limits.tmp,
            "pidns_file": str(self.base / "pidns") if self.isolation.namespaces else None,
            "cgroup": self.cgroup or None,
        }
        spec_path = self.base / "spec.json"
        spec_path.write_text(json.dumps(spec))
        os.chmod(spec_path, 0o600)
        launch = [sys.executable, "-I", "-S", str(LAUNCHER), str(spec_path), "--", *argv]
        if self.isolation.namespaces:
            return [shutil.which("unshare"), "--net", "--mount", "--pid", "--fork", "--kill-child",
                    "--propagation", "private", *launch]
        return launch

    def chown(self, path: Path) -> None:
        if self.uid is not None:
            os.chown(path, self.uid, self.gid)

    def pid_namespace(self) -> str:
        """The PID namespace this sandbox's processes run in ("" before they start, or
        without namespaces): the launcher notes it, as root, before it runs anything."""
        try:
            return (self.base / "pidns").read_text().strip()
        except OSError:
            return ""

    def pids(self) -> list[int]:
        """The sandbox's processes: its PID namespace's, or else the kernel's own."""
        members = pid_namespace_members(self.pid_namespace())
        return members or ([self.pid] if self.pid else [])

    def cpu_sample(self) -> CpuSample:
        return cpu_sample(self.pids())

    @property
    def flags(self) -> list[dict]:
        flags = list(self.isolation.flags)
        if self.jobs > 1 and not self.cgroup:
            flags.append({"kind": "no-cpu-share", "detail": "sandboxes graded at once shared the CPUs without a "
                          f"cgroup each (per thread: more threads, more CPU): {self.share_kind.reason}"})
        return flags

    def kill_all(self) -> None:
        """Kill every process of this sandbox: those in its PID namespace, and no other
        (another process of the same user id is not this sandbox's). Without namespaces the
        kernel's process group is killed by its manager, and nothing more is done here."""
        kill_namespace(self.pid_namespace())

    def remove(self) -> None:
        self.kill_all()
        remove_cgroup(self.cgroup)
        _uids_in_use.discard(self.uid)
        if self.mounted:
            unmount(self.share)
        shutil.rmtree(self.base, ignore_errors=True)


def unmount(path: Path) -> None:
    import ctypes

    ctypes.CDLL(None, use_errno=True).umount2(str(path).encode(), 2)  # MNT_DETACH


def die_with_parent() -> None:
    """``preexec_fn``: the child is killed when the grader's process dies."""
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
