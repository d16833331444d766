"""Grading is fair to the learner, read statically from every chapter source in solutions/.

- Hidden test cells draw their inputs from the global generators, which the grader seeds
  afresh on every run: they never seed a generator themselves, nor make one of their own
  (``torch.Generator()`` without a seed is seeded with a constant too).
- Keep going never adopts a failing answer: each ``course.keep_going`` call passes a named
  check function, and for an exercise it is the function that the exercise's visible test
  cell defines and calls on the learner's answer.
- Exercises are graded on their own: no test cell reaches a name that another exercise's
  answer cell defines (directly, or through the chapter's given code), nor a name that a
  keep-going cell binds to another exercise's answer; an answer cell that reaches one is
  checked with its reference, by its visible check and by the grader.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field

import pytest

from course_runtime import marks
from coursebuild import notebooks, paths

SLUGS = paths.present_slugs()
# Calls that seed a generator or make one: a hidden cell uses the global generators instead.
SEEDING = {"manual_seed", "seed", "seed_everything", "setup", "Generator", "Random", "SystemRandom",
           "default_rng", "RandomState"}


@dataclass
class Chapter:
    slug: str
    answers: dict[str, ast.Module] = field(default_factory=dict)  # grade_id -> answer cell
    tests: dict[str, tuple[ast.Module, bool]] = field(default_factory=dict)  # grade_id -> (cell, hidden)
    owner: dict[str, str] = field(default_factory=dict)  # a name an answer cell defines -> its grade_id
    given: dict[str, ast.AST] = field(default_factory=dict)  # a function or class of the given code -> its definition
    keep_going: list[tuple[str, ast.Call]] = field(default_factory=list)  # (bound name, call)


def _defined(tree: ast.Module) -> dict[str, ast.AST]:
    """Names a cell binds at its top level, with the statement that binds each."""
    names = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        names[name.id] = node
    return names


def _keep_going_call(node: ast.AST) -> ast.Call | None:
    value = getattr(node, "value", None)
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "keep_going":
        return value
    return None


def load(slug: str) -> Chapter:
    chapter = Chapter(slug)
    for cell in notebooks.build_notebook(slug).cells:
        if cell.cell_type != "code":
            continue
        tree = ast.parse(cell.source)
        meta = cell.metadata.get("nbgrader", {})
        grade_id = meta.get("grade_id")
        if grade_id and meta.get("solution"):
            chapter.answers[grade_id] = tree
            chapter.owner.update(dict.fromkeys(_defined(tree), grade_id))
        elif grade_id:
            chapter.tests[grade_id] = (tree, marks.is_hidden_test(cell.source))
        else:
            chapter.given.update((name, node) for name, node in _defined(tree).items()
                                 if isinstance(node, (ast.FunctionDef, ast.ClassDef)))
        for node in tree.body:
            call = _keep_going_call(node)
            if call is not None:
                chapter.keep_going += [(target.id, call) for target in node.targets if isinstance(target, ast.Name)]
    return chapter


def _free_names(tree: ast.AST) -> set[str]:
    """Names ``tree`` reads, less those it binds itself (arguments, assignments, imports):
    roughly, the names it takes from the rest of the notebook."""
    read = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    local = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}
    for node in ast.walk(tree):
        if isinstance(node, ast.arg):
            local.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            local.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return read - local


def _exercise(chapter: Chapter, grade_id: str) -> str:
    """The answer grade_id that a test cell's grade_id (``NAME_visible``, ``NAME_hidden``) checks."""
    name = grade_id.rsplit("_", 1)[0]
    assert name in chapter.answers, f"{chapter.slug}: test cell {grade_id!r} checks no answer cell of its chapter"
    return name


def _reached(chapter: Chapter, tree: ast.AST, own: str) -> dict[str, str]:
    """Other exercises' names that ``tree`` reaches (name -> its answer's grade_id),
    following the chapter's given definitions (not the answers themselves)."""
    learner_bound = {name: chapter.owner.get(call.args[1].id) for name, call in chapter.keep_going
                     if len(call.args) > 1 and isinstance(call.args[1], ast.Name)}
    found, seen, todo = {}, set(), set(_free_names(tree))
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        exercise = chapter.owner.get(name) or learner_bound.get(name)
        if exercise is not None:
            if exercise != own:
                found[name] = exercise
        elif name in chapter.given:
            todo |= _free_names(chapter.given[name])
    return found


def _visible_checks(tree: ast.Module, learner: str) -> set[str]:
    """The functions a visible test cell defines and calls, at its top level, on ``learner``."""
    defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    return {node.value.func.id for node in tree.body
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)
            and node.value.func.id in defined and node.value.args[:1]
            and isinstance(node.value.args[0], ast.Name) and node.value.args[0].id == learner}


def _calls_first(function: ast.FunctionDef, checks: set[str]) -> bool:
    """Whether ``function``'s first statement calls one of ``checks`` on its first argument."""
    first = function.body[0] if function.body else None
    call = first.value if isinstance(first, ast.Expr) else None
    return (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in checks
            and bool(function.args.args) and bool(call.args) and isinstance(call.args[0], ast.Name)
            and call.args[0].id == function.args.args[0].arg)


CHAPTERS = pytest.mark.parametrize("slug", SLUGS)


@CHAPTERS
def test_hidden_cells_draw_their_inputs_from_the_graders_seed(slug):
    chapter = load(slug)
    hidden = {grade_id: tree for grade_id, (tree, is_hidden) in chapter.tests.items() if is_hidden}
    assert hidden, f"{slug} has no hidden test"
    for grade_id, tree in hidden.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
                assert name not in SEEDING, (
                    f"{slug} {grade_id} line {node.lineno}: {ast.unparse(node)[:80]} fixes the hidden inputs; use "
                    "the global generators (torch.randn(...), random.randrange(...)), which the grader seeds per run")


