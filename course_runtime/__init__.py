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
from .bundle import BUNDLE_MARKER, NeedsAnswer, in_student_bundle, using
from .diagnosis import CheckFailed, NotAnswered, not_answered, unanswered, visible_check
from .expect import close, describe, expect_close, expect_equal, expect_raises
from .fallback import SkipUnsolved, keep_going, report_skipped
from .session import QUICK, best_seconds, one_thread, pick_device, seed_everything, setup

__all__ = [
    "BUNDLE_MARKER", "CheckFailed", "NeedsAnswer", "NotAnswered", "QUICK", "SkipUnsolved", "best_seconds", "close",
    "describe", "expect_close", "expect_equal", "expect_raises", "in_student_bundle", "keep_going", "not_answered",
    "one_thread", "pick_device", "report_skipped", "seed_everything", "setup", "unanswered", "using",
    "visible_check",
]
