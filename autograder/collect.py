"""Which files of a batch are submissions, and whose: the three accepted layouts.

Relative to each folder given on the command line, a submission is either

- ``<student>/<NN_slug>/<NN_slug>.ipynb``: nbgrader's ``submitted/`` folder (a course
  directory, a folder holding ``submitted/``, is read through its ``submitted/``), or
- ``<student>__<NN_slug>.ipynb`` at the top of the folder (a flat folder).

A file named on the command line is the third layout, a single file: its chapter comes from
``--chapter`` (or ``--master``) or its name, its student from a ``<student>__`` prefix or
else its name. The student is read from these places only, never from elsewhere in the
path, and no link is ever followed inside a folder.

Every other notebook found in a folder (deeper, another name, another chapter), every
symbolic link to a notebook or a folder, and every notebook that is not a regular file is
*flagged* and not graded. A symbolic link or a special file at a submission's own place
still names the student and chapter: that student's submission is then unreadable, scored 0
with the reason. Two files for one student and chapter are a duplicate: neither is graded.
"""
from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from .chapters import chapter_of
from .course import present_slugs

STUDENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")
CHECKPOINTS = ".ipynb_checkpoints"
MAX_DEPTH = 8          # folders deeper than this below a folder given are flagged, not searched
LAYOUTS = "<student>/<NN_slug>/<NN_slug>.ipynb or <student>__<NN_slug>.ipynb"


@dataclass(frozen=True)
class Found:
    """A submission's place: a file, its student and chapter, and why it cannot be read, if so."""

    path: str
    layout: str      # nbgrader, flat or single
    student: str
    slug: str
    problem: str = ""


@dataclass(frozen=True)
class Flagged:
    """A file or folder of the batch that is not graded, and why."""

    path: str
    kind: str        # stray-notebook, symlink, not-a-regular-file, duplicate-submission, bad-student-id, too-deep
    reason: str


def _entries(folder: Path, exclude: set[str]):
    """``(path, relative parts, what)`` below ``folder``, links never followed.

    ``what`` is ``file`` (a regular notebook), ``special`` (a notebook that is a pipe, a
    device, ...), ``symlink`` (a link to a notebook or to a folder) or ``too-deep``.
    """
    stack = [(folder, ())]
    while stack:
        current, parts = stack.pop()
        try:
            with os.scandir(current) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            path, relative = Path(entry.path), parts + (entry.name,)
            if entry.is_symlink():
                if entry.name.endswith(".ipynb") or os.path.isdir(path):
                    yield path, relative, "symlink"
            elif entry.is_dir(follow_symlinks=False):
                if entry.name == CHECKPOINTS or str(path) in exclude:
                    continue
                if len(relative) >= MAX_DEPTH:
                    yield path, relative, "too-deep"
                else:
                    stack.append((path, relative))
            elif entry.name.endswith(".ipynb"):
                yield path, relative, "file" if entry.is_file(follow_symlinks=False) else "special"


def _place(relative: tuple, slugs: list[str]) -> tuple[str, str, str] | None:
    """``(layout, student, slug)`` when ``relative`` is one of the folder layouts."""
    if len(relative) == 3 and relative[1] in slugs and relative[2] == f"{relative[1]}.ipynb":
        return "nbgrader", relative[0], relative[1]
    if len(relative) == 1:
        for slug in slugs:
            suffix = f"__{slug}.ipynb"
            if relative[0].endswith(suffix) and len(relative[0]) > len(suffix):
                return "flat", relative[0][: -len(suffix)], slug
    return None


def bad_student(student: str) -> str:
    """Why ``student`` cannot be a student id (empty when it can)."""
    if STUDENT.match(student):
        return ""
    return (f"the student id {student!r} may hold only letters, digits, '_', '.' and '-', and must start with a "
            "letter or digit")


def in_folder(folder: Path, slugs: list[str], exclude=()) -> tuple[list[Found], list[Flagged]]:
    """The submissions in ``folder`` for the chapters ``slugs``, and what is flagged there."""
    folder = Path(folder).resolve()
    if (folder / "submitted").is_dir() and not (folder / "submitted").is_symlink():
        folder = folder / "submitted"
    skip = {str(Path(p).resolve()) for p in exclude if p is not None}
    found, flagged = [], []
    for path, relative, what in _entries(folder, skip):
        shown = "/".join(relative)
        if what == "too-deep":
            flagged.append(Flagged(str(path), "too-deep", f"{shown} is more than {MAX_DEPTH} folders deep; "
                                   "it was not searched"))
            continue
        place = _place(relative, slugs)
        if place is None:
            if what == "symlink":
                flagged.append(Flagged(str(path), "symlink", f"{shown} is a symbolic link; links are never followed"))
            else:
                flagged.append(Flagged(str(path), "stray-notebook", f"{shown} is not graded: a submission must be "
                                       f"{LAYOUTS} (chapter {' or '.join(slugs)}) inside the folder given"))
            continue
        layout, student, slug = place
        problem = bad_student(student)
        if problem:
            flagged.append(Flagged(str(path), "bad-student-id", f"{shown} is not graded: {problem}"))
            continue
        if what == "symlink":
            problem = f"{shown} is a symbolic link; links are never followed, so it was not read"
        elif what == "special":
            problem = f"{shown} is not a regular file (a pipe, a socket or a device), so it was not read"
        found.append(Found(str(path), layout, student, slug, problem))
    return sorted(found, key=lambda f: f.path), sorted(flagged, key=lambda f: f.path)


