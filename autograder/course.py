"""Where the grader finds the course: its chapters, their notebooks and nbgrader's settings.

The grader is a package of its own: it imports nothing of the build chain
(``coursebuild``), so ``python -m autograder`` works from any folder, a learner's
``~/work`` included. The chapter list comes from ``minillm.coursemap``, the graded cells
from the packaged ``autograder/manifest.json``, and the notebooks (the masters in
``solutions/``, the learner's release in ``chapters/``) from the course's folder: the
folder above this package when the course is installed from a clone (``make venv``), or
the folder named by the environment variable ``MINILLM_COURSE_ROOT``.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from traitlets.config import Config

from minillm import coursemap

from . import marks

ROOT_VARIABLE = "MINILLM_COURSE_ROOT"
MANIFEST = Path(__file__).resolve().parent / "manifest.json"

# Every chapter of the course, in order, written or not: the course map is their one list.
SLUGS = tuple(entry.slug for entry in coursemap.CHAPTERS)

# Files beside a solution notebook that the release must never copy: the jupytext source
# (it holds the solutions and hidden tests) and the instructor notes (model answers).
PRIVATE_PATTERNS = ("*.py", "*.md")


def root(needs: str = "chapters") -> Path:
    """The course's folder, which must hold ``needs`` (``solutions`` or ``chapters``).

    ``MINILLM_COURSE_ROOT`` wins; otherwise the folder above the installed package.
    ``ValueError``, saying what to set, when neither holds it.
    """
    named = os.environ.get(ROOT_VARIABLE)
    if named:
        folder = Path(named).expanduser().resolve()
        if not (folder / needs).is_dir():
            raise ValueError(f"{ROOT_VARIABLE}={named} has no {needs}/ folder: set it to the course's folder "
                             f"(a clone of the course, which holds {needs}/)")
        return folder
    folder = Path(__file__).resolve().parent.parent
    if not (folder / needs).is_dir():
        raise ValueError(f"the course's {needs}/ folder is not beside the installed autograder ({folder}): "
                         f"set {ROOT_VARIABLE} to the course's folder (a clone of the course)")
    return folder


def solution_notebook(slug: str) -> Path:
    """The master notebook of a chapter (nbgrader's source, solutions included)."""
    return root("solutions") / "solutions" / slug / f"{slug}.ipynb"


def release_notebook(slug: str) -> Path:
    """The learner's notebook of a chapter (nbgrader's release)."""
    return root("chapters") / "chapters" / slug / f"{slug}.ipynb"


def manifest() -> dict:
    """The committed manifest: every graded cell of every chapter, with its points."""
    return json.loads(MANIFEST.read_text(encoding="utf-8"))


def present_slugs() -> list[str]:
    """Slugs of the chapters the course grades (those in the manifest), in course order."""
    listed = manifest()["chapters"]
    return [slug for slug in SLUGS if slug in listed]


def resolve_slugs(names: list[str] | None, present: list[str] | None = None) -> list[str]:
    """Chapters named on a command line (slug or its two-digit number); all when empty."""
    present = present_slugs() if present is None else present
    if not names:
        return list(present)
    chosen = []
    for name in names:
        matches = [s for s in present if s == name or s.split("_", 1)[0] == name]
        if not matches:
            raise ValueError(f"no chapter {name!r}; chapters present: {present}")
        chosen.extend(matches)
    return chosen


def alembic_on_path() -> None:
    """nbgrader runs ``alembic`` from PATH; make the one beside this Python findable."""
    scripts = str(Path(sys.executable).parent)
    if scripts not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = scripts + os.pathsep + os.environ.get("PATH", "")


def course_config(root: Path) -> Config:
    """nbgrader settings shared by the release and the autograder."""
    config = Config()
    config.CourseDirectory.root = str(root)
    config.CourseDirectory.course_id = "minillm"
    config.CourseDirectory.ignore = [
        ".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", *PRIVATE_PATTERNS,
    ]
    config.Exchange.root = str(Path(root) / "exchange")
    config.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
    config.ClearSolutions.text_stub = "YOUR ANSWER HERE"
    # nbgrader finds the regions by these substrings; the manifest and the grader use the same.
    config.ClearSolutions.begin_solution_delimeter = marks.SOLUTION_BEGIN
    config.ClearSolutions.end_solution_delimeter = marks.SOLUTION_END
    config.ClearHiddenTests.begin_test_delimeter = marks.HIDDEN_BEGIN
    config.ClearHiddenTests.end_test_delimeter = marks.HIDDEN_END
    config.OverwriteCells.add_missing_cells = True
    config.ExecutePreprocessor.timeout = 600
    config.Execute.timeout = 600
    config.GenerateAssignment.create_assignment = True
    config.NbGraderAPI.log_level = "WARN"
    return config
