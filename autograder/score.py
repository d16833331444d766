"""The score stage: Gradescope-shaped results, a score per check, a reason for every lost point, and flags.

The shape (``results.json``)::

    {"score": 9.0, "max_score": 16.0, "output": "00_history: 9 / 16 autograded points ...",
     "tests": [{"name": "rnn_forward_hidden", "score": 0.0, "max_score": 2.0,
                "status": "failed", "output": "why", "visibility": "visible",
                "tags": ["hidden"], "number": "1.2"}],
     "extra_data": {"chapter": ..., "flags": [{"kind": ..., "detail": ..., "cell": ...}],
                    "manual_grading": [{"name": ..., "max_score": ..., "answered": true}],
                    "submission": {"file": ..., "sha256": ...}, "seed": ..., ...}}

Every check's ``output`` is the exception's type and message, never a traceback (a
traceback would quote the check's code, and hidden checks stay hidden).
Flags are kept to :data:`MAX_FLAGS_PER_KIND` of each kind, then one flag says how many
more there were, so no submission can make its results large.
"""
from __future__ import annotations

MAX_MESSAGE = 2000
# The exceptions of an exercise not answered yet: its stub's, and the checks' own
# (course_runtime.NotAnswered), which say "NAME: not answered yet" and nothing else.
UNANSWERED = ("NotImplementedError", "NotAnswered")
MAX_FLAGS_PER_KIND = 20
FORMAT = 1


def cap_flags(flags: list[dict], per_kind: int = MAX_FLAGS_PER_KIND) -> list[dict]:
    """At most ``per_kind`` flags of each kind, then one that says how many more there were."""
    kept, counts = [], {}
    for entry in flags:
        kind = entry.get("kind")
        counts[kind] = counts.get(kind, 0) + 1
        if counts[kind] <= per_kind:
            kept.append(entry)
    for kind, count in counts.items():
        if count > per_kind:
            kept.append({"kind": kind, "detail": f"and {count - per_kind:,} more {kind} flags like the ones above"})
    return kept


def failure_message(cell) -> str:
    """What a failed test cell of an executed notebook reports: type and message, no traceback."""
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            if output.get("ename") in UNANSWERED:
                return "not answered yet: the answer cell still raises NotImplementedError"
            text = f"{output.get('ename', 'Error')}: {output.get('evalue', '')}"
            return text[:MAX_MESSAGE]
    return "the cell did not run to the end"


def reason(verdict: dict | None, execution) -> str:
    """Why a check failed, from its verdict: the exception's type and message. An exercise
    whose code raises ``NotImplementedError`` (its stub) is "not answered yet", whatever the
    check made of that error (``course_runtime.NotAnswered``)."""
    if verdict is None:
        if execution is not None and execution.timed_out:
            return execution.timed_out
        if execution is not None and execution.judge_error:
            return "not graded: the grader itself failed on this notebook (see the instructor)"
        return "not run"
    if verdict.get("unavailable"):
        return str(verdict.get("evalue", ""))[:MAX_MESSAGE]
    name, value = verdict.get("ename", "Error"), str(verdict.get("evalue", ""))
    if name in UNANSWERED:
        return (value if value.endswith("not answered yet") else f"not answered yet: {value}")[:MAX_MESSAGE]
    if verdict.get("student"):  # the message already says "your f raised ValueError: ..."
        return value[:MAX_MESSAGE]
    return f"{name}: {value}"[:MAX_MESSAGE]


def _numbering(chapter) -> dict[str, str]:
    numbers, exercise, check = {}, 0, 0
    for cell in chapter.cells:
        if cell.kind == "answer":
            exercise, check = exercise + 1, 0
        elif cell.is_test:
            check += 1
            numbers[cell.grade_id] = f"{exercise}.{check}"
    return numbers


def _reference_objects(chapter, execution) -> dict[str, str]:
    """Exercises whose defined names are the reference itself, as the learner's process said."""
    found = {}
    modules = set(chapter.reference_modules)
    for grade_id, names in chapter.answer_names.items():
        for name in names:
            info = (execution.described if execution else {}).get(name, {})
            if info.get("module") in modules:
                found[grade_id] = (f"your {name} is the course's reference ({info['module']}.{name}), not your "
                                   "own code, so its checks score nothing")
    return found


def build(chapter, rebuilt, execution, submission: dict | None = None) -> dict:
    """The results of one graded submission."""
    flags = list(rebuilt.flags) + list(execution.flags if execution else [])
    reference = _reference_objects(chapter, execution)
    for grade_id, detail in reference.items():
        flags.append({"kind": "reference-use", "cell": grade_id, "detail": detail})
    numbers = _numbering(chapter)
    tests = []
    failure = execution.failure if execution else ""  # it fails every check, passed or not
    for cell in chapter.tests:
        withheld = failure or rebuilt.reasons.get(cell.exercise) or reference.get(cell.exercise)
        verdict = execution.verdicts.get(cell.index) if execution else None
        passed = not withheld and verdict is not None and verdict["status"] == "passed"
        tests.append({
            "name": cell.grade_id,
            "score": cell.points if passed else 0.0,
            "max_score": cell.points,
            "status": "passed" if passed else "failed",
            "output": "" if passed else (withheld or reason(verdict, execution)),
            "visibility": "visible",
            "tags": [cell.kind, cell.exercise or ""],
            "number": numbers.get(cell.grade_id, ""),
        })
    manual = [{"name": c.grade_id, "max_score": c.points, "answered": rebuilt.status.get(c.grade_id) == "answered"}
              for c in chapter.written]
    outcome = assemble(chapter, tests, manual, flags, execution, submission)
    outcome["extra_data"]["answers"] = dict(rebuilt.status)
    return outcome


def assemble(chapter, tests, manual, flags, execution=None, submission=None, *, output=None,
             grader_error: str = "") -> dict:
    score = sum(t["score"] for t in tests)
    max_score = chapter.autograded_points
    summary = output or (f"{chapter.slug}: {score:g} / {max_score:g} autograded points"
                         + (f"; {sum(m['max_score'] for m in manual):g} more points are graded by hand" if manual else ""))
    extra = {
        "format": FORMAT,
        "chapter": chapter.slug,
        "manual_grading": manual,
        "flags": cap_flags(flags),
        "submission": submission or {},
    }
    if execution is not None:
        extra["seed"] = execution.seed
        extra["seconds"] = {k: round(v, 2) for k, v in execution.seconds.items()}
    if grader_error:
        extra["grader_error"] = grader_error[-4000:]
    return {"score": score, "max_score": max_score, "output": summary[:MAX_MESSAGE], "tests": tests,
            "extra_data": extra}


def unreadable(chapter, reason: str, submission: dict | None = None, *, kind: str = "unreadable",
               grader_error: str = "") -> dict:
    """Results for a submission that could not be graded: every check 0, with the reason."""
    numbers = _numbering(chapter)
    tests = [{"name": c.grade_id, "score": 0.0, "max_score": c.points, "status": "failed", "output": reason,
              "visibility": "visible", "tags": [c.kind, c.exercise or ""], "number": numbers.get(c.grade_id, "")}
             for c in chapter.tests]
    manual = [{"name": c.grade_id, "max_score": c.points, "answered": False} for c in chapter.written]
    return assemble(chapter, tests, manual, [{"kind": kind, "detail": reason}], None, submission,
                    output=f"{chapter.slug}: 0 / {chapter.autograded_points:g}: {reason}", grader_error=grader_error)
