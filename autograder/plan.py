"""The plan stage: which kernels a submission's run starts, and what each one checks.

Grading goes down one pipeline, one stage a module, called in turn by
:func:`autograder.grade.grade_submission` (and :func:`autograder.check.report` for a
self-check)::

    collect → reconstruct → plan → run → score → report

:func:`for_chapter` builds a chapter's plan once per process: its exercises, the checks
each one has, the names the judge binds, and the groups of exercises that build on others
(:func:`autograder.view.dependent_groups`). :func:`for_submission` turns it and one
submission's answers into a :class:`RunPlan`, immutable, that :mod:`autograder.run`
carries out kernel by kernel:

- the notebook's one run, with the answers exported into its package view and no solution
  of the chapter in it, checks every exercise but those that build on others;
- each group of those is checked in a verdict-only kernel that runs no chapter cell, whose
  view holds the references of the other exercises, and whose judge returns verdicts and
  constant messages only.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import nbformat

from .chapters import Chapter


@dataclass(frozen=True)
class ChapterPlan:
    """What grading one chapter needs, the same for every submission."""

    chapter: Chapter
    exercises: frozenset[str]                 # grade_ids of the answer cells
    tested: frozenset[str]                    # the exercises that have checks
    names: tuple[str, ...]                    # what the judge binds to the learner's objects
    dependent: tuple[frozenset[str], ...]     # exercises that build on others, a group a kernel


@dataclass(frozen=True)
class KernelPlan:
    """One learner kernel and its judge."""

    notebook: nbformat.NotebookNode           # what the kernel runs
    judge_cells: tuple[dict, ...]             # what the judge runs (``autograder.judge``'s plan cells)
    names: tuple[str, ...]                    # the judge's proxies
    counts: frozenset[str] | None             # exercises whose verdicts from this kernel count (None: all...
    skips: frozenset[str]                     # ...but these, which other kernels check)
    answers: tuple[tuple[str, str], ...]      # exported into the package view (grade_id, source)
    references: frozenset[str] = frozenset()  # shown in the package view as the course's versions
    verdict_only: bool = False                # the judge keeps no text of the learner's

    def counts_verdict_of(self, exercise: str | None) -> bool:
        return (self.counts is None or exercise in self.counts) and exercise not in self.skips


@dataclass(frozen=True)
class RunPlan:
    """Every kernel of one submission's run, the notebook's own first."""

    chapter: Chapter
    kernels: tuple[KernelPlan, ...]


@lru_cache(maxsize=32)
def for_chapter(chapter: Chapter) -> ChapterPlan:
    """``chapter``'s plan (built once per process)."""
    from . import view

    return ChapterPlan(chapter, frozenset(c.grade_id for c in chapter.answers),
                       frozenset(c.exercise for c in chapter.tests), tuple(chapter.proxied_names),
                       () if chapter.release else view.dependent_groups(chapter))


def judge_cells(chapter: Chapter, *, visible_only: bool = False, names=(), checks=None) -> tuple[dict, ...]:
    """The cells the judge runs, with their sources from the master.

    ``checks``: which exercises' tests to run (a set of grade_ids; None: all). ``early``
    marks the leading cells that read none of the learner's names: the judge runs them while
    the learner's notebook is still running.
    """
    from . import analysis

    cells, leading = [], True
    learner = set(names)
    for index in chapter.plan_for(None if checks is None else frozenset(checks)):
        cell = chapter.cells[index]
        if visible_only and cell.kind == "hidden":
            continue
        source = chapter.plan_source(index)
        fact = analysis.facts(source)
        leading = leading and not cell.is_test and fact.parsed and not (fact.reads & learner)
        cells.append({"index": index, "grade_id": cell.grade_id, "test": cell.is_test,
                      "hidden": cell.kind == "hidden", "source": source, "early": leading})
    return tuple(cells)


def verdict_notebook(chapter: Chapter) -> nbformat.NotebookNode:
    """The notebook of a verdict-only kernel: one cell that binds the exercises' names to
    its view's modules (:func:`autograder.view.verdict_cell`), and none of the chapter's."""
    from . import view

    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(view.verdict_cell(chapter))])


def for_submission(planned: ChapterPlan, notebook, answers: dict[str, str], *, settled=(),
                   names=(), visible_only: bool = False) -> RunPlan:
    """The kernels that grade one submission.

    ``notebook``: the reconstruction's learner view; ``answers`` (grade_id → source): what
    its package view exports; ``settled``: exercises whose score is known without their
    checks (unanswered, or withheld), for which no kernel is started. ``names``: more names
    for the judge to bind (a self-check's own answers). A self-check (``visible_only``)
    runs the visible tests in one kernel: on the learner's own machine the package is
    theirs anyway.
    """
    from . import view

    chapter = planned.chapter
    names = tuple(sorted(set(planned.names) | set(names)))
    groups = () if visible_only else view.checked_apart(chapter, planned.dependent, answers)
    apart = frozenset().union(*groups)
    first_checks = None if not apart else planned.tested - apart
    kernels = [KernelPlan(notebook, judge_cells(chapter, visible_only=visible_only, names=names, checks=first_checks),
                          names, None, apart, tuple(sorted(answers.items())))]
    if groups:
        alone = verdict_notebook(chapter)
        for group in (group - frozenset(settled) for group in groups):
            if group:
                kernels.append(KernelPlan(alone, judge_cells(chapter, names=names, checks=group), names, group,
                                          frozenset(), tuple(sorted((g, answers[g]) for g in group if g in answers)),
                                          planned.exercises - group, verdict_only=True))
    return RunPlan(chapter, tuple(kernels))
