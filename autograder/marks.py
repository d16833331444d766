"""The marks that give a cell of a course notebook its role: the one definition of each.

The build chain (``coursebuild``: package, manifest, release) and the grader read the same
marks. They live here, in the grader's package, because the grader must run where the
build chain is absent (a learner's folder) and so never needs ``coursebuild`` for them;
the build chain imports this module.

- ``#| export minillm/<module>.py`` on the first line of a code cell: the cell becomes part
  of the package (``make package``), in chapter order.
- ``### BEGIN HIDDEN TESTS`` ... ``### END HIDDEN TESTS`` in a test cell: the part only the
  grader sees. nbgrader's release removes it (``coursebuild.release`` hands nbgrader these
  delimiters), the manifest counts the cell as hidden, and the grader runs it.
- ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` in an answer cell: the model answer,
  replaced by a stub in the release and stripped of its marks in the package.
"""
from __future__ import annotations

import re

EXPORT = re.compile(r"^#\|\s*export\s+(\S+)\s*$")
HIDDEN_BEGIN = "### BEGIN HIDDEN TESTS"
HIDDEN_END = "### END HIDDEN TESTS"
SOLUTION_BEGIN = "### BEGIN SOLUTION"
SOLUTION_END = "### END SOLUTION"


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
