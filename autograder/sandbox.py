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
  only the system, the Python installation, the course package and data and the sandbox
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
    memory: int = 3 * GiB            # address space allowed above what the kernel maps at start
    file_size: int = 64 * MiB        # largest file the learner's code may write
    processes: int = 256             # processes and threads of the learner's user
    output: int = 2 * MiB            # notebook output kept (text and images); the rest is dropped
    tmp: int = 256 * MiB             # the sandbox's /tmp and /dev/shm
    threads: int | None = None       # torch/OpenMP threads (default: the CPUs / jobs)

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
    """The course package and its data, wherever they are installed."""
    import minillm

    package = Path(minillm.__file__).resolve().parent
    paths = [str(package)]
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
        }
        self._seed_matplotlib_cache()

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
            "read_only": read_only_paths(), "writable": [str(self.share)], "tmp_bytes": self.limits.tmp,
            "pidns_file": str(self.base / "pidns") if self.isolation.namespaces else None,
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

    def kill_all(self) -> None:
        """Kill every process of this sandbox: those in its PID namespace, and no other
        (another process of the same user id is not this sandbox's). Without namespaces the
        kernel's process group is killed by its manager, and nothing more is done here."""
        kill_namespace(self.pid_namespace())

    def remove(self) -> None:
        self.kill_all()
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
