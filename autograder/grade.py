"""Grade submitted notebooks, one or a batch: ``grade_files(paths, out, chapter=None, ...)``.

The batch is planned file by file (:mod:`autograder.collect`): only the three accepted
layouts are graded, one job per student and chapter; every other notebook, link or special
file is flagged instead. For each job:

1. the chapter comes from ``chapter`` (or ``master``) or from the file name, never from the
   notebook's contents;
2. the notebook is rebuilt from the master with the learner's answer cells
   (:mod:`autograder.reconstruct`);
3. the learner's cells run in a sandboxed kernel and the checks in the judge
   (:mod:`autograder.execute`);
4. ``OUT/submissions/<name>/results.json`` (Gradescope's shape) and ``feedback.html``
   beside it, the nbgrader gradebook (``OUT/nbgrader`` unless told otherwise) and
   ``OUT/summary.csv`` are written (``<name>`` is ``<student>__<chapter>``: only the
   ``submissions`` folder holds names that come from submissions). Every file is written
   atomically, ``results.json`` last: a submission whose ``results.json`` exists (for the
   same file contents) is graded, and a re-run skips it unless ``force``. A run that is
   killed therefore resumes without losing or duplicating a grade (the gradebook has one
   row per student and chapter, updated in place).

A submission that cannot be read (whatever the reason, the reader's own exceptions
included), or belongs to another chapter, scores 0 with the reason, and the batch goes on.
A failure of the grader itself is recorded the same way, marked ``grader_error`` (regraded
on the next run), and makes the command exit with 1.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import sys
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import nbformat

from . import collect, feedback, results
from .chapters import Chapter, chapter_of
from .collect import Flagged
from .course import present_slugs
from .reconstruct import SubmissionError, read_submission, reconstruct
from .sandbox import Limits

SUBMISSIONS = "submissions"  # OUT/submissions/<student>__<chapter>/: the one folder named after submissions


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


@dataclass
class Plan:
    """What a batch grades (one job per student and chapter) and what it flags instead."""

    jobs: list[Job]
    flagged: list[Flagged]


@dataclass
class Batch:
    """A graded batch: each gradebook row's job and results, and the files not graded."""

    rows: list[tuple[Job, dict]]
    flagged: list[Flagged]

    @property
    def outcomes(self) -> list[dict]:
        return [outcome for _, outcome in self.rows]

    def of(self, student: str) -> dict:
        """The results of ``student``'s one row in this batch."""
        found = [outcome for job, outcome in self.rows if job.student == student]
        if len(found) != 1:
            raise KeyError(f"{len(found)} rows of this batch are {student!r}'s")
        return found[0]


def _slugs(chapter: str | None, master: Path | None) -> list[str]:
    if master is not None:
        return [chapter or Path(master).stem]
    if chapter is not None:
        return [chapter_of(Path("."), chapter)]
    return present_slugs()


def plan(paths, chapter: str | None = None, master: Path | None = None, exclude=()) -> Plan:
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
            inside, odd = collect.in_folder(path, slugs, exclude)
            found += inside
            flagged += odd
        else:
            slug = slugs[0] if (master is not None or chapter is not None) else chapter_of(path)
            found.append(collect.single_file(path, slug))
    unique = {}
    for entry in found:  # the same file named twice is one submission
        unique.setdefault(entry.path, entry)
    kept, doubled = collect.duplicates(list(unique.values()))
    master_path = Path(master).resolve() if master is not None else None
    jobs = [Job(entry.path, f"{entry.student}__{entry.slug}", ChapterRef(entry.slug, master_path), entry.student,
                entry.layout, entry.problem) for entry in kept]
    return Plan(jobs, flagged + doubled)


@lru_cache(maxsize=32)
def load_chapter(ref: ChapterRef) -> Chapter:
    """The chapter ``ref`` names, read once per process."""
    if ref.master is not None:
        return Chapter.from_master(ref.master, ref.slug)
    return Chapter.load(ref.slug)


def grade_submission(job: Job, limits: Limits, jobs: int = 1, seed: int | None = None,
                     scratch: str | None = None) -> dict:
    """Grade one submission; its results, feedback page and instructor notebook (as text).

    Whatever goes wrong while the submission is read and rebuilt is the submission's: it
    scores 0 with the reason (never a ``grader_error``, which would be graded again forever).
    """
    from .execute import execute_sync
    from .gradebook import instructor_notebook

    chapter = load_chapter(job.chapter)
    path = Path(job.path)
    submission = {"file": job.path, "name": job.name, "student": job.student, "layout": job.layout}

    def unreadable(reason: str) -> dict:
        outcome = results.unreadable(chapter, reason, submission)
        return {"results": outcome, "feedback": feedback.render(chapter, None, outcome), "notebook": None}

    if job.problem:
        return unreadable(job.problem)
    try:
        data = read_submission(path)
        submission["sha256"] = hashlib.sha256(data).hexdigest()
        rebuilt = reconstruct(chapter, data, path.name)
    except SubmissionError as error:
        return unreadable(str(error))
    except Exception as error:  # noqa: BLE001 - a file that breaks the reader is unreadable, not the grader's fault
        return unreadable(f"{path.name} could not be read: it made the grader's reader fail "
                          f"({type(error).__name__}: {str(error)[:300]})")
    wrong = [f for f in rebuilt.flags if f["kind"] == "wrong-chapter"]
    if wrong:
        reason = f"this is not a notebook of chapter {chapter.slug}: {wrong[0]['detail']}"
        outcome = results.unreadable(chapter, reason, submission, kind="wrong-chapter")
        outcome["extra_data"]["flags"] = results.cap_flags(rebuilt.flags)
        return {"results": outcome, "feedback": feedback.render(chapter, None, outcome), "notebook": None}
    execution = execute_sync(chapter, rebuilt.notebook, limits, jobs=jobs, seed=seed,
                             scratch=Path(scratch) if scratch else None, settled=rebuilt.reasons,
                             answers=rebuilt.exported())
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
        # The learner sees the error's first line only: its log (a traceback) is the instructor's.
        first_line = (str(error).splitlines() or [""])[0][:300]
        outcome = results.unreadable(chapter, f"not graded: the grader failed on this notebook ({type(error).__name__}: "
                                     f"{first_line}); it will be graded again on the next run",
                                     {"file": job.path, "name": job.name, "student": job.student,
                                      "layout": job.layout},
                                     kind="grader-error", grader_error=detail)
        return {"results": outcome, "feedback": feedback.render(chapter, None, outcome), "notebook": None}


