"""The notebook runtime (course_runtime): the diagnosis behind visible tests, and the keep-going fallback."""
import pytest
import torch

import course_runtime as course
from course_runtime import bundle, fallback


def test_expect_close_names_the_matching_mistake():
    expected = torch.tensor([1.0, 2.0])
    wrong = torch.tensor([2.0, 4.0])
    with pytest.raises(course.CheckFailed, match="known mistake: doubled"):
        course.expect_close(wrong, expected, "f", mistakes={"doubled": wrong.clone(), "other": -expected})


def test_expect_close_reports_shape_then_first_mismatch():
    with pytest.raises(course.CheckFailed, match=r"expected shape \(2,\), got \(3,\)"):
        course.expect_close(torch.zeros(3), torch.zeros(2), "f")
    with pytest.raises(course.CheckFailed, match=r"first mismatch at index \(1,\): expected 2, got 5"):
        course.expect_close(torch.tensor([1.0, 5.0]), torch.tensor([1.0, 2.0]), "f")
    with pytest.raises(course.CheckFailed, match="NaN"):
        course.expect_close(torch.tensor([float("nan")]), torch.tensor([1.0]), "f")
    with pytest.raises(course.CheckFailed, match="expected a tensor"):
        course.expect_close([1.0], torch.tensor([1.0]), "f")


def test_expect_close_passes_within_tolerance():
    course.expect_close(torch.tensor([1.0 + 1e-7]), torch.tensor([1.0]), "f")


def test_expect_equal():
    course.expect_equal(3, 3, "n")
    with pytest.raises(course.CheckFailed, match="known mistake: off by one"):
        course.expect_equal(4, 3, "n", mistakes={"off by one": 4})
    with pytest.raises(course.CheckFailed):
        course.expect_equal(True, 1, "n")


def test_keep_going_prefers_the_learner_and_falls_back(capsys):
    def learner(x):
        return x + 1

    def broken(x):
        raise NotImplementedError()

    def reference(x):
        return x + 1

    check = lambda f: course.expect_equal(f(1), 2, "f")  # noqa: E731
    assert course.keep_going("f", learner, reference, check) is learner
    assert course.keep_going("f", broken, reference, check) is reference
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "f: using your implementation"
    assert out[1] == "f: it calls broken, which is not answered yet; the cells below use the package's reference"


def test_keep_going_says_not_answered_yet_for_a_stub_and_nothing_else(capsys):
    """The stub raises NotImplementedError, a RuntimeError: a check that turns RuntimeError
    into a hint must not show that hint for an exercise not answered yet."""
    def softmax(x, dim):
        # YOUR CODE HERE
        raise NotImplementedError()

    def check(f):
        try:
            f(torch.ones(2), dim=-1)
        except RuntimeError as error:
            raise course.CheckFailed(f"softmax raised RuntimeError: {error}. Hint: pass keepdim=True") from error

    assert course.keep_going("softmax", softmax, torch.softmax, check) is torch.softmax
    assert capsys.readouterr().out == "softmax: not answered yet; the cells below use the package's reference\n"


def test_keep_going_in_a_student_bundle_leaves_the_package_as_it_is(capsys, monkeypatch):
    """A bundle's module lists its stubs in __learner_exercises__: a working answer is returned
    with a line saying how to export it; the package keeps its stub (no module is patched);
    a broken answer is kept behind a stand-in, and said so."""
    import sys
    import types

    stubbed = types.ModuleType("minillm.ffn")  # chapter 05's module, so the hint names chapter 05
    exec("def double(x):\n    raise NotImplementedError()\n\n"
         "def twice(x):\n    return 2 * double(x)\n\n"
         "__learner_exercises__ = ('double',)\n", stubbed.__dict__)
    stub = stubbed.double
    monkeypatch.setitem(sys.modules, stubbed.__name__, stubbed)

    def check(f):
        course.expect_equal(f(3), 6, "double")

    def broken(x):
        return x + 2

    def right(x):
        return 2 * x

    def raising(x):
        raise ValueError("not yet")

    waiting = course.keep_going("double", broken, stub, check)
    assert waiting.__wrapped__ is broken and waiting(1) == 3, "a broken answer is kept, behind a stand-in"
    with pytest.raises(course.NeedsAnswer, match="needs your `double`"):
        course.keep_going("double", raising, stub, check)(3)
    assert course.keep_going("double", right, stub, check) is right
    assert stubbed.double is stub, "the package is never patched: export makes an answer the package's"
    with pytest.raises(NotImplementedError):
        stubbed.twice(3)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("double: not working yet (CheckFailed") and "no reference" in out[0]
    assert out[1].startswith("double: not working yet (ValueError")
    assert out[2] == ("double: using your implementation; the package's own code (minillm.ffn) runs it once you "
                      "export it: make export CHAPTER=05, then restart the kernel")


