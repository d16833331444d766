"""Grade submitted notebooks, one or a batch: ``grade_files(paths, out, chapter=None, ...)``.

This module is the orchestrator of grading's one pipeline, a stage a module, each called
once per submission by :func:`grade_submission`:

1. **collect** (:mod:`autograder.collect`): the batch's jobs, file by file; only the three
   accepted layouts are graded, one job per student and chapter, and every other notebook,
   link or special file is flagged instead. The chapter comes from ``chapter`` (or
   ``master``) or from the file name, never from the notebook's contents;
2. **reconstruct** (:mod:`autograder.reconstruct`): the notebook rebuilt from the master
   with the learner's answer cells;
3. **plan** (:mod:`autograder.plan`): the chapter's plan, built once, and the kernels that
   grade this submission;
4. **run** (:mod:`autograder.run`): the learner's cells in sandboxed kernels, the checks in
   judges beside them;
5. **score** (:mod:`autograder.score`): a score and a reason for every check;
6. **report** (:mod:`autograder.report`): ``OUT/submissions/<name>/results.json``
   (Gradescope's shape) and ``feedback.html`` beside it, the nbgrader gradebook
   (``OUT/nbgrader`` unless told otherwise) and ``OUT/summary.csv`` (``<name>`` is
   ``<student>__<chapter>``: only the ``submissions`` folder holds names that come from
   submissions). A submission whose ``results.json`` exists (for the same file contents) is
   graded, and a re-run skips it unless ``force``; the gradebook has one row per student
   and chapter, updated in place.

A submission that cannot be read (whatever the reason, the reader's own exceptions
included), or belongs to another chapter, scores 0 with the reason, and the batch goes on.
A failure of the grader itself is recorded the same way, marked ``grader_error`` (regraded
on the next run), and makes the command exit with 1.
"""
from __future__ import annotations

import hashlib
import json
import sys
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from . import collect, plan, report, run, score
from .chapters import Chapter
from .collect import ChapterRef, Flagged, Job
from .reconstruct import SubmissionError, read_submission, reconstruct
from .report import SUBMISSIONS
from .sandbox import Limits


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


@lru_cache(maxsize=32)
def load_chapter(ref: ChapterRef) -> Chapter:
    """The chapter ``ref`` names, read once per process."""
    if ref.master is not None:
        return Chapter.from_master(ref.master, ref.slug)
    return Chapter.load(ref.slug)


def grade_submission(job: Job, limits: Limits, jobs: int = 1, seed: int | None = None,
                     scratch: str | None = None) -> dict:
    """Grade one submission down the pipeline: the job (collected) → its reconstruction →
    the run's plan → the run → the score → the report (its results, feedback page and
    instructor notebook, as text; :func:`autograder.report.graded`).

    Whatever goes wrong while the submission is read and rebuilt is the submission's: it
    scores 0 with the reason (never a ``grader_error``, which would be graded again forever).
    """
    chapter = load_chapter(job.chapter)
    submission = job.submission()
    if job.problem:
        return report.not_graded(chapter, score.unreadable(chapter, job.problem, submission))
    path = Path(job.path)
    try:
        data = read_submission(path)
        submission["sha256"] = hashlib.sha256(data).hexdigest()
        rebuilt = reconstruct(chapter, data, path.name)
    except SubmissionError as error:
        return report.not_graded(chapter, score.unreadable(chapter, str(error), submission))
    except Exception as error:  # noqa: BLE001 - a file that breaks the reader is unreadable, not the grader's fault
        reason = (f"{path.name} could not be read: it made the grader's reader fail "
                  f"({type(error).__name__}: {str(error)[:300]})")
        return report.not_graded(chapter, score.unreadable(chapter, reason, submission))
    wrong = [f for f in rebuilt.flags if f["kind"] == "wrong-chapter"]
    if wrong:
        reason = f"this is not a notebook of chapter {chapter.slug}: {wrong[0]['detail']}"
        outcome = score.unreadable(chapter, reason, submission, kind="wrong-chapter")
        outcome["extra_data"]["flags"] = score.cap_flags(rebuilt.flags)
        return report.not_graded(chapter, outcome)
    planned = plan.for_submission(plan.for_chapter(chapter), rebuilt.notebook, rebuilt.exported(),
                                  settled=rebuilt.reasons)
    execution = run.execute_sync(planned, limits, jobs=jobs, seed=seed, scratch=Path(scratch) if scratch else None)
    outcome = score.build(chapter, rebuilt, execution, submission)
    if execution.judge_error:
        outcome["extra_data"]["grader_error"] = execution.judge_error[-4000:]
    return report.graded(chapter, rebuilt, execution, outcome)


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
        outcome = score.unreadable(chapter, f"not graded: the grader failed on this notebook ({type(error).__name__}: "
                                   f"{first_line}); it will be graded again on the next run",
                                   job.submission(), kind="grader-error", grader_error=detail)
        return report.not_graded(chapter, outcome)


def already_graded(job: Job, out: Path) -> dict | None:
    """The results of ``job`` from an earlier run, when they are complete and current."""
    if job.problem:
        return None  # costs nothing to say again, and its reason may have changed
    try:
        previous = json.loads((out / SUBMISSIONS / job.name / "results.json").read_text())
        recorded = previous["extra_data"]["submission"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if previous["extra_data"].get("grader_error") or previous["extra_data"].get("format") != score.FORMAT:
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
    return report.write_graded(job, load_chapter(job.chapter), graded, out, course)


def grade_files(paths, out: Path, chapter: str | None = None, *, jobs: int = 1, force: bool = False,
                limits: Limits | None = None, course: Path | None | bool = None, master: Path | None = None,
                progress: bool = False, seed: int | None = None, scratch: Path | None = None) -> Batch:
    """Grade the notebooks and folders ``paths`` (see :func:`autograder.collect.batch`) into ``out``.

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
    planned = collect.batch(paths, chapter, master, exclude=[out, course_dir, scratch])
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
        report.write_summary(out, [(job, done[job.name]) for job in batch if job.name in done], planned.flagged)
    return Batch([(job, done[job.name]) for job in batch], planned.flagged)
