"""``python -m autograder check NOTEBOOK|CHAPTER``: the learner's own report.

The notebook goes through the same machinery as grading (answers taken by ``grade_id``
into the learner's release of the chapter, the learner's cells in a sandboxed kernel, the
checks in a separate process), with the visible checks only: hidden checks run when the
notebook is graded. It needs only the learner's release (``chapters/``), never the
solutions, so it works from a student bundle.
"""
from __future__ import annotations

import sys
from pathlib import Path

from . import analysis, course
from .chapters import Chapter, chapter_of
from .execute import execute_sync
from .reconstruct import SubmissionError, reconstruct
from .sandbox import Limits

SHOWN_FLAGS = ("missing-answer", "extra-cells-ignored", "reference-use", "reference-nearby", "cell-timeout",
               "kernel-died", "kernel-stuck", "notebook-timeout", "output-truncated", "call-timeout",
               "answer-too-large", "not-analyzable", "too-many-cells")


def resolve_target(target: str, work: Path | None = None) -> Path:
    """The notebook ``target`` names: a notebook, a chapter's folder, or a chapter's number
    or slug, looked up in ``work`` (default: the current folder's ``work/``, or the current
    folder itself when it holds the chapters' folders, as a learner's ``~/work`` does)."""
    path = Path(target).expanduser()
    if path.is_file():
        return path
    present = course.present_slugs()
    if path.is_dir():
        for slug in present:
            if path.resolve().name in (slug, slug[:2]) and (path / f"{slug}.ipynb").is_file():
                return path / f"{slug}.ipynb"
        inside = [path / f"{slug}.ipynb" for slug in present if (path / f"{slug}.ipynb").is_file()]
        if len(inside) == 1:
            return inside[0]
        raise ValueError(f"argument NOTEBOOK|CHAPTER: the folder {target!r} holds no chapter notebook "
                         f"(a chapter's folder holds NN_slug.ipynb; chapters: {', '.join(present)})")
    try:
        if "/" in target or target.endswith(".ipynb"):
            raise ValueError(target)
        slug = course.resolve_slugs([target], present)[0]
    except ValueError:
        raise ValueError(f"argument NOTEBOOK|CHAPTER: {target!r} is neither a notebook, a chapter's folder "
                         f"nor a chapter (chapters: {', '.join(present)})") from None
    places = work_places(work)
    for place in places:
        notebook = place / slug / f"{slug}.ipynb"
        if notebook.is_file():
            return notebook
    where = " or ".join(str((place / slug / f"{slug}.ipynb").absolute()) for place in places)
    raise ValueError(f"argument NOTEBOOK|CHAPTER: chapter {slug} has no notebook at {where} "
                     "(run make lab first, give --work FOLDER, or name your notebook's file)")


