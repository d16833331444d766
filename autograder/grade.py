"""Grade submitted notebooks through nbgrader, in a temporary course directory."""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import nbformat

from coursebuild import manifest, release

from . import feedback, results
from .chapters import Chapter, chapter_of
from .reconstruct import SubmissionError, reconstruct_file


def submission_name(path: Path) -> str:
    """A folder name for a submission's results: its file stem, made safe."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", path.stem) or "submission"


def student_id(path: Path) -> str:
    """An nbgrader student id unique to the submission's absolute path."""
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]
    return f"s{digest}"


@contextmanager
def _quick_mode():
    saved = os.environ.get("COURSE_QUICK")
    os.environ["COURSE_QUICK"] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("COURSE_QUICK", None)
        else:
            os.environ["COURSE_QUICK"] = saved


class CourseDirectory:
    """A throwaway nbgrader course holding one chapter's master notebook."""

    def __init__(self, root: Path, slug: str):
        from nbgrader.apps import NbGraderAPI

        self.root, self.slug = root, slug
        self.chapter = Chapter.load(slug)
        release.generate([slug], root)
        self.api = NbGraderAPI(config=release.course_config(root))

    def autograde(self, notebook, student: str) -> tuple[list[dict], nbformat.NotebookNode]:
        """Grade one reconstructed notebook; the gradebook's rows for it and the executed notebook."""
        from nbgrader.api import Gradebook

        target = self.root / "submitted" / student / self.slug / f"{self.slug}.ipynb"
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook, target)
        with _quick_mode():
            outcome = self.api.autograde(self.slug, student, force=True, create=True)
        if not outcome["success"]:
            raise RuntimeError(f"nbgrader could not grade the notebook: {outcome.get('error') or outcome['log']}")
        kinds = {grade_id: cell["kind"] for grade_id, cell in manifest.load()["chapters"][self.slug]["cells"].items()}
        with Gradebook(f"sqlite:///{self.root / 'gradebook.db'}") as gradebook:
            graded = gradebook.find_submission_notebook(self.slug, self.slug, student)
            grades = [
                {
                    "grade_id": grade.name,
                    "score": float(grade.score),
                    "max_score": float(grade.max_score),
                    "manual": kinds[grade.name] == "manual",
                }
                for grade in graded.grades
            ]
        executed = nbformat.read(self.root / "autograded" / student / self.slug / f"{self.slug}.ipynb", as_version=4)
        order = {cell.metadata.get("nbgrader", {}).get("grade_id"): i for i, cell in enumerate(executed.cells)}
        grades.sort(key=lambda g: order.get(g["grade_id"], len(order)))
        return grades, executed


def grade_files(files: list[Path], out: Path, chapter: str | None = None) -> list[dict]:
    """Grade each file into ``out/<name>/``; the results of each, in order."""
    by_chapter: dict[str, list[Path]] = {}
    for path in files:
        by_chapter.setdefault(chapter_of(path, chapter), []).append(path)
    names: dict[Path, str] = {}
    for path in files:
        name, n = submission_name(path), 1
        while name in names.values():
            n += 1
            name = f"{submission_name(path)}-{n}"
        names[path] = name
    everything = {}
    for slug, group in by_chapter.items():
        with tempfile.TemporaryDirectory(prefix="minillm-grade-") as tmp:
            course = CourseDirectory(Path(tmp), slug)
            for path in group:
                everything[path] = grade_one(course, path, out / names[path])
    return [everything[path] for path in files]


def grade_one(course: CourseDirectory, path: Path, out: Path) -> dict:
    """Grade one submission; write results.json and feedback.html under ``out``."""
    try:
        rebuilt = reconstruct_file(course.chapter, path)
    except SubmissionError as error:  # a broken file scores 0 with a reason, never a crash
        outcome = {
            "score": 0, "max_score": manifest.load()["chapters"][course.slug]["autograded_points"], "tests": [],
            "output": str(error)[:500],
            "extra_data": {"chapter": course.slug, "manual_grading": [],
                           "flags": [{"kind": "unreadable", "detail": str(error)[:500]}]},
        }
        results.write(out / "results.json", outcome)
        return outcome
    grades, executed = course.autograde(rebuilt.notebook, student_id(path))
    outcome = results.build(grades, executed, course.slug, rebuilt)
    results.write_atomic(out / "feedback.html", feedback.render(executed, outcome))
    results.write(out / "results.json", outcome)
    return outcome
