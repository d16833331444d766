"""``constraints.txt``: the exact version of every package the course installs.

``pyproject.toml`` states the ranges the course supports; ``constraints.txt`` holds the one
set of versions that was tested, for pip's ``-c``. ``make venv`` installs with
``pip install -c constraints.txt -e '.[test]'`` and ``environment.yml`` hands pip the same
file, so a clean clone, CI and Binder all get the same packages.

``make constraints`` writes the file anew: it resolves ``pyproject.toml`` in a fresh venv and
runs ``python -m coursebuild.constraints`` there, which prints the pins of what that Python
has installed.
"""
from __future__ import annotations

import subprocess
import sys
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from . import paths

FILE = paths.ROOT / "constraints.txt"
PROJECT = "minillm-course"
# The installer is not a dependency: `pip freeze --all` lists it (and setuptools, which
# torch needs at run time, so that one stays).
INSTALLER = "pip"
HEADER = """\
# The exact version of every package the course installs, for pip's -c. Written by
# `make constraints` from a fresh resolve of pyproject.toml's ranges; do not edit by hand.
# Used by `make venv` and environment.yml. README.md, "Pinned versions".
"""


def declared() -> list[Requirement]:
    """Every requirement ``pyproject.toml`` declares: the dependencies and each extra's."""
    project = tomllib.loads((paths.ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    lines = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        lines.extend(extra)
    return [Requirement(line) for line in lines]


def pins(frozen: list[str], requirements: list[Requirement]) -> list[str]:
    """``constraints.txt`` lines for the lines of ``pip freeze --all --exclude-editable``.

    A local version label is dropped (``torch==2.13.0+cpu`` → ``torch==2.13.0``), so that a
    CUDA build of the same release satisfies the pin; a package that ``requirements``
    declares with an environment marker keeps that marker (Triton exists for Linux x86_64
    only). The installer and the course itself are left out.
    """
    markers = {canonicalize_name(r.name): r.marker for r in requirements if r.marker is not None}
    lines = []
    for line in frozen:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        if not sep:
            raise ValueError(f"frozen: expected NAME==VERSION lines from pip freeze, got {line!r}")
        key = canonicalize_name(name)
        if key in (INSTALLER, PROJECT):
            continue
        pin = f"{name}=={Version(version).public}"
        if key in markers:
            pin += f"; {markers[key]}"
        lines.append(pin)
    return lines


def read(path=FILE) -> list[Requirement]:
    """The pins of ``constraints.txt``."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]


def main() -> int:
    """Print ``constraints.txt`` for what this Python has installed."""
    frozen = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--all", "--exclude-editable"],
        check=True, capture_output=True, text=True,
    ).stdout.splitlines()
    sys.stdout.write(HEADER + "\n".join(pins(frozen, declared())) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
