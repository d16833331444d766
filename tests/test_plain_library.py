"""minillm reads as a plain library: no module of it imports itself, imports the notebook
runtime (``course_runtime``) or IPython, or walks over ``sys.modules`` to replace what other
modules hold.

A function that imported its own module to reach the package's version of another exercise
(``from minillm.tokenizer import merge_pair`` inside ``minillm/tokenizer.py``) made the
learner's copy of it call the package's stub on the learner's machine, where the chapter's
exercises are stubs: the self-check called a correct answer unanswered. An exercise that
builds on another calls it by its plain name; its checks give it the other's reference
(``course.visible_check(NAME, **builds_on)``, and the grader's references).
"""
import ast
from pathlib import Path

import pytest

import minillm

PACKAGE = Path(minillm.__file__).resolve().parent
MODULES = sorted(PACKAGE.glob("*.py"))


def self_imports(path: Path) -> list[str]:
    """The import statements of ``path`` (a module of minillm) that import that module itself."""
    me = f"minillm.{path.stem}"
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level <= 1:  # from . import x is minillm's
            module = node.module if node.level == 0 else ".".join(["minillm", *filter(None, [node.module])])
            names = [module] + [f"{module}.{alias.name}" for alias in node.names]
        else:
            continue
        if me in names:
            found.append((node.lineno, f"{path.name}:{node.lineno}: {ast.unparse(node)}"))
    return [text for _, text in sorted(found)]


def runtime_reaches(path: Path) -> list[str]:
    """What ``path`` does that only the notebook runtime may: import it or IPython, or walk
    over ``sys.modules`` (``sys.modules.items()``, ``for name in sys.modules``, ...)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        imported = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                    else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        if any(name.split(".")[0] in ("course_runtime", "IPython") for name in imported):
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
        walked = (node.iter if isinstance(node, (ast.For, ast.comprehension)) else
                  node.func.value if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr in ("items", "values", "keys", "copy") else
                  node.args[0] if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in ("list", "dict", "tuple", "sorted", "iter") and node.args else None)
        if walked is not None and ast.unparse(walked) == "sys.modules":
            found.append(f"{path.name}:{walked.lineno}: walks sys.modules")
    return sorted(set(found), key=lambda line: int(line.split(":")[1]))


@pytest.mark.parametrize("path", MODULES, ids=[p.name for p in MODULES])
def test_no_module_of_minillm_imports_itself(path):
    assert not self_imports(path)


@pytest.mark.parametrize("path", MODULES, ids=[p.name for p in MODULES])
def test_no_module_of_minillm_reaches_the_notebook_runtime_or_other_modules(path):
    assert not runtime_reaches(path)


def test_the_lint_finds_a_self_import(tmp_path):
    module = tmp_path / "tokenizer.py"
    module.write_text("def train_step(counts):\n    from minillm.tokenizer import count_pairs\n    return count_pairs(counts)\n"
                      "from minillm import tokenizer\nfrom . import tokenizer as again\nfrom minillm import config\n")
    assert [line.split(": ", 1)[0] for line in self_imports(module)] == ["tokenizer.py:2", "tokenizer.py:4",
                                                                          "tokenizer.py:5"]


def test_the_lint_finds_the_runtime_and_a_walk_over_sys_modules(tmp_path):
    module = tmp_path / "course.py"
    module.write_text("import sys\nfrom course_runtime import keep_going\nimport IPython\n"
                      "for name, m in list(sys.modules.items()):\n    pass\n"
                      "names = [n for n in sys.modules]\nfound = sys.modules.get('minillm')\n")
    assert [line.split(": ", 1)[0] for line in runtime_reaches(module)] == [
        "course.py:2", "course.py:3", "course.py:4", "course.py:6"]
