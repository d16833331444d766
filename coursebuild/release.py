"""Generate the learner's notebooks with nbgrader (solutions → chapters)."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import nbformat

from autograder.course import alembic_on_path, course_config

from . import notebooks, paths

__all__ = ["alembic_on_path", "canonical", "course_config", "generate", "release"]


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
