"""``python -m autograder check NOTEBOOK|CHAPTER``: the learner's own report.

The notebook goes through the same machinery as grading (answers taken by ``grade_id``
into the learner's release of the chapter, the learner's cells in a sandboxed kernel, the
checks in a separate process), with the visible checks only: hidden checks run when the
notebook is graded. It needs only the learner's release (``chapters/``), never the
solutions, so it works from a student bundle.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from . import course
from .sandbox import Limits

CACHE = ".progress-cache"  # in the work folder: check all's last result per chapter

SHOWN_FLAGS = ("missing-answer", "extra-cells-ignored", "reference-use", "reference-nearby", "cell-timeout",
               "kernel-died", "kernel-stuck", "notebook-timeout", "output-truncated", "call-timeout",
               "answer-too-large", "not-analyzable", "too-many-cells", "submission-timeout", "message-over-limit")


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
    from . import analysis, plan, run, score
    from .chapters import Chapter, chapter_of
    from .reconstruct import SubmissionError, reconstruct

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
    planned = plan.for_submission(plan.for_chapter(chapter), rebuilt.notebook, rebuilt.exported(), names=names,
                                  visible_only=True)
    execution = run.execute_sync(planned, limits)
    print(f"{slug}: checking {path}", file=stream)
    checks, written = {}, {}
    exercise = 0
    checked = {cell.exercise for cell in chapter.cells if cell.kind == "visible"}
    for cell in chapter.cells:
        if cell.kind == "answer":
            exercise += 1
            print(f"\nExercise {exercise} · {cell.grade_id}", file=stream)
            # An untouched answer cell is said at its visible check: "not answered yet".
            if rebuilt.reasons.get(cell.grade_id) and not (unanswered(rebuilt, cell.grade_id)
                                                            and cell.grade_id in checked):
                print(f"  ✗ {rebuilt.reasons[cell.grade_id]}", file=stream)
        elif cell.kind == "visible":
            verdict = execution.verdicts.get(cell.index)
            withheld = rebuilt.reasons.get(cell.exercise)
            passed = not withheld and verdict is not None and verdict["status"] == "passed"
            checks[cell.grade_id] = passed
            if passed:
                print(f"  ✓ {cell.grade_id} ({cell.points:g} point{'s' if cell.points != 1 else ''})", file=stream)
            elif unanswered(rebuilt, cell.exercise):
                print(f"  ✗ {cell.grade_id}: not answered yet", file=stream)
            elif not withheld:
                why = score.reason(verdict, execution) if verdict else execution.reason or "not run"
                if why == f"{cell.exercise}: not answered yet":  # the check's NotAnswered names the exercise
                    why = "not answered yet"
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
    if execution.judge_error:
        print(f"\n✗ the grader itself failed on this notebook, so some checks did not run: "
              f"{execution.judge_error.strip().splitlines()[-1][:300]}", file=stream)
    passed = sum(checks.values())
    print(f"\n{passed} of {len(checks)} visible checks pass.", file=stream)
    return {"ok": passed == len(checks), "checks": checks, "written": written,
            "grader_error": bool(execution.judge_error)}


def unanswered(rebuilt, grade_id: str | None) -> bool:
    """True when the answer cell ``grade_id`` still holds the release's starting code."""
    return rebuilt.status.get(grade_id) == "unanswered"


def work_places(work: Path | None) -> list[Path]:
    """Where the learner's chapters may be, in order: ``work`` alone when given, else
    ./work, then the current folder (a learner's ``~/work`` itself)."""
    return [Path(work).expanduser()] if work is not None else [Path("work"), Path(".")]


def _digest(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "big") + part)
    return digest.hexdigest()


def grader_version() -> str:
    """A hash of the code a check's result depends on besides the two notebooks: the
    grader (``autograder/``, its manifest included), the package and the notebook runtime the
    notebook runs on (``minillm/``, ``course_runtime/``); and of the Python running them."""
    import course_runtime
    import minillm

    parts = [sys.version.encode()]
    for package in (Path(__file__).resolve().parent, Path(minillm.__file__).resolve().parent,
                    Path(course_runtime.__file__).resolve().parent):
        for file in sorted(package.rglob("*")):
            if file.suffix in (".py", ".json") and file.is_file() and "__pycache__" not in file.parts:
                parts += [file.relative_to(package.parent).as_posix().encode(), file.read_bytes()]
    return _digest(*parts)


