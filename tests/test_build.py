"""The build chain's cell directives and export rules."""
from pathlib import Path

import nbformat
import pytest

from course_runtime import marks
from coursebuild import manifest, notebooks, package, release


def cell(source, kind="code"):
    return (nbformat.v4.new_code_cell if kind == "code" else nbformat.v4.new_markdown_cell)(source)


def test_directives_become_nbgrader_metadata():
    answer = cell("#| answer f\n#| export minillm/x.py\ndef f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION")
    notebooks.apply_directives(answer, "t")
    assert answer.metadata["nbgrader"]["solution"] and not answer.metadata["nbgrader"]["grade"]
    assert answer.source.startswith("#| export minillm/x.py\ndef f")
    test = cell("#| test f_visible points=1\nassert f() == 1")
    notebooks.apply_directives(test, "t")
    meta = test.metadata["nbgrader"]
    assert (meta["grade"], meta["solution"], meta["locked"], meta["points"]) == (True, False, True, 1)
    assert test.metadata["tags"] == ["raises-exception"]
    assert test.source == "assert f() == 1"
    stable = cell("#| stable\nprint(1)")
    notebooks.apply_directives(stable, "t")
    assert stable.metadata["tags"] == ["nbval-check-output"]


@pytest.mark.parametrize("source, message", [
    ("#| frobnicate\nx = 1", "unknown directive"),
    ("#| test f_visible\nx = 1", "points"),
    ("#| answer Bad-Id\n### BEGIN SOLUTION\n### END SOLUTION", "grade_id"),
    ("#| answer f\nx = 1", "BEGIN SOLUTION"),
])
def test_bad_directives_are_errors(source, message):
    with pytest.raises(ValueError, match=message):
        notebooks.apply_directives(cell(source), "t")


def test_export_strips_markers_and_directive():
    exported = cell("#| export minillm/x.py\ndef f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION")
    assert package.export_target(exported) == "minillm/x.py"
    assert marks.export_body(exported.source) == "def f():\n    return 1"
    assert package.export_target(cell("x = 1")) is None
    assert package.export_target(cell("#| export minillm/x.py", kind="markdown")) is None


def test_the_export_mark_is_one_line_and_round_trips():
    assert marks.export_target(marks.export_line("minillm/attention.py") + "\nx = 1") == "minillm/attention.py"
    assert marks.export_target("#|  export   minillm/x.py  ") == "minillm/x.py"
    assert marks.export_target("x = 1\n#| export minillm/x.py") is None, "only the first line counts"
    assert marks.export_target("# export minillm/x.py") is None
    assert marks.export_target("") is None


def test_the_release_and_the_grader_share_the_hidden_test_marks():
    """nbgrader finds hidden tests and solutions by the same marks as the manifest and grader."""
    config = release.course_config(Path("."))
    assert config.ClearHiddenTests.begin_test_delimeter == marks.HIDDEN_BEGIN
    assert config.ClearHiddenTests.end_test_delimeter == marks.HIDDEN_END
    assert config.ClearSolutions.begin_solution_delimeter == marks.SOLUTION_BEGIN
    hidden = cell(f"#| test f_hidden points=2\nassert True\n{marks.HIDDEN_BEGIN}\nassert f() == 1\n{marks.HIDDEN_END}")
    notebooks.apply_directives(hidden, "t")
    notebook = nbformat.v4.new_notebook(cells=[hidden])
    assert manifest.graded_cells(notebook) == {"f_hidden": {"points": 2, "kind": "hidden"}}
