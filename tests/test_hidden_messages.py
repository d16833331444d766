"""A hidden check's failure message reaches the learner only when it is a constant.

For a failed hidden ``assert``, the judge shows its message only if the check's source spells
it out as a string literal (``autograder.failures.hidden_reason``); a formatted message could quote
the hidden inputs or the expected values, so it is replaced by a generic reason. The course's
helpers put their ``name`` (``expect_close``, ``expect_equal``) or ``what`` (``expect_raises``)
into the value-free summary a learner sees, so those must not be formatted from values either.
A message may also be a name that a ``for`` loop takes from a literal list of cases, each of
which gives it a string literal: one constant message per kind of case.
"""
import ast

import pytest

from course_runtime.marks import HIDDEN_BEGIN, HIDDEN_END
from coursebuild import paths

from .conftest import SLUGS

# the position of the message among a helper's positional arguments, and its keyword
MESSAGE_ARGUMENTS = {"expect_close": (2, "name"), "expect_equal": (2, "name"), "expect_raises": (None, "what")}


def hidden_lines(text: str) -> list[tuple[int, int]]:
    """The (first, last) line numbers of each hidden-test region of a chapter source."""
    regions, start = [], None
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip() == HIDDEN_BEGIN:
            start = number
        elif line.strip() == HIDDEN_END and start is not None:
            regions.append((start, number))
            start = None
    return regions


def _is_literal(node) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _loop_constant(name: ast.Name, loops: list[ast.For]) -> bool:
    """Whether ``name`` is bound by an enclosing ``for`` over literal cases, each giving it a literal."""
    for loop in reversed(loops):
        targets = loop.target.elts if isinstance(loop.target, ast.Tuple) else [loop.target]
        positions = [i for i, t in enumerate(targets) if isinstance(t, ast.Name) and t.id == name.id]
        if not positions:
            continue
        if not isinstance(loop.iter, (ast.List, ast.Tuple)) or not loop.iter.elts:
            return False
        i = positions[0]
        for case in loop.iter.elts:
            if isinstance(loop.target, ast.Tuple):
                if not isinstance(case, ast.Tuple) or len(case.elts) != len(targets) or not _is_literal(case.elts[i]):
                    return False
            elif not _is_literal(case):
                return False
        return True
    return False


def formatted_messages(text: str) -> list[str]:
    """``line: message`` for each message in a hidden region that is not a constant string."""
    regions = hidden_lines(text)
    found = []

    def visit(node, loops):
        inside = hasattr(node, "lineno") and any(a < node.lineno < b for a, b in regions)
        messages = []
        if inside and isinstance(node, ast.Assert) and node.msg is not None:
            messages.append(node.msg)
        if inside and isinstance(node, ast.Call):
            helper = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if helper in MESSAGE_ARGUMENTS:
                position, keyword = MESSAGE_ARGUMENTS[helper]
                if position is not None and len(node.args) > position:
                    messages.append(node.args[position])
                messages += [k.value for k in node.keywords if k.arg == keyword]
        for message in messages:
            if not (_is_literal(message) or isinstance(message, ast.Name) and _loop_constant(message, loops)):
                found.append(f"line {message.lineno}: {ast.get_source_segment(text, message)}")
        inner = loops + [node] if isinstance(node, ast.For) else loops
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(ast.parse(text), [])
    return found


def test_the_scan_finds_formatted_messages_and_accepts_constant_ones():
    source = "\n".join([
        "assert ok, f'visible {x}'",
        HIDDEN_BEGIN,
        "assert ok, 'a constant'",
        "assert ok, f'got {x}'",
        "assert ok, 'got %s' % x",
        "course.expect_close(a, b, 'constant name')",
        "course.expect_close(a, b, f'name {n}')",
        "course.expect_equal(a, b, name='x' + str(n))",
        "course.expect_raises(ValueError, f, what=f'f({n})')",
        "for n, what in [(1, 'kind one'), (2, 'kind two')]:",
        "    course.expect_raises(ValueError, f, n, what=what)",
        "for n, what in [(1, 'kind one'), (2, str(n))]:",
        "    assert ok, what",
        HIDDEN_END,
        "assert ok, f'visible {x}'",
    ])
    assert [line.split(":")[0] for line in formatted_messages(source)] == [
        "line 4", "line 5", "line 7", "line 8", "line 9", "line 13"]


@pytest.mark.parametrize("slug", SLUGS)
def test_hidden_messages_are_constant_strings(slug):
    text = paths.source_file(slug).read_text(encoding="utf-8")
    assert hidden_lines(text), f"{slug} has no hidden tests"
    assert formatted_messages(text) == [], (
        f"{slug}: hidden checks whose message is formatted (the learner sees only a generic reason, "
        "and a helper's name would carry the values into the summary): write a constant string")
