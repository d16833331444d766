"""What a check says when it fails, and the decorator of a visible test's check.

- ``CheckFailed``: a test found a mistake; ``summary`` says so without any value.
- ``NotAnswered``: the exercise is not answered yet (its answer cell's stub raises
  ``NotImplementedError``): "NAME: not answered yet" and nothing else, never a hint about a
  mistake (``NotImplementedError`` is a ``RuntimeError``, which checks catch to diagnose
  mistakes).
- ``visible_check``: the decorator of a visible test's check function; it gives the answer
  the references of the exercises it builds on (``bundle.using``).
"""
from __future__ import annotations

import functools
from typing import Callable

from .bundle import NeedsAnswer, using

class CheckFailed(AssertionError):
    """A test found a mistake; the message says which.

    ``summary`` says the same without any value (the check's name and the kind of
    mistake): all that a hidden test shows, since its inputs stay hidden.
    """

    def __init__(self, message: str, summary: str | None = None):
        super().__init__(message)
        self.summary = summary or message


class NotAnswered(CheckFailed):
    """The exercise is not answered yet: the code a check called raises ``NotImplementedError``
    (the answer cell's starting stub). It says so and nothing else: no hint about a mistake,
    and in a notebook no traceback either (IPython shows :meth:`_render_traceback_`).

    ``calls``: the stub that raised, when it is not ``name``'s own (an answer that calls
    another exercise, not answered yet). ``message``: the whole message, as the grader
    already wrote it for a call of the learner's code.
    """

    def __init__(self, name: str | None = None, calls: str | None = None, *, message: str | None = None):
        if message is None:
            message = (f"{name}: it calls {calls}, which is not answered yet" if name and calls else
                       f"{name}: not answered yet" if name else "not answered yet")
        super().__init__(message, message)
        self.name = name

    def _render_traceback_(self) -> list[str]:
        return [str(self)]


def _stub_error(error: BaseException | None) -> BaseException | None:
    """The ``NotImplementedError`` (or :class:`NotAnswered`) that ``error`` is, or was raised
    while handling or from (``raise CheckFailed(...) from error`` in a check that catches
    ``RuntimeError``); None when there is none. A :class:`NeedsAnswer` (a student bundle's
    cell that needs another exercise) is none: it says itself which answer is missing."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, NotAnswered):
            return error
        if isinstance(error, NotImplementedError):
            return None if isinstance(error, NeedsAnswer) else error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def unanswered(error: BaseException | None) -> bool:
    """True when ``error`` comes from an answer cell's stub (``NotImplementedError``, also
    when a check turned it into another error): the exercise is not answered yet."""
    return _stub_error(error) is not None


def not_answered(name: str, error: BaseException) -> NotAnswered:
    """What a check of ``name`` says when ``error`` comes from a stub (:func:`unanswered`):
    "NAME: not answered yet", or, when the stub that raised is another function's,
    "NAME: it calls OTHER, which is not answered yet"."""
    stub = _stub_error(error)
    if isinstance(stub, NotAnswered):
        return stub
    if getattr(stub, "summary", None) and str(stub).endswith("not answered yet"):
        return NotAnswered(message=str(stub))  # relayed by the grader, which named the call already
    frame = stub.__traceback__ if stub is not None else None
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    raised_in = frame.tb_frame.f_code.co_qualname.rpartition("<locals>.")[2] if frame is not None else None
    if raised_in and raised_in.split(".")[0] not in (name, "<module>"):
        return NotAnswered(name, raised_in)
    return NotAnswered(name)


def visible_check(name: str, /, **builds_on: object) -> Callable[[Callable], Callable]:
    """The decorator of a visible test's check function, ``name`` the exercise it checks.

    When the learner's code raises ``NotImplementedError`` (the exercise is not answered
    yet), the check fails with :class:`NotAnswered` ("NAME: not answered yet") instead of
    whatever the check would have made of that error: checks catch ``RuntimeError`` to
    diagnose shape mistakes, and ``NotImplementedError`` is one. Other failures pass
    through unchanged.

    ``builds_on``: the course's references of the exercises that this one calls, by the
    names it calls them (``count_pairs=reference_tokenizer.count_pairs``). The check runs
    the answer, its first argument, :func:`using` them, so it grades this exercise on its own.
    """
    def decorate(check: Callable) -> Callable:
        @functools.wraps(check)
        def checked(answer, *args, **kwargs):
            try:
                with using(answer, **builds_on):
                    return check(answer, *args, **kwargs)
            except Exception as error:
                if not unanswered(error):
                    raise
                failure = not_answered(name, error)
            raise failure

        return checked

    return decorate
