"""Scores into an nbgrader course directory, through nbgrader's ``Gradebook`` API.

The grader keeps nbgrader as the system of record without running ``nbgrader autograde``
(7-10 s a student): the assignment is created once per chapter by nbgrader's own
``generate_assignment`` (so the gradebook holds exactly nbgrader's grade and solution
cells), and each graded submission becomes a submission row whose grades are set by
``grade_id``, plus the graded notebook under ``autograded/`` for formgrader. ``nbgrader
export`` and formgrader (manual grading of written answers, overriding a score) then work
on that course directory as on any other.

Only the batch's main process writes here, one submission at a time, so SQLite never sees
two writers; re-grading a student updates the same rows (no duplicates) and keeps every
manual score and comment an instructor gave in formgrader.

formgrader counts a student as graded only when the submission's time in the gradebook is
the one in ``submitted/<student>/<chapter>/timestamp.txt`` (what ``nbgrader collect`` writes
and ``nbgrader autograde`` copies); otherwise its per-student views show "not submitted",
score 0. So each record writes that file too, or, in a folder ``nbgrader collect`` filled,
takes the submission's time from it.
"""
from __future__ import annotations

import datetime
import shutil
import warnings
from pathlib import Path

import nbformat

from .course import alembic_on_path, course_config

HEADER = "# nbgrader settings for the course directory the autograder fills."
CONFIG = HEADER + """
# Every path is relative to this file's folder: the folder can be moved or copied, and
# formgrader and `nbgrader export` then read the gradebook where it now is.
import os

c = get_config()  # noqa
here = os.path.dirname(os.path.abspath(__file__))
c.CourseDirectory.root = here
c.CourseDirectory.course_id = "minillm"
c.CourseDirectory.db_url = "sqlite:///" + os.path.join(here, "gradebook.db")
# An exchange of its own (empty: the grader collects nothing through it), so formgrader
# finds one and neither warns that it is missing nor logs that it is unwritable.
c.Exchange.root = os.path.join(here, "exchange")
"""


class CourseGradebook:
    """An nbgrader course directory: ``source/``, ``autograded/``, ``gradebook.db``."""

    def __init__(self, root: Path):
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.db_url = f"sqlite:///{self.root / 'gradebook.db'}"
        config = self.root / "nbgrader_config.py"
        # Written when missing, and rewritten when an older grader wrote it (absolute
        # paths); a configuration of the instructor's own is left alone.
        if not config.exists() or (config.read_text().startswith(HEADER) and config.read_text() != CONFIG):
            config.write_text(CONFIG)
        (self.root / "exchange").mkdir(exist_ok=True)
        self._ready: set[str] = set()

    def gradebook(self):
        from nbgrader.api import Gradebook

        alembic_on_path()
        return Gradebook(self.db_url)

    def ensure_assignment(self, chapter) -> None:
        """Create the chapter's assignment with nbgrader (once; again when its cells changed)."""
        if chapter.slug in self._ready:
            return
        from nbgrader.api import MissingEntry

        wanted = {c.grade_id: c.points for c in chapter.cells if c.kind in ("visible", "hidden", "written")}
        with self.gradebook() as gb:
            try:
                notebook = gb.find_notebook(chapter.slug, chapter.slug)
                present = {cell.name: cell.max_score for cell in notebook.grade_cells}
            except MissingEntry:
                present = None
        if present != wanted:
            self._generate(chapter)
        self._ready.add(chapter.slug)

    def _generate(self, chapter) -> None:
        from nbgrader.apps import NbGraderAPI

        source = self.root / "source" / chapter.slug
        if source.exists():
            shutil.rmtree(source)
        source.mkdir(parents=True)
        nbformat.write(chapter.master, source / f"{chapter.slug}.ipynb")
        config = course_config(self.root)
        config.CourseDirectory.db_url = self.db_url
        api = NbGraderAPI(config=config)
        result = api.generate_assignment(chapter.slug, force=True)
        if not result["success"]:
            raise RuntimeError(f"nbgrader could not create assignment {chapter.slug}:\n{result['log']}"
                               f"\n{result.get('error', '')}")

    def record(self, chapter, student: str, results: dict, notebook, timestamp: float | None = None) -> None:
        """Write one submission's scores (by grade_id) and its graded notebook."""
        from .report import write_atomic

        self.ensure_assignment(chapter)
        target = self.root / "autograded" / student / chapter.slug / f"{chapter.slug}.ipynb"
        target.parent.mkdir(parents=True, exist_ok=True)
        if notebook is not None:
            temporary = target.with_name(f".{target.name}.tmp")
            nbformat.write(notebook, temporary)
            temporary.replace(target)
        when = datetime.datetime.fromtimestamp(timestamp or 0, tz=datetime.timezone.utc) if timestamp else None
        submitted = self.root / "submitted" / student / chapter.slug
        stamp = submitted / "timestamp.txt"
        collected = _collected_time(submitted)
        if collected is not None:
            when = collected
        scores = {t["name"]: t["score"] for t in results["tests"]}
        answered = {m["name"]: m.get("answered", False) for m in results["extra_data"].get("manual_grading", [])}
        solution_status = results["extra_data"].get("answers", {})
        with self.gradebook() as gb, warnings.catch_warnings():
            # nbgrader's own add_submission triggers SQLAlchemy's harmless "not in session".
            warnings.simplefilter("ignore")
            # formgrader shows "last, first": the student's id stands in until the
            # instructor gives names (never overwritten).
            known = gb.update_or_create_student(student)
            if known.first_name is None and known.last_name is None:
                known.first_name = known.last_name = student
            del known
            submission = gb.update_or_create_submission(
                chapter.slug, student, **({"timestamp": when.isoformat()} if when else {}))
            recorded = submission.timestamp
            del submission
            for cell in chapter.cells:
                if cell.is_test:
                    grade = gb.find_grade(cell.grade_id, chapter.slug, chapter.slug, student)
                    grade.auto_score = float(scores.get(cell.grade_id, 0.0))
                    grade.needs_manual_grade = grade.manual_score is not None
                elif cell.kind == "written":
                    grade = gb.find_grade(cell.grade_id, chapter.slug, chapter.slug, student)
                    grade.auto_score = None
                    grade.needs_manual_grade = grade.manual_score is None
                    comment = gb.find_comment(cell.grade_id, chapter.slug, chapter.slug, student)
                    comment.auto_comment = None if answered.get(cell.grade_id) else "No response."
                elif cell.kind == "answer":
                    comment = gb.find_comment(cell.grade_id, chapter.slug, chapter.slug, student)
                    comment.auto_comment = None if solution_status.get(cell.grade_id) == "answered" else "No response."
            gb.db.commit()
        if collected is None:
            submitted.mkdir(parents=True, exist_ok=True)
            if recorded is None:
                stamp.unlink(missing_ok=True)
            else:
                write_atomic(stamp, f"{recorded:%Y-%m-%d %H:%M:%S.%f} UTC")

    def scores(self, chapter_slug: str, student: str) -> dict[str, float | None]:
        """grade_id → score (manual when given, else automatic), as nbgrader computes it."""
        with self.gradebook() as gb:
            notebook = gb.find_submission_notebook(chapter_slug, chapter_slug, student)
            return {grade.name: grade.score for grade in notebook.grades}


    def marks(self, chapter_slug: str, student: str) -> tuple[dict[str, float | None], dict[str, str]]:
        """(grade_id → score, grade_id → the instructor's comment) as nbgrader holds them. The
        score is the manual one where one was given, the automatic one otherwise, None for a
        cell that still awaits its manual grade; comments are those formgrader took on any
        cell, the answer cells' code included."""
        with self.gradebook() as gb:
            notebook = gb.find_submission_notebook(chapter_slug, chapter_slug, student)
            scores = {grade.name: None if grade.manual_score is None and grade.auto_score is None else float(grade.score)
                      for grade in notebook.grades}
            return scores, {c.name: c.manual_comment for c in notebook.comments if c.manual_comment}