def already_graded(job: Job, out: Path) -> dict | None:
    """The results of ``job`` from an earlier run, when they are complete and current."""
    if job.problem:
        return None  # costs nothing to say again, and its reason may have changed
    try:
        previous = json.loads((out / SUBMISSIONS / job.name / "results.json").read_text())
        recorded = previous["extra_data"]["submission"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if previous["extra_data"].get("grader_error") or previous["extra_data"].get("format") != results.FORMAT:
        return None
    if recorded.get("file") != job.path:
        return None
    try:
        if recorded.get("sha256") != hashlib.sha256(read_submission(Path(job.path))).hexdigest():
            return None
    except (OSError, SubmissionError):
        return None
    return previous


def write_graded(job: Job, graded: dict, out: Path, course) -> dict:
    outcome = graded["results"]
    folder = out / SUBMISSIONS / job.name
    results.write_atomic(folder / "feedback.html", graded["feedback"])
    if course is not None and not outcome["extra_data"].get("grader_error"):
        chapter = load_chapter(job.chapter)
        notebook = nbformat.reads(graded["notebook"], as_version=4) if graded["notebook"] else None
        try:
            mtime = os.lstat(job.path).st_mtime if job.path else None
        except OSError:
            mtime = None
        course.record(chapter, job.student, outcome, notebook, mtime)
    results.write(folder / "results.json", outcome)
    return outcome


SUMMARY = ["submission", "student", "file", "chapter", "score", "max_score", "status", "failed_checks", "flags",
           "layout", "reason"]


def write_summary(out: Path, done: list[tuple[Job, dict]], flagged: list[Flagged] = ()) -> Path:
    """``OUT/summary.csv``: one row per gradebook row of this batch (and the file it came
    from), then one per file that was flagged and not graded."""
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
    results.write_atomic(path, buffer.getvalue())
    return path


def grade_files(paths, out: Path, chapter: str | None = None, *, jobs: int = 1, force: bool = False,
                limits: Limits | None = None, course: Path | None | bool = None, master: Path | None = None,
                progress: bool = False, seed: int | None = None, scratch: Path | None = None) -> Batch:
    """Grade the notebooks and folders ``paths`` (see :func:`plan`) into ``out``.

    Each job's results go to ``out/submissions/<student>__<chapter>/``; ``out/summary.csv``
    and the gradebook sit beside that folder, so no name a submission chooses can reach them.
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
    course_dir = None if course is False else (Path(course) if course else out / "nbgrader")
    planned = plan(paths, chapter, master, exclude=[out, course_dir, scratch])
    batch = planned.jobs
    out.mkdir(parents=True, exist_ok=True)
    from .processes import sweep_stale

    sweep_stale(Path(scratch) if scratch else None)
    gradebook = None
    if course_dir is not None:
        from .gradebook import CourseGradebook

        gradebook = CourseGradebook(course_dir)
    done: dict[str, dict] = {}
    todo = []
    for job in batch:
        previous = None if force else already_graded(job, out)
        if previous is not None:
            done[job.name] = previous
        else:
            todo.append(job)
    if gradebook is not None:
        for key in sorted({job.chapter for job in todo}, key=lambda ref: (ref.slug, str(ref.master))):
            gradebook.ensure_assignment(load_chapter(key))
    from tqdm.auto import tqdm

    bar = tqdm(total=len(batch), initial=len(batch) - len(todo), desc="grading", unit="notebook",
               disable=not progress, file=sys.stderr)
    try:
        cheap = [job for job in todo if job.problem]
        costly = [job for job in todo if not job.problem]
        for job in cheap:
            done[job.name] = write_graded(job, _grade_job(job, limits, jobs, seed, scratch), out, gradebook)
            bar.update(1)
        if jobs == 1 or len(costly) <= 1:
            for job in costly:
                done[job.name] = write_graded(job, _grade_job(job, limits, jobs, seed, scratch), out, gradebook)
                bar.update(1)
        else:
            import multiprocessing

            context = multiprocessing.get_context("forkserver")
            with ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_worker_init) as pool:
                pending = {pool.submit(_grade_job, job, limits, jobs, seed, str(scratch) if scratch else None): job
                           for job in costly}
                while pending:
                    finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for future in finished:
                        job = pending.pop(future)
                        done[job.name] = write_graded(job, future.result(), out, gradebook)
                        bar.update(1)
    finally:
        bar.close()
        write_summary(out, [(job, done[job.name]) for job in batch if job.name in done], planned.flagged)
    return Batch([(job, done[job.name]) for job in batch], planned.flagged)
