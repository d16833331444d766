"""The report stage: a submission's results, feedback page and instructor notebook, written.

``OUT/submissions/<name>/results.json`` (Gradescope's shape) and ``feedback.html`` beside
it, the nbgrader gradebook's row and ``OUT/summary.csv``. Every file is written atomically,
``results.json`` last, so a submission whose ``results.json`` exists is graded: a run that
is killed resumes without losing or duplicating a grade.
"""
from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from pathlib import Path

import nbformat

from . import feedback
from .collect import submission_time

SUBMISSIONS = "submissions"  # OUT/submissions/<student>__<chapter>/: the one folder named after submissions
SUMMARY = ["submission", "student", "file", "chapter", "score", "max_score", "status", "failed_checks", "flags",
           "layout", "reason"]


def graded(chapter, rebuilt, execution, outcome: dict) -> dict:
    """What the grading of one submission reports: its results, its feedback page and the
    instructor's notebook (as text)."""
    from .gradebook import instructor_notebook

    page = feedback.render(chapter, execution.notebook, outcome, execution.verdicts)
    return {"results": outcome, "feedback": page,
            "notebook": nbformat.writes(instructor_notebook(chapter, rebuilt, execution, outcome))}


def not_graded(chapter, outcome: dict) -> dict:
    """The report of a submission that was not run (unreadable, another chapter's, or a
    grader error): its results and a feedback page of the summary alone."""
    return {"results": outcome, "feedback": feedback.render(chapter, None, outcome), "notebook": None}


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_results(path: Path, results: dict) -> None:
    write_atomic(path, json.dumps(results, indent=2) + "\n")


def write_graded(job, chapter, report: dict, out: Path, course) -> dict:
    """Write ``job``'s ``report`` under ``out`` and record it in the gradebook ``course``
    (None: none); its results."""
    outcome = report["results"]
    folder = out / SUBMISSIONS / job.name
    write_atomic(folder / "feedback.html", report["feedback"])
    when, source = submission_time(job.path)
    outcome["extra_data"]["submitted"] = {"time": when, "source": source}
    if course is not None and not outcome["extra_data"].get("grader_error"):
        notebook = nbformat.reads(report["notebook"], as_version=4) if report["notebook"] else None
        course.record(chapter, job.student, outcome, notebook, when)
    write_results(folder / "results.json", outcome)
    return outcome


def write_summary(out: Path, done: list[tuple], flagged=()) -> Path:
    """``OUT/summary.csv``: one row per gradebook row of this batch (a job, its results, and
    the file it came from), then one per file that was flagged and not graded."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(SUMMARY)
    for job, outcome in done:
        extra = outcome["extra_data"]
        status = ("grader-error" if extra.get("grader_error")
                  else next((f["kind"] for f in extra.get("flags", []) if f["kind"] in ("unreadable", "wrong-chapter")),
                            "graded"))
        failed = ";".join(t["name"] for t in outcome["tests"] if t["status"] != "passed")
        flags = ";".join(sorted({f["kind"] for f in extra.get("flags", [])}))
        writer.writerow([job.name, job.student, job.path, extra.get("chapter"), f"{outcome['score']:g}",
                         f"{outcome['max_score']:g}", status, failed, flags, job.layout,
                         "" if status == "graded" else outcome["output"]])
    for entry in flagged:
        writer.writerow(["", "", entry.path, "", "", "", "not-graded", "", entry.kind, "", entry.reason])
    path = out / "summary.csv"
    write_atomic(path, buffer.getvalue())
    return path
