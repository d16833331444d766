"""A student bundle's stubs, and the learner's answers in their place.

A student bundle (``make student-bundle``) ships the chapters not yet due with their
exercises as stubs, and lists those names in each module's ``__learner_exercises__``
(``minillm.markers.LEARNER_EXERCISES``). A working answer takes the stub's place in the
package (:func:`install_answers`), so the package's own code runs on it.
"""
from __future__ import annotations

import sys
import types
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Mapping

from minillm.markers import LEARNER_EXERCISES

_STUBS: dict[tuple[str, str], object] = {}  # (module, exercise) -> the bundle's stub
_ANSWERS: dict[tuple[str, str], object] = {}  # (module, exercise) -> the learner's answer in use


def _bundle_stubs() -> Iterator[tuple[str, str, object]]:
    """(module, exercise, stub) for the exercises that a student bundle left to the learner.

    A student bundle (``make student-bundle``) ships the chapters not yet due with their
    exercises as stubs, and lists those names in the module's ``__learner_exercises__``.
    """
    for module_name, module in list(sys.modules.items()):
        if module_name.startswith("minillm."):
            for name in getattr(module, LEARNER_EXERCISES, ()):
                yield module_name, name, _STUBS.setdefault((module_name, name), getattr(module, name))


def _bundle_module(reference) -> str | None:
    """The module whose exercise ``reference`` is, when it is a bundle's stub or the
    learner's answer already put in its place; else None."""
    for module_name, name, stub in list(_bundle_stubs()):
        if reference is stub or reference is _ANSWERS.get((module_name, name)):
            return module_name
    return None


def install_answers(namespace: Mapping[str, object]) -> list[str]:
    """Put the learner's definitions in ``namespace`` where a student bundle has stubs.

    Every minillm module that holds the stub (or an earlier answer) gets the learner's
    function or class, so the package's own code runs on it. Returns the names installed.
    Does nothing outside a student bundle.
    """
    installed = []
    for module_name, name, stub in list(_bundle_stubs()):
        answer = namespace.get(name)
        previous = _ANSWERS.get((module_name, name), stub)
        if answer is None or answer is stub or answer is previous:
            continue
        for other_name, module in list(sys.modules.items()):
            if other_name.startswith("minillm.") and getattr(module, name, None) in (stub, previous):
                setattr(module, name, answer)
        _ANSWERS[(module_name, name)] = answer
        installed.append(name)
    return installed


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