def cache_key(notebook: Path, slug: str, limits: Limits, version: str) -> str:
    """What a chapter's result depends on: the learner's notebook, the chapter's release
    (``chapters/`` or the student bundle's), the grader's version and the time limits."""
    return _digest(notebook.read_bytes(), course.release_notebook(slug).read_bytes(), version.encode(),
                   repr((limits.cell_timeout, limits.call_timeout)).encode())


def _cached(folder: Path, slug: str, key: str) -> dict | None:
    try:
        entry = json.loads((folder / CACHE / f"{slug}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    outcome = entry.get("outcome") if isinstance(entry, dict) and entry.get("key") == key else None
    if not (isinstance(outcome, dict) and isinstance(outcome.get("checks"), dict)
            and isinstance(outcome.get("written", {}), dict) and isinstance(outcome.get("ok"), bool)):
        return None
    return outcome


def _remember(folder: Path, slug: str, key: str, outcome: dict) -> None:
    from .report import write_atomic

    try:
        write_atomic(folder / CACHE / f"{slug}.json", json.dumps({"key": key, "outcome": outcome}) + "\n")
    except OSError:
        pass  # a folder the learner cannot write: checked again next time


def summary_line(slug: str, outcome: dict) -> str:
    checks, written = outcome["checks"], outcome.get("written", {})
    left = sum(not answered for answered in written.values())
    mark = "✓" if outcome["ok"] and not left else "·"
    line = f"{mark} {slug}: {sum(checks.values())} of {len(checks)} visible checks pass"
    if written:
        line += f", {len(written) - left} of {len(written)} written answers given"
    if outcome.get("grader_error"):
        line += " (the grader itself failed on this notebook: run make self-check on it)"
    return line


def report_all(limits: Limits, stream=None, work: Path | None = None, progress: bool = True) -> dict[str, dict]:
    """One line per chapter of the work folder: its visible checks and written answers.

    A chapter whose notebook, release and grader are those of the last run is not checked
    again: its result comes from ``FOLDER/.progress-cache/`` (:func:`cache_key`). A
    progress bar (on stderr) counts the chapters.
    """
    import io

    from tqdm.auto import tqdm

    stream = stream or sys.stdout
    places = work_places(work)
    folder = next((place for place in places if place.is_dir()), places[0])
    found = [slug for slug in course.present_slugs() if (folder / slug / f"{slug}.ipynb").is_file()]
    if not found:
        raise ValueError(f"argument NOTEBOOK|CHAPTER: no chapter notebooks in {folder.absolute()} "
                         "(run make lab first, or give --work FOLDER)")
    version = grader_version()
    outcomes, reused = {}, 0
    bar = tqdm(total=len(found), desc="checking", unit="chapter", file=sys.stderr, disable=not progress)
    try:
        for slug in found:
            bar.set_postfix_str(slug)
            notebook = folder / slug / f"{slug}.ipynb"
            key = cache_key(notebook, slug, limits, version)
            outcome = _cached(folder, slug, key)
            if outcome is None:
                outcome = report(str(notebook), limits, stream=io.StringIO())
                if not outcome.get("grader_error"):
                    _remember(folder, slug, key, outcome)
            else:
                reused += 1
            bar.write(summary_line(slug, outcome), file=stream)
            stream.flush()
            outcomes[slug] = outcome
            bar.update()
    finally:
        bar.close()
    passed = sum(sum(o["checks"].values()) for o in outcomes.values())
    total = sum(len(o["checks"]) for o in outcomes.values())
    given = sum(sum(o.get("written", {}).values()) for o in outcomes.values())
    written = sum(len(o.get("written", {})) for o in outcomes.values())
    print(f"\n{passed} of {total} visible checks pass; {given} of {written} written answers given"
          + (f" ({reused} unchanged chapter{'s' if reused != 1 else ''} not checked again)" if reused else "")
          + ".", file=stream)
    return outcomes


def check_command(target: str, limits: Limits, work: Path | None = None, progress: bool = True) -> int:
    """The exit status of ``check``: 0 once the report is written, whatever it says (checks
    that fail are the report's news, not an error); 1 when the grader itself failed on a
    notebook; 2 for a bad argument (no such chapter, no notebook where one was named)."""
    try:
        if target == "all":
            outcomes = report_all(limits, work=work, progress=progress).values()
        else:
            outcomes = [report(target, limits, work=work)]
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 1 if any(o.get("grader_error") for o in outcomes) else 0
