"""The course map and the Tech Band index are complete and point at real places."""
import importlib
import re

import nbformat
import pytest

from coursebuild import book, paths
from minillm.coursemap import CHAPTERS, TECH_BAND, chapter

from .conftest import SLUGS


def test_chapters_are_numbered_in_order():
    """The course map is the one list of chapters; a slug starts with its two-digit place."""
    assert len(CHAPTERS) == 14
    for number, entry in enumerate(CHAPTERS):
        assert re.fullmatch(rf"{number:02d}_[a-z][a-z_]*", entry.slug), entry.slug


def test_tech_band_has_twenty_distinct_terms():
    assert len(TECH_BAND) == 20
    assert len({t.term for t in TECH_BAND}) == 20
    assert {t.slug for t in TECH_BAND} <= set(paths.SLUGS)


def headings(slug):
    notebook = nbformat.read(paths.solution_notebook(slug), as_version=4)
    return {
        match.group(1).strip()
        for cell in notebook.cells if cell.cell_type == "markdown"
        for match in re.finditer(r"^#{2,4}\s+(.+)$", cell.source, re.M)
    }


@pytest.mark.parametrize("term", [t for t in TECH_BAND if t.slug in SLUGS], ids=lambda t: t.term)
def test_term_has_its_section_and_symbol(term):
    assert term.section in headings(term.slug), f"{term.slug} has no section {term.section!r}"
    module_name, _, attribute = term.symbol.rpartition(".")
    assert hasattr(importlib.import_module(module_name), attribute), f"{term.symbol} does not exist"


def test_every_present_chapter_teaches_its_modules():
    for slug in SLUGS:
        for module in chapter(slug).modules:
            importlib.import_module(module)


def test_unknown_chapter_is_an_error():
    with pytest.raises(ValueError, match="99_nothing"):
        chapter("99_nothing")


def test_readme_course_map_is_the_generated_table():
    """README's course map is what `python -m coursebuild.book --course-map` prints: every
    chapter, its status, and Colab and Binder links for the chapters written once the
    repository has a real address (none while it is the placeholder)."""
    readme = (paths.ROOT / "README.md").read_text()
    assert book.course_map_table() in readme, (
        "README's course map differs from `.venv/bin/python -m coursebuild.book --course-map`: paste its output")
    for entry in CHAPTERS:
        row = next((line for line in readme.splitlines() if f"`{entry.slug}`" in line), "")
        assert entry.title in row, f"README's course map lacks {entry.slug} ({entry.title})"
        status = "ready" if entry.slug in SLUGS else "in preparation"
        assert row.rstrip(" |").endswith(status), f"README says the wrong status for {entry.slug}"
        linked = entry.slug in SLUGS and book.colab.published()
        assert (book.colab_url(entry.slug) in row) == (book.binder_url(entry.slug) in row) == linked


def test_readme_starts_a_newcomer_in_one_screen():
    """Within README's first 60 lines: what the course is, a table of contents, the two
    commands with their times, how a chapter works, and the whole course map; the
    measurements live on pages of their own, linked from the contents."""
    readme = (paths.ROOT / "README.md").read_text()
    first = "\n".join(readme.splitlines()[:60])
    assert first.startswith("# ") and "Jupyter textbook and exercise course" in first
    assert first.index("**Contents:**") < first.index("## Start")
    for section in ("Start", "How a chapter works", "Course map"):
        assert f"## {section}" in first and f"](#{section.lower().replace(' ', '-')})" in first, section
    for command in ("make lab", "make test"):
        line = next(line for line in first.splitlines() if line.startswith(command + " "))
        assert re.search(r"about \d+ minutes?", line), f"{command} has no time beside it: {line!r}"
    assert book.course_map_table().strip() in first, "the course map does not end within the first 60 lines"
    for page in ("docs/measured.md", "docs/platforms.md", "docs/training.md", "docs/speedrun.md"):
        assert f"]({page})" in first and (paths.ROOT / page).exists(), page
    assert "## Measured" not in readme, "the measurements belong in docs/measured.md"
