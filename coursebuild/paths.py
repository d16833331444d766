"""Where the course's files live, and the chapter slugs."""
from __future__ import annotations

from pathlib import Path

from autograder import course

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "solutions"
CHAPTERS = ROOT / "chapters"
PACKAGE = ROOT / "minillm"
MANIFEST = course.MANIFEST
# The chapter slugs and the files a release never copies are the grader's (autograder.course).
SLUGS = course.SLUGS
PRIVATE_PATTERNS = course.PRIVATE_PATTERNS


def source_file(slug: str) -> Path:
    """The jupytext percent-format source of a chapter."""
    return SOLUTIONS / slug / f"{slug}.py"


def solution_notebook(slug: str) -> Path:
    """The complete chapter notebook, nbgrader's source."""
    return SOLUTIONS / slug / f"{slug}.ipynb"


def release_notebook(slug: str) -> Path:
    """The learner's notebook, nbgrader's release."""
    return CHAPTERS / slug / f"{slug}.ipynb"


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
    return course.resolve_slugs(names, present_slugs())
