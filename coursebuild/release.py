"""Generate the learner's notebooks with nbgrader (solutions → chapters)."""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import nbformat
from traitlets.config import Config

from autograder import marks

from . import notebooks, paths


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
        ".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", *paths.PRIVATE_PATTERNS,
    ]
    config.Exchange.root = str(root / "exchange")
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


def generate(slugs: list[str], workdir: Path) -> dict[str, nbformat.NotebookNode]:
    """Run nbgrader's generate_assignment on each chapter inside ``workdir``."""
    from nbgrader.apps import NbGraderAPI

    alembic_on_path()
    for slug in slugs:
        shutil.copytree(
            paths.SOLUTIONS / slug,
            workdir / "source" / slug,
            ignore=shutil.ignore_patterns(*paths.PRIVATE_PATTERNS, ".ipynb_checkpoints"),
        )
    api = NbGraderAPI(config=course_config(workdir))
    released = {}
    for slug in slugs:
        result = api.generate_assignment(slug, force=True)
        if not result["success"]:
            raise RuntimeError(f"nbgrader could not release {slug}:\n{result['log']}\n{result.get('error', '')}")
        out = workdir / "release" / slug
        released[slug] = canonical(nbformat.read(out / f"{slug}.ipynb", as_version=4))
        extra = sorted(p.name for p in out.iterdir() if p.name != f"{slug}.ipynb")
        if extra:
            raise RuntimeError(f"release of {slug} would ship extra files: {extra}")
    return released


def canonical(notebook):
    """Drop what varies between runs (and is of no use to a learner) from a release."""
    notebook.metadata = nbformat.from_dict(
        {"kernelspec": notebooks.KERNELSPEC, "language_info": {"name": "python"}}
    )
    return notebook


def release(slugs: list[str]) -> dict[str, nbformat.NotebookNode]:
    """The learner's notebook of each chapter, as ``make release`` would write it."""
    with tempfile.TemporaryDirectory(prefix="minillm-release-") as tmp:
        return generate(slugs, Path(tmp))
