"""``python -m autograder export CHAPTER [--work FOLDER]``: your answers become the package.

A chapter's answer cells are export cells (``#| export minillm/attention.py``). Exporting a
chapter writes each answer that passes its visible test into the learner's own copy of the
package, an overlay in ``<work>/.minillm/minillm/``: the installed package (a clone's, or a
student bundle's with its stubs) with those definitions replaced by the learner's. ``make lab``
puts the overlay first on the kernels' path (:func:`kernel_environment`), so after a restart
of the kernel the package's own code (``GPT``, the trainer) runs the learner's functions,
as nbdev and TinyTorch do it: in files, never by patching a module at run time.

- An answer whose visible test fails, or that is not answered yet, is not exported: the
  package keeps its own version (the reference in a clone, the stub in a bundle), and an
  earlier export of it is withdrawn.
- An answer that reads a name no export cell of its module defines (a helper written in a
  scratch cell) is refused, with the name: the package could not run it.
- What was exported is recorded in ``<work>/.minillm/exports.json`` (chapter → module →
  answer sources); the overlay is rebuilt from the installed package and that record at
  every export and at every ``make lab``, so a ``git pull`` reaches the modules not exported.
- ``make reset CHAPTER=NN`` withdraws the chapter's exports with its notebook.

Grading never reads the overlay: the grader builds its own view of the package.
"""
from __future__ import annotations

import ast
import io
import json
import os
import shutil
import sys
from pathlib import Path

from course_runtime import marks
from course_runtime.bundle import BUNDLE_MARKER
from minillm.markers import LEARNER_EXERCISES

from .analysis import BUILTINS

OVERLAY = ".minillm"
RECORD = "exports.json"


def overlay_folder(work: Path) -> Path:
    """The folder that goes first on the kernels' path: it holds the overlay's ``minillm/``."""
    return Path(work) / OVERLAY


def kernel_environment(work: Path, environ: dict) -> dict:
    """``environ`` with the overlay of ``work`` first on ``PYTHONPATH``, and ``MINILLM_DATA``
    naming the installed package's data (the overlay has no ``data/`` beside it)."""
    import minillm.data

    environ = dict(environ)
    others = environ.get("PYTHONPATH")
    environ["PYTHONPATH"] = os.pathsep.join([str(overlay_folder(work).resolve())] + ([others] if others else []))
    environ.setdefault("MINILLM_DATA", str(minillm.data.data_dir().resolve()))
    return environ


def _record(work: Path) -> dict:
    path = overlay_folder(work) / RECORD
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _top_level(tree: ast.Module) -> dict[str, tuple[int, int]]:
    """name → (first line, last line) of each top-level function or class, decorators included."""
    spans = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            spans[node.name] = (first, node.end_lineno)
    return spans


def bound_names(tree: ast.Module) -> set[str]:
    """The names a module's top level binds: definitions, assignments and imports."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def outside_names(answer: str, module: str) -> list[str]:
    """The names ``answer`` reads that neither it, ``module``'s top level nor Python defines."""
    tree = ast.parse(answer)
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    own = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    own |= {a.arg for a in ast.walk(tree) if isinstance(a, ast.arg)} | bound_names(tree)
    own |= {(alias.asname or alias.name).split(".")[0] for n in ast.walk(tree)
            if isinstance(n, (ast.Import, ast.ImportFrom)) for alias in n.names}
    return sorted(read - own - bound_names(ast.parse(module)) - BUILTINS)


def with_answer(module: str, answer: str) -> str:
    """``module``'s text with the top-level definitions that ``answer`` makes replaced by it
    (in the place of the first of them), and those names out of its ``__learner_exercises__``."""
    defined = _top_level(ast.parse(answer))
    spans = _top_level(ast.parse(module))
    missing = sorted(set(defined) - set(spans))
    if missing:
        raise ValueError(f"the answer defines {missing}, which the package's module does not")
    lines = module.splitlines()
    first = min(spans[name][0] for name in defined)
    for name in sorted(defined, key=lambda n: spans[n][0], reverse=True):
        start, end = spans[name]
        lines[start - 1:end] = answer.rstrip("\n").splitlines() if start == first else []
    text = "\n".join(lines) + "\n"
    tree = ast.parse(text)
    for node in tree.body:
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == [LEARNER_EXERCISES]:
            left = tuple(name for name in ast.literal_eval(node.value) if name not in defined)
            lines = text.splitlines()
            lines[node.lineno - 1:node.end_lineno] = [f"{LEARNER_EXERCISES} = {left!r}"]
            text = "\n".join(lines) + "\n"
    return text


