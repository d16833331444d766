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


@pytest.mark.parametrize("slug", SLUGS)
def test_stubbed_exercises_raise_and_the_others_are_the_solution(views, slug):
    chapter, folder = views[slug]
    stubbed = set(view.stubbed_names(chapter))
    defined = {}
    for module in chapter.reference_modules:
        defined.update(_definitions(folder / (module.rsplit(".", 1)[1] + ".py")))
        real = _definitions(PACKAGE / (module.rsplit(".", 1)[1] + ".py"))
        for name, node in _definitions(folder / (module.rsplit(".", 1)[1] + ".py")).items():
            if name not in stubbed:
                assert ast.dump(node) == ast.dump(real[name]), f"{module}.{name} differs from the package's"
    for name in stubbed:
        assert _raises_not_implemented(defined[name]), f"{name} is not a stub in the view of {slug}"


def test_an_exercise_the_chapters_code_calls_keeps_its_solution():
    # Chapter 04's MultiHeadAttention calls softmax (through the attention function);
    # kv_cache_bytes is called by nothing the chapter gives.
    attention = chapters.load("04_attention")
    assert "kv_cache_bytes" in view.stubbed_names(attention)
    assert "softmax" not in view.stubbed_names(attention)
    # Chapter 12 gives lora_targets to lora_parameter_count's answer cell.
    assert "lora_targets" not in view.stubbed_names(chapters.load("12_lora"))


@pytest.mark.parametrize("slug", SLUGS)
def test_held_exercises_are_checked_in_groups_that_stub_them(slug, tmp_path):
    """Each exercise the view keeps is in exactly one group; that group's view stubs it and
    lists it in ``__learner_exercises__``, and keeps the other groups' solutions."""
    chapter = chapters.load(slug)
    groups = view.held_groups(chapter)
    exported = {c.grade_id for c in chapter.answers if marks.export_target(c.source)}
    base = set(view.stubbed_names(chapter))
    held = [g for group in groups for g in group]
    assert len(held) == len(set(held)), "an exercise is in two groups"
    held_names = {n for g in held for n in chapter.answer_names[g]}
    assert not held_names & base and set(held) <= exported
    assert held_names | base == {n for g in exported for n in chapter.answer_names[g]}
    for number, group in enumerate(groups):
        names = {n for g in group for n in chapter.answer_names[g]}
        assert set(view.stubbed_names(chapter, group)) == base | names
        assert not names & set(view.package_names(chapter, group))
        folder = view.write(chapter, PACKAGE, tmp_path / str(number), group)
        listed = set()
        for module in chapter.reference_modules:
            text = (folder / (module.rsplit(".", 1)[1] + ".py")).read_text(encoding="utf-8")
            listed |= set(ast.literal_eval(text.rsplit("__learner_exercises__ = ", 1)[1]))
        assert listed == base | names


def test_an_exercise_is_never_held_with_one_its_solution_calls():
    # The attention exercise calls softmax; the tiled forward pass calls its tile helpers.
    def together(slug, a, b):
        return any({a, b} <= group for group in view.held_groups(chapters.load(slug)))

    assert not together("04_attention", "scaled_dot_product_attention", "softmax")
    assert not together("10_flash_attention", "tiled_attention_forward", "tile_update")
    assert not together("10_flash_attention", "tiled_attention_forward", "tile_visibility")
    assert together("04_attention", "softmax", "split_heads")  # so a chapter needs few extra kernels


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
    functions = _definitions(folder / "fixture_ref.py")
    assert view.stubbed_names(chapter) == ["scale"]  # count_weights is not exported
    assert _raises_not_implemented(functions["scale"])
