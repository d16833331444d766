"""course_runtime.opcount: the lines of Python a call runs in the learner's code, counted
per iteration, and not those of the libraries it calls."""
import statistics
import sys

import pytest
import torch

from course_runtime.opcount import grows_with_size, python_steps


def loop(n):
    total = 0
    for i in range(n):
        total += i
    return total


def through_libraries(n):
    return statistics.fmean(range(n)), torch.arange(n).sum()  # the standard library's loop, torch's


def test_a_loop_counts_each_iteration():
    lines, result = python_steps(loop, 10)
    assert result == 45
    assert lines == 1 + 2 * 10 + 1 + 1  # total = 0; (for, +=) per i; the loop's exit; return


def test_the_libraries_lines_are_not_counted():
    few, _ = python_steps(through_libraries, 10)
    many, _ = python_steps(through_libraries, 10_000)
    assert few == many == 1
    assert grows_with_size(through_libraries, (10,), (10_000,), slack=0) is None
    assert grows_with_size(loop, (10,), (1_000,), slack=100) == (python_steps(loop, 10)[0], python_steps(loop, 1_000)[0])


def test_the_tracer_before_the_count_is_restored():
    def outer(frame, event, arg):
        return None

    sys.settrace(outer)
    try:
        python_steps(loop, 3)
        after = sys.gettrace()
    finally:
        sys.settrace(None)
    assert after is outer


class _LearnersProcess:
    """A stand-in for the grader's connection: it answers a "steps" request as the server in
    the learner's kernel does, by counting there (here: in this process)."""

    def __init__(self, function, forged=None):
        self.function, self.forged, self.requests = function, forged, []

    def request(self, what, **fields):
        self.requests.append(what)
        steps, value = python_steps(self.function, *fields["args"], **fields["kwargs"])
        return {"steps": steps if self.forged is None else self.forged, "value": value}


def test_a_proxys_lines_are_counted_in_the_process_that_runs_it():
    from autograder.failures import StudentError
    from autograder.proxies import RemoteObject

    remote = _LearnersProcess(loop)
    proxy = RemoteObject(remote, {"id": 1, "type": "function"}, label="loop")
    assert python_steps(proxy, 10) == python_steps(loop, 10)
    assert remote.requests == ["steps"]
    assert grows_with_size(proxy, (10,), (1_000,), slack=100) is not None
    for forged in (-1, 2.5, "many", True):
        with pytest.raises(StudentError, match="could not be counted"):
            python_steps(RemoteObject(_LearnersProcess(loop, forged), {"id": 1}, label="loop"), 3)
