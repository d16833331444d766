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
def test_check_all_prints_one_line_per_chapter_and_checks_only_what_changed(tmp_path, capsys, monkeypatch):
    work = tmp_path / "work"
    shutil.copytree(course.release_notebook(SLUG).parent, work / SLUG)
    outcomes = check.report_all(Limits(), work=work, progress=False)
    assert list(outcomes) == [SLUG]
    line, blank, total = capsys.readouterr().out.strip().splitlines()
    assert line.startswith(f"· {SLUG}: 0 of ") and "visible checks pass" in line and "written answers given" in line
    assert total.startswith("0 of ") and "visible checks pass" in total and "not checked again" not in total
    assert (work / check.CACHE / f"{SLUG}.json").is_file()

    checked = []
    fresh = {"ok": False, "checks": {"a_visible": True, "b_visible": False}, "written": {"w": True}}
    monkeypatch.setattr(check, "report", lambda *args, **kwargs: checked.append(args) or fresh)
    assert check.report_all(Limits(), work=work, progress=False) == outcomes
    assert checked == [] and "(1 unchanged chapter not checked again)" in capsys.readouterr().out
    release = nbformat.read(course.release_notebook(SLUG), as_version=4)
    release.cells[0].source += "\n\nA sentence a new release adds."
    nbformat.write(release, tmp_path / "new-release.ipynb")
    for change in ("release", "grader", "limits", "notebook"):
        with monkeypatch.context() as patch:
            if change == "release":
                patch.setattr(check.course, "release_notebook", lambda slug: tmp_path / "new-release.ipynb")
            elif change == "grader":
                patch.setattr(check, "grader_version", lambda: "another grader")
            elif change == "notebook":
                mine = nbformat.read(work / SLUG / f"{SLUG}.ipynb", as_version=4)
                _first(mine.cells, "markdown").source = "My written answer."
                nbformat.write(mine, work / SLUG / f"{SLUG}.ipynb")
            checked.clear()
            assert check.report_all(Limits(cell_timeout=61) if change == "limits" else Limits(), work=work,
                                    progress=False) == {SLUG: fresh}
            assert len(checked) == 1, f"a changed {change} is checked again"
    line = capsys.readouterr().out.strip().splitlines()[-3]
    assert line == f"· {SLUG}: 1 of 2 visible checks pass, 1 of 1 written answers given", "the new result is shown"
    checked.clear()
    check.report_all(Limits(), work=work, progress=False)
    assert checked == [], "the last result is kept"


def _next_release(path):
    """A new release of the chapter at ``path``, as `git pull` may bring one: a given cell's
    text changes, a cell is added near the top (so every later cell's id shifts, ids being
    places), and a text cell is dropped."""
    notebook = nbformat.read(path, as_version=4)
    notebook.cells[0].source += "\n\nA sentence the new release adds."
    notebook.cells.insert(3, nbformat.v4.new_markdown_cell("A paragraph the new release adds."))
    dropped = next(i for i, c in enumerate(notebook.cells) if i > 3 and c.cell_type == "markdown"
                   and not c.metadata.get("nbgrader"))
    del notebook.cells[dropped]
    for index, cell in enumerate(notebook.cells):
        if not cell.metadata.get("nbgrader") and cell.id != "colab-setup":
            cell.id = f"c{index:03d}"
    nbformat.write(notebook, path)


def test_update_counts_only_the_cells_the_learner_added(course_copy, tmp_path, capsys):
    """The old release's cells that the new one changed, moved or dropped are not the
    learner's: an untouched copy loses nothing; a cell the learner added is counted."""
    work = tmp_path / "work"
    shutil.copytree(course_copy / "chapters" / SLUG, work / SLUG)
    mine = work / SLUG / f"{SLUG}.ipynb"
    untouched = mine.read_bytes()
    notebook = nbformat.read(mine, as_version=4)
    notebook.cells.insert(5, nbformat.v4.new_code_cell("print('my own experiment')"))
    notebook.cells.insert(6, nbformat.v4.new_markdown_cell(""))  # empty: nothing lost
    nbformat.write(notebook, mine)

    _next_release(course_copy / "chapters" / SLUG / f"{SLUG}.ipynb")
    capsys.readouterr()
    assert workspace.update(work)[SLUG] == "updated"
    said = capsys.readouterr().out
    assert "1 cell(s) you added are left out" in said, said

    mine.write_bytes(untouched)  # the old release as `make lab` copied it, untouched
    release = nbformat.read(course.release_notebook(SLUG), as_version=4)
    assert workspace.added_cells(release, nbformat.reads(untouched.decode(), as_version=4)) == []
    assert workspace.update(work)[SLUG] == "updated"
    said = capsys.readouterr().out
    assert f"{SLUG}: updated" in said and "you added" not in said, said


def test_a_notebook_that_imports_the_runtime_from_minillm_is_brought_up_to_date(course_copy, tmp_path, capsys):
    """Releases before the notebook runtime left minillm imported it as `from minillm import
    course`: the lab says which notebooks of work/ still do, and `make update` rewrites them
    (the release's cells anew, the import in a carried answer too), keeping the answers."""
    from autograder import lab

    work = tmp_path / "work"
    lab.lab(work, [], prepare_only=True)
    mine = work / SLUG / f"{SLUG}.ipynb"
    notebook = nbformat.read(mine, as_version=4)
    setup = next(c for c in notebook.cells if c.cell_type == "code" and "import course_runtime as course" in c.source)
    setup.source = setup.source.replace("import course_runtime as course", "from minillm import course")
    _first(notebook.cells, "code").source = "from minillm import course, data\ndef my_answer():\n    return 42"
    nbformat.write(notebook, mine)
    assert workspace.predates_runtime(mine)
    capsys.readouterr()

    lab.lab(work, [], prepare_only=True)
    said = capsys.readouterr().out
    assert "1 notebook(s) of" in said and "run `make update`" in said and SLUG in said

    assert workspace.update(work)[SLUG] == "updated"
    assert not workspace.predates_runtime(mine)
    assert _first(_cells(mine), "code").source == ("import course_runtime as course\nfrom minillm import data\n"
                                                  "def my_answer():\n    return 42")
    lab.lab(work, [], prepare_only=True)
    assert "older release" not in capsys.readouterr().out