@CHAPTERS
def test_keep_going_runs_the_visible_test(slug):
    chapter = load(slug)
    assert chapter.keep_going, f"{slug} has no keep-going cell"
    for bound, call in chapter.keep_going:
        arguments = list(call.args) + [keyword.value for keyword in call.keywords if keyword.arg == "check"]
        assert len(arguments) == 4, f"{slug}: {bound} = {ast.unparse(call)[:80]} needs (name, learner, reference, check)"
        learner, check = arguments[1], arguments[3]
        assert isinstance(learner, ast.Name), f"{slug}: keep_going for {bound} must name the learner's function"
        assert isinstance(check, ast.Name), (
            f"{slug}: keep_going for {bound} passes {ast.unparse(check)[:60]}: pass the visible test's check function")
        exercise = chapter.owner.get(learner.id)
        if exercise is None:  # given code built on the exercises (chapter 04's MultiHeadAttention)
            assert isinstance(chapter.given.get(check.id), ast.FunctionDef), (
                f"{slug}: keep_going for {bound} passes {check.id}, which no cell of the chapter defines")
            continue
        visible = f"{exercise}_visible"
        assert visible in chapter.tests, f"{slug}: exercise {exercise} has a keep-going cell but no visible test"
        tree, _ = chapter.tests[visible]
        checks = _visible_checks(tree, learner.id)
        assert checks, f"{slug}: {visible} defines no check function that it calls on {learner.id}"
        # the visible test's own check, or (for what only the notebook can check) a function that runs it first
        wrapper = chapter.given.get(check.id)
        assert check.id in checks or (isinstance(wrapper, ast.FunctionDef) and _calls_first(wrapper, checks)), (
            f"{slug}: keep_going for {bound} passes {check.id}, not the check function of {visible} "
            f"({', '.join(sorted(checks))}) nor a function that calls it on its argument first")
        assert bound not in chapter.owner, f"{slug}: keep_going rebinds the graded name {bound}"


def _builds_on(tree: ast.Module) -> set[str]:
    """The names a visible test cell's check gives the references of: the keywords of its
    ``@course.visible_check(NAME, **builds_on)``."""
    return {keyword.arg for node in tree.body if isinstance(node, ast.FunctionDef)
            for decorator in node.decorator_list
            if isinstance(decorator, ast.Call) and ast.unparse(decorator.func) == "course.visible_check"
            for keyword in decorator.keywords}


def _given_by_the_grader(slug: str, grade_id: str) -> set[str]:
    """The names whose references the grader gives while it checks ``grade_id``: the other
    exercises it builds on are references in the view of its verdict-only kernel
    (autograder.view.builds_on)."""
    from autograder import view
    from autograder.chapters import Chapter as Graded

    graded = Graded.load(slug)
    return {name for other in view.builds_on(graded).get(grade_id, ()) for name in graded.answer_names[other]}


@CHAPTERS
def test_an_answer_that_builds_on_others_is_checked_with_their_references(slug):
    """An answer may call another exercise by its plain name (in the notebook, the learner's
    own); its checks give it the other's reference instead: the visible check by its
    ``builds_on``, the grader by a verdict-only kernel whose package holds the references."""
    chapter = load(slug)
    for grade_id, tree in chapter.answers.items():
        reached = _reached(chapter, tree, grade_id)
        if not reached:
            continue
        visible, _ = chapter.tests[f"{grade_id}_visible"]
        assert set(reached) <= _builds_on(visible), (
            f"{slug}: answer {grade_id} reaches {sorted(reached)}, the answers to {sorted(set(reached.values()))}: "
            f"its visible check must give their references (@course.visible_check({grade_id!r}, NAME=reference))")
        assert set(reached) <= _given_by_the_grader(slug, grade_id), (
            f"{slug}: the grader checks {grade_id} without the references of {sorted(set(reached) - _given_by_the_grader(slug, grade_id))}")


@CHAPTERS
def test_tests_need_no_other_answer(slug):
    chapter = load(slug)
    for grade_id, (tree, _) in chapter.tests.items():
        reached = _reached(chapter, tree, _exercise(chapter, grade_id))
        assert not reached, (f"{slug}: test {grade_id} reaches {sorted(reached)}, the learner's answers to "
                             f"{sorted(set(reached.values()))}: use the course's reference for them")


def test_the_checks_can_fail():
    """Each rule flags a chapter that breaks it (the rules' own negative cases)."""
    chapter = Chapter("fixture")
    chapter.answers["a"] = ast.parse("def a(x):\n    return x")
    chapter.answers["b"] = ast.parse("def b(x):\n    from minillm.m import a\n    return a(x)")
    chapter.answers["c"] = ast.parse("def c(x):\n    return helper(x)")
    chapter.owner.update(a="a", b="b", c="c")
    chapter.given["helper"] = ast.parse("def helper(x):\n    return a(x)").body[0]
    assert _reached(chapter, chapter.answers["b"], "b") == {}  # the course's a, imported in the function
    assert _reached(chapter, chapter.answers["c"], "c") == {"a": "a"}  # through given code
    assert _builds_on(ast.parse('@course.visible_check("c", a=reference.a)\ndef check_c(c):\n    pass')) == {"a"}
    assert _builds_on(ast.parse('@course.visible_check("c")\ndef check_c(c):\n    pass')) == set()
    assert _free_names(ast.parse("def f(y):\n    z = 1\n    return g(y, z)")) == {"g"}
