"""Where the course's files live, and the chapter slugs."""
from __future__ import annotations

from pathlib import Path

from minillm import coursemap

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "solutions"
CHAPTERS = ROOT / "chapters"
PACKAGE = ROOT / "minillm"
MANIFEST = ROOT / "autograder" / "manifest.json"

# Every chapter of the course, in order, written or not: the course map is their one list.
SLUGS = tuple(entry.slug for entry in coursemap.CHAPTERS)

# Files beside a solution notebook that the release must never copy: the jupytext source
# (it holds the solutions and hidden tests) and the instructor notes (model answers).
PRIVATE_PATTERNS = ("*.py", "*.md")


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
    present = present_slugs()
    if not names:
        return present
    chosen = []
    for name in names:
        matches = [s for s in present if s == name or s.split("_", 1)[0] == name]
        if not matches:
            raise ValueError(f"no chapter {name!r}; chapters present: {present}")
        chosen.extend(matches)
    return chosen