def single_file(path: Path, slug: str) -> Found:
    """A notebook named on the command line (links followed: the instructor named it)."""
    path = Path(path).resolve()
    info = path.stat()
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"argument PATH: {path} is not a regular file")
    place = _place((path.name,), [slug])
    if place and not bad_student(place[1]):
        student = place[1]
    else:
        student = re.sub(r"[^A-Za-z0-9_.-]+", "_", path.stem).strip("._") or "submission"
    return Found(str(path), "single", student, slug)


def duplicates(found: list[Found]) -> tuple[list[Found], list[Flagged]]:
    """Each (student, chapter) once: a pair claimed by two files becomes one unreadable entry."""
    claims: dict[tuple[str, str], list[Found]] = {}
    for entry in found:
        claims.setdefault((entry.student, entry.slug), []).append(entry)
    kept, flagged = [], []
    for (student, slug), entries in claims.items():
        if len(entries) == 1:
            kept.append(entries[0])
            continue
        files = sorted(e.path for e in entries)
        reason = (f"duplicate: {len(files)} files are {student}'s {slug} ({'; '.join(files)}); neither is graded: "
                  "keep one and grade again")
        kept.append(Found("", "duplicate", student, slug, reason))
        flagged += [Flagged(path, "duplicate-submission", reason) for path in files]
    return kept, flagged


@dataclass(frozen=True)
class ChapterRef:
    """The chapter a submission is graded against: a chapter of the course by its slug, or,
    with ``master``, any master notebook (a fixture, a course of one's own) under that slug."""

    slug: str
    master: Path | None = None  # absolute path of the master notebook; None: the course's own


@dataclass(frozen=True)
class Job:
    path: str        # absolute path of the submission ("" for a duplicate: no one file)
    name: str        # its results folder under OUT/submissions/, unique in the batch
    chapter: ChapterRef
    student: str     # the gradebook's student id
    layout: str = "single"  # how the file was found: nbgrader, flat, single (or duplicate)
    problem: str = ""       # why the file is not read (a link, a duplicate, ...): it scores 0 with this

    def submission(self) -> dict:
        """What a result says of the file it graded."""
        return {"file": self.path, "name": self.name, "student": self.student, "layout": self.layout}


@dataclass
class Collected:
    """What a batch grades (one job per student and chapter) and what it flags instead."""

    jobs: list[Job]
    flagged: list[Flagged]


def _slugs(chapter: str | None, master: Path | None) -> list[str]:
    if master is not None:
        return [chapter or Path(master).stem]
    if chapter is not None:
        return [chapter_of(Path("."), chapter)]
    return present_slugs()


def batch(paths, chapter: str | None = None, master: Path | None = None, exclude=()) -> Collected:
    """The jobs of a batch: ``paths`` are notebooks (the single-file layout) and folders
    (searched for the two folder layouts, see :mod:`autograder.collect`). ``exclude``:
    folders inside them not to search (the grader's own output). A notebook named here
    whose chapter cannot be told is refused (``ValueError``); anything in a folder that is
    not a submission is flagged, never graded."""
    slugs = _slugs(chapter, master)
    found, flagged = [], []
    for item in paths:
        path = Path(item)
        if path.is_dir():
            inside, odd = in_folder(path, slugs, exclude)
            found += inside
            flagged += odd
        else:
            slug = slugs[0] if (master is not None or chapter is not None) else chapter_of(path)
            found.append(single_file(path, slug))
    unique = {}
    for entry in found:  # the same file named twice is one submission
        unique.setdefault(entry.path, entry)
    kept, doubled = duplicates(list(unique.values()))
    master_path = Path(master).resolve() if master is not None else None
    jobs = [Job(entry.path, f"{entry.student}__{entry.slug}", ChapterRef(entry.slug, master_path), entry.student,
                entry.layout, entry.problem) for entry in kept]
    return Collected(jobs, flagged + doubled)


def submission_time(path: Path | None) -> tuple[float | None, str]:
    """When the notebook at ``path`` was submitted (seconds since the epoch, UTC) and where
    that came from: nbgrader's ``timestamp.txt`` beside it (written by ``nbgrader submit``,
    kept by ``collect``) where there is a readable one, else the file's mtime, which
    ``touch`` back-dates. ``(None, "none")`` when neither can be read, or there is no one
    file (``path`` empty: a duplicate)."""
    if not path:
        return None, "none"
    stamp = Path(path).with_name("timestamp.txt")
    if stamp.is_file() and not stamp.is_symlink():
        from nbgrader.utils import parse_utc

        try:
            return parse_utc(stamp.read_text(encoding="utf-8")[:100].strip()).timestamp(), "nbgrader timestamp.txt"
        except (ValueError, OverflowError, OSError, UnicodeDecodeError):
            pass
    try:
        return os.lstat(path).st_mtime, "file mtime"
    except OSError:
        return None, "none"
