"""A chapter as the grader sees it, read from its master notebook (the nbgrader source).

Everything the grader trusts comes from here: which cells are answers, written answers,
visible and hidden tests, their points, the learner's view of each cell (what nbgrader's
release holds), the names each answer defines, the package modules the chapter exports
(its reference implementation) and the judge's plan. Nothing comes from a submission.

The chapter of a submission is decided from its file name or ``--chapter``, never from
its contents.
"""
from __future__ import annotations

import ast
import copy
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path

import nbformat

from course_runtime import marks

from . import analysis, course, references

# Cell tags a chapter may use to steer the judge's plan.
FORCE_TAG, SKIP_TAG = "grader-needs", "grader-skip"


def chapter_of(path: Path, chapter: str | None = None) -> str:
    """The slug of the chapter to grade ``path`` against.

    ``chapter`` (a slug or its two-digit number) wins; otherwise the file name must start
    with a chapter's number or slug, as the released notebooks are named, after a
    ``<student>__`` prefix if it has one (``alice__00_history.ipynb``).
    """
    present = course.present_slugs()
    if chapter is not None:
        return course.resolve_slugs([chapter], present)[0]
    name = Path(path).name.partition("__")[2] or Path(path).name
    matches = [slug for slug in present if name.startswith(slug) or name.startswith(slug[:3])]
    if len(matches) != 1:
        raise ValueError(
            f"cannot tell the chapter of {name!r} from its name; pass --chapter (one of {present})"
        )
    return matches[0]


@dataclass
class Cell:
    """One cell of the master notebook and its role in grading."""

    index: int
    cell_type: str
    kind: str            # answer, written, visible, hidden, code, markdown
    grade_id: str | None
    points: float
    source: str          # the master's source (solutions and hidden tests included)
    learner_source: str  # what the learner's release shows
    exercise: str | None = None  # for tests: the grade_id of the answer they check
    tags: tuple = ()

    @property
    def is_test(self) -> bool:
        return self.kind in ("visible", "hidden")


def _learner_view(master) -> nbformat.NotebookNode:
    """The release of ``master``, made by nbgrader's own preprocessors (no database)."""
    from nbgrader.preprocessors import ClearHiddenTests, ClearSolutions

    config = course.course_config(Path("."))
    notebook = copy.deepcopy(master)
    resources = {"language": "python"}
    notebook, resources = ClearSolutions(config=config).preprocess(notebook, resources)
    notebook, resources = ClearHiddenTests(config=config).preprocess(notebook, resources)
    return notebook


def _kind(cell) -> str:
    meta = cell.metadata.get("nbgrader", {})
    if meta.get("solution") and meta.get("grade"):
        return "written" if cell.cell_type == "markdown" else "answer"
    if meta.get("solution"):
        return "answer" if cell.cell_type == "code" else "written"
    if meta.get("grade"):
        if marks.is_hidden_test(cell.source):
            return "hidden"
        tree = analysis.parse(cell.source)
        # In a learner's release a hidden test is only its comment: a placeholder.
        return "hidden" if tree is not None and not tree.body else "visible"
    return cell.cell_type


