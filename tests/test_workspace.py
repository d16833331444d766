"""make update / make reset: the learner's work/ gets new releases and never loses an answer."""
import shutil

import nbformat
import pytest

from autograder import check, course, workspace
from autograder.sandbox import Limits

SLUG = "00_history"


@pytest.fixture
def course_copy(tmp_path, monkeypatch):
    """A course folder whose chapters/ this test may change (a new release arriving)."""
    root = tmp_path / "course"
    shutil.copytree(course.root("chapters") / "chapters", root / "chapters")
    monkeypatch.setenv(course.ROOT_VARIABLE, str(root))
    return root


def _cells(path):
    return nbformat.read(path, as_version=4).cells


def _first(cells, kind):
    return next(c for c in cells if c.get("metadata", {}).get("nbgrader", {}).get("solution")
                and c.cell_type == kind)


def test_update_adds_new_chapters_and_keeps_answers_while_refreshing_the_rest(course_copy, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    assert set(workspace.update(work).values()) == {"added"}
    mine = work / SLUG / f"{SLUG}.ipynb"
    notebook = nbformat.read(mine, as_version=4)
    _first(notebook.cells, "code").source = "def my_answer():\n    return 42"
    _first(notebook.cells, "markdown").source = "My written answer."
    notebook.cells.append(nbformat.v4.new_code_cell("print('a cell of my own')"))
    nbformat.write(notebook, mine)
    before = mine.read_text()
    assert workspace.update(work)[SLUG] == "unchanged", "no new release: nothing to do"
    assert mine.read_text() == before

    release = course_copy / "chapters" / SLUG / f"{SLUG}.ipynb"
    new = nbformat.read(release, as_version=4)
    new.cells[0].source += "\n\nA sentence the new release adds."
    nbformat.write(new, release)
    outcome = workspace.update(work)
    assert outcome[SLUG] == "updated" and set(outcome.values()) <= {"updated", "unchanged"}
    cells = _cells(mine)
    assert cells[0].source.endswith("A sentence the new release adds."), "the chapter's own text is refreshed"
    assert _first(cells, "code").source == "def my_answer():\n    return 42"
    assert _first(cells, "markdown").source == "My written answer."
    assert not any("a cell of my own" in c.source for c in cells)
    [backup] = (work / workspace.BACKUPS).glob(f"*/{SLUG}/{SLUG}.ipynb")
    assert backup.read_text() == before, "the old notebook, own cell included, is in the backup"


def test_reset_restores_the_release_and_keeps_a_backup(course_copy, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    workspace.update(work)
    mine = work / SLUG / f"{SLUG}.ipynb"
    notebook = nbformat.read(mine, as_version=4)
    _first(notebook.cells, "code").source = "def my_answer():\n    return 42"
    nbformat.write(notebook, mine)
    edited = mine.read_text()
    workspace.reset(work, "00")
    assert mine.read_bytes() == (course_copy / "chapters" / SLUG / f"{SLUG}.ipynb").read_bytes()
    [backup] = (work / workspace.BACKUPS).glob(f"*/{SLUG}/{SLUG}.ipynb")
    assert backup.read_text() == edited
    with pytest.raises(ValueError, match="no chapter"):
        workspace.reset(work, "99")
    with pytest.raises(ValueError, match="--work"):
        workspace.update(tmp_path / "missing")


@pytest.mark.grading
def test_check_all_prints_one_line_per_chapter(tmp_path, capsys):
    work = tmp_path / "work"
    shutil.copytree(course.release_notebook(SLUG).parent, work / SLUG)
    outcomes = check.report_all(Limits(), work=work)
    assert list(outcomes) == [SLUG]
    [line] = capsys.readouterr().out.strip().splitlines()
    assert line.startswith(f"· {SLUG}: 0 of ") and "visible checks pass" in line and "written answers given" in line
