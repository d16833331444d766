"""``constraints.txt``: the exact version of every package the course installs, on every
platform and Python it supports.

``pyproject.toml`` states the ranges the course supports; ``constraints.txt`` holds the one
set of versions that was tested, for pip's ``-c``. ``make venv`` installs with
``pip install -c constraints.txt -e '.[test]'`` and ``environment.yml`` hands pip the same
file, so a clean clone, CI and Binder all get the same packages.

``make constraints`` writes the file anew with ``python -m coursebuild.constraints``: uv
resolves ``pyproject.toml`` with its test extra once for every platform and every Python of
``requires-python`` (``uv pip compile --universal``), from PyPI alone (no pip or uv
configuration, no local wheels), and writes each package's pin with the environment marker
under which it is needed (``triton==3.7.1 ; sys_platform == 'linux'``, the nvidia packages
of PyPI's CUDA build of torch). A plain resolve on one machine cannot do that: it sees only
that machine's markers, and here a CPU build of torch lies on disk that needs no triton and
no nvidia packages at all. uv keeps the versions already in ``constraints.txt`` wherever they
still fit; ``--upgrade`` takes the newest that fit. With ``--fork-strategy fewest`` uv picks
one version of a package for every Python where one version fits them all.

This module imports only the standard library at the top: ``make constraints`` runs it in a
venv that holds nothing but uv. ``tests/test_resolution.py`` resolves the learner's install
and the test extra for each of :data:`TARGETS` with :func:`target_command`.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILE = ROOT / "constraints.txt"
PYPROJECT = ROOT / "pyproject.toml"
PROJECT = "minillm-course"
# The public index, and nothing else: what a learner's pip sees.
INDEX = "https://pypi.org/simple"
HEADER = """\
# The exact version of every package the course installs, for pip's -c, on every platform
# and Python that pyproject.toml's requires-python allows: a pin with a marker applies only
# where the marker holds (triton and the nvidia packages of PyPI's CUDA build of torch on
# Linux, pywinpty on Windows). Written by `make constraints` (uv pip compile --universal
# against PyPI alone); do not edit by hand. No hashes: the course machines and CI install a
# CPU wheel of torch 2.13.0 from disk, whose hash is not PyPI's. Used by `make venv` and
# environment.yml. docs/platforms.md, "Pinned versions".
"""

# The platforms docs/platforms.md names, as uv's --python-platform, and the values of the environment
# markers there (PEP 508), to tell which pins of constraints.txt apply. macOS: torch 2.13.0's
# wheels are for macOS 14 or newer, and uv assumes 13 unless told (MACOSX_DEPLOYMENT_TARGET).
TARGETS = {
    "linux-x86_64": ("x86_64-unknown-linux-gnu", {
        "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix"}),
    "linux-aarch64": ("aarch64-unknown-linux-gnu", {
        "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "aarch64", "os_name": "posix"}),
    "macos-arm64": ("aarch64-apple-darwin", {
        "sys_platform": "darwin", "platform_system": "Darwin", "platform_machine": "arm64", "os_name": "posix"}),
    "windows-x86_64": ("x86_64-pc-windows-msvc", {
        "sys_platform": "win32", "platform_system": "Windows", "platform_machine": "AMD64", "os_name": "nt"}),
}
MACOS_DEPLOYMENT_TARGET = "14.0"


def requires_python() -> str:
    return tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["requires-python"]


def python_bounds(specifier: str | None = None) -> tuple[str, str]:
    """The lowest and the highest Python of ``requires-python`` (``>=3.11,<3.15``): the
    first release of the lowest minor version, and the highest minor version."""
    specifier = specifier or requires_python()
    parts = specifier.split(",")
    lower = [m for m in (re.fullmatch(r"\s*>=\s*3\.(\d+)(?:\.(\d+))?\s*", s) for s in parts) if m]
    upper = [m for m in (re.fullmatch(r"\s*<\s*3\.(\d+)\s*", s) for s in parts) if m]
    if len(parts) != 2 or len(lower) != 1 or len(upper) != 1:
        raise ValueError(f"requires-python: expected '>=3.X[.Y],<3.Z', got {specifier!r}")
    (lower,), (upper,) = lower, upper
    return f"3.{lower.group(1)}.{lower.group(2) or 0}", f"3.{int(upper.group(1)) - 1}"


def _uv() -> str:
    """The uv binary of this Python's environment (the uv package on PyPI), else one on PATH."""
    try:
        from uv import find_uv_bin
        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if not found:
            raise SystemExit("uv is not installed: pip install uv (it is in the test extra)") from None
        return found


# What every resolve here shares: no configuration (uv.toml, UV_* files, pip.conf are not
# read), PyPI only, metadata only (no source distribution is built: every pinned package has
# wheels), and no Python downloaded for the target version.
COMMON = ("--no-config", "--index-url", INDEX, "--no-build", "--no-python-downloads")


def lock_command(output: Path, upgrade: bool = False) -> list[str]:
    """The ``uv pip compile`` that writes ``output`` (in the repository) for every platform and
    every Python from the lowest of ``requires-python`` on (uv writes ``python_full_version``
    markers where a pin depends on it), run in the repository's folder."""
    lowest, _ = python_bounds()
    return [_uv(), "pip", "compile", *COMMON, "--universal", "--python-version", lowest,
            "--fork-strategy", "fewest", "--quiet", PYPROJECT.name, "--extra", "test", "--no-header",
            "--output-file", str(output.relative_to(ROOT)), *(["--upgrade"] if upgrade else [])]


def target_command(target: str, python: str, constraints: Path, extras: tuple[str, ...] = ()) -> list[str]:
    """The ``uv pip compile`` that resolves the course (with ``extras``) for one of
    :data:`TARGETS` and one Python with ``constraints``, as a learner's pip would there."""
    platform, _ = TARGETS[target]
    return [_uv(), "pip", "compile", *COMMON, "--quiet", "--python-platform", platform, "--python-version", python,
            "-c", str(constraints), str(PYPROJECT), *[a for extra in extras for a in ("--extra", extra)],
            "--no-header", "--no-annotate"]


def read(path: Path = FILE) -> list:
    """The pins of ``constraints.txt`` (``packaging`` Requirements, markers included)."""
    from packaging.requirements import Requirement

    lines = (line.split(" #", 1)[0].strip() for line in path.read_text(encoding="utf-8").splitlines())
    return [Requirement(line) for line in lines if line and not line.startswith("#")]


def declared() -> list:
    """Every requirement ``pyproject.toml`` declares: the dependencies and each extra's."""
    from packaging.requirements import Requirement

    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    lines = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        lines.extend(extra)
    return [Requirement(line) for line in lines]


def main(argv: list[str] | None = None) -> int:
    """Rewrite ``constraints.txt``; ``--upgrade`` moves every pin to the newest that fits."""
    argv = sys.argv[1:] if argv is None else argv
    upgrade = "--upgrade" in argv
    new = FILE.with_name(FILE.name + ".new")
    # uv reads the versions it should keep from the file it writes.
    shutil.copyfile(FILE, new)
    subprocess.run(lock_command(new, upgrade), check=True, cwd=ROOT)
    new.write_text(HEADER + new.read_text(encoding="utf-8"), encoding="utf-8")
    new.replace(FILE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
