"""make solutions: the solution notebooks as read-only pages that work offline."""
import re
from pathlib import Path

import pytest

from coursebuild import paths, solutions

from . import browser

pytestmark = pytest.mark.xdist_group(name="solutions-pages")  # one worker builds the pages

SLUGS = ["04_attention", "12_lora"]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return solutions.build(tmp_path_factory.mktemp("solutions"), SLUGS).parent


def model_answer_lines(slug: str) -> list[str]:
    """Lines inside the chapter source's solution regions (what only the solutions show)."""
    source = paths.source_file(slug).read_text(encoding="utf-8")
    regions = re.findall(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", source, re.S)
    return [line.strip() for region in regions for line in region.splitlines() if len(line.strip()) > 25]


@pytest.mark.parametrize("slug", SLUGS)
def test_each_page_shows_the_model_answers_and_loads_nothing_from_the_network(built, slug):
    text = (built / f"{slug}.html").read_text(encoding="utf-8")
    lines = model_answer_lines(slug)
    assert lines and all(re.sub(r"\s+", "", line)[:20] in re.sub(r"<[^>]+>|\s+", "", text) for line in lines[:5])
    sources = re.findall(r'<script[^>]*\bsrc="([^"]+)"', text) + re.findall(r'<link[^>]*\bhref="(https?:[^"]+)"', text)
    assert sources == [solutions.MATHJAX], sources
    assert (built / solutions.MATHJAX).stat().st_size > 1_000_000


def test_the_index_links_every_page_in_course_order(built):
    links = re.findall(r'href="([^"]+)"', (built / "index.html").read_text(encoding="utf-8"))
    assert links == [f"{slug}.html" for slug in SLUGS]


@pytest.mark.skipif(browser.MISSING is not None, reason=str(browser.MISSING))
def test_pages_typeset_their_math_offline_in_chromium(built):
    requests, errors = [], []
    with browser.page() as tab:
        tab.route("http*://**", lambda route: (requests.append(route.request.url), route.abort()))
        tab.on("pageerror", lambda error: errors.append(str(error)))
        for slug in SLUGS:
            tab.goto((built / f"{slug}.html").as_uri(), wait_until="load")
            typeset = tab.evaluate("async () => { await MathJax.startup.promise;"
                                   " return document.querySelectorAll('mjx-container').length; }")
            assert typeset > 10, f"{slug}: {typeset} formulas typeset"
            raw = tab.evaluate("""() => { const copy = document.body.cloneNode(true);
                copy.querySelectorAll('pre, code, script, style, mjx-container, .jp-OutputArea').forEach(e => e.remove());
                return copy.textContent; }""")
            assert "$$" not in raw and "\\(" not in raw, f"{slug}: raw TeX left in the text"
    assert errors == [] and requests == [], (errors, requests[:5])
