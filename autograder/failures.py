"""What a failed call of the learner's code, or a failed check, says.

The learner's process answers a call with data only (see ``wire``); when the call raised,
:func:`call_failure` turns that answer into an exception of the judge's own
(:class:`StudentError`, and the built-in type it names). :func:`hidden_reason` and
:func:`constant_reason` are what a learner sees of a failed hidden check, or of a check run
where the references of other exercises are held: texts that carry no value.
"""
from __future__ import annotations

import builtins
import re

MAX_TEXT = 8000


class StudentError(Exception):
    """Raised in a check when the learner's code raised, or could not be reached."""


_exception_types: dict[str, type] = {}
OWN_TYPE = "an exception of a type your code defined"


def builtin_exception(name: str) -> type | None:
    """The exception class of Python's ``builtins`` module called ``name``, or None. Only
    these names are shown of a hidden check: a type the learner defined can be named after
    the check's inputs (their shapes, their dtypes)."""
    base = getattr(builtins, name, None)
    if isinstance(base, type) and issubclass(base, Exception) and not issubclass(base, StudentError):
        return base
    return None


def student_exception(name: str, message: str, summary: str | None = None) -> StudentError:
    """An exception that is a ``StudentError`` and, for built-in types, that type too.

    A check that expects ``ValueError`` from the learner's code still catches it; any
    other type becomes a plain ``StudentError``. Nothing is rebuilt from the learner's
    own classes. ``summary`` is what a hidden check may show of it: no message of the
    learner's, so no argument that the message could echo.
    """
    base = builtin_exception(name)
    if name not in _exception_types:
        bases = (StudentError, base) if base is not None else (StudentError,)
        try:
            _exception_types[name] = type(name if base is not None else "StudentError", bases, {})
        except TypeError:  # layout conflicts (e.g. OSError subclasses): keep StudentError
            _exception_types[name] = type("StudentError", (StudentError,), {})
    error = _exception_types[name](message)
    error.summary = summary
    return error


class Unavailable(StudentError):
    """The learner's process cannot answer (it died, hung, or was never started)."""


class CheckTimeout(StudentError):
    """A check ran past its own time budget, spent in the learner's calls: the learner's failure."""




def call_failure(answer: dict, label: str) -> StudentError:
    """The exception a call of ``label`` raised in the learner's process, from its answer
    (``type``, ``message``, ``frames``), as an exception of the judge's own."""
    message = str(answer.get("message", ""))[:MAX_TEXT]
    name = str(answer.get("type", "Exception"))[:100]
    where = ""
    frames = answer.get("frames") if isinstance(answer.get("frames"), list) else []
    if frames and isinstance(frames[-1], dict):
        frame = frames[-1]
        where = f" (in {str(frame.get('name'))[:80]}, line {frame.get('line')}: {str(frame.get('code'))[:200]})"
    if name == "InPlaceModification":
        # The summary is built here, not taken from the message: a learner's own class of
        # that name could carry anything in it.
        which = re.match(r"it changed ((?:its argument (?:\d+|\w+=)(?:, )?)+) in place", message)
        return student_exception(name, f"your {label}: {message}",
                                 f"your {label}: it changed {which.group(1) if which else 'an argument'} in place")
    if name == "NotImplementedError":  # an answer cell's stub: the exercise is not answered yet
        stub = str(frames[-1].get("name", ""))[:80] if frames and isinstance(frames[-1], dict) else ""
        own = stub in ("", *label.split(".")[-1].split()[-1:]) or stub.startswith("__")
        message = f"{label}: not answered yet" if own else f"{label}: it calls {stub}, which is not answered yet"
        return student_exception(name, message, message)
    shown = name if builtin_exception(name) else OWN_TYPE
    return student_exception(name, f"your {label} raised {name}: {message}{where}", f"your {label} raised {shown}")


def hidden_reason(error: BaseException, source: str) -> str:
    """What the learner sees of a failed hidden check: its kind, never a value.

    A hidden check's inputs stay hidden, so its message cannot carry them: a diagnosis of
    the course's checks gives its value-free summary, the learner's own exception only its
    type (its message may quote the arguments it was called with), and an ``assert`` only a
    message that the check's source spells out as a constant, not one formatted from values.
    """
    summary = getattr(error, "summary", None)
    if isinstance(summary, str) and summary:
        return summary
    if isinstance(error, (Unavailable, CheckTimeout)):
        return str(error)
    if isinstance(error, StudentError):
        return "your code failed in a way the check could not read"
    if isinstance(error, AssertionError):
        message = str(error)
        if message and message in _constant_strings(source):
            return message
        return "a hidden check found a wrong value or a property that does not hold"
    return f"{type(error).__name__} while checking what your code returned"


def constant_reason(error: BaseException, source: str) -> str:
    """What the learner sees of a failed check in a verdict-only kernel, which holds the
    references of the exercises the answer builds on: only texts the grader or the check's
    source spells out, never one that the learner's code could fill (an exception's type
    name or message, a frame's code), which could carry a reference back out."""
    if isinstance(error, CheckTimeout):
        return "the check ran past its time budget in calls of your code"
    if isinstance(error, Unavailable):
        return "the check could not reach your answer"
    if isinstance(error, NotImplementedError):
        return "not answered yet"
    if isinstance(error, StudentError):
        return "your code raised an exception while checked with the course's versions of the exercises it builds on"
    if isinstance(error, AssertionError) and str(error) in _constant_strings(source):
        return str(error)
    return "a check found a wrong value or a property that does not hold"


def _constant_strings(source: str) -> set[str]:
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    return {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)}
