"""Where the course's files live in this repository (the layout is ``course_runtime.layout``'s)."""
from __future__ import annotations

from pathlib import Path

from autograder.course import MANIFEST
from course_runtime import layout
from course_runtime.layout import PRIVATE_PATTERNS, SLUGS

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "solutions"
CHAPTERS = ROOT / "chapters"
PACKAGE = ROOT / "minillm"


def source_file(slug: str) -> Path:
    """The jupytext percent-format source of a chapter."""
    return layout.source_file(slug, ROOT)


def solution_notebook(slug: str) -> Path:
    """The complete chapter notebook, nbgrader's source."""
    return layout.solution_notebook(slug, ROOT)


def release_notebook(slug: str) -> Path:
    """The learner's notebook, nbgrader's release."""
    return layout.release_notebook(slug, ROOT)


def present_slugs() -> list[str]:
    """Slugs of the chapters written so far, in course order."""
    unknown = sorted(
        p.name for p in SOLUTIONS.iterdir() if p.is_dir() and p.name not in SLUGS
    ) if SOLUTIONS.exists() else []
    if unknown:
        raise ValueError(f"solutions/ holds folders that are not chapter slugs: {unknown}")
    return [slug for slug in SLUGS if source_file(slug).exists()]


def resolve_slugs(names: list[str] | None) -> list[str]:
    """Chapters named on a command line (slug or its two-digit number); all when empty."""
    return layout.resolve_slugs(names, present_slugs())
