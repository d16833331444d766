"""A student bundle's stubs, and the references a check gives an answer.

A student bundle (``make student-bundle``) ships the chapters not yet due with their
exercises as stubs, and lists those names in each module's ``__learner_exercises__``
(``minillm.markers.LEARNER_EXERCISES``). Nothing here replaces them: a learner's working
answer becomes the package's own by export (``make export CHAPTER=NN``, ``autograder.export``),
in the learner's own copy of the package, which the kernel imports once restarted.
"""
from __future__ import annotations

import sys
import types
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from minillm.markers import LEARNER_EXERCISES

_STUBS: dict[tuple[str, str], object] = {}  # (module, exercise) -> the bundle's stub, as first seen


def _bundle_stubs() -> Iterator[tuple[str, str, object]]:
    """(module, exercise, stub) for the exercises that a student bundle left to the learner:
    the names each imported ``minillm`` module lists in ``__learner_exercises__``."""
    for module_name, module in list(sys.modules.items()):
        if module_name.startswith("minillm."):
            for name in getattr(module, LEARNER_EXERCISES, ()):
                yield module_name, name, _STUBS.setdefault((module_name, name), getattr(module, name))


def stub_module(reference) -> str | None:
    """The module whose exercise ``reference`` is, when it is a bundle's stub; else None."""
    for module_name, _, stub in list(_bundle_stubs()):
        if reference is stub:
            return module_name
    return None


def export_hint(module_name: str) -> str:
    """How the learner makes a working answer the package's own: the chapter's ``make export``."""
    from minillm.coursemap import CHAPTERS

    number = next((entry.slug[:2] for entry in CHAPTERS if module_name in entry.modules), "NN")
    return f"make export CHAPTER={number}, then restart the kernel"


BUNDLE_MARKER = "bundle.json"  # at the root of a student bundle, beside minillm/


def in_student_bundle() -> bool:
    """True when the installed minillm is a student bundle's (``make student-bundle``)."""
    import minillm

    return (Path(minillm.__file__).resolve().parent.parent / BUNDLE_MARKER).is_file()


class NeedsAnswer(NotImplementedError):
    """A cell called an exercise whose answer does not work yet (student bundles only)."""

    def __init__(self, name: str):
        super().__init__(f"skipped: this cell needs your `{name}`, which does not work yet "
                         "(its visible test says why)")


@contextmanager
def using(answer: Callable, **references: object) -> Iterator[None]:
    """Within the block, the global names ``references`` of the learner's function ``answer``
    are the objects given (the course's references of the exercises it builds on), then
    what they were before: its check then grades ``answer`` on its own, whatever the
    learner's answers to those exercises do.

    ``answer``'s globals are the notebook's, so the given code that it calls (a helper the
    chapter wrote) sees the references too. A reference that is a student bundle's stub is
    left out: the learner's own answer stands in for it. Anything but a plain function (the
    grader's proxy of one, which binds the references itself) is left as it is.
    """
    namespace = answer.__globals__ if isinstance(answer, types.FunctionType) else None
    stubs = {id(stub) for _, _, stub in _bundle_stubs()}
    given = {name: value for name, value in references.items() if id(value) not in stubs}
    if namespace is None or not given:
        yield
        return
    missing = object()
    saved = {name: namespace.get(name, missing) for name in given}
    namespace.update(given)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is missing:
                namespace.pop(name, None)
            else:
                namespace[name] = value
