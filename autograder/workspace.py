"""The learner's ``work/`` folder: bring in new releases without losing answers, or start over.

``make lab`` copies ``chapters/`` into ``work/`` once and never overwrites. After a
``git pull`` brings new or changed chapters:

- :func:`update` gives every chapter of ``work/`` the current release, with the learner's
  answer cells and written answers (found by their ``grade_id``) carried over; a chapter
  not in ``work/`` yet is copied in;
- :func:`reset` gives one chapter the untouched release.

Nothing is lost: before a notebook is rewritten, the old one is copied to
``work/.backups/<time>/``. Cells the learner added outside the answer cells are not carried
over (the release's cells are the chapter); the report says how many, and they stay in
the backup. A cell is the learner's own when its id is not one the build gives a release's
cell (:func:`course_runtime.marks.is_release_cell_id`): so a cell of the old release that the
new one changed, moved or dropped is never counted as the learner's.
"""
from __future__ import annotations

import copy
import re
import shutil
import time
from pathlib import Path

import nbformat

from course_runtime import marks

from . import course, export

BACKUPS = ".backups"
# Releases before the notebook runtime left the package imported it from minillm.
OLD_RUNTIME_IMPORT = re.compile(r"^(\s*)from minillm import course(?:, (.+))?$", re.M)


def migrated(source: str) -> str:
    """``source`` with an older release's import of the notebook runtime
    (``from minillm import course[, other]``) rewritten as ``import course_runtime as course``."""
    return OLD_RUNTIME_IMPORT.sub(lambda m: f"{m[1]}import course_runtime as course"
                                  + (f"\n{m[1]}from minillm import {m[2]}" if m[2] else ""), source)


def predates_runtime(path: Path) -> bool:
    """Whether the notebook at ``path`` still imports the notebook runtime from minillm (a
    notebook of an older release: ``make update`` brings it up to date)."""
    try:
        notebook = nbformat.read(path, as_version=4)
    except Exception:  # a notebook the learner broke is update's and check's to report
        return False
    return any(cell.cell_type == "code" and OLD_RUNTIME_IMPORT.search(cell.source) for cell in notebook.cells)


def _answer_sources(notebook) -> dict[str, str]:
    """grade_id → source of the answer cells (code and written) of a notebook, first copy wins."""
    found: dict[str, str] = {}
    for cell in notebook.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("solution") and meta.get("grade_id") and meta["grade_id"] not in found:
            found[meta["grade_id"]] = cell.source
    return found


def added_cells(release, learner) -> list:
    """The cells the learner added: not a cell of a release (its id is none the build
    gives, see :func:`course_runtime.marks.is_release_cell_id`), not an nbgrader cell, not
    empty, and not a copy of a cell of ``release``."""
    ids = {cell.get("id") for cell in release.cells}
    given = {cell.source.strip() for cell in release.cells}
    return [cell for cell in learner.cells
            if not cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            and cell.get("id") not in ids and not marks.is_release_cell_id(cell.get("id"))
            and cell.source.strip() and cell.source.strip() not in given]


def merged(release, learner) -> tuple[nbformat.NotebookNode, int]:
    """The release with the learner's answers; and how many cells the learner added
    (:func:`added_cells`) it leaves out."""
    answers = _answer_sources(learner)
    new = copy.deepcopy(release)
    for cell in new.cells:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id in answers and cell.metadata["nbgrader"].get("solution"):
            cell.source = migrated(answers[grade_id])
    return new, len(added_cells(release, learner))


def release_changed(release, learner) -> bool:
    """True when a cell of the release that is not an answer is missing from the learner's
    notebook, or holds other text there (cells are matched by their id, which the release
    fixes and JupyterLab keeps). Answers and cells the learner added do not count."""
    theirs = {cell.get("id"): cell.source for cell in learner.cells}
    return any(theirs.get(cell.get("id")) != cell.source for cell in release.cells
               if not cell.get("metadata", {}).get("nbgrader", {}).get("solution"))


def _backup(path: Path, work: Path, stamp: str) -> Path:
    target = work / BACKUPS / stamp / path.relative_to(work)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(path, target)
    return target


def released() -> list[str]:
    """The chapters whose release is here (a student bundle holds those handed out)."""
    return [slug for slug in course.present_slugs() if course.release_notebook(slug).is_file()]


def _work_folder(work: Path) -> Path:
    work = Path(work).expanduser()
    if not work.is_dir():
        raise ValueError(f"argument --work: {work} is not a folder (make lab creates work/)")
    return work


def update(work: Path, stream=None) -> dict[str, str]:
    """Bring every released chapter into ``work``, keeping the learner's answers.

    Returns slug → what happened: "added", "updated", "unchanged".
    """
    work = _work_folder(work)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    outcome: dict[str, str] = {}
    for slug in released():
        release_folder = course.release_notebook(slug).parent
        target = work / slug
        if not target.exists():
            shutil.copytree(release_folder, target)
            outcome[slug] = "added"
            continue
        notebook = target / f"{slug}.ipynb"
        release = nbformat.read(course.release_notebook(slug), as_version=4)
        if not notebook.exists():
            nbformat.write(release, notebook)
            outcome[slug] = "added"
            continue
        learner = nbformat.read(notebook, as_version=4)
        if not release_changed(release, learner):
            outcome[slug] = "unchanged"
            continue
        new, dropped = merged(release, learner)
        saved = _backup(notebook, work, stamp)
        nbformat.write(new, notebook)
        outcome[slug] = "updated"
        note = f"; {dropped} cell(s) you added are left out (they are in the backup)" if dropped else ""
        print(f"{slug}: updated, your answers kept; the old notebook is in {saved}{note}", file=stream)
    for slug, what in outcome.items():
        if what == "added":
            print(f"{slug}: added", file=stream)
    if not any(what != "unchanged" for what in outcome.values()):
        print(f"{work}: every chapter is up to date", file=stream)
    return outcome


def reset(work: Path, target: str, stream=None) -> Path:
    """Give one chapter of ``work`` the untouched release; the old notebook goes to a backup."""
    work = _work_folder(work)
    [slug] = course.resolve_slugs([target], released())
    notebook = work / slug / f"{slug}.ipynb"
    if notebook.exists():
        saved = _backup(notebook, work, time.strftime("%Y%m%d-%H%M%S"))
        print(f"{slug}: your notebook is saved in {saved}", file=stream)
    notebook.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(course.release_notebook(slug), notebook)
    export.withdraw(work, slug)
    print(f"{slug}: reset to the chapter as released (and its answers withdrawn from your package)", file=stream)
    return notebook