def rebuild(work: Path, package: Path | None = None) -> Path | None:
    """Write the overlay anew from ``package`` (default: the installed ``minillm`` folder) and
    the record; None (and no overlay) when nothing is exported."""
    import minillm

    folder = overlay_folder(work)
    target = folder / "minillm"
    record = _record(work)
    if target.exists():
        shutil.rmtree(target)
    if not any(record.values()):
        return None
    installed = Path(package or Path(minillm.__file__).parent).resolve()
    if installed == target.resolve():
        raise RuntimeError("this process imported the overlay's own minillm: run the export from outside the lab's kernel")
    partial = folder / "minillm.partial"
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(installed, partial, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for chapter in record.values():
        for module, answers in chapter.items():
            path = partial / Path(module).name
            text = path.read_text(encoding="utf-8")
            for source in answers.values():
                text = with_answer(text, source)
            path.write_text(text, encoding="utf-8")
    partial.rename(target)
    bundle = installed.parent / BUNDLE_MARKER
    if bundle.is_file():  # the overlay of a student bundle is still one (course_runtime.in_student_bundle)
        shutil.copyfile(bundle, folder / BUNDLE_MARKER)
    return target


def write(work: Path, slug: str, answers: dict[str, dict[str, str]], package: Path | None = None) -> Path | None:
    """Record ``answers`` (module → grade_id → source) as ``slug``'s exports, in place of its
    earlier ones, and rebuild the overlay over ``package`` (as :func:`rebuild`); its
    ``minillm`` folder, or None."""
    record = _record(work)
    record[slug] = answers
    _save(work, record)
    return rebuild(work, package)


def withdraw(work: Path, slug: str) -> None:
    """Drop ``slug``'s exports (``make reset``) and rebuild the overlay."""
    record = _record(work)
    if record.pop(slug, None) is not None:
        _save(work, record)
    rebuild(work)


def _save(work: Path, record: dict) -> None:
    folder = overlay_folder(work)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / RECORD).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def export(target: str, work: Path | None = None, stream=None) -> dict[str, str]:
    """Export the answers of the chapter ``target`` names that pass their visible tests; print
    one line per exercise to ``stream``; grade_id → "exported", "failing", "unanswered" or
    "refused"."""
    import minillm

    from . import check, course
    from .chapters import Chapter, chapter_of
    from .reconstruct import reconstruct

    stream = stream or sys.stdout
    path = check.resolve_target(target, work)
    work = Path(work) if work is not None else path.parent.parent
    slug = chapter_of(path)
    outcome = check.report(str(path), stream=io.StringIO(), work=work)
    chapter = Chapter.from_release(course.release_notebook(slug), slug)
    package = Path(minillm.__file__).resolve().parent
    rebuilt = reconstruct(chapter, path.read_bytes(), path.name)
    mine: dict[str, dict[str, str]] = {}
    said = {}
    installed: dict[str, str] = {}  # module → the installed package's text of it
    for cell in chapter.answers:
        module = marks.export_target(cell.source)
        if not module:
            continue
        source = marks.export_body(rebuilt.answers.get(cell.grade_id) or "")
        if module not in installed:
            installed[module] = (package / Path(module).name).read_text(encoding="utf-8")
        if check.unanswered(rebuilt, cell.grade_id):
            said[cell.grade_id], why = "unanswered", "not answered yet: the package keeps its own"
        elif not outcome["checks"].get(f"{cell.grade_id}_visible"):
            said[cell.grade_id], why = "failing", "its visible test does not pass yet: the package keeps its own"
        elif outside := _refusal(source, installed[module]):
            said[cell.grade_id], why = "refused", outside
        else:
            mine.setdefault(module, {})[cell.grade_id] = source
            said[cell.grade_id], why = "exported", f"exported into {module}"
        print(f"{cell.grade_id}: {why}", file=stream)
    write(work, slug, mine)
    if any(state == "exported" for state in said.values()):
        print(f"{overlay_folder(work) / 'minillm'} is your package now: restart the notebook's kernel "
              "(Kernel ▸ Restart Kernel) so that it imports it", file=stream)
    return said


def _refusal(source: str, module: str) -> str | None:
    """Why ``source`` (an answer) cannot go into ``module``'s text, or None."""
    try:
        outside = outside_names(source, module)
        with_answer(module, source)
    except SyntaxError as error:
        return f"not exported: it does not parse ({error.msg}, line {error.lineno})"
    except ValueError as error:
        return f"not exported: {error}"
    if outside:
        return (f"not exported: it uses {', '.join(outside)}, which no export cell of its module defines "
                "(move it into the answer cell, or import it there)")
    return None
