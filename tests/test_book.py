"""The textbook website (``make book``): built once, then every page read in headless Chromium,
and every page checked for what only the instructor may see."""
import fcntl
import html
import os
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

import nbformat
import pytest

from coursebuild import book, book_pages, paths
from minillm.coursemap import TECH_BAND

from . import browser
from .conftest import SLUGS
from .test_release_safety import secret_lines

pytestmark = pytest.mark.xdist_group(name="book")  # one worker builds the site


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site's HTML folder, built once per test session: pytest-xdist's workers share it, and
    the first to ask builds it while the others wait (under `--dist loadgroup` the module's
    xdist_group keeps its tests on one worker, so none waits)."""
    base = tmp_path_factory.getbasetemp()
    out = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "book"
    out.mkdir(exist_ok=True)
    with open(out / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        html_dir = out / "src" / "_build" / "html"
        if not (out / "done").exists():
            book.build(out)
            (out / "done").touch()
    return html_dir


def pages(site: Path) -> list[Path]:
    """Every page built (_static/ holds the theme's templates, not pages)."""
    return sorted(p for p in site.rglob("*.html") if p.relative_to(site).parts[0] not in ("_static", "_sources"))


def text_of(page: Path) -> str:
    """A page's text: tags dropped, entities decoded (highlighted code keeps its lines whole)."""
    body = re.sub(r"<(script|style)\b.*?</\1>", "", page.read_text(encoding="utf-8"), flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", "", body))


# ---------------------------------------------------------------- what is on the site
def test_every_chapter_and_page_is_built(site):
    warnings = (site.parent.parent.parent / "warnings.txt").read_text()
    assert warnings == "", f"the build warned:\n{warnings[:3000]}"
    names = {p.relative_to(site).as_posix() for p in pages(site)}
    assert {f"chapters/{slug}.html" for slug in SLUGS} <= names
    assert {"index.html", "tech_band.html", "tee_errata.html", "instructor.html", "workshop.html", "grading.html",
            "search.html"} <= names
    assert not any(name.startswith("chapters/") and name[9:-5] not in SLUGS for name in names)


@pytest.mark.parametrize("slug", SLUGS)
def test_chapter_page_holds_the_learners_text_and_no_secret(site, slug):
    source = nbformat.read(site.parent.parent / "chapters" / f"{slug}.ipynb", as_version=4)
    text = text_of(site / "chapters" / f"{slug}.html")
    assert "BEGIN HIDDEN TESTS" not in text and "BEGIN SOLUTION" not in text
    assert "Hidden tests: they run when" not in text, "cells that only announce hidden tests are left out"
    release = nbformat.read(paths.release_notebook(slug), as_version=4)
    # A hidden test may repeat a line the learner's notebook shows on purpose (a setting, a
    # call): what must not appear is a secret line the release does not hold.
    shown = "\n".join(c.source for c in release.cells)
    never_shown = {line for line in secret_lines(slug, ("hidden", "text", "notes")) if line not in shown}
    leaked = sorted(line for line in never_shown if line in text)
    assert not leaked, f"the page of {slug} shows instructor-only lines: {leaked[:5]}"
    code = "\n".join(c.source for c in source.cells if c.cell_type == "code")
    leaked = sorted(line for line in secret_lines(slug, ("code",)) if line in code)
    assert not leaked, f"the page of {slug} shows solution lines in its code: {leaked[:5]}"
    stubs = [c for c in release.cells if c.metadata.get("nbgrader", {}).get("solution") and c.cell_type == "code"]
    assert stubs and all(c.source.splitlines()[-1].strip() in text for c in stubs), "the exercise stubs are shown"
    for cell in source.cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and (meta.get("solution") or meta.get("grade")):
            assert cell.outputs == [], f"{slug}: answer or test cell {cell.id} shows outputs"
    assert any(cell.get("outputs") for cell in source.cells if cell.cell_type == "code"), "stored outputs are shown"


def page_html(site: Path, name: str) -> str:
    return (site / name).read_text(encoding="utf-8")


def test_other_pages_hold_no_secret(site):
    never_shown = set().union(*(secret_lines(slug, ("hidden", "text", "code")) for slug in SLUGS))
    guides = set()
    for slug in SLUGS:
        notes = (paths.SOLUTIONS / slug / "INSTRUCTOR.md").read_text(encoding="utf-8")
        # The grading guide: from its heading to the next section.
        guide = re.search(rf"{book_pages.GRADING_GUIDE.pattern}.*?(?=^## |\Z)", notes, re.I | re.M | re.S)
        solution = nbformat.read(paths.solution_notebook(slug), as_version=4)
        if any(c.cell_type == "markdown" and c.metadata.get("nbgrader", {}).get("solution") for c in solution.cells):
            assert guide, f"{slug} has written questions and INSTRUCTOR.md no section {book_pages.GRADING_GUIDE.pattern}"
        if guide:
            guides.update(line.strip() for line in guide.group(0).splitlines()[1:] if len(line.strip()) > 25)
    for page in pages(site):
        if page.parent.name == "chapters":
            continue
        text = text_of(page)
        leaked = sorted(line for line in never_shown | guides if line in text)
        assert not leaked, f"{page.name} shows instructor-only lines: {leaked[:5]}"


def test_instructor_guide_has_every_chapters_notes(site):
    text = text_of(site / "instructor.html")
    for slug in SLUGS:
        assert "What to demo" in text and "Where learners get stuck" in text
        first = next(line for line in (paths.SOLUTIONS / slug / "INSTRUCTOR.md").read_text().splitlines()
                     if line.startswith("**Session length:**"))
        assert first.replace("**", "") in text, f"{slug}: the session's time is missing"
    assert "Solutions." in text


def test_tech_band_index_names_a_test_for_every_written_term(site):
    text = text_of(site / "tech_band.html")
    for term in TECH_BAND:
        assert term.symbol in text
        if term.slug in SLUGS:
            tests = book_pages.tests_of(term.symbol)
            assert tests, f"no test in tests/ uses {term.symbol}"
            path, _, name = tests[0].partition("::")
            assert re.search(rf"def {name.split('::')[-1]}\b", (paths.ROOT / path).read_text())
            assert tests[0] in text


def test_tee_errata_has_every_chapters_tee_check(site):
    text = text_of(site / "tee_errata.html")
    for slug in SLUGS:
        checks = book_pages.tee_checks(nbformat.read(site.parent.parent / "chapters" / f"{slug}.ipynb", as_version=4))
        assert checks, f"{slug} has no Tee check section"
        assert f"The tee check in chapter {slug[:2]}" in text
        for _, _, printed in checks:
            lines = [line.strip() for line in "".join(printed).splitlines() if line.strip()]
            assert not lines or (lines[0] in text and lines[-1] in text), f"{slug}: what the tee check measured is missing"


def test_tee_check_found_wherever_its_heading_stands():
    new = nbformat.v4
    page = new.new_notebook(cells=[
        new.new_markdown_cell("Before.\n\n## Tee check: \"fast\"\n\n> the shirt"),
        new.new_code_cell("print(1)", outputs=[new.new_output("stream", name="stdout", text="measured 1\n")]),
        new.new_markdown_cell("What is loose.\n\n## Further reading\n\n- a paper"),
        new.new_code_cell("print(2)", outputs=[new.new_output("stream", name="stdout", text="not this\n")]),
    ])
    assert book_pages.tee_checks(page) == [('Tee check: "fast"', "> the shirt\n\nWhat is loose.", ["measured 1\n"])]
    assert book_pages.slugify('Tee check: "fast O(1) step decode"') == "tee-check-fast-o1-step-decode"


LAUNCH = re.compile(r"PLACEHOLDER|colab\.research\.google\.com|mybinder\.org")


def test_no_placeholder_or_launch_link_is_published(site):
    """While the repository's address is the placeholder, README and no file of the site
    (pages, their sources, the search index) names it or links to Colab or Binder."""
    assert not book.colab.published(), "pyproject.toml holds a real address: this test is for the placeholder"
    assert not LAUNCH.search((paths.ROOT / "README.md").read_text(encoding="utf-8"))
    found = [f"{path.relative_to(site)}: {LAUNCH.search(path.read_text(encoding='utf-8', errors='replace')).group(0)}"
             for path in sorted(site.rglob("*")) if path.is_file() and path.relative_to(site).parts[0] != "_static"
             and LAUNCH.search(path.read_text(encoding="utf-8", errors="replace"))]
    assert found == [], f"published with the placeholder address: {found[:10]}"


def test_a_real_address_publishes_well_formed_links(monkeypatch):
    monkeypatch.setattr(book.colab, "repository", lambda root=None: "https://github.com/someone/course")
    assert book.colab.published()
    table = book.course_map_table()
    assert "| open in |" in table.splitlines()[0]
    entry = next(e for e in book.CHAPTERS if e.slug == SLUGS[0])
    page = book.chapter_page(entry)
    index = book.index_page({entry.slug: page})
    colab = f"https://colab.research.google.com/github/someone/course/blob/main/chapters/{entry.slug}/{entry.slug}.ipynb"
    binder = f"https://mybinder.org/v2/gh/someone/course/main?labpath=work%2F{entry.slug}%2F{entry.slug}.ipynb"
    for text in (table, index, page.cells[0].source):
        assert f"[Colab]({colab}) · [Binder]({binder})" in text
    assert "PLACEHOLDER" not in table + index
    assert any(cell.id == "colab-setup" for cell in page.cells), "the Colab set-up cell is shown once it clones a real address"


def test_links_come_from_the_repository_setting(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project.urls]\nRepository = "https://github.com/someone/course"\n')
    assert book.colab_url("04_attention", tmp_path) == (
        "https://colab.research.google.com/github/someone/course/blob/main/chapters/04_attention/04_attention.ipynb")
    assert book.binder_url("04_attention", tmp_path) == (
        "https://mybinder.org/v2/gh/someone/course/main?labpath=work%2F04_attention%2F04_attention.ipynb")
    (tmp_path / "pyproject.toml").write_text('[project.urls]\nRepository = "https://example.org/course"\n')
    with pytest.raises(ValueError, match="Repository"):
        book.github(tmp_path)


# ---------------------------------------------------------------- in a browser
def anchors(page: Path, cache: dict) -> set[str]:
    if page not in cache:
        cache[page] = set(re.findall(r'\b(?:id|name)="([^"]+)"', page.read_text(encoding="utf-8")))
    return cache[page]


@pytest.mark.skipif(browser.MISSING is not None, reason=str(browser.MISSING))
def test_every_page_renders_offline_in_chromium(site):
    requests, broken, ids = [], [], {}
    with browser.page() as tab:
        tab.route("http*://**", lambda route: (requests.append(route.request.url), route.abort()))
        errors = []
        tab.on("console", lambda message: message.type == "error" and errors.append(message.text))
        tab.on("pageerror", lambda error: errors.append(str(error)))
        for page in pages(site):
            name = page.relative_to(site).as_posix()
            errors.clear()
            tab.goto(page.as_uri(), wait_until="load")
            typeset = tab.evaluate("""async () => {
                if (!window.MathJax || !MathJax.startup) return null;
                await MathJax.startup.promise;
                return document.querySelectorAll('mjx-container').length;
            }""")
            maths = tab.locator("span.math, div.math").count()
            if maths:
                assert typeset, f"{name}: {maths} formulas and no MathJax output"
            raw = tab.evaluate("""() => {
                const body = document.querySelector('article') || document.body;
                const copy = body.cloneNode(true);
                copy.querySelectorAll('pre, code, script, style, mjx-container, .highlight').forEach(e => e.remove());
                return copy.textContent;
            }""")
            assert "\\(" not in raw and "$$" not in raw and "\\[" not in raw, f"{name}: raw TeX left in the text"
            images = tab.evaluate("""() => Array.from(document.images).map(i => [i.getAttribute('src'), i.complete && i.naturalWidth])""")
            assert all(width for _, width in images), f"{name}: images missing or empty: {[s for s, w in images if not w]}"
            for href in tab.evaluate("() => Array.from(document.querySelectorAll('a[href]')).map(a => a.href)"):
                url = urlsplit(href)
                if url.scheme != "file":
                    continue
                target = Path(unquote(url.path))
                if not target.is_file():
                    broken.append(f"{name} → {href}")
                elif url.fragment and target.suffix == ".html" and unquote(url.fragment) not in anchors(target, ids):
                    broken.append(f"{name} → {href} (no such anchor)")
            assert errors == [], f"{name}: console errors {errors}"
        assert len(pages(site)) >= len(SLUGS) + 7
        # Sphinx's search runs offline: the attention chapter is found by a word of its text.
        tab.goto((site / "search.html").as_uri() + "?q=softmax", wait_until="load")
        tab.wait_for_selector("#search-results li a", timeout=30_000)
        found = tab.evaluate("() => Array.from(document.querySelectorAll('#search-results li a')).map(a => a.href)")
        assert any("04_attention" in href for href in found), found
    assert broken == [], f"internal links that lead nowhere: {broken[:10]}"
    assert requests == [], f"pages asked the network for {requests[:5]}"


@pytest.mark.skipif(browser.MISSING is not None, reason=str(browser.MISSING))
def test_nothing_stands_past_the_column_and_no_serious_accessibility_violation(site):
    """On every page, at a desktop width: no element (display math, a table, code, an image)
    extends past the content column outside a scroll box of its own, and axe-core finds no
    serious or critical WCAG 2.1 A/AA violation."""
    overflow, violations = [], []
    with browser.page() as tab:
        tab.route("http*://**", lambda route: route.abort())
        for page in pages(site):
            name = page.relative_to(site).as_posix()
            tab.goto(page.as_uri(), wait_until="load")
            overflow += [f"{name}: {line}" for line in browser.overflowing(tab)]
            violations += [f"{name}: {v['id']} ({v['impact']}) {v['help']}: {v['nodes'][:3]}"
                           for v in browser.accessibility_violations(tab) if v["impact"] in ("serious", "critical")]
    assert overflow == [], f"{len(overflow)} elements stand past the column: {overflow[:10]}"
    assert violations == [], f"{len(violations)} serious or critical violations: {violations[:10]}"


@pytest.mark.skipif(browser.MISSING is not None, reason=str(browser.MISSING))
def test_the_page_checks_can_fail(tmp_path):
    """The overflow measure and axe each find what they look for on a page made to fail."""
    page = tmp_path / "bad.html"
    page.write_text('<!doctype html><html lang="en"><head><title>t</title></head><body><main>'
                    '<article class="bd-article" style="width: 300px"><h1>t</h1>'
                    '<div style="overflow: hidden"><pre style="width: 900px">wide</pre></div>'
                    '<div style="overflow-x: auto" tabindex="0"><pre style="width: 900px">scrolls</pre></div>'
                    '<img src="x.png"></article></main></body></html>')
    with browser.page() as tab:
        tab.goto(page.as_uri(), wait_until="load")
        assert [line.split(">")[0] for line in browser.overflowing(tab)] == ['<pre class=""']
        assert "image-alt" in {v["id"] for v in browser.accessibility_violations(tab)}
