"""``python -m autograder lab [--work FOLDER] [--prepare-only] [JUPYTER_ARGS...]``: the learner's lab.

Every route a learner takes opens the same lab: `make lab`, a student bundle's `make lab`,
the conda route and Binder's ``start`` script. The course's learner notebooks
(``chapters/``) are copied into the learner's own folder (default ``./work``), never over a
file already there, so answers survive a ``git pull`` and tracked files are never edited.
JupyterLab then runs rooted at that folder with the learner's configuration
(``lab/learner/``, put ahead of any other Jupyter config folder): nbgrader's instructor tools
(formgrader, create assignment, the course list, the Validate button) and its assignment list
(the course has no exchange to fetch from) are turned off. The kernels import the learner's
own package first, where ``make export`` wrote one (``autograder.export``).
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from . import course, export, workspace

CONFIG_PATH = "JUPYTER_CONFIG_PATH"


def learner_config() -> Path:
    """The folder of the learner's Jupyter configuration, beside the course's chapters."""
    return course.root("chapters") / "lab" / "learner"


def copy_chapters(work: Path) -> list[Path]:
    """Copy every released file of the course into ``work`` where none is there yet; the
    files copied."""
    chapters = course.root("chapters") / "chapters"
    copied = []
    for source in sorted(chapters.rglob("*")):
        target = Path(work) / source.relative_to(chapters)
        if source.is_file() and not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
            copied.append(target)
    return copied


def learner_environment(work: Path, environ=None) -> dict:
    """``environ`` (default: this process's) with the learner's configuration first, and the
    learner's own package (``make export``) first on the kernels' path."""
    environ = dict(os.environ if environ is None else environ)
    others = environ.get(CONFIG_PATH)
    environ[CONFIG_PATH] = os.pathsep.join([str(learner_config())] + ([others] if others else []))
    return export.kernel_environment(work, environ)


def open_lab(work: Path, jupyter_args: list[str]) -> None:
    """Replace this process with JupyterLab rooted at ``work``, in the learner's configuration."""
    args = [sys.executable, "-m", "jupyter", "lab", *jupyter_args]
    if hasattr(os, "geteuid") and os.geteuid() == 0 and "--allow-root" not in jupyter_args:
        args.append("--allow-root")  # a container's root (Binder's, a Docker image's)
    environment = learner_environment(work)
    os.chdir(work)
    os.execve(sys.executable, args, environment)


def lab(work: Path, jupyter_args: list[str], prepare_only: bool = False) -> None:
    work = Path(work)
    copied = copy_chapters(work)
    if copied:
        print(f"copied {len(copied)} file(s) of the course into {work}/ (files already there are kept)")
    if export.rebuild(work):  # the exports again, over the package as installed now
        print(f"your package: {export.overlay_folder(work) / 'minillm'} (make export CHAPTER=NN adds to it)")
    older = [path for path in sorted(work.glob("*/*.ipynb")) if workspace.predates_runtime(path)]
    if older:
        print(f"{len(older)} notebook(s) of {work}/ come from an older release, whose first cell imports "
              f"minillm.course (now the package course_runtime): run `make update`, which keeps your answers "
              f"({', '.join(path.parent.name for path in older)})")
    if not prepare_only:
        open_lab(work, jupyter_args)
