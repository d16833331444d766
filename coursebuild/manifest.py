"""The grade manifest: every graded cell of every chapter, with its points."""
from __future__ import annotations

import json

import nbformat

from autograder import course
from course_runtime import marks

from . import paths


def graded_cells(notebook) -> dict[str, dict]:
    """``grade_id`` → {points, kind} for each graded cell of a solution notebook."""
    cells = {}
    for cell in notebook.cells:
        meta = cell.metadata.get("nbgrader", {})
        if not meta.get("grade"):
            continue
        if meta.get("solution"):
            kind = "manual"
        elif marks.is_hidden_test(cell.source):
            kind = "hidden"
        else:
            kind = "visible"
        cells[meta["grade_id"]] = {"points": meta["points"], "kind": kind}
    return cells


def build(slugs: list[str]) -> dict:
    """The manifest of ``slugs``, in course order."""
    chapters = {}
    for slug in slugs:
        cells = graded_cells(nbformat.read(paths.solution_notebook(slug), as_version=4))
        chapters[slug] = {
            "total_points": sum(c["points"] for c in cells.values()),
            "autograded_points": sum(c["points"] for c in cells.values() if c["kind"] != "manual"),
            "cells": cells,
        }
    return {"course_id": "minillm", "chapters": chapters}


def dumps(manifest: dict) -> str:
    return json.dumps(manifest, indent=2) + "\n"


def load() -> dict:
    """The committed manifest."""
    return course.manifest()
