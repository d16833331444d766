"""Where a chapter's master reaches its reference implementation, and where an answer does.

An answer cell that uses the package's own version of a name it must define is not the
learner's work; one that uses the reference of another name is flagged for the
instructor. Only the source is read (``analysis``); nothing is run.
"""
from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from . import analysis
from .view import builds_on

if TYPE_CHECKING:
    from .chapters import Chapter


def bindings(chapter: Chapter) -> tuple[dict[str, str], dict[str, set[str]]]:
    """Names the master binds to the reference: module aliases, and fallbacks.

    ``aliases``: name → module (``reference_history`` → ``minillm.history``).
    ``fallbacks``: name → the answer names it may stand for (``rnn`` → {rnn_forward}),
    and what a fallback computed (``w`` from ``routing(...)`` → {top_k_routing}).
    """
    modules = set(chapter.reference_modules)
    answers = set(chapter.proxied_names)
    aliases: dict[str, str] = {}
    direct: dict[str, str] = {}
    for cell in chapter.cells:
        if cell.cell_type != "code" or cell.kind == "answer":
            continue
        tree = analysis.parse(cell.source)
        if tree is None:
            continue
        for module, name, bound in analysis.imported_modules(tree):
            if name is None and module in modules:
                aliases[bound] = module
            elif name is not None and f"{module}.{name}" in modules:
                aliases[bound] = f"{module}.{name}"
            elif name is not None and module in modules and name in answers:
                direct[bound] = name
    fallbacks: dict[str, set[str]] = {}
    for cell in chapter.cells:
        if cell.cell_type != "code" or cell.kind == "answer":
            continue
        tree = analysis.parse(cell.source)
        if tree is None:
            continue
        for stmt in tree.body:
            if not isinstance(stmt, (ast.Assign, ast.AnnAssign)) or stmt.value is None:
                continue
            covered = set()
            for node in ast.walk(stmt.value):
                if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                        and node.value.id in aliases and node.attr in answers):
                    covered.add(node.attr)
                elif isinstance(node, ast.Name) and node.id in direct:
                    covered.add(direct[node.id])
                elif isinstance(node, ast.Name) and node.id in fallbacks:  # what a fallback returned
                    covered.update(fallbacks[node.id])
            if covered:
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                for target in targets:
                    for name in analysis.target_names(target):
                        fallbacks.setdefault(name, set()).update(covered)
    for bound, name in direct.items():
        fallbacks.setdefault(bound, set()).add(name)
    return aliases, fallbacks


def asked_for(chapter: Chapter, grade_id: str) -> set[str]:
    """The names of the exercises ``grade_id``'s solution builds on (:func:`view.builds_on`):
    an answer may call the course's version of those, as the exercise asks."""
    return {name for other in builds_on(chapter).get(grade_id, ()) for name in chapter.answer_names.get(other, ())}


def uses(chapter: Chapter, grade_id: str, source: str) -> list[tuple[bool, str]]:
    """How an answer cell's ``source`` reaches the chapter's reference implementation.

    Each finding is ``(own, detail)``: ``own`` is true when it reaches the reference of
    a name this very answer must define (the answer is then not the learner's work).
    Not a find: an import that the release's own answer cell gives (the package's version
    of an earlier exercise, so that this one is graded on its own); the course's version of
    an exercise this one builds on (``flash.tile_update`` in the tiled forward), reached as
    an attribute of a reference module; and a name the master binds to a reference that the
    answer binds itself (a local ``w``) before reading it.
    """
    given = {line.strip() for line in chapter.by_id[grade_id].learner_source.splitlines()
             if line.strip().startswith(("import ", "from "))} if grade_id in chapter.by_id else set()
    if given:
        source = "\n".join(line for line in source.splitlines() if line.strip() not in given)
    tree = analysis.parse(source)
    if tree is None:
        return []
    own = set(chapter.answer_names.get(grade_id, []))
    modules = set(chapter.reference_modules)
    short = {m.rsplit(".", 1)[-1]: m for m in modules}
    aliases, fallbacks = chapter.reference_bindings
    asked = asked_for(chapter, grade_id)
    bases = [node for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)]
    as_asked = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name) and node.attr in asked}
    only_asked = {node.id for node in bases if id(node) in as_asked} - {node.id for node in bases if id(node) not in as_asked}
    free = analysis.free_reads(tree)
    found: list[tuple[bool, str]] = []
    module_objects: dict[str, str] = {}
    for module, name, bound in analysis.imported_modules(tree):
        if name is None and module in modules:
            module_objects[bound] = module
            if bound not in only_asked:
                found.append((False, f"imports {module}"))
        elif name is None and module.split(".")[0] == "minillm" and bound == "minillm":
            module_objects["minillm"] = "minillm"
        elif name is not None and f"{module}.{name}" in modules:
            module_objects[bound] = f"{module}.{name}"
            if bound not in only_asked:
                found.append((False, f"imports {module}.{name}"))
        elif name is not None and module in modules:
            found.append((name in own or name == "*", f"imports {name} from {module}"))
    module_objects.update({k: v for k, v in aliases.items()})
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            base = node.value.id
            if base in module_objects and base != "minillm" and node.attr not in asked:
                found.append((node.attr in own, f"uses {module_objects[base]}.{node.attr}"))
            elif base == "minillm" and node.attr in short:
                found.append((False, f"uses {short[node.attr]}"))
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            if (node.id in aliases and node.id not in module_objects.keys() - aliases.keys()
                    and id(node) not in as_asked):
                found.append((False, f"uses {node.id} (the reference module {aliases[node.id]})"))
            if node.id in fallbacks and node.id in free:
                found.append((bool(fallbacks[node.id] & own),
                              f"uses {node.id}, which may be the reference {', '.join(sorted(fallbacks[node.id]))}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            for module in modules:
                if module in node.value or module.replace(".", "/") in node.value:
                    found.append((any(n in node.value for n in own), f"names {module} in a string"))
    unique: dict[str, bool] = {}
    for is_own, detail in found:
        unique[detail] = unique.get(detail, False) or is_own
    return [(is_own, detail) for detail, is_own in unique.items()]
