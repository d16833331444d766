"""The learner's sandbox: a fresh folder, limits, and (as root) namespaces and a new root.

What the sandbox gives the learner's process, strongest first:

- always: its own temporary folder as the working directory (outside the course
  repository, holding only the reconstructed notebook), a clean environment (no grader
  variables, no ``NBGRADER_EXECUTION``), resource limits (address space, file size,
  processes, no core files, open files), and its standard streams sent nowhere;
- when the grader runs as root and the kernel allows namespaces (``unshare``): no network
  (a new network namespace whose only interface is its own loopback, up: the learner's
  processes can talk to each other on 127.0.0.1 and reach nothing else), its own IPC
  namespace (System V objects of one sandbox are invisible to the next and die with it;
  shared memory is capped at the memory limit), its own PID namespace (it sees
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
import shutil
import signal
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from .cpu import CpuSample, CpuShare, cpu_sample, cpu_share, remove_cgroup
from .isolation import GiB, MiB, baseline_virtual_bytes, isolation, package_paths, read_only_paths
from .processes import claim, draw_uid, kill_namespace, pid_namespace_members, release_uid, unmount

LAUNCHER = Path(__file__).with_name("_launch.py")


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
    tmp: int = 256 * MiB             # the sandbox's /tmp and /dev/shm together
    threads: int | None = None       # torch/OpenMP threads (default: the CPUs / jobs)

    @property
    def check_budget(self) -> float:
        """The time budget of one cell the judge runs (its own code and the learner's calls)."""
        return float(self.check_timeout or 2 * max(self.cell_timeout, self.call_timeout))

    def __post_init__(self):
        for name, value in asdict(self).items():
            if value is not None and (not isinstance(value, (int, float)) or value <= 0):
                raise ValueError(f"limit {name} must be a positive number, got {value!r}")


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
        self._namespace: tuple[str, int] | None = None  # its PID namespace, and the descriptor that holds it
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
            "PYTHONPATH": os.pathsep.join(dict.fromkeys(str(Path(p).parent) for p in package_paths()[:2])),
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

        package, _, *data = package_paths()
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
            # System V shared memory of the sandbox's own IPC namespace, capped at its memory limit.
            "shm_bytes": self.limits.memory if self.isolation.namespaces else None,
        }
        spec_path = self.base / "spec.json"
        spec_path.write_text(json.dumps(spec))
        os.chmod(spec_path, 0o600)
        launch = [sys.executable, "-I", "-S", str(LAUNCHER), str(spec_path), "--", *argv]
        if self.isolation.namespaces:
            return [shutil.which("unshare"), "--net", "--mount", "--pid", "--ipc", "--fork", "--kill-child",
                    "--propagation", "private", *launch]
        return launch

    def chown(self, path: Path) -> None:
        if self.uid is not None:
            os.chown(path, self.uid, self.gid)

    def hold_pid_namespace(self) -> None:
        """Hold the PID namespace of this sandbox's process open until :meth:`remove`. Call
        it once that process is known to run (its kernel has answered). The kernel hands a
        freed namespace's number to the next new one at once, so without the hold a sandbox
        whose processes have died could name, and kill, the namespace of a sandbox started
        since."""
        self._release_pid_namespace()
        try:
            noted = (self.base / "pidns").read_text().strip()
        except OSError:
            return
        for pid in pid_namespace_members(noted):
            try:
                held = os.open(f"/proc/{pid}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            if os.readlink(f"/proc/self/fd/{held}") == noted:
                self._namespace = (noted, held)
                return
            os.close(held)

    def _release_pid_namespace(self) -> None:
        if self._namespace:
            os.close(self._namespace[1])
        self._namespace = None

    def pid_namespace(self) -> str:
        """The PID namespace this sandbox's processes run in, as :meth:`hold_pid_namespace`
        holds it ("" before it is held, or without namespaces). The launcher notes it, as
        root, before it runs anything."""
        return self._namespace[0] if self._namespace else ""

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
        self._release_pid_namespace()
        remove_cgroup(self.cgroup)
        release_uid(self.uid)
        if self.mounted:
            unmount(self.share)
        shutil.rmtree(self.base, ignore_errors=True)


def die_with_parent() -> None:
    """``preexec_fn``: the child is killed when the grader's process dies."""
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