def _collected_time(folder: Path):
    """The submission time in a folder ``nbgrader collect`` filled (a notebook beside its
    ``timestamp.txt``; the grader writes only the latter), else None."""
    from nbgrader.utils import parse_utc

    stamp = folder / "timestamp.txt"
    if not stamp.is_file() or not any(folder.glob("*.ipynb")):
        return None
    try:
        return parse_utc(stamp.read_text().strip())
    except (ValueError, OverflowError, OSError):
        return None


def instructor_notebook(chapter, rebuilt, execution, results: dict) -> nbformat.NotebookNode:
    """The graded notebook formgrader shows: the master's cells (hidden tests included),
    the learner's answers, the outputs of the learner's kernel and the judge's verdicts.

    formgrader renders markdown cells as HTML on the instructor's own origin, so a written
    answer is stored as plain text (a fenced block nothing in it can close), never as the
    learner's markdown; outputs keep text and re-encoded images only."""
    from .feedback import as_plain_text, sanitize_outputs
    from .reconstruct import MAX_ANSWER_CHARS

    notebook = nbformat.v4.new_notebook(metadata=nbformat.from_dict(dict(chapter.master.metadata)))
    tests = {t["name"]: t for t in results["tests"]}
    ran = execution.notebook.cells if execution is not None else [None] * len(chapter.cells)
    for master, cell in zip(chapter.cells, ran):
        source = master.source
        if master.kind in ("answer", "written"):
            source = rebuilt.answers.get(master.grade_id) or master.learner_source
        if master.kind == "written" and rebuilt.answers.get(master.grade_id):
            source = as_plain_text(source, limit=MAX_ANSWER_CHARS)
        if master.cell_type == "markdown":
            new = nbformat.v4.new_markdown_cell(source)
        else:
            new = nbformat.v4.new_code_cell(source)
            if master.is_test:
                verdict = execution.verdicts.get(master.index) if execution else None
                test = tests[master.grade_id]
                text = (verdict or {}).get("stdout", "")
                new.outputs = ([nbformat.v4.new_output("stream", name="stdout", text=text)] if text else [])
                if test["status"] != "passed":
                    new.outputs.append(nbformat.v4.new_output(
                        "error", ename="CheckFailed", evalue=test["output"], traceback=[test["output"]]))
            elif cell is not None:
                new.outputs = sanitize_outputs(cell.get("outputs"))
        new.metadata = nbformat.from_dict(dict(chapter.master.cells[master.index].metadata))
        new.id = chapter.master.cells[master.index].get("id", new.id)
        notebook.cells.append(new)
    return notebook
