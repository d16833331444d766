"""Gradescope-shaped results from nbgrader's gradebook and the autograded notebook."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

MAX_MESSAGE = 2000


def failure_message(cell) -> str:
    """What a failed test cell reports: the exception's type and message, no traceback.

    Tracebacks would quote the test's code, and hidden tests must stay hidden.
    """
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            if output.get("ename") == "NotImplementedError":
                return "not answered yet: the answer cell still raises NotImplementedError"
            text = f"{output.get('ename', 'Error')}: {output.get('evalue', '')}"
            return text[:MAX_MESSAGE]
    return "the cell did not run to the end"


def build(grades: list[dict], notebook, chapter: str, rebuilt=None) -> dict:
    """``grades``: one dict per graded cell (grade_id, score, max_score, manual).

    ``rebuilt`` (a :class:`~autograder.reconstruct.Reconstruction`) zeroes the checks of an
    exercise whose answer is missing, unanswered or the reference, with that reason.
    """
    cells = {cell.metadata.get("nbgrader", {}).get("grade_id"): cell for cell in notebook.cells}
    tests, manual = [], []
    for grade in grades:
        if grade["manual"]:
            manual.append({"name": grade["grade_id"], "max_score": grade["max_score"]})
            continue
        passed = grade["score"] >= grade["max_score"]
        exercise = rebuilt.chapter.exercise_of(grade["grade_id"]) if rebuilt else None
        withheld = rebuilt.reasons.get(exercise) if rebuilt and exercise else None
        if withheld:
            passed = False
        tests.append({
            "name": grade["grade_id"],
            "score": 0.0 if withheld else grade["score"],
            "max_score": grade["max_score"],
            "status": "passed" if passed else "failed",
            "output": "" if passed else (withheld or failure_message(cells.get(grade["grade_id"], {}))),
        })
    score = sum(t["score"] for t in tests)
    max_score = sum(t["max_score"] for t in tests)
    return {
        "score": score,
        "max_score": max_score,
        "output": f"{chapter}: {score:g} / {max_score:g} autograded points"
        + (f"; {sum(m['max_score'] for m in manual):g} more points are graded by hand" if manual else ""),
        "tests": tests,
        "extra_data": {"chapter": chapter, "manual_grading": manual, "flags": rebuilt.flags if rebuilt else []},
    }


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write(path: Path, results: dict) -> None:
    write_atomic(path, json.dumps(results, indent=2) + "\n")
