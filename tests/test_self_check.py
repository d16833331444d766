"""Self-check agrees with grading, on every chapter.

A learner's solved notebook (the release, each answer cell holding the solution's code) passes
every visible check under ``autograder check``, run from the learner's own folder, as grading
gives it full marks (tests/test_grading.py); the untouched release passes none, as grading
gives it zero. The learner's machine has only the release: the package's exercises of the
chapter are stubs there, so an answer that reached the package's version of another
exercise, instead of calling the learner's own, would be called unanswered.
"""
import io
import shutil

import pytest

from autograder.chapters import Chapter
from autograder.check import report
from coursebuild import paths

from . import grading_fixture as fx
from .conftest import SLUGS


def per_chapter(slug):
    return pytest.param(slug, marks=[pytest.mark.xdist_group(name=f"grade-{slug}"), pytest.mark.grading])


@pytest.mark.parametrize("slug", [per_chapter(s) for s in SLUGS])
def test_self_check_passes_a_solved_notebook_and_nothing_of_the_release(slug, tmp_path, monkeypatch):
    work = tmp_path / "work"
    fx.write(fx.submission(Chapter.load(slug), solved=True), work / "solved" / slug / f"{slug}.ipynb")
    shutil.copytree(paths.release_notebook(slug).parent, work / "untouched" / slug)
    monkeypatch.chdir(tmp_path)

    printed = io.StringIO()
    solved = report(f"work/solved/{slug}", stream=printed)
    assert solved["checks"] and not solved["grader_error"], printed.getvalue()
    assert all(solved["checks"].values()), printed.getvalue()

    printed = io.StringIO()
    untouched = report(f"work/untouched/{slug}", stream=printed)
    assert untouched["checks"].keys() == solved["checks"].keys()
    assert not any(untouched["checks"].values()), printed.getvalue()
    said = [line.strip() for line in printed.getvalue().splitlines() if line.startswith("  ✗ ")]
    assert said == [f"✗ {grade_id}: not answered yet" for grade_id in untouched["checks"]], printed.getvalue()
