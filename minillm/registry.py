"""Named, swappable components, resolved when they are looked up (infrastructure; no chapter teaches this module).

Chapter 04's attention backends, chapter 05's feed-forward networks and chapter 06's norms
each keep one ``Registry``. An entry is either an object (a function, a class) or a
forward reference ``"package.module:attribute"`` that is imported only when the name is
looked up. Forward references are what make the registries open:

- a later chapter's component can be named before its module exists
  (``"flash": "minillm.flash:flash_backend"``), so a config or a checkpoint that names it
  works as soon as that chapter is installed, and fails with an error naming the chapter
  where it is not;
- the lookup reads the module's attribute each time, so whatever stands there now (a
  learner's answer installed by the notebook runtime in a student bundle) is what a model
  built afterwards calls.

One rule for replacing an entry: a name is bound once. Registering the same entry again
does nothing; a different entry under a taken name is a ``ValueError`` unless
``replace=True``.
"""
from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field
from functools import partial
from typing import Any


@dataclass(frozen=True)
class _Entry:
    target: Any  # an object, or "module:attribute"
    chapter: str | None = None
    options: dict = field(default_factory=dict)


class Registry:
    """Names of one kind of component (``kind``, for messages: "attention backend", "FFN", "norm").

    ``register(name, target, chapter=None, replace=False, **options)``: ``target`` is an
    object or ``"module:attribute"``; ``chapter`` names the chapter that provides it (for
    the error where that chapter is missing); ``options`` are keyword arguments bound to
    the target (``register("relu", "minillm.ffn:FeedForward", activation="relu")``).
    ``get(name)`` resolves and returns the component (with its options bound).
    ``name in registry`` and ``names()`` never import anything.
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, _Entry] = {}

    def register(self, name: str, target, *, chapter: str | None = None, replace: bool = False, **options) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty str, got {name!r}")
        if isinstance(target, str):
            module, _, attribute = target.partition(":")
            if not module or not attribute:
                raise ValueError(f"target must be callable or a 'module:attribute' string, got {target!r}")
        elif not callable(target):
            raise TypeError(f"target must be callable or a 'module:attribute' string, got {type(target).__name__}")
        entry = _Entry(target, chapter, dict(options))
        if name in self._entries and self._entries[name] != entry and not replace:
            raise ValueError(f"{self.kind} {name!r} is already registered (as {self._describe(name)}); "
                             "pass replace=True to replace it")
        self._entries[name] = entry

    def get(self, name: str):
        """The component registered as ``name``; ``ValueError`` for an unknown name or a
        forward reference whose chapter (or dependency) this installation lacks."""
        entry = self._entries.get(name)
        if entry is None:
            raise ValueError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}")
        target = entry.target
        if isinstance(target, str):
            target = self._resolve(name, entry)
        return partial(target, **entry.options) if entry.options else target

    def names(self) -> tuple[str, ...]:
        """Every registered name, sorted (forward references included, resolved or not)."""
        return tuple(sorted(self._entries))

    def __contains__(self, name) -> bool:
        return name in self._entries

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self.names())})"

    def _describe(self, name: str) -> str:
        target = self._entries[name].target
        return target if isinstance(target, str) else getattr(target, "__qualname__", repr(target))

    def _resolve(self, name: str, entry: _Entry):
        module_name, _, attribute = entry.target.partition(":")
        module = sys.modules.get(module_name)
        if module is None:
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError as error:
                if error.name is not None and (module_name == error.name or module_name.startswith(error.name + ".")):
                    provider = f"chapter {entry.chapter} ({module_name})" if entry.chapter else module_name
                    raise ValueError(f"{self.kind} {name!r} comes from {provider}, which this installation of "
                                     "minillm does not have") from error
                raise ValueError(f"{self.kind} {name!r} ({entry.target}) needs the package {error.name!r}, "
                                 "which is not installed") from error
        try:
            return getattr(module, attribute)
        except AttributeError:
            raise ValueError(f"{self.kind} {name!r} refers to {entry.target}, but {module_name} defines no "
                             f"{attribute!r}") from None
