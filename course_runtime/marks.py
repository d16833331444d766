"""The marks that give a cell of a course notebook its role: the one definition of each.

The build chain (``coursebuild``: package, manifest, release) and the grader read the same
marks. They live in the notebook runtime, which both import, so that the grader runs where
the build chain is absent (a learner's folder) and neither imports the other for them.

- ``#| export minillm/<module>.py`` on the first line of a code cell: the cell becomes part
  of the package (``make package``), in chapter order.
- ``### BEGIN HIDDEN TESTS`` ... ``### END HIDDEN TESTS`` in a test cell: the part only the
  grader sees. nbgrader's release removes it (``coursebuild.release`` hands nbgrader these
  delimiters), the manifest counts the cell as hidden, and the grader runs it.
- ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` in an answer cell: the model answer,
  replaced by a stub in the release and stripped of its marks in the package.
- Cell ids: a graded cell's id is its ``grade_id``; every other cell's is
  :func:`cell_id` of its place in the source (``c007``), and the Colab set-up cell's is
  :data:`COLAB_SETUP_ID`. So a cell whose id is neither (JupyterLab gives a new cell a
  random one) is one the learner added (:func:`is_release_cell_id`).
"""
from __future__ import annotations

import re

EXPORT = re.compile(r"^#\|\s*export\s+(\S+)\s*$")
HIDDEN_BEGIN = "### BEGIN HIDDEN TESTS"
HIDDEN_END = "### END HIDDEN TESTS"
SOLUTION_BEGIN = "### BEGIN SOLUTION"
SOLUTION_END = "### END SOLUTION"
COLAB_SETUP_ID = "colab-setup"
_CELL_ID = re.compile(r"^c\d{3,}$")


def cell_id(index: int) -> str:
    """The id of the ungraded cell at ``index`` of a chapter's source."""
    return f"c{index:03d}"


def is_release_cell_id(cell_id_: str | None) -> bool:
    """True for the id the build gives an ungraded cell (:func:`cell_id`, the Colab set-up
    cell's), in this release or an earlier one (whose cells may have had other places)."""
    return bool(cell_id_) and (cell_id_ == COLAB_SETUP_ID or bool(_CELL_ID.match(cell_id_)))


def export_line(target: str) -> str:
    """The first line of a cell that exports to ``target`` (``minillm/attention.py``)."""
    return f"#| export {target}"


def export_target(source: str) -> str | None:
    """The package path a code cell's ``source`` exports to, from its first line, or None."""
    match = EXPORT.match(source.split("\n", 1)[0]) if source else None
    return match.group(1) if match else None


def export_body(source: str) -> str:
    """What an export cell's ``source`` writes into its module: all but the export line,
    without the solution marks."""
    lines = source.split("\n")[1:]
    return "\n".join(line for line in lines if line.strip() not in (SOLUTION_BEGIN, SOLUTION_END)).strip("\n")


def is_hidden_test(source: str) -> bool:
    """Whether a test cell's ``source`` holds a hidden part."""
    return HIDDEN_BEGIN in source
