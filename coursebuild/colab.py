"""Colab: the set-up cell every chapter opens with, and the install it runs.

The build puts :func:`cell_source` before the first code cell of every notebook. In Colab
the cell clones the repository (its address is ``[project.urls] Repository`` in
pyproject.toml, the one place it is written) and runs this file from the clone, as a
script; while that address is a placeholder, it says so and stops. Anywhere else the cell
does nothing.

As a script this file uses the standard library only (nothing of the course is installed
yet). It installs the course in editable mode without its dependencies, then every
dependency except torch and Triton: Colab's own torch build (with CUDA) is kept, where
the course's pin would replace it with a CPU wheel.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

CLONE = "/content/minillm-course"  # Colab's working folder is /content
KEEP = ("torch", "triton")  # the runtime's own builds


def repository(root: Path | None = None) -> str:
    """The repository's address, from pyproject.toml."""
    root = root or Path(__file__).resolve().parent.parent
    with open(root / "pyproject.toml", "rb") as file:
        return tomllib.load(file)["project"]["urls"]["Repository"]


def published(root: Path | None = None) -> bool:
    """Whether the repository has a real address yet (not the placeholder of an unpublished one)."""
    return "PLACEHOLDER" not in repository(root)


UNPUBLISHED = ("this copy of the course names no repository that Colab could fetch: pyproject.toml's "
               "[project.urls] Repository is still a placeholder. Run the course on your own machine "
               "(README.md, Start: make lab), or set that address and rebuild the notebooks (make build).")


def cell_source(root: Path | None = None) -> str:
    """The set-up cell: a no-op except in Colab. While the repository's address is the
    placeholder, in Colab it stops with :data:`UNPUBLISHED` rather than clone nothing."""
    head = ("# Colab: fetch and install the course in this runtime. Anywhere else this cell does nothing.\n"
            "import sys\n"
            "if \"google.colab\" in sys.modules:\n")
    if not published(root):
        return head + f"    raise RuntimeError({json.dumps(UNPUBLISHED)})"
    clone, script, url = json.dumps(CLONE), json.dumps(f"{CLONE}/coursebuild/colab.py"), json.dumps(repository(root))
    return head + (
        "    import os, subprocess\n"
        f"    if not os.path.isdir({clone}):\n"
        f"        subprocess.run([\"git\", \"clone\", \"--depth\", \"1\", {url}, {clone}], check=True)\n"
        f"    subprocess.run([sys.executable, {script}], check=True)\n"
        f"    sys.path.insert(0, {clone})"
    )


def requirements(root: Path) -> list[str]:
    """The course's dependencies, less the packages the runtime keeps its own builds of."""
    with open(root / "pyproject.toml", "rb") as file:
        dependencies = tomllib.load(file)["project"]["dependencies"]
    return [d for d in dependencies if not any(d.split(";")[0].strip().startswith(k) for k in KEEP)]


def install(root: Path) -> None:
    """Install the course at ``root`` into this Python, keeping its torch."""
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run(pip + ["--no-deps", "-e", str(root)], check=True)
    subprocess.run(pip + requirements(root), check=True)


if __name__ == "__main__":
    install(Path(__file__).resolve().parent.parent)
