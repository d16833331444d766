"""The notebook runtime of the course: what every chapter's notebook uses besides ``minillm``.

A chapter imports it as ``import course_runtime as course``. It sits beside ``minillm`` at the
bottom layer: the chapters, ``coursebuild`` and ``autograder`` import it; ``minillm`` never
does, so the package reads as a plain library.

- ``session``: ``QUICK``, ``seed_everything``, ``pick_device``, ``one_thread``,
  ``best_seconds`` and ``setup``, the first code cell of every chapter.
- ``expect``: the checks behind the visible tests (``expect_close``, ``expect_equal``,
  ``expect_raises``, ``describe``, ``close``).
- ``diagnosis``: ``CheckFailed``, ``NotAnswered`` and ``visible_check``, the decorator of a
  visible test's check function.
- ``fallback``: ``keep_going``, the fallback after an exercise, and a student bundle's Run
  All past an unsolved one (``SkipUnsolved``, ``report_skipped``).
- ``bundle``: a student bundle's stubs; ``using``, the references a check gives an answer.
- ``marks``: the cell grammar (export, answer and hidden-test marks, cell ids).
- ``layout``: where the course's notebooks live, and the chapter slugs.
"""
from importlib import import_module

# Each public name and the submodule it lives in, imported on first use: the grader and the
# build chain read ``marks`` and ``layout`` without paying for torch (over a second).
_EXPORTS = {
    "bundle": ["BUNDLE_MARKER", "NeedsAnswer", "in_student_bundle", "using"],
    "diagnosis": ["CheckFailed", "NotAnswered", "not_answered", "unanswered", "visible_check"],
    "expect": ["close", "describe", "expect_close", "expect_equal", "expect_raises"],
    "fallback": ["SkipUnsolved", "keep_going", "report_skipped"],
    "session": ["QUICK", "best_seconds", "one_thread", "pick_device", "seed_everything", "setup"],
}
_HOME = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_HOME)


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{_HOME[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
