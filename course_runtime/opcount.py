"""Counting the steps an answer takes, for checks that it is vectorised, without timing it.

A loop over tokens runs its body once per token; a vectorised answer runs the same lines
whatever the number of tokens, and lets torch loop in C. ``python_steps`` counts the
Python lines that a call executes in the learner's code (a notebook cell, or a module
outside the libraries: ``minillm``, a student bundle's export), so that a check can run an
answer at two sizes and see whether the count grows with the size.

Lines in the standard library, in installed packages (torch among them), in this runtime
and in the grader are not counted: they do not loop over the learner's data. Where the
answer runs in another process (the hardened grader's proxy of it), the lines are counted
there, in the learner's process, and the count comes back with the result.
"""
from __future__ import annotations

import sys
import sysconfig
from pathlib import Path
from typing import Callable

_LIBRARIES = tuple(str(Path(p).resolve()) for p in {sysconfig.get_paths()[key]
                                                      for key in ("stdlib", "platstdlib", "purelib", "platlib")})
_OURS = (str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent / "autograder"))


def _counted(filename: str) -> bool:
    """Whether lines of ``filename`` are the learner's (a cell, the package), not a library's."""
    if filename.startswith("<"):  # "<frozen ...>" is the standard library's; "<string>", a cell's, is not
        return not filename.startswith("<frozen ")
    try:
        path = str(Path(filename).resolve())
    except (OSError, ValueError):
        return True
    return not path.startswith(_LIBRARIES + _OURS)


def python_steps(fn: Callable, *args, **kwargs) -> tuple[int, object]:
    """``(lines, result)``: the Python lines that ``fn(*args, **kwargs)`` executed in the
    learner's code (a loop's body counts once per iteration), and what it returned."""
    counted_where_it_runs = getattr(type(fn), "_call_counting_steps", None)  # the grader's proxy
    if counted_where_it_runs is not None:
        return counted_where_it_runs(fn, *args, **kwargs)
    count = 0
    known: dict[str, bool] = {}

    def local(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
        return local

    def tracer(frame, event, arg):
        filename = frame.f_code.co_filename
        if filename not in known:
            known[filename] = _counted(filename)
        return local if known[filename] else None

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        result = fn(*args, **kwargs)
    finally:
        sys.settrace(previous)
    return count, result


def grows_with_size(fn: Callable, small: tuple, large: tuple, slack: int) -> tuple[int, int] | None:
    """``(lines at small, lines at large)`` when ``fn(*large)`` executes more than ``slack``
    lines more than ``fn(*small)``; None when it does not (the count does not grow)."""
    few, _ = python_steps(fn, *small)
    many, _ = python_steps(fn, *large)
    return (few, many) if many - few > slack else None
