"""No file under chapters/ holds solution code, hidden tests, instructor notes or model answers."""
import re

import nbformat
import pytest

from coursebuild import paths

from .conftest import SLUGS

REGION = re.compile(r"### BEGIN (SOLUTION|HIDDEN TESTS)(.*?)### END \1", re.S)


def secret_lines(slug: str, kinds: tuple[str, ...]) -> set[str]:
    """Substantial lines that only the instructor may see.

    ``kinds``: "code" (answer code), "text" (model answers of written questions), "hidden"
    (hidden tests), "notes" (instructor notes).
    """
    solution = nbformat.read(paths.solution_notebook(slug), as_version=4)
    lines = set()
    for cell in solution.cells:
        for region, body in REGION.findall(cell.source):
            kind = "hidden" if region == "HIDDEN TESTS" else ("code" if cell.cell_type == "code" else "text")
            if kind in kinds:
                lines.update(line.strip() for line in body.splitlines())
    if "notes" in kinds:
        for note in (paths.SOLUTIONS / slug).glob("*.md"):
            lines.update(line.strip() for line in note.read_text().splitlines())
    return {line for line in lines if len(line) > 25}


@pytest.mark.parametrize("slug", SLUGS)
def test_release_ships_only_the_learner_notebook(slug):
    assert [p.name for p in (paths.CHAPTERS / slug).iterdir()] == [f"{slug}.ipynb"]


@pytest.mark.parametrize("slug", SLUGS)
def test_release_holds_no_secret(slug):
    text = paths.release_notebook(slug).read_text(encoding="utf-8")
    assert "BEGIN SOLUTION" not in text and "BEGIN HIDDEN TESTS" not in text
    never_shown = secret_lines(slug, ("hidden", "text", "notes"))
    assert never_shown, "the solution should have hidden tests to hide"
    leaked = sorted(line for line in never_shown if line in text)
    assert not leaked, f"chapters/{slug} shows instructor-only lines: {leaked[:5]}"
    # Hints may quote a line of an answer; the learner's code cells never hold one.
    code = "\n".join(c.source for c in nbformat.reads(text, as_version=4).cells if c.cell_type == "code")
    leaked = sorted(line for line in secret_lines(slug, ("code",)) if line in code)
    assert not leaked, f"chapters/{slug} code cells hold solution lines: {leaked[:5]}"


@pytest.mark.parametrize("slug", SLUGS)
def test_release_is_clean(slug):
    notebook = nbformat.read(paths.release_notebook(slug), as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{cell.id} keeps outputs"
        meta = cell.metadata.get("nbgrader")
        if meta and meta["grade"] and not meta["solution"]:
            assert meta["locked"] and meta.get("checksum"), f"test cell {cell.id} is not locked with a checksum"
        if meta and meta["solution"] and cell.cell_type == "code":
            assert "raise NotImplementedError()" in cell.source
