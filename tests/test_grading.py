"""The grading round trip: the solution earns full marks, the untouched chapter earns 0."""
import ast
import html
import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from course_runtime import marks
from autograder.chapters import Chapter
from autograder.score import failure_message
from coursebuild import manifest, paths

from .conftest import SLUGS, graded

GROUP = [pytest.mark.grading]


def per_chapter(slug):
    return pytest.param(slug, marks=[pytest.mark.xdist_group(name=f"grade-{slug}"), *GROUP])


CHAPTER = pytest.mark.parametrize("slug", [per_chapter(s) for s in SLUGS])


@CHAPTER
def test_solution_earns_full_marks(slug, grading_root):
    result = graded(slug, grading_root)["solution"]
    expected = manifest.load()["chapters"][slug]["autograded_points"]
    failed = [t for t in result["tests"] if t["status"] != "passed"]
    assert not failed, f"solution lost points: {failed}"
    assert result["score"] == result["max_score"] == expected


@CHAPTER
def test_untouched_chapter_earns_nothing(slug, grading_root):
    result = graded(slug, grading_root)["untouched"]
    assert result["score"] == 0
    assert result["max_score"] == manifest.load()["chapters"][slug]["autograded_points"]
    assert all(t["output"] for t in result["tests"]), "every lost point needs a reason"


OUTPUT_TEXT = re.compile(r'<div class="jp-RenderedText[^"]*" data-mime-type="text/plain"[^>]*>\s*<pre>(.*?)</pre>', re.S)


def _printed(feedback_page: str) -> list[str]:
    """The lines of the text outputs a feedback page shows."""
    return [line for block in OUTPUT_TEXT.findall(feedback_page)
            for line in html.unescape(re.sub(r"<[^>]+>", "", block)).splitlines()]


def _keep_going_names(slug) -> list[str]:
    """The names the chapter's keep-going cells give course.keep_going."""
    names = []
    for cell in nbformat.read(paths.release_notebook(slug), as_version=4).cells:
        if cell.cell_type == "code" and "keep_going(" in cell.source:
            names += [node.args[0].value for node in ast.walk(ast.parse(cell.source))
                      if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("keep_going")]
    return names


@pytest.mark.parametrize("slug", SLUGS)
def test_every_visible_check_says_not_answered_yet_for_a_stub(slug):
    """The check functions of the visible tests carry @course.visible_check(NAME), which
    turns the stub's NotImplementedError, whatever the check made of it, into
    course.NotAnswered ("NAME: not answered yet"); and the cell calls them."""
    for cell in Chapter.load(slug).cells:
        if cell.kind != "visible":
            continue
        tree = ast.parse(cell.source)
        checks = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("check_")]
        called = {ast.unparse(node.value.func) for node in tree.body
                  if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)}
        assert checks and {check.name for check in checks} <= called, cell.grade_id
        for check in checks:
            assert any(ast.unparse(d).startswith("course.visible_check(") for d in check.decorator_list), (
                f"{cell.grade_id}: {check.name} needs @course.visible_check(...)")


@CHAPTER
def test_an_untouched_chapter_says_not_answered_yet_and_nothing_else(slug, grading_root):
    """Every check of the untouched release says "not answered yet", and so does every
    keep-going cell that the learner's kernel ran on a stub (the feedback page shows what
    they printed): never a hint about a mistake, though the stub's NotImplementedError is a
    RuntimeError, which some checks catch to diagnose shapes."""
    run = graded(slug, grading_root)
    for test in run["untouched"]["tests"]:
        assert test["output"].startswith("not answered yet"), test
    page = (Path(run["out"]) / "submissions" / f"untouched__{slug}" / "feedback.html").read_text()
    printed = _printed(page)
    exercises = {name for names in Chapter.load(slug).answer_names.values() for name in names}
    for name in _keep_going_names(slug):
        said = [line for line in printed if line.startswith(f"{name}: ")]
        assert said, f"{slug}: the keep-going cell of {name} printed nothing"
        for line in said:
            assert "not answered yet" in line or (name not in exercises and "using your implementation" in line), line
            assert not re.search(r"Hint|mistake|RuntimeError|CheckFailed|NotImplementedError", line), line


@CHAPTER
def test_results_have_gradescope_shape(slug, grading_root):
    out = Path(graded(slug, grading_root)["out"])
    pages = sorted(out.glob("submissions/*/results.json"))
    assert len(pages) == 2
    for page in pages:
        results = json.loads(page.read_text())
        assert {"score", "tests", "output"} <= results.keys()
        for test in results["tests"]:
            assert {"name", "score", "max_score", "status", "output"} <= test.keys()
            assert test["status"] in ("passed", "failed")
        assert {m["name"] for m in results["extra_data"]["manual_grading"]} == {
            gid for gid, c in manifest.load()["chapters"][slug]["cells"].items() if c["kind"] == "manual"}


@CHAPTER
def test_feedback_never_shows_hidden_tests(slug, grading_root):
    solution = nbformat.read(paths.solution_notebook(slug), as_version=4)
    hidden_lines = {
        line.strip()
        for cell in solution.cells if marks.is_hidden_test(cell.source)
        for line in cell.source.split(marks.HIDDEN_BEGIN)[1].split(marks.HIDDEN_END)[0].splitlines()
        if len(line.strip()) > 12
    }
    assert hidden_lines
    # A hidden test may share a line with the learner's own notebook (`return min_lr`).
    public = paths.release_notebook(slug).read_text()
    hidden_lines = {line for line in hidden_lines if line not in public}
    for page in Path(graded(slug, grading_root)["out"]).glob("submissions/*/feedback.html"):
        text = page.read_text()
        leaked = [line for line in hidden_lines if line in text]
        assert not leaked, f"{page} shows hidden test code: {leaked[:3]}"


def test_failure_message_never_quotes_the_traceback():
    cell = {"outputs": [{"output_type": "error", "ename": "AssertionError", "evalue": "x differs",
                         "traceback": ["secret_hidden_check(x)"]}]}
    assert failure_message(cell) == "AssertionError: x differs"


@pytest.mark.grading
@pytest.mark.xdist_group(name="grade-cli")
def test_cli_grades_a_malformed_notebook_as_zero_with_a_reason(tmp_path):
    broken = tmp_path / "00_history.ipynb"
    broken.write_text("{ this is not json")
    run = subprocess.run([sys.executable, "-m", "autograder", "grade", str(broken), "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    results = json.loads((tmp_path / "out" / "submissions" / "00_history__00_history" / "results.json").read_text())
    assert results["score"] == 0
    assert "not a readable notebook" in results["output"]


def test_cli_refuses_a_file_whose_chapter_it_cannot_tell(tmp_path):
    stray = tmp_path / "homework.ipynb"
    stray.write_text("{}")
    run = subprocess.run([sys.executable, "-m", "autograder", "grade", str(stray), "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "--chapter" in run.stderr
