"""Where the course's notebooks live, and the chapter slugs: the folder layout, in one place.

A course folder (a clone, a student bundle, a Gradescope autograder) holds the masters in
``solutions/NN_slug/NN_slug.ipynb`` (beside their jupytext sources ``NN_slug.py``) and the
learner's release in ``chapters/NN_slug/NN_slug.ipynb``. The grader and the build chain find
them through these functions; the grader finds the folder itself with :func:`root`.
"""
from __future__ import annotations

import os
from pathlib import Path

from minillm import coursemap

ROOT_VARIABLE = "MINILLM_COURSE_ROOT"

# Every chapter of the course, in order, written or not: the course map is their one list.
SLUGS = tuple(entry.slug for entry in coursemap.CHAPTERS)

# Files beside a solution notebook that the release must never copy: the jupytext source
# (it holds the solutions and hidden tests) and the instructor notes (model answers).
PRIVATE_PATTERNS = ("*.py", "*.md")


def root(needs: str = "chapters") -> Path:
    """The course's folder, which must hold ``needs`` (``solutions`` or ``chapters``).

    ``MINILLM_COURSE_ROOT`` wins; otherwise the folder above the installed runtime (a
    clone installed with ``make venv``, a student bundle). ``ValueError``, saying what to
    set, when neither holds it.
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
        raise ValueError(f"the course's {needs}/ folder is not beside the installed course ({folder}): "
                         f"set {ROOT_VARIABLE} to the course's folder (a clone of the course)")
    return folder


def source_file(slug: str, folder: Path | None = None) -> Path:
    """The jupytext percent-format source of a chapter (solutions included)."""
    return (folder or root("solutions")) / "solutions" / slug / f"{slug}.py"


def solution_notebook(slug: str, folder: Path | None = None) -> Path:
    """The master notebook of a chapter (nbgrader's source, solutions included)."""
    return (folder or root("solutions")) / "solutions" / slug / f"{slug}.ipynb"


def release_notebook(slug: str, folder: Path | None = None) -> Path:
    """The learner's notebook of a chapter (nbgrader's release)."""
    return (folder or root("chapters")) / "chapters" / slug / f"{slug}.ipynb"


def resolve_slugs(names: list[str] | None, present: list[str]) -> list[str]:
    """Chapters named on a command line (slug or its two-digit number), among ``present``;
    all of them when ``names`` is empty. ``ValueError`` for a name that matches none."""
    if not names:
        return list(present)
    chosen = []
    for name in names:
        matches = [s for s in present if s == name or s.split("_", 1)[0] == name]
        if not matches:
            raise ValueError(f"no chapter {name!r}; chapters present: {present}")
        chosen.extend(matches)
    return chosen