def test_seed_everything_reproduces_and_rejects_bad_seeds():
    course.seed_everything(3)
    a = torch.rand(3)
    course.seed_everything(3)
    assert torch.equal(a, torch.rand(3))
    with pytest.raises(ValueError, match="seed"):
        course.seed_everything(-1)


def test_pick_device():
    assert course.pick_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="prefer"):
            course.pick_device("cuda")


def test_one_thread_restores_the_setting_even_after_an_error():
    before = torch.get_num_threads()
    with pytest.raises(RuntimeError):
        with course.one_thread():
            assert torch.get_num_threads() == 1
            raise RuntimeError("boom")
    assert torch.get_num_threads() == before


def _reject_negative(n, *, name="n"):
    if n < 0:
        raise ValueError(f"{name} must be >= 0, got {n}")
    return n


def test_expect_raises_passes_when_the_expected_error_is_raised():
    assert course.expect_raises(ValueError, _reject_negative, -1, name="count", match="count") is None
    course.expect_raises((TypeError, ValueError), _reject_negative, -2)
    course.expect_raises(LookupError, {}.__getitem__, 3)  # a subclass counts, as with except


def test_expect_raises_fails_naming_the_call_when_nothing_is_raised():
    with pytest.raises(course.CheckFailed, match=r"^_reject_negative\(3\) must raise ValueError, but it returned int 3$"):
        course.expect_raises(ValueError, _reject_negative, 3)
    with pytest.raises(course.CheckFailed, match=r"^a count of 3 must raise TypeError or ValueError, .*\. Hint: negative"):
        course.expect_raises((TypeError, ValueError), _reject_negative, 3, what="a count of 3", hint="negative")
    with pytest.raises(course.CheckFailed, match=r"^add\(tensor of shape \(2,\), dtype torch.int64, 1, alpha=2\) must"):
        course.expect_raises(ValueError, torch.add, torch.tensor([1, 2]), 1, alpha=2)


def test_expect_raises_checks_that_the_message_names_the_argument():
    with pytest.raises(course.CheckFailed, match="raised ValueError as it should, but its message does not name 'size'"):
        course.expect_raises(ValueError, _reject_negative, -1, match="size")


def test_expect_raises_lets_another_error_through_unless_it_is_a_known_mistake():
    with pytest.raises(KeyError):  # unchanged, so NotImplementedError and the grader's own errors stay visible
        course.expect_raises(ValueError, {}.__getitem__, 3)
    with pytest.raises(NotImplementedError):
        course.expect_raises(ValueError, _not_implemented)
    with pytest.raises(NotImplementedError):  # a stub, never a known mistake, though it is a RuntimeError
        course.expect_raises(ValueError, _not_implemented, mistakes={"reshape's RuntimeError escapes": RuntimeError})
    with pytest.raises(course.CheckFailed, match="must raise ValueError, got KeyError .*known mistake: the lookup's KeyError"):
        course.expect_raises(ValueError, {}.__getitem__, 3, mistakes={"the lookup's KeyError escapes": KeyError})


def _not_implemented(*args):
    raise NotImplementedError()


def _swiglu_stub(x, w1, w2, w3):
    # YOUR CODE HERE
    raise NotImplementedError()


