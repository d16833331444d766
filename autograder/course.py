"""Where the grader finds the course: its chapters, their notebooks and nbgrader's settings.

The grader is a package of its own: it imports nothing of the build chain
(``coursebuild``), so ``python -m autograder`` works from any folder, a learner's
``~/work`` included. The graded cells come from the packaged ``autograder/manifest.json``;
the chapter slugs and the notebooks (the masters in ``solutions/``, the learner's release
in ``chapters/``) from the notebook runtime's folder layout (``course_runtime.layout``): the
folder above the installed course, or the one the environment variable
``MINILLM_COURSE_ROOT`` names.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from traitlets.config import Config

from course_runtime import layout, marks
from course_runtime.layout import PRIVATE_PATTERNS, ROOT_VARIABLE, SLUGS, release_notebook, root, solution_notebook

MANIFEST = Path(__file__).resolve().parent / "manifest.json"


def manifest() -> dict:
    """The committed manifest: every graded cell of every chapter, with its points."""
    return json.loads(MANIFEST.read_text(encoding="utf-8"))


def present_slugs() -> list[str]:
    """Slugs of the chapters the course grades (those in the manifest), in course order."""
    listed = manifest()["chapters"]
    return [slug for slug in SLUGS if slug in listed]


def resolve_slugs(names: list[str] | None, present: list[str] | None = None) -> list[str]:
    """Chapters named on a command line (slug or its two-digit number), among ``present``
    (default: those the course grades); all when empty."""
    return layout.resolve_slugs(names, present_slugs() if present is None else present)


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
