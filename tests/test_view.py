"""The package view the learner's kernel sees while a chapter is graded (autograder.view)."""
import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import minillm
from autograder import chapters, view
from course_runtime import marks
from autograder import course as grader_course

from . import grading_fixture as fx

PACKAGE = Path(minillm.__file__).resolve().parent
SLUGS = grader_course.present_slugs()


@pytest.fixture(scope="module")
def views(tmp_path_factory):
    root = tmp_path_factory.mktemp("views")
    built = {}
    for slug in SLUGS:
        chapter = chapters.load(slug)
        built[slug] = (chapter, view.write(chapter, PACKAGE, root / slug))
    return built


def _raises_not_implemented(function: ast.AST) -> bool:
    return any(isinstance(node, ast.Raise) and "NotImplementedError" in ast.unparse(node) for node in ast.walk(function))


def _definitions(path: Path) -> dict[str, ast.AST]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}


@pytest.mark.parametrize("slug", SLUGS)
def test_earlier_modules_are_the_package_and_later_ones_are_absent(views, slug):
    chapter, folder = views[slug]
    graded = int(slug[:2])
    own = {m.rsplit(".", 1)[1] + ".py" for m in chapter.reference_modules}
    for path in sorted(PACKAGE.glob("*.py")):
        owner = view.module_chapter(path)
        shown = folder / path.name
        if owner is not None and owner > graded:
            assert not shown.exists(), f"{path.name} (chapter {owner:02d}) is in the view of {slug}"
        elif path.name not in own:
            assert shown.read_bytes() == path.read_bytes(), path.name


def _exercise_names(chapter, grade_ids) -> set[str]:
    return {n for g in grade_ids for n in chapter.answer_names[g]}


def _exported(chapter) -> set[str]:
    return {c.grade_id for c in chapter.answers if marks.export_target(c.source)}


def _shown(chapter, folder: Path) -> tuple[dict[str, ast.AST], set[str]]:
    """The view's definitions of the chapter's modules, and the names they list as the learner's."""
    defined, listed = {}, set()
    for module in chapter.reference_modules:
        path = folder / (module.rsplit(".", 1)[1] + ".py")
        defined.update(_definitions(path))
        listed |= set(ast.literal_eval(path.read_text(encoding="utf-8").rsplit("__learner_exercises__ = ", 1)[1]))
    return defined, listed


def _package_definitions(chapter) -> dict[str, ast.AST]:
    real = {}
    for module in chapter.reference_modules:
        real.update(_definitions(PACKAGE / (module.rsplit(".", 1)[1] + ".py")))
    return real


@pytest.mark.parametrize("slug", SLUGS)
def test_without_answers_every_exercise_is_a_stub_and_the_given_code_the_packages(views, slug):
    """The view holds no solution of the chapter graded: each exercise is the release's stub."""
    chapter, folder = views[slug]
    defined, listed = _shown(chapter, folder)
    stubbed = _exercise_names(chapter, _exported(chapter))
    real = _package_definitions(chapter)
    for name, node in defined.items():
        if name not in stubbed:
            assert ast.dump(node) == ast.dump(real[name]), f"{name} differs from the package's"
    for grade_id in _exported(chapter):
        assert any(_raises_not_implemented(defined[n]) for n in chapter.answer_names[grade_id]), \
            f"{grade_id} is not a stub in the view of {slug}"
    assert listed == stubbed


@pytest.mark.parametrize("slug", SLUGS)
def test_the_submissions_answers_are_exported_into_the_view(slug, tmp_path):
    """With the solution's answers given, the view's modules define them as the package does,
    and still list them as the learner's (they are not the course's reference)."""
    chapter = chapters.load(slug)
    answers = {c.grade_id: c.source for c in chapter.answers}
    folder = view.write(chapter, PACKAGE, tmp_path / "view", answers)
    defined, listed = _shown(chapter, folder)
    real = _package_definitions(chapter)
    for name in _exercise_names(chapter, _exported(chapter)):
        assert ast.dump(defined[name]) == ast.dump(real[name]), name
    assert listed == _exercise_names(chapter, _exported(chapter))


def test_an_answer_a_module_cannot_hold_leaves_the_stub():
    attention = chapters.load("04_attention")
    solution = attention.by_id["softmax"].source
    body = marks.export_body(solution)  # a learner who deleted the export line
    assert view.exportable(attention, "softmax", solution) == view.exportable(attention, "softmax", body) == body
    assert view.exportable(attention, "softmax", "%time\n" + body) is None        # a magic: not Python
    assert view.exportable(attention, "softmax", "def soft_max(x):\n    return x") is None  # not its name
    assert view.exportable(attention, "softmax", "") is None


