"""feedback.html in a real browser: the course's math typeset offline, the learner's text
never, long reasons wrapped."""
import re

import pytest

from autograder.chapters import Chapter
from autograder.grade import grade_files

from . import browser
from . import grading_fixture as fx

pytestmark = [pytest.mark.grading, pytest.mark.skipif(browser.MISSING is not None, reason=str(browser.MISSING))]

WRITTEN = "$\\beta$ LEARNER-MATH-5e1 stays as I typed it"
LONG_NAME = "a_very_long_name_" * 12


def test_feedback_typesets_the_course_math_offline_and_never_the_learners(tmp_path):
    master = fx.write_master(tmp_path / "master")
    chapter = Chapter.from_master(master, fx.SLUG)
    answers = {"why_bias": WRITTEN,
               "scale": f"def scale(x, factor):\n    raise ValueError('{LONG_NAME}')\n"}
    fx.write(fx.submission(chapter, answers, solved=True), tmp_path / "subs" / f"ann__{fx.SLUG}.ipynb")
    grade_files([tmp_path / "subs"], tmp_path / "out", master=master, course=False)
    page = tmp_path / "out" / "submissions" / f"ann__{fx.SLUG}" / "feedback.html"
    assert not re.search(r"<script[^>]*src=\"https?:", page.read_text()), "no script comes from the network"
    with browser.page() as tab:
        requests = []
        tab.route("http*://**", lambda route: (requests.append(route.request.url), route.abort()))
        errors = []
        tab.on("console", lambda message: message.type == "error" and errors.append(message.text))
        tab.goto(page.as_uri(), wait_until="load")
        tab.wait_for_function("window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=60_000)
        tab.evaluate("MathJax.startup.promise")
        assert tab.locator(".jp-RenderedMarkdown mjx-container").count() >= 2, "inline and display math typeset"
        text = tab.inner_text("body")
        assert "$y = c" not in text and "$$y_i" not in text, "no raw TeX left in the course's text"
        assert WRITTEN in text, "the learner's written answer is shown as typed, math and all"
        assert tab.locator("#grading-summary mjx-container").count() == 0
        wrap = tab.evaluate("getComputedStyle(document.querySelector('#grading-summary pre')).whiteSpace")
        assert wrap == "pre-wrap"
        table = tab.evaluate("document.querySelector('#grading-summary table').getBoundingClientRect().width")
        assert table <= tab.viewport_size["width"], "a long reason wraps instead of running off the page"
        assert requests == [] and errors == []
        assert browser.hostile_marks(tab) == []