def report(target: str, limits: Limits | None = None, stream=None, work: Path | None = None) -> dict:
    """Check a notebook; print the report to ``stream``; the per-check outcome."""
    stream = stream or sys.stdout
    limits = limits or Limits()
    path = resolve_target(target, work)
    slug = chapter_of(path)
    release = course.release_notebook(slug)
    chapter = Chapter.from_release(release, slug)
    try:
        rebuilt = reconstruct(chapter, path.read_bytes(), path.name)
    except SubmissionError as error:
        print(f"✗ {error}", file=stream)
        return {"ok": False, "checks": {}}
    wrong = [f for f in rebuilt.flags if f["kind"] == "wrong-chapter"]
    if wrong:
        print(f"✗ this is not a notebook of chapter {slug}: {wrong[0]['detail']}", file=stream)
        return {"ok": False, "checks": {}}
    names = set()
    unanalyzable = {f.get("cell") for f in rebuilt.flags if f["kind"] == "not-analyzable"}
    for grade_id, source in rebuilt.answers.items():
        if source and chapter.by_id[grade_id].kind == "answer" and grade_id not in unanalyzable:
            fact = analysis.facts(source)
            names |= fact.binds - fact.imports - {analysis.STAR}
    execution = execute_sync(chapter, rebuilt.notebook, limits, visible_only=True, names=sorted(names))
    print(f"{slug}: checking {path}", file=stream)
    checks, written = {}, {}
    exercise = 0
    for cell in chapter.cells:
        if cell.kind == "answer":
            exercise += 1
            print(f"\nExercise {exercise} · {cell.grade_id}", file=stream)
            if rebuilt.reasons.get(cell.grade_id):
                print(f"  ✗ {rebuilt.reasons[cell.grade_id]}", file=stream)
        elif cell.kind == "visible":
            verdict = execution.verdicts.get(cell.index)
            withheld = rebuilt.reasons.get(cell.exercise)
            passed = not withheld and verdict is not None and verdict["status"] == "passed"
            checks[cell.grade_id] = passed
            if passed:
                print(f"  ✓ {cell.grade_id} ({cell.points:g} point{'s' if cell.points != 1 else ''})", file=stream)
            elif not withheld:
                why = (f"{verdict.get('ename')}: {verdict.get('evalue')}" if verdict else
                       execution.reason or "not run")
                print(f"  ✗ {cell.grade_id}: {why}", file=stream)
        elif cell.kind == "hidden":
            print(f"  · {cell.grade_id} ({cell.points:g} points): a hidden check, run when your notebook is graded",
                  file=stream)
        elif cell.kind == "written":
            written[cell.grade_id] = rebuilt.status.get(cell.grade_id) == "answered"
            state = "answered" if written[cell.grade_id] else "not answered yet"
            print(f"\nWritten answer {cell.grade_id} ({cell.points:g} points, graded by hand): {state}", file=stream)
    notes = [f for f in rebuilt.flags + execution.flags if f["kind"] in SHOWN_FLAGS]
    if notes:
        print("\nNotes:", file=stream)
        for note in notes:
            print(f"  - {note['detail']}", file=stream)
    passed = sum(checks.values())
    print(f"\n{passed} of {len(checks)} visible checks pass.", file=stream)
    return {"ok": passed == len(checks), "checks": checks, "written": written}


def work_places(work: Path | None) -> list[Path]:
    """Where the learner's chapters may be, in order: ``work`` alone when given, else
    ./work, then the current folder (a learner's ``~/work`` itself)."""
    return [Path(work).expanduser()] if work is not None else [Path("work"), Path(".")]


def report_all(limits: Limits, stream=None, work: Path | None = None) -> dict[str, dict]:
    """One line per chapter of the work folder: its visible checks and written answers."""
    import io

    stream = stream or sys.stdout
    places = work_places(work)
    folder = next((place for place in places if place.is_dir()), places[0])
    found = [slug for slug in course.present_slugs() if (folder / slug / f"{slug}.ipynb").is_file()]
    if not found:
        raise ValueError(f"argument NOTEBOOK|CHAPTER: no chapter notebooks in {folder.absolute()} "
                         "(run make lab first, or give --work FOLDER)")
    outcomes = {}
    for slug in found:
        outcome = report(str(folder / slug / f"{slug}.ipynb"), limits, stream=io.StringIO())
        checks, written = outcome["checks"], outcome.get("written", {})
        left = sum(not answered for answered in written.values())
        mark = "✓" if outcome["ok"] and not left else "·"
        line = f"{mark} {slug}: {sum(checks.values())} of {len(checks)} visible checks pass"
        if written:
            line += f", {len(written) - left} of {len(written)} written answers given"
        print(line, file=stream, flush=True)
        outcomes[slug] = outcome
    return outcomes


def check_command(target: str, limits: Limits, work: Path | None = None) -> int:
    try:
        if target == "all":
            return 0 if all(o["ok"] for o in report_all(limits, work=work).values()) else 1
        outcome = report(target, limits, work=work)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0 if outcome["ok"] else 1
