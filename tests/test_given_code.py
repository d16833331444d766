"""Given code runs what the learner passed: no given cell calls an exercise by its raw name.

A cell of the chapter's own code that calls an exercise's name (``top_k_routing(...)``), or
a given function or class that calls one (chapter 11's ``MoEFeedForward`` calls the
learner's ``dispatch_plan``), runs the learner's answer whether it works or not: with one
wrong answer, the prose beside it reads numbers that the output does not show. Given code
calls the name a keep-going cell bound instead (the learner's answer once it passes its
visible test, else the course's reference), or the package's module: after ``from
minillm.tokenizer import BPETokenizer`` the name is the package's class (in the learner's
kernel, the course's or the learner's exported copy, which holds only answers that pass
their visible tests), until a later cell defines it again. Passing an exercise to
``keep_going`` or to a check is not calling it.

Read statically from the chapter sources, as ``test_fairness`` reads them.
"""
from __future__ import annotations

import ast

import pytest

from coursebuild import notebooks, paths

from .test_fairness import Chapter, _free_names, _keep_going_call, load

SLUGS = paths.present_slugs()


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


def _exercises_reached(chapter: Chapter, name: str, assigned: dict[str, ast.AST],
                       imported: frozenset[str] = frozenset()) -> set[str]:
    """The exercise names that calling ``name`` runs: itself when an answer defines it, else
    those that the given definitions and values it reaches call or read. A name in
    ``imported`` is, at the time of the call, the package's, and runs none of the notebook's."""
    found, seen, todo = set(), set(), {name}
    while todo:
        current = todo.pop()
        if current in seen or current in imported:
            continue
        seen.add(current)
        if current in chapter.owner:
            found.add(current)
        elif current in chapter.given:
            todo |= _free_names(chapter.given[current])
        elif current in assigned:
            todo |= _free_names(assigned[current])
    return found


def _rebinds(statement: ast.stmt, imported: set[str]) -> None:
    """Update ``imported`` (the names that are the package's) past a top-level statement:
    an import binds its names to the package, a definition takes its name back."""
    if isinstance(statement, (ast.Import, ast.ImportFrom)):
        imported |= {alias.asname or alias.name.split(".")[0] for alias in statement.names}
    elif isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        imported.discard(statement.name)


def raw_calls(chapter: Chapter, cell: ast.Module, assigned: dict[str, ast.AST] | None = None,
              imported: set[str] | None = None) -> list[str]:
    """``'line N: call'`` for each call in ``cell`` that runs an exercise by its raw name.
    ``imported`` holds the names that earlier cells bound to the package; the cell's own
    imports and definitions update it, in order."""
    found, imported = [], set() if imported is None else imported
    for statement in cell.body:
        for node in _executed(ast.Module(body=[statement], type_ignores=[])):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                reached = _exercises_reached(chapter, node.func.id, assigned or {}, frozenset(imported))
                if reached:
                    found.append(f"line {node.lineno}: {ast.unparse(node)[:70]} runs {', '.join(sorted(reached))}")
        _rebinds(statement, imported)
    return found


def given_cells(slug: str) -> list[tuple[int, ast.Module]]:
    """(index, tree) of each code cell of the chapter that is neither an answer nor a test."""
    cells = []
    for index, cell in enumerate(notebooks.build_notebook(slug).cells):
        if cell.cell_type == "code" and not cell.metadata.get("nbgrader", {}).get("grade_id"):
            cells.append((index, ast.parse(cell.source)))
    return cells


@pytest.mark.parametrize("slug", SLUGS)
def test_no_given_cell_calls_an_exercise_by_its_raw_name(slug):
    chapter, cells, imported = load(slug), given_cells(slug), set()
    assigned = _assigned([tree for _, tree in cells])
    found = [f"cell {index} {call}" for index, tree in cells for call in raw_calls(chapter, tree, assigned, imported)]
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
    imported = set()
    assert raw_calls(chapter, ast.parse("from minillm.layers import Layer\nLayer()(x)"), {}, imported) == []
    assert raw_calls(chapter, ast.parse("run(x)"), assigned, imported) == ["line 1: run(x) runs plan"]
    assert raw_calls(chapter, ast.parse("Layer()"), {}, imported) == []  # still the package's, a cell later
    assert raw_calls(chapter, ast.parse("Layer()\nfrom minillm.layers import Layer"), {}, set()) == ["line 1: Layer() runs plan"]
    assert raw_calls(chapter, ast.parse("class Layer:\n    pass\nLayer()"), {}, imported) == ["line 3: Layer() runs plan"]