class Chapter:
    """A chapter's master notebook, parsed for grading."""

    def __init__(self, slug: str, master, *, source: str | Path = "", release: bool = False):
        self.slug = slug
        self.release = release
        self.master = master
        self.origin = str(source)
        self.learner = copy.deepcopy(master) if release else _learner_view(master)
        cells, exercise = [], None
        seen: set[str] = set()
        for index, (cell, shown) in enumerate(zip(master.cells, self.learner.cells)):
            meta = cell.metadata.get("nbgrader", {})
            grade_id = meta.get("grade_id")
            if grade_id in seen:
                raise ValueError(f"{slug}: the master notebook uses grade_id {grade_id!r} twice")
            if grade_id:
                seen.add(grade_id)
            kind = _kind(cell) if grade_id else cell.cell_type
            if kind == "answer":
                exercise = grade_id
            points = float(meta.get("points", 0) or 0) if kind in ("visible", "hidden", "written") else 0.0
            cells.append(Cell(index, cell.cell_type, kind, grade_id, points, cell.source, shown.source,
                              exercise if kind in ("visible", "hidden") else None,
                              tuple(cell.metadata.get("tags", []))))
        self.cells: list[Cell] = cells
        self.by_id = {c.grade_id: c for c in cells if c.grade_id}
        if not any(c.kind == "answer" for c in cells):
            raise ValueError(f"{slug}: the master notebook has no answer cells")

    # ----------------------------------------------------------------- construction
    @classmethod
    def load(cls, slug: str) -> "Chapter":
        """A chapter of the course, from ``solutions/``, checked against the manifest."""
        path = course.solution_notebook(slug)
        if not path.exists():
            raise ValueError(f"chapter {slug!r} has no master notebook at {path}")
        chapter = cls(slug, nbformat.read(path, as_version=4), source=path)
        committed = course.manifest()["chapters"].get(slug)
        derived = {c.grade_id: c.points for c in chapter.cells if c.kind in ("visible", "hidden", "written")}
        if committed is None or {k: float(v["points"]) for k, v in committed["cells"].items()} != derived:
            raise ValueError(f"autograder/manifest.json does not match {path.name}: run make manifest")
        return chapter

    @classmethod
    def from_master(cls, path: Path, slug: str | None = None) -> "Chapter":
        """A chapter from any master notebook (a fixture, a course of one's own)."""
        path = Path(path)
        return cls(slug or path.stem, nbformat.read(path, as_version=4), source=path)

    @classmethod
    def from_release(cls, path: Path, slug: str) -> "Chapter":
        """The learner's own chapter (no solutions, no hidden tests): for ``check``."""
        return cls(slug, nbformat.read(Path(path), as_version=4), source=path, release=True)

    # ----------------------------------------------------------------- points
    @property
    def autograded_points(self) -> float:
        return sum(c.points for c in self.cells if c.is_test)

    @property
    def tests(self) -> list[Cell]:
        return [c for c in self.cells if c.is_test]

    @property
    def answers(self) -> list[Cell]:
        return [c for c in self.cells if c.kind == "answer"]

    @property
    def written(self) -> list[Cell]:
        return [c for c in self.cells if c.kind == "written"]

    # ----------------------------------------------------------------- names
    @cached_property
    def facts(self) -> list[analysis.CellFacts]:
        return [analysis.facts(c.source) if c.cell_type == "code" else analysis.CellFacts(True)
                for c in self.cells]

    @cached_property
    def answer_names(self) -> dict[str, list[str]]:
        """grade_id → the names the answer cell defines (defs, classes, assignments)."""
        names = {}
        for cell in self.answers:
            fact = self.facts[cell.index]
            names[cell.grade_id] = sorted(fact.binds - fact.imports - {analysis.STAR})
        return names

    @cached_property
    def proxied_names(self) -> list[str]:
        return sorted({n for names in self.answer_names.values() for n in names})

    def answer_imports(self, cell: Cell) -> str:
        """The import statements of a master answer cell (the judge runs these itself)."""
        tree = analysis.parse(cell.source)
        if tree is None:
            return ""
        return "\n".join(ast.unparse(s) for s in tree.body if isinstance(s, (ast.Import, ast.ImportFrom)))

    @cached_property
    def reference_modules(self) -> list[str]:
        """Dotted names of the package modules this chapter's cells export."""
        found = []
        for cell in self.cells:
            target = marks.export_target(cell.source) if cell.cell_type == "code" else None
            if target and target.endswith(".py"):
                module = target[:-3].replace("/", ".")
                if module not in found:
                    found.append(module)
        return found

    # ----------------------------------------------------------------- the judge's plan
    @cached_property
    def plan(self) -> list[int]:
        """Indexes of the master cells the judge runs, in order.

        The test cells, every earlier cell they need, the cells tagged ``grader-needs``,
        and the set-up cells before the first answer that bind nothing. Answer cells are
        never run there: only their import statements (see :meth:`plan_source`).
        """
        return self.plan_for(None)

    @cache
    def plan_for(self, exercises: frozenset[str] | None) -> list[int]:
        """:attr:`plan` for the tests of ``exercises`` alone (grade_ids; None: every test).
        A test cell of another exercise is in it when a planned cell needs what it defines."""
        facts = list(self.facts)
        for cell in self.answers:
            facts[cell.index] = analysis.facts(self.answer_imports(cell))
        for cell in self.cells:
            if SKIP_TAG in cell.tags and not cell.is_test:
                facts[cell.index] = analysis.CellFacts(True)
        first_answer = min(c.index for c in self.answers)
        roots = [c.index for c in self.cells if FORCE_TAG in c.tags
                 or c.is_test and (exercises is None or c.exercise in exercises)]
        roots += [c.index for c in self.cells[:first_answer]
                  if c.cell_type == "code" and c.source.strip() and not facts[c.index].binds]
        needed = analysis.needed_cells(facts, roots, provided=set(self.proxied_names))
        return sorted(i for i in needed if self.cells[i].cell_type == "code"
                      and (SKIP_TAG not in self.cells[i].tags or self.cells[i].is_test))

    def plan_source(self, index: int) -> str:
        cell = self.cells[index]
        return self.answer_imports(cell) if cell.kind == "answer" else cell.source

    # ----------------------------------------------------------------- the reference
    @cached_property
    def reference_bindings(self) -> tuple[dict[str, str], dict[str, set[str]]]:
        """Names the master binds to the reference (see :func:`references.bindings`)."""
        return references.bindings(self)

    def reference_uses(self, grade_id: str, source: str) -> list[tuple[bool, str]]:
        """How an answer cell's ``source`` reaches the chapter's reference (see :func:`references.uses`)."""
        return references.uses(self, grade_id, source)

    def exercise_of(self, grade_id: str) -> str | None:
        cell = self.by_id.get(grade_id)
        return cell.exercise if cell else None


def load(slug_or_path: str | Path, slug: str | None = None) -> Chapter:
    """A course chapter by slug, or any master notebook by path."""
    if isinstance(slug_or_path, Path) or str(slug_or_path).endswith(".ipynb"):
        return Chapter.from_master(Path(slug_or_path), slug)
    return Chapter.load(course.resolve_slugs([str(slug_or_path)])[0])
