"""Turn a chapter's jupytext source into its solution notebook.

Cell directives, on the first lines of a cell, become metadata and are removed:

``#| answer ID``           an autograded answer cell (nbgrader "solution")
``#| test ID points=N``    a graded test cell; hidden when it holds ``marks.HIDDEN_BEGIN``
``#| written ID points=N`` a manually graded answer (markdown)
``#| stable``              nbval compares this cell's output (tag ``nbval-check-output``)
``#| tags T [T ...]``      extra cell tags

``#| export PATH`` stays in the cell: it tells the reader, and ``make package``, that the
cell becomes part of ``minillm``.
"""
from __future__ import annotations

import re
from pathlib import Path

import jupytext
import nbformat

from course_runtime import marks

from . import colab, paths

DIRECTIVE = re.compile(r"^#\|\s*(\w+)\s*(.*)$")
GRADE_ID = re.compile(r"^[a-z0-9_]+$")
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


def _parse_options(text: str) -> tuple[str, dict[str, str]]:
    words = text.split()
    if not words:
        return "", {}
    head, options = words[0], {}
    for word in words[1:]:
        key, sep, value = word.partition("=")
        if not sep:
            raise ValueError(f"directive option {word!r} is not key=value")
        options[key] = value
    return head, options


def _nbgrader(grade_id: str, *, grade: bool, solution: bool, locked: bool, points=None):
    if not GRADE_ID.match(grade_id):
        raise ValueError(f"grade_id {grade_id!r} must match {GRADE_ID.pattern}")
    meta = {
        "grade": grade,
        "grade_id": grade_id,
        "locked": locked,
        "schema_version": 3,
        "solution": solution,
        "task": False,
    }
    if points is not None:
        meta["points"] = points
    return meta


def _points(options: dict[str, str], where: str) -> int:
    if "points" not in options:
        raise ValueError(f"{where}: a graded cell needs points=N")
    return int(options["points"])


def apply_directives(cell, where: str) -> None:
    """Move a cell's ``#|`` directive lines into its metadata (in place)."""
    lines = cell.source.split("\n")
    tags: list[str] = []
    kept_head: list[str] = []
    while lines and DIRECTIVE.match(lines[0]):
        name, rest = DIRECTIVE.match(lines.pop(0)).groups()
        label = f"{where} directive {name!r}"
        if name == "export":
            kept_head.append(marks.export_line(rest.strip()))
        elif name == "answer":
            grade_id, _ = _parse_options(rest)
            cell.metadata["nbgrader"] = _nbgrader(grade_id, grade=False, solution=True, locked=False)
        elif name == "test":
            grade_id, options = _parse_options(rest)
            cell.metadata["nbgrader"] = _nbgrader(
                grade_id, grade=True, solution=False, locked=True, points=_points(options, label)
            )
            tags.append("raises-exception")
        elif name == "written":
            grade_id, options = _parse_options(rest)
            cell.metadata["nbgrader"] = _nbgrader(
                grade_id, grade=True, solution=True, locked=False, points=_points(options, label)
            )
        elif name == "stable":
            tags.append("nbval-check-output")
        elif name == "tags":
            tags.extend(rest.split())
        else:
            raise ValueError(f"{label}: unknown directive")
    cell.source = "\n".join(kept_head + lines).strip("\n")
    if tags:
        cell.metadata["tags"] = tags
    if cell.metadata.get("nbgrader", {}).get("solution") and marks.SOLUTION_BEGIN not in cell.source:
        raise ValueError(f"{where}: an answer cell needs {marks.SOLUTION_BEGIN} / {marks.SOLUTION_END}")


def build_notebook(slug: str) -> nbformat.NotebookNode:
    """The solution notebook of ``slug`` as its source defines it, without outputs."""
    source = paths.source_file(slug)
    notebook = jupytext.read(source, fmt="py:percent")
    seen: set[str] = set()
    for index, cell in enumerate(notebook.cells):
        cell.metadata.pop("lines_to_next_cell", None)
        apply_directives(cell, f"{source.name} cell {index}")
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in seen:
            raise ValueError(f"{source.name}: grade_id {grade_id!r} is used twice")
        if grade_id:
            seen.add(grade_id)
        cell.id = grade_id or marks.cell_id(index)
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    first_code = next(i for i, cell in enumerate(notebook.cells) if cell.cell_type == "code")
    setup = nbformat.v4.new_code_cell(colab.cell_source())
    setup.id = marks.COLAB_SETUP_ID
    notebook.cells.insert(first_code, setup)
    notebook.metadata = nbformat.from_dict(
        {"kernelspec": KERNELSPEC, "language_info": {"name": "python"}}
    )
    notebook.nbformat, notebook.nbformat_minor = 4, 5
    return notebook


def sources_of(notebook) -> list[tuple]:
    """What the build decides about a notebook: everything but outputs and counts."""
    return [
        (cell.id, cell.cell_type, cell.source, dict(cell.metadata)) for cell in notebook.cells
    ] + [dict(notebook.metadata)]


def write(notebook, path: Path) -> None:
    """Write a notebook in the one canonical form used throughout the course."""
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.validate(notebook)
    path.write_text(nbformat.writes(notebook, version=4) + "\n", encoding="utf-8")
