"""Grade submitted notebooks, one or a batch: ``grade_files(files, out, chapter=None, ...)``.

For each submission:

1. the chapter comes from ``chapter`` (or ``master``) or from the file name, never from the
   notebook's contents;
2. the notebook is rebuilt from the master with the learner's answer cells
   (:mod:`autograder.reconstruct`);
3. the learner's cells run in a sandboxed kernel and the checks in the judge
   (:mod:`autograder.execute`);
4. ``OUT/<name>/results.json`` (Gradescope's shape), ``OUT/<name>/feedback.html``, the
   nbgrader gradebook (``OUT/nbgrader`` unless told otherwise) and ``OUT/summary.csv`` are
   written. Every file is written atomically, ``results.json`` last: a submission whose
   ``results.json`` exists (for the same file contents) is graded, and a re-run skips it
   unless ``force``. A run that is killed therefore resumes without losing or duplicating a
   grade (the gradebook has one row per student and chapter, updated in place).

A submission that cannot be read, or belongs to another chapter, scores 0 with the reason,
and the batch goes on. A failure of the grader itself is recorded the same way, marked
``grader_error`` (regraded on the next run), and makes the command exit with 1.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import nbformat

from . import feedback, results
from .chapters import Chapter, chapter_of
from .reconstruct import SubmissionError, reconstruct
from .sandbox import Limits

SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class ChapterRef:
    """The chapter a submission is graded against: a chapter of the course by its slug, or,
    with ``master``, any master notebook (a fixture, a course of one's own) under that slug."""

    slug: str
    master: Path | None = None  # absolute path of the master notebook; None: the course's own


@dataclass(frozen=True)
class Job:
    path: str            # absolute path of the submission
    name: str            # its results folder, unique in the batch
    chapter: ChapterRef
    student: str         # the gradebook's student id


def _safe(text: str) -> str:
    return SAFE.sub("_", text).strip("._") or "submission"


def _digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _student(path: Path, slug: str, name: str) -> str:
    """nbgrader's layout ``submitted/<student>/<chapter>/<file>`` names the student; else ``name``."""
    parts = Path(path).parts
    if len(parts) >= 4 and parts[-2] == slug and parts[-4] == "submitted":
        return _safe(parts[-3])
    return name


def plan(files, chapter: str | None = None, master: Path | None = None) -> list[Job]:
    """One job per file. ``files`` holds paths, or ``(path, folder)`` pairs for files found
    in a folder given on the command line (their name in the results keeps the subfolders)."""
    entries = []
    for item in files:
        path, folder = (item if isinstance(item, tuple) else (item, None))
        path = Path(path).resolve()
        if master is not None:
            slug = chapter or Path(master).stem
            ref = ChapterRef(slug, Path(master).resolve())
        else:
            slug = chapter_of(path, chapter)
            ref = ChapterRef(slug)
        if folder is not None:
            relative = path.relative_to(Path(folder).resolve()).with_suffix("")
            name = _safe("__".join(relative.parts))
        else:
            name = _safe(path.stem)
        entries.append([path, name, ref])
    counts: dict[str, int] = {}
    for entry in entries:
        counts[entry[1]] = counts.get(entry[1], 0) + 1
    jobs, seen = [], set()
    for path, name, ref in entries:
        if counts[name] > 1:
            name = f"{name}-{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
        if str(path) in seen:
            continue
        seen.add(str(path))
        jobs.append(Job(str(path), name, ref, _student(path, ref.slug, name)))
    return jobs


@lru_cache(maxsize=32)
def load_chapter(ref: ChapterRef) -> Chapter:
    """The chapter ``ref`` names, read once per process."""
    if ref.master is not None:
        return Chapter.from_master(ref.master, ref.slug)
    return Chapter.load(ref.slug)


def grade_submission(job: Job, limits: Limits, jobs: int = 1, seed: int | None = None,
                     scratch: str | None = None) -> dict:
    """Grade one submission; its results, feedback page and instructor notebook (as text)."""
    from .execute import execute_sync
    from .gradebook import instructor_notebook

    chapter = load_chapter(job.chapter)
    path = Path(job.path)
    submission = {"file": str(path), "name": job.name, "student": job.student}
    try:
        data = path.read_bytes()
        submission["sha256"] = hashlib.sha256(data).hexdigest()
        rebuilt = reconstruct(chapter, data, path.name)
    except (OSError, SubmissionError) as error:
        reason = str(error) if isinstance(error, SubmissionError) else f"{path.name} cannot be read: {error}"
        outcome = results.unreadable(chapter, reason, submission)
        return {"results": outcome, "feedback": feedback.render(chapter, None, outcome), "notebook": None}
    wrong = [f for f in rebuilt.flags if f["kind"] == "wrong-chapter"]
    if wrong:
        reason = f"this is not a notebook of chapter {chapter.slug}: {wrong[0]['detail']}"
        outcome = results.unreadable(chapter, reason, submission, kind="wrong-chapter")
        outcome["extra_data"]["flags"] = rebuilt.flags
        return {"results": outcome, "feedback": feedback.render(chapter, None, outcome), "notebook": None}
    execution = execute_sync(chapter, rebuilt.notebook, limits, jobs=jobs, seed=seed,
                             scratch=Path(scratch) if scratch else None)
    outcome = results.build(chapter, rebuilt, execution, submission)
    if execution.judge_error:
        outcome["extra_data"]["grader_error"] = execution.judge_error[-4000:]
    page = feedback.render(chapter, execution.notebook, outcome, execution.verdicts)
    graded = instructor_notebook(chapter, rebuilt, execution, outcome)
    return {"results": outcome, "feedback": page, "notebook": nbformat.writes(graded)}


def _worker_init() -> None:
    from .sandbox import die_with_parent

    die_with_parent()


def _grade_job(job: Job, limits: Limits, jobs: int, seed: int | None, scratch: str | None = None) -> dict:
    try:
        return grade_submission(job, limits, jobs, seed, scratch)
    except Exception as error:  # noqa: BLE001 - one submission must never stop the batch
        import traceback

        chapter = load_chapter(job.chapter)
        detail = traceback.format_exc()[-4000:]
        outcome = results.unreadable(chapter, f"not graded: the grader failed on this notebook ({type(error).__name__}: "
                                     f"{str(error)[:300]}); it will be graded again on the next run",
                                     {"file": job.path, "name": job.name, "student": job.student},
                                     kind="grader-error", grader_error=detail)
        return {"results": outcome, "feedback": feedback.render(chapter, None, outcome), "notebook": None}


def already_graded(job: Job, out: Path) -> dict | None:
    """The results of ``job`` from an earlier run, when they are complete and current."""
    try:
        previous = json.loads((out / job.name / "results.json").read_text())
        recorded = previous["extra_data"]["submission"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if previous["extra_data"].get("grader_error") or previous["extra_data"].get("format") != results.FORMAT:
        return None
    if recorded.get("file") != job.path:
        return None
    try:
        if recorded.get("sha256") != _digest(Path(job.path)):
            return None
    except OSError:
        return None
    return previous


def write_graded(job: Job, graded: dict, out: Path, course) -> dict:
    """Write what ``grade_submission`` returned for ``job`` into ``out/<name>/`` and the
    gradebook ``course`` (a ``CourseGradebook`` or None), ``results.json`` last; its results."""
    outcome = graded["results"]
    folder = out / job.name
    results.write_atomic(folder / "feedback.html", graded["feedback"])
    if course is not None and not outcome["extra_data"].get("grader_error"):
        chapter = load_chapter(job.chapter)
        notebook = nbformat.reads(graded["notebook"], as_version=4) if graded["notebook"] else None
        try:
            mtime = Path(job.path).stat().st_mtime
        except OSError:
            mtime = None
        course.record(chapter, job.student, outcome, notebook, mtime)
    results.write(folder / "results.json", outcome)
    return outcome


def write_summary(out: Path, done: list[tuple[Job, dict]]) -> Path:
    """``OUT/summary.csv``: one row per submission of this batch."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["submission", "student", "file", "chapter", "score", "max_score", "status", "failed_checks", "flags"])
    for job, outcome in done:
        extra = outcome["extra_data"]
        status = ("grader-error" if extra.get("grader_error")
                  else next((f["kind"] for f in extra.get("flags", []) if f["kind"] in ("unreadable", "wrong-chapter")),
                            "graded"))
        failed = ";".join(t["name"] for t in outcome["tests"] if t["status"] != "passed")
        flags = ";".join(sorted({f["kind"] for f in extra.get("flags", [])}))
        writer.writerow([job.name, job.student, job.path, extra.get("chapter"), f"{outcome['score']:g}",
                         f"{outcome['max_score']:g}", status, failed, flags])
    path = out / "summary.csv"
    results.write_atomic(path, buffer.getvalue())
    return path


def grade_files(files, out: Path, chapter: str | None = None, *, jobs: int = 1, force: bool = False,
                limits: Limits | None = None, course: Path | None | bool = None, master: Path | None = None,
                progress: bool = False, seed: int | None = None, scratch: Path | None = None) -> list[dict]:
    """Grade each file into ``out/<name>/``; the results of each, in order.

    ``course``: the nbgrader course directory to record scores in (default ``out/nbgrader``;
    False for none). ``master``: grade against this master notebook instead of a chapter of
    the course. ``jobs``: submissions graded at once. ``scratch``: where sandboxes live while
    they run (default: the system's temporary folder).
    """
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a positive int, got {jobs!r}")
    scratch = str(Path(scratch).resolve()) if scratch else None
    out = Path(out)
    limits = limits or Limits()
    batch = plan(files, chapter, master)
    out.mkdir(parents=True, exist_ok=True)
    from .sandbox import sweep_stale

    sweep_stale(Path(scratch) if scratch else None)
    gradebook = None
    if course is not False:
        from .gradebook import CourseGradebook

        gradebook = CourseGradebook(Path(course) if course else out / "nbgrader")
    done: dict[str, dict] = {}
    todo = []
    for job in batch:
        previous = None if force else already_graded(job, out)
        if previous is not None:
            done[job.path] = previous
        else:
            todo.append(job)
    if gradebook is not None:
        for ref in sorted({job.chapter for job in todo}, key=lambda ref: (ref.slug, str(ref.master))):
            gradebook.ensure_assignment(load_chapter(ref))
    from tqdm.auto import tqdm

    bar = tqdm(total=len(batch), initial=len(batch) - len(todo), desc="grading", unit="notebook",
               disable=not progress, file=sys.stderr)
    try:
        if jobs == 1 or len(todo) <= 1:
            for job in todo:
                done[job.path] = write_graded(job, _grade_job(job, limits, jobs, seed, scratch), out, gradebook)
                bar.update(1)
        else:
            import multiprocessing

            context = multiprocessing.get_context("forkserver")
            with ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_worker_init) as pool:
                pending = {pool.submit(_grade_job, job, limits, jobs, seed, str(scratch) if scratch else None): job
                           for job in todo}
                while pending:
                    finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for future in finished:
                        job = pending.pop(future)
                        done[job.path] = write_graded(job, future.result(), out, gradebook)
                        bar.update(1)
    finally:
        bar.close()
        write_summary(out, [(job, done[job.path]) for job in batch if job.path in done])
    return [done[job.path] for job in batch]
