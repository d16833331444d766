"""What this machine lets the sandbox do, and what the sandbox's root holds.

:func:`isolation` probes once whether namespaces work (they need root and ``unshare``);
:func:`read_only_paths` lists the system, the Python installation, the course package, the
notebook runtime and the data, which are all the sandbox's new root shows besides its own
folder; :func:`baseline_virtual_bytes` is the address space a kernel maps before the
learner's code runs, above which the memory limit sits.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/sys")
GiB, MiB = 2**30, 2**20


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
    disk per Python and torch installation, in the user's own cache folder: a file that
    another user could write would set the learner's memory limit.
    """
    key = hashlib.sha256(f"{sys.executable}\0{_torch_version()}".encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "minillm" / f"grader-vm-{key}.json"
    try:
        if cache.stat().st_uid == os.geteuid() and not cache.stat().st_mode & 0o022:
            return int(json.loads(cache.read_text())["bytes"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    run = subprocess.run([sys.executable, "-c", _measure_script()], capture_output=True, text=True,
                         env={**os.environ, "MALLOC_ARENA_MAX": "2"}, timeout=300)
    measured = int(run.stdout.strip().splitlines()[-1]) if run.returncode == 0 else 2 * GiB
    # ipykernel adds threads (each with a stack) and sockets: leave room for them.
    measured += 512 * MiB
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        partial = cache.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps({"bytes": measured}))
        partial.replace(cache)
    except OSError:
        pass
    return measured


def _torch_version() -> str:
    try:
        from importlib.metadata import version
        return version("torch")
    except Exception:
        return "?"


def package_paths() -> list[str]:
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
    for path in package_paths():
        if not any(path == p or path.startswith(p + "/") for p in paths):
            paths.append(path)
    return paths
