"""Grading inside a Gradescope container: the one submission of ``ROOT/submission`` in,
``ROOT/results/results.json`` out (``python -m autograder gradescope CHAPTER``).

Gradescope runs each submission in a container of its own, so a class too large for one
grading machine is graded there; ``make gradescope CHAPTER=NN`` writes the autograder zip
whose ``run_autograder`` calls this. The layout is Gradescope's: the submitted files in
``ROOT/submission/``, the results in ``ROOT/results/``.
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from . import course
from .grade import grade_files
from .isolation import isolation
from .sandbox import Limits


def submitted_notebook(folder: Path, slug: str) -> tuple[Path | None, str]:
    """The notebook to grade among the submitted files, and a note on the choice.

    The chapter's own name wins; otherwise the only notebook there. Several other
    notebooks, or none, grade nothing.
    """
    notebooks = sorted(p for p in folder.glob("*.ipynb") if p.is_file() and not p.is_symlink())
    named = [p for p in notebooks if p.name == f"{slug}.ipynb"]
    if named:
        others = len(notebooks) - 1
        return named[0], f" ({others} other notebook(s) ignored)" if others else ""
    if len(notebooks) == 1:
        return notebooks[0], ""
    if not notebooks:
        return None, f"no notebook was submitted: upload your {slug}.ipynb"
    return None, (f"{len(notebooks)} notebooks were submitted and none is named {slug}.ipynb: "
                  f"upload that one notebook")


def gradescope_time(root: Path) -> dict | None:
    """The submission's time as Gradescope recorded it (``created_at`` in
    ``ROOT/submission_metadata.json``, which the student cannot write), or None."""
    import datetime

    try:
        created = json.loads((Path(root) / "submission_metadata.json").read_text(encoding="utf-8"))["created_at"]
        return {"time": datetime.datetime.fromisoformat(str(created)[:64]).timestamp(), "source": "gradescope"}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def run(chapter: str, root: Path, limits: Limits | None = None) -> dict:
    """Grade the submission under ``root`` and write ``root/results/results.json``."""
    [slug] = course.resolve_slugs([chapter])
    root = Path(root)
    said = isolation().statement(own_work=False)
    if said:  # the autograder's output: the instructor's, never the student's
        print(said, flush=True)
    (root / "results").mkdir(parents=True, exist_ok=True)
    notebook, note = submitted_notebook(root / "submission", slug)
    if notebook is None:
        results = {"score": 0.0, "output": note, "tests": [],
                   "extra_data": {"chapter": slug, "flags": [{"kind": "no-submission", "detail": note}]}}
    else:
        with tempfile.TemporaryDirectory() as out:
            [(_, results)] = grade_files([notebook], Path(out), slug, course=False, limits=limits).rows
        results["output"] = results.get("output", "") + note
        results["extra_data"]["submitted"] = gradescope_time(root) or results["extra_data"].get("submitted")
    # Gradescope shows results.json to the student: the grader's own failure (a traceback) goes
    # to the autograder's output, which only the instructor sees.
    detail = results.get("extra_data", {}).pop("grader_error", "")
    if detail:
        print(f"the grader failed on {notebook.name}:\n{detail}", file=sys.stderr)
    (root / "results" / "results.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    return results