@course.visible_check("swiglu")
def _check_swiglu(swiglu):
    """Chapter 05's pattern: a RuntimeError from the answer gets a hint about shapes."""
    try:
        got = swiglu(torch.ones(2, 4), torch.ones(6, 4), torch.ones(4, 6), torch.ones(6, 4))
    except RuntimeError as error:
        raise course.CheckFailed(f"swiglu raised {error}: a weight used untransposed?") from error
    course.expect_close(got, torch.zeros(2, 4), "swiglu", hint="subtract nothing")


def test_a_visible_check_of_a_stub_says_not_answered_yet_and_nothing_else():
    def swiglu(x, w1, w2, w3):
        # YOUR CODE HERE
        raise NotImplementedError()

    failure = _failure(_check_swiglu, swiglu)
    assert type(failure) is course.NotAnswered and isinstance(failure, course.CheckFailed)
    assert str(failure) == failure.summary == "swiglu: not answered yet"
    assert failure._render_traceback_() == ["swiglu: not answered yet"], "a notebook shows this line, no traceback"
    assert failure.__cause__ is None and failure.__context__ is None


def test_a_visible_check_keeps_its_hints_for_real_mistakes():
    def untransposed(x, w1, w2, w3):
        return (x @ w1) @ w2

    def wrong(x, w1, w2, w3):
        return torch.ones(2, 4)

    assert "a weight used untransposed?" in str(_failure(_check_swiglu, untransposed))
    assert "Hint: subtract nothing" in str(_failure(_check_swiglu, wrong))
    assert _check_swiglu(lambda x, w1, w2, w3: torch.zeros(2, 4)) is None


def test_a_visible_check_names_the_stub_an_answer_calls():
    def swiglu(x, w1, w2, w3):
        return _swiglu_stub(x, w1, w2, w3)

    assert str(_failure(_check_swiglu, swiglu)) == "swiglu: it calls _swiglu_stub, which is not answered yet"
    relayed = NotImplementedError("swiglu: not answered yet")  # what the grader's proxy raises
    relayed.summary = str(relayed)
    assert str(course.not_answered("swiglu", relayed)) == "swiglu: not answered yet"
    assert not course.unanswered(course.NeedsAnswer("gelu")), "a bundle's skip says itself what it needs"
    assert not course.unanswered(RuntimeError("size mismatch"))


def _failure(call, *args, **kwargs) -> course.CheckFailed:
    with pytest.raises(course.CheckFailed) as caught:
        call(*args, **kwargs)
    return caught.value


def test_every_failed_check_has_a_summary_without_values():
    expected = torch.tensor([1.25, 2.5])
    cases = [
        (_failure(course.expect_close, torch.tensor([1.25, 9.75]), expected, "f(x)"), "f(x): values differ"),
        (_failure(course.expect_close, torch.tensor([1.25]), expected, "f(x)"), "f(x): wrong shape"),
        (_failure(course.expect_close, 3.75, expected, "f(x)"), "f(x): not a tensor"),
        (_failure(course.expect_close, torch.tensor([float("nan"), 2.5]), expected, "f(x)"), "f(x): NaN or inf"),
        (_failure(course.expect_equal, 17, 42, "count"), "count: values differ"),
        (_failure(course.expect_raises, ValueError, lambda k: 17, 3, what="f with k = 0"),
         "f with k = 0 must raise ValueError, but it returned a value"),
    ]
    for error, summary in cases:
        assert error.summary == summary
        for value in ("9.75", "3.75", "17", "42"):
            assert value not in error.summary
    mistake = _failure(course.expect_close, expected * 2, expected, "f(x)", mistakes={"doubled": expected * 2})
    assert mistake.summary == "f(x): your result matches a known mistake: doubled"


def test_a_hidden_check_shows_a_constant_assert_message_but_not_a_formatted_one():
    from autograder.failures import hidden_reason, student_exception

    source = "assert ok, 'rows must sum to 1'\nassert got == want, f'expected {want}, got {got}'"
    assert hidden_reason(AssertionError("rows must sum to 1"), source) == "rows must sum to 1"
    assert "42" not in hidden_reason(AssertionError("expected 42, got 17"), source)
    echoed = student_exception("ValueError", "your f raised ValueError: bad 4.25", "your f raised ValueError")
    assert isinstance(echoed, ValueError) and hidden_reason(echoed, source) == "your f raised ValueError"
    assert hidden_reason(TypeError("unsupported operand 4.25"), source) == "TypeError while checking what your code returned"
    assert hidden_reason(_failure(course.expect_equal, 17, 42, "count"), source) == "count: values differ"