@pytest.mark.parametrize("slug", SLUGS)
def test_a_verdict_only_view_shows_the_references_of_all_but_its_group(slug, tmp_path):
    chapter = chapters.load(slug)
    real = _package_definitions(chapter)
    for number, group in enumerate(view.dependent_groups(chapter)):
        others = frozenset(c.grade_id for c in chapter.answers) - group
        folder = view.write(chapter, PACKAGE, tmp_path / str(number), {}, others)
        defined, listed = _shown(chapter, folder)
        assert listed == _exercise_names(chapter, group)
        for name in _exercise_names(chapter, _exported(chapter) - group):
            assert ast.dump(defined[name]) == ast.dump(real[name]), name
        for grade_id in group:
            assert any(_raises_not_implemented(defined[n]) for n in chapter.answer_names[grade_id]), grade_id


def test_the_dependent_exercises_and_their_groups():
    # Each of these solutions calls another exercise of its chapter.
    def builds_on(slug):
        return {g: set(calls) for g, calls in view.builds_on(chapters.load(slug)).items()}

    assert builds_on("01_tokenization") == {"train_step": {"count_pairs", "merge_pair"}, "encode_word": {"merge_pair"}}
    assert builds_on("03_positional_encoding") == {"alibi_bias": {"alibi_slopes"}}
    assert builds_on("04_attention") == {"scaled_dot_product_attention": {"softmax"}}
    assert builds_on("10_flash_attention") == {"tiled_attention_forward": {"tile_update", "tile_visibility"}}
    # Through the given code of its module: the parameter count builds the model's blocks.
    assert builds_on("00_history") == {"count_parameters": {"attention_parameters", "ffn_parameters"}}
    assert builds_on("12_lora") == {"lora_parameter_count": {"lora_update", "merge_weight"}}
    assert builds_on("05_feed_forward") == {}
    for slug in SLUGS:
        chapter = chapters.load(slug)
        calls = view.builds_on(chapter)
        groups = view.dependent_groups(chapter)
        assert sorted(g for group in groups for g in group) == sorted(calls)
        for group in groups:
            assert not any(calls[g] & group for g in group), (slug, group)
    assert len(view.dependent_groups(chapters.load("01_tokenization"))) == 1


def test_an_answer_that_needs_a_scratch_cell_is_checked_in_the_notebooks_kernel():
    positional = chapters.load("03_positional_encoding")
    groups = view.dependent_groups(positional)
    solution = positional.by_id["alibi_bias"].source
    assert view.checked_apart(positional, groups, {"alibi_bias": solution}) == (frozenset({"alibi_bias"}),)
    helped = solution.rstrip() + "\n\nSLOPE_SCALE = my_scratch_helper(1)\n"  # defined by no export cell
    assert view.checked_apart(positional, groups, {"alibi_bias": helped}) == ()
    assert view.checked_apart(positional, groups, {}) == ()   # not answered: its stub needs no kernel


def test_every_view_imports(views, tmp_path):
    """Each view, imported as ``minillm`` in a fresh interpreter: every module of the graded
    chapter loads, from the view."""
    plan = {slug: [str(folder.parent), [m for m in chapter.reference_modules]] for slug, (chapter, folder) in views.items()}
    script = (
        "import importlib, json, sys\n"
        f"plan = json.loads({json.dumps(json.dumps(plan))})\n"
        "for slug, (root, modules) in plan.items():\n"
        "    for name in [n for n in sys.modules if n == 'minillm' or n.startswith('minillm.')]:\n"
        "        del sys.modules[name]\n"
        "    sys.path.insert(0, root)\n"
        "    for module in modules:\n"
        "        loaded = importlib.import_module(module)\n"
        "        assert loaded.__file__.startswith(root), (slug, loaded.__file__)\n"
        "    sys.path.remove(root)\n"
        "print('imported', len(plan))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"imported {len(plan)}" in done.stdout


def test_the_fixture_chapter_gets_its_module_from_the_release(tmp_path):
    chapter = chapters.Chapter.from_master(fx.write_master(tmp_path / "master"), fx.SLUG)
    folder = view.write(chapter, PACKAGE, tmp_path / "view")
    functions, listed = _shown(chapter, folder)
    assert listed == {"scale"}  # count_weights is not exported
    assert _raises_not_implemented(functions["scale"])
