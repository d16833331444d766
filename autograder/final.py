"""After manual grading: every learner's results.json and feedback.html with the final score.

``python -m autograder feedback OUT [--course DIR]`` reads the gradebook a ``grade`` run
filled (``OUT/nbgrader`` unless ``--course``), where the instructor graded the written
answers and perhaps overrode a check in formgrader, and rewrites, for every submission of
``OUT/summary.csv``, its ``results.json`` (scores by hand included) and the summary of its
``feedback.html``. The checks' verdicts and the learner's notebook on the page stay as the
grader wrote them.
"""
from __future__ import annotations

import copy
import csv
import json
from pathlib import Path

from . import feedback, report
from .score import MAX_MESSAGE
from .gradebook import CourseGradebook

SUBMISSIONS = "submissions"


def final_results(graded: dict, scores: dict[str, float | None], comments: dict[str, str]) -> dict:
    """``graded`` (a results.json the grader wrote) with the gradebook's ``scores`` and
    ``comments``. A comment on an answer cell (the learner's code) goes with the exercise's
    first check, where results.json and the feedback page show it."""
    final = copy.deepcopy(graded)
    on_answer = dict(comments)
    for test in final["tests"]:
        score, notes = scores.get(test["name"]), []
        exercise = (test.get("tags") or ["", ""])[-1]
        if exercise in on_answer:
            notes.append(f"comment on your answer {exercise}: {on_answer.pop(exercise)}")
        if score is not None and score != test["score"]:
            notes.append(f"score set by hand: {score:g} / {test['max_score']:g}")
            test["score"] = score
        if comments.get(test["name"]):
            notes.append(f"comment: {comments[test['name']]}")
        if notes:
            test["output"] = "; ".join(notes + ([test["output"]] if test["output"] else []))
    manual = final["extra_data"].get("manual_grading", [])
    for item in manual:
        item["score"], item["comment"] = scores.get(item["name"]), comments.get(item["name"], "")
    waiting = sum(item["score"] is None for item in manual)
    final["score"] = sum(t["score"] for t in final["tests"]) + sum(m["score"] or 0.0 for m in manual)
    final["max_score"] = sum(t["max_score"] for t in final["tests"]) + sum(m["max_score"] for m in manual)
    slug = final["extra_data"].get("chapter", "")
    final["output"] = (f"{slug}: {final['score']:g} / {final['max_score']:g} points"
                       + (f"; {waiting} written answer(s) not graded yet" if waiting else ", final")
                       )[:MAX_MESSAGE]
    return final


def refresh(out: Path, course: Path | None = None, stream=None) -> list[Path]:
    """Rewrite the results and feedback of every graded submission under ``out``."""
    out = Path(out)
    summary = out / "summary.csv"
    if not summary.is_file():
        raise ValueError(f"argument OUT: {out} holds no summary.csv (grade into it first)")
    gradebook = CourseGradebook(Path(course) if course else out / "nbgrader")
    written = []
    with open(summary, newline="", encoding="utf-8") as rows:
        for row in csv.DictReader(rows):
            if row["status"] != "graded" or not row["submission"]:
                continue
            folder = out / SUBMISSIONS / row["submission"]
            graded = json.loads((folder / "results.json").read_text(encoding="utf-8"))
            final = final_results(graded, *gradebook.marks(row["chapter"], row["student"]))
            report.write_results(folder / "results.json", final)
            page = folder / "feedback.html"
            report.write_atomic(page, feedback.with_summary(page.read_text(encoding="utf-8"), final))
            print(f"{row['submission']}: {final['output']}", file=stream)
            written.append(folder)
    return written