def test_a_skipped_cell_claims_only_the_names_it_binds_in_the_notebook(capsys):
    """SkipUnsolved: a later cell that needs a name the skipped cell would have bound prints
    one line; a name local to that cell's function is no such name, and stays a NameError."""
    import ast

    def unsolved():
        raise NotImplementedError()

    cell = ("import math as m\ndef helper():\n    local_only = 1\n    return local_only\n"
            "squares = [inside for inside in range(3)]\nfor row in range(2):\n    pass\nvalue = unsolved()\n")
    namespace = {"unsolved": unsolved, course.SkipUnsolved.REPORT: course.report_skipped}
    fallback._SKIPPED_NAMES.clear()
    exec(compile(course.SkipUnsolved().visit(ast.parse(cell)), "<cell>", "exec"), namespace)
    assert fallback._SKIPPED_NAMES == {"m", "helper", "squares", "row", "value"}
    later = compile(course.SkipUnsolved().visit(ast.parse("print(value)")), "<cell>", "exec")
    exec(later, namespace)
    assert "skipped: this cell needs `value`" in capsys.readouterr().out
    with pytest.raises(NameError):
        exec(compile(course.SkipUnsolved().visit(ast.parse("print(local_only)")), "<cell>", "exec"), namespace)
    fallback._SKIPPED_NAMES.clear()


def test_best_seconds_is_the_fastest_of_its_runs():
    import time

    delays = iter([0.03, 0.005, 0.02])
    calls = []
    best = course.best_seconds(lambda: (calls.append(1), time.sleep(next(delays))), 3)
    assert len(calls) == 3
    assert 0.005 <= best < 0.02
    with pytest.raises(ValueError, match="repeats"):
        course.best_seconds(lambda: None, 0)


def _notebook(source: str) -> dict:
    """The namespace of a notebook that ran ``source``."""
    namespace: dict = {}
    exec(source, namespace)
    return namespace


def _reference_count_pairs(counts):
    return {"reference": 1}


@course.visible_check("train_step", count_pairs=_reference_count_pairs)
def _check_train_step(train_step, expected):
    course.expect_equal(train_step({}), expected, "train_step")


def test_a_visible_check_runs_the_answer_with_the_references_it_builds_on():
    notebook = _notebook("def count_pairs(counts):\n    raise ValueError('a wrong count_pairs')\n\n"
                         "def helper(counts):\n    return count_pairs(counts)\n\n"
                         "def train_step(counts):\n    return helper(counts)\n")
    _check_train_step(notebook["train_step"], {"reference": 1})  # through the chapter's helper too
    failure = _failure(_check_train_step, notebook["train_step"], {"other": 2})
    assert "train_step: expected {'other': 2}" in str(failure)
    with pytest.raises(ValueError, match="a wrong count_pairs"):
        notebook["train_step"]({})  # the learner's own again, after a pass and after a failure

    fresh = _notebook("def train_step(counts):\n    return count_pairs(counts)\n")
    _check_train_step(fresh["train_step"], {"reference": 1})
    assert "count_pairs" not in fresh, "a name the notebook did not define is removed again"


def test_using_leaves_what_is_no_plain_function_and_a_bundles_stubs(monkeypatch):
    class Proxy:  # the grader's proxy of a function: the grader binds the references itself
        def __call__(self, counts):
            return "the learner's process"

    with course.using(Proxy(), count_pairs=_reference_count_pairs):
        assert Proxy()({}) == "the learner's process"

    def stub(counts):
        raise NotImplementedError

    notebook = _notebook("def count_pairs(counts):\n    return 'mine'\n\ndef train_step(counts):\n    return count_pairs(counts)\n")
    monkeypatch.setattr(bundle, "_bundle_stubs", lambda: iter([("minillm.tokenizer", "count_pairs", stub)]))
    with course.using(notebook["train_step"], count_pairs=stub):
        assert notebook["train_step"]({}) == "mine", "a bundle's stub never replaces the learner's own answer"
