"""Given code runs what the learner passed: no given cell calls an exercise by its raw name.

A cell of the chapter's own code that calls an exercise's name (``top_k_routing(...)``), or
a given function or class that calls one (chapter 11's ``MoEFeedForward`` calls the
learner's ``dispatch_plan``), runs the learner's answer whether it works or not: with one
wrong answer, the prose beside it reads numbers that the output does not show. Given code
calls the name a keep-going cell bound instead (the learner's answer once it passes its
visible test, else the course's reference), or the package's module. Passing an exercise
to ``keep_going`` or to a check is not calling it.

Read statically from the chapter sources, as ``test_fairness`` reads them.
"""
from __future__ import annotations

import ast

import pytest

from coursebuild import notebooks, paths

from .test_fairness import Chapter, _free_names, _keep_going_call, load

SLUGS = paths.present_slugs()
# Chapters whose given code still calls an answer's class by its raw name, to be brought
# under the rule by their owners (strict: the test says so once one is fixed).
KNOWN = {"01_tokenization": "BPETokenizer(...) runs the learner's merge_pair and decode_ids",
         "03_positional_encoding": "ALiBi(8) runs the learner's alibi_slopes",
         "05_feed_forward": "SwiGLU(...) runs the learner's swiglu_hidden_size"}


def _executed(tree: ast.Module):
    """The nodes a cell runs when it runs: its statements, not the bodies of the functions
    and classes it defines (those run when called)."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(node.decorator_list if not isinstance(node, ast.Lambda) else [])
            continue
        yield node
        todo.extend(ast.iter_child_nodes(node))


def _assigned(cells: list[ast.Module]) -> dict[str, ast.AST]:
    """What the given cells' top-level assignments bind (``DISPATCHERS = {...}``), less the
    keep-going bindings, which are the rule's way out."""
    values = {}
    for tree in cells:
        for node in tree.body:
            if isinstance(node, ast.Assign) and _keep_going_call(node) is None:
                values.update((target.id, node.value) for target in node.targets if isinstance(target, ast.Name))
    return values


def _exercises_reached(chapter: Chapter, name: str, assigned: dict[str, ast.AST]) -> set[str]:
    """The exercise names that calling ``name`` runs: itself when an answer defines it, else
    those that the given definitions and values it reaches call or read."""
    found, seen, todo = set(), set(), {name}
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        if current in chapter.owner:
            found.add(current)
        elif current in chapter.given:
            todo |= _free_names(chapter.given[current])
        elif current in assigned:
            todo |= _free_names(assigned[current])
    return found


def raw_calls(chapter: Chapter, cell: ast.Module, assigned: dict[str, ast.AST] | None = None) -> list[str]:
    """``'line N: call'`` for each call in ``cell`` that runs an exercise by its raw name."""
    found = []
    for node in _executed(cell):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            reached = _exercises_reached(chapter, node.func.id, assigned or {})
            if reached:
                found.append(f"line {node.lineno}: {ast.unparse(node)[:70]} runs {', '.join(sorted(reached))}")
    return found


def given_cells(slug: str) -> list[tuple[int, ast.Module]]:
    """(index, tree) of each code cell of the chapter that is neither an answer nor a test."""
    cells = []
    for index, cell in enumerate(notebooks.build_notebook(slug).cells):
        if cell.cell_type == "code" and not cell.metadata.get("nbgrader", {}).get("grade_id"):
            cells.append((index, ast.parse(cell.source)))
    return cells


@pytest.mark.parametrize("slug", [pytest.param(slug, marks=pytest.mark.xfail(reason=KNOWN[slug], strict=True))
                                  if slug in KNOWN else slug for slug in SLUGS])
def test_no_given_cell_calls_an_exercise_by_its_raw_name(slug):
    chapter, cells = load(slug), given_cells(slug)
    assigned = _assigned([tree for _, tree in cells])
    found = [f"cell {index} {call}" for index, tree in cells for call in raw_calls(chapter, tree, assigned)]
    assert not found, (f"{slug}: given code calls the learner's answers whatever they do; call the keep-going "
                       "name or the package's instead:\n" + "\n".join(found))


def test_the_rule_can_fail():
    chapter = Chapter("fixture")
    chapter.owner.update(plan="plan")
    chapter.given["Layer"] = ast.parse("class Layer:\n    def forward(self, x):\n        return plan(x)").body[0]
    assert raw_calls(chapter, ast.parse("y = plan(x)")) == ["line 1: plan(x) runs plan"]
    assert raw_calls(chapter, ast.parse("layer = Layer()\nlayer(x)")) == ["line 1: Layer() runs plan"]
    assert raw_calls(chapter, ast.parse("fn = course.keep_going('plan', plan, ref.plan, check)\nfn(x)")) == []
    assert raw_calls(chapter, ast.parse("def f(x):\n    return plan(x)")) == []  # defined, not run
    assert raw_calls(chapter, ast.parse("[plan(x) for x in xs]")) == ["line 1: plan(x) runs plan"]
    assigned = _assigned([ast.parse("PLANS = {'a': plan}\nmine = course.keep_going('plan', plan, ref.plan, check)")])
    assert raw_calls(chapter, ast.parse("PLANS['a'](x)\nrun(PLANS)"), assigned) == []  # a subscript, not a name
    chapter.given["run"] = ast.parse("def run(x):\n    return PLANS['a'](x)").body[0]
    assert raw_calls(chapter, ast.parse("run(x)"), assigned) == ["line 1: run(x) runs plan"]
    assert raw_calls(chapter, ast.parse("mine(x)"), assigned) == []
