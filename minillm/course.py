"""Helpers every chapter uses (infrastructure; no chapter teaches this module).

- ``QUICK``: true when ``COURSE_QUICK=1``; chapters shrink their experiments then.
- ``seed_everything`` and ``pick_device``: one way to seed, one way to choose the device.
- ``one_thread``: run a block on one CPU thread (small models and fair timings).
- ``smooth`` and ``plot_history``: loss curves for figures.
- ``expect_*``: the checks behind the visible tests. A failure says what was expected,
  what came back, where the first mismatch is, and, when the wrong answer matches a known
  mistake, names that mistake. ``expect_raises`` checks that bad input gets its error.
- ``visible_check``: the decorator of a visible test's check function. An exercise not
  answered yet (its answer cell's stub raises ``NotImplementedError``) fails with
  :class:`NotAnswered`, which says "NAME: not answered yet" and nothing else, never a
  hint about a mistake (``NotImplementedError`` is a ``RuntimeError``, which checks catch
  to diagnose mistakes).
- ``using``: within a check, an answer's calls of the exercises it builds on reach the
  course's references, so the check grades that answer on its own.
- ``keep_going``: after an exercise, binds a new name to the learner's function when it
  passes the visible test's checks, else to the package's reference, and says which. In a student
  bundle, where the reference of a chapter not yet due is a stub, a working answer takes
  the stub's place in the package.
"""
from __future__ import annotations

import ast
import functools
import os
import random
import sys
import textwrap
import time
import types
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import torch

from .checks import positive_int

QUICK = os.environ.get("COURSE_QUICK", "").strip() not in ("", "0")


def seed_everything(seed: int = 0) -> None:
    """Seed Python's and torch's generators, so that numbers and figures reproduce."""
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    random.seed(seed)
    torch.manual_seed(seed)


def pick_device(prefer: str | None = None) -> torch.device:
    """``prefer`` when given, else CUDA when present, else the CPU."""
    if prefer is not None:
        device = torch.device(prefer)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"prefer={prefer!r}, but no CUDA device is available")
        return device
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@contextmanager
def one_thread() -> Iterator[None]:
    """Run the block on one CPU thread, then restore the previous setting.

    The course's experiments use matrices too small to gain from a second thread, and on a
    busy machine threads that wait for each other can cost more than the work; timings on
    one thread compare algorithms rather than how many cores each can use.
    """
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def best_seconds(run: Callable[[], object], repeats: int) -> float:
    """The fastest of ``repeats`` calls of ``run()``, in seconds: the call least disturbed by
    whatever else the machine does, which is the one to compare on a busy machine."""
    positive_int("repeats", repeats)
    fastest = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        fastest = min(fastest, time.perf_counter() - started)
    return fastest


def setup(seed: int = 0) -> torch.device:
    """The first code cell of every chapter: seed, pick the device, say what was chosen.

    In a student bundle it also makes the learner's answers take the place of the
    package's stubs as soon as their cells run (:func:`install_answers`).
    """
    seed_everything(seed)
    _watch_learner_answers()
    device = pick_device()
    mode = "quick mode (COURSE_QUICK=1): experiments shrunk" if QUICK else "full mode"
    print(f"torch {torch.__version__} · device {device} · {mode} · seed {seed}")
    return device


def smooth(values, weight: float = 0.9) -> list[float]:
    """An exponential moving average of a loss curve, for plotting: each point is
    ``weight`` times the previous smoothed point plus ``1 - weight`` times the new value."""
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"weight must be in [0, 1), got {weight!r}")
    out, running = [], values[0]
    for value in values:
        running = weight * running + (1 - weight) * value
        out.append(running)
    return out


def plot_history(history: Mapping, title: str = "Training the mini-LLM"):
    """The loss curves of a training history (``minillm.train.TrainState.history``, or a
    checkpoint that keeps one): the training loss of every step, smoothed by ``smooth``
    over about a fiftieth of the run, and the validation loss at each evaluation, in nats
    per token. Returns the matplotlib figure."""
    import matplotlib.pyplot as plt

    losses = [float(value) for value in history["train_loss"]]
    if not losses:
        raise ValueError("history holds no training loss to plot")
    span = max(1, len(losses) // 50)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(range(1, len(losses) + 1), smooth(losses, 1 - 1 / span), label=f"training (smoothed over ~{span} steps)")
    if history.get("val_loss"):
        ax.plot(history["val_step"], history["val_loss"], "o-", label="validation (windows of the held-out 10%)")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (nats per token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


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


def describe(value) -> str:
    """A short description of a value: shape and dtype for tensors."""
    if isinstance(value, torch.Tensor):
        return f"tensor of shape {tuple(value.shape)}, dtype {value.dtype}"
    return f"{type(value).__name__} {value!r}"[:120]


def _first_mismatch(got: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float) -> str:
    bad = ~torch.isclose(got, expected, atol=atol, rtol=rtol, equal_nan=False)
    index = tuple(int(i) for i in bad.nonzero()[0])
    diff = (got - expected).abs().max().item()
    return (
        f"first mismatch at index {index}: expected {expected[index].item():.6g}, "
        f"got {got[index].item():.6g}; largest difference {diff:.3g}"
    )


def close(got, expected: torch.Tensor, atol: float = 1e-5, rtol: float = 1e-4) -> bool:
    """True when ``got`` is a tensor of ``expected``'s shape and values (NaN never matches)."""
    return (
        isinstance(got, torch.Tensor)
        and got.shape == expected.shape
        and bool(torch.allclose(got.detach().to(expected.dtype), expected, atol=atol, rtol=rtol))
    )


def expect_close(
    got,
    expected: torch.Tensor,
    name: str,
    *,
    atol: float = 1e-5,
    rtol: float = 1e-4,
    mistakes: Mapping[str, torch.Tensor] | None = None,
    hint: str | None = None,
) -> None:
    """Fail with a diagnosis unless ``got`` matches ``expected`` (a tensor).

    ``mistakes`` maps a description of a known mistake to the output that mistake would
    produce; when ``got`` matches one, the message names it.
    """
    if not isinstance(got, torch.Tensor):
        raise CheckFailed(f"{name}: expected a tensor, got {describe(got)}", f"{name}: not a tensor")
    if got.shape != expected.shape:
        raise CheckFailed(
            f"{name}: expected shape {tuple(expected.shape)}, got {tuple(got.shape)}"
            + (f". Hint: {hint}" if hint else ""), f"{name}: wrong shape"
        )
    if close(got, expected, atol, rtol):
        return
    for mistake, wrong in (mistakes or {}).items():
        if wrong.shape == expected.shape and close(got, wrong, atol, rtol):
            message = f"{name}: your result matches a known mistake: {mistake}"
            raise CheckFailed(message, message)
    got = got.detach().to(expected.dtype)
    message = f"{name}: values differ; " + (
        "got NaN or inf" if not torch.isfinite(got).all() else _first_mismatch(got, expected, atol, rtol)
    )
    raise CheckFailed(message + (f". Hint: {hint}" if hint else ""),
                      f"{name}: " + ("NaN or inf" if message.endswith("got NaN or inf") else "values differ"))


def expect_equal(got, expected, name: str, *, mistakes: Mapping[str, object] | None = None, hint: str | None = None) -> None:
    """Fail unless ``got == expected`` for plain values (ints, strings, tuples).

    ``mistakes`` maps a description of a known mistake to the value it would produce.
    """
    if got == expected and isinstance(got, bool) == isinstance(expected, bool):
        return
    for mistake, wrong in (mistakes or {}).items():
        if got == wrong:
            raise CheckFailed(f"{name}: expected {expected!r}, got {got!r}, which matches a known mistake: {mistake}",
                              f"{name}: your result matches a known mistake: {mistake}")
    raise CheckFailed(
        f"{name}: expected {expected!r}, got {describe(got)}" + (f". Hint: {hint}" if hint else ""),
        f"{name}: " + ("values differ" if type(got) is type(expected) else f"expected a {type(expected).__name__}")
    )


def _call_text(call: Callable, args: tuple, kwargs: dict) -> str:
    shown = [describe(a) if isinstance(a, torch.Tensor) else repr(a)[:60] for a in args]
    shown += [f"{k}={describe(v) if isinstance(v, torch.Tensor) else repr(v)[:60]}" for k, v in kwargs.items()]
    return f"{getattr(call, '__name__', None) or repr(call)[:60]}({', '.join(shown)})"


def expect_raises(
    error: type[BaseException] | tuple[type[BaseException], ...],
    call: Callable,
    *args: Any,
    what: str | None = None,
    match: str | None = None,
    mistakes: Mapping[str, type[BaseException]] | None = None,
    hint: str | None = None,
    **kwargs: Any,
) -> None:
    """Fail unless ``call(*args, **kwargs)`` raises ``error`` (an exception class or a tuple of them).

    ``what`` names the call in the message (default: the function's name and its arguments).
    ``match``: text the error's message must contain, such as the name of the bad argument
    (a plain substring, not a regular expression). An exception of another type propagates
    unchanged, as from a plain call, unless it is an instance of a type in ``mistakes``
    (a description of a known mistake → the exception type that mistake raises): then the
    failure names that mistake. ``NotImplementedError`` (an unanswered exercise's stub) always
    propagates unchanged, never as a mistake.
    """
    def label() -> str:  # built only on failure: naming a grader's proxy of the call may cost a round trip
        return what or _call_text(call, args, kwargs)

    def brief() -> str:  # the label without the arguments' values
        return what or str(getattr(call, "__name__", None) or "the call")[:60]

    wanted = error if isinstance(error, tuple) else (error,)
    expected = " or ".join(e.__name__ for e in wanted)
    suffix = f". Hint: {hint}" if hint else ""
    try:
        result = call(*args, **kwargs)
    except wanted as raised:
        if match is not None and match not in str(raised):
            raise CheckFailed(
                f"{label()} raised {type(raised).__name__} as it should, but its message does not name "
                f"{match!r}: {str(raised)[:200]}" + suffix,
                f"{brief()} raised {type(raised).__name__} as it should, but its message does not name {match!r}"
            ) from raised
        return
    except Exception as other:
        if unanswered(other):  # a stub, not a known mistake (NotImplementedError is a RuntimeError)
            raise
        for mistake, kind in (mistakes or {}).items():
            if isinstance(other, kind):
                raise CheckFailed(
                    f"{label()} must raise {expected}, got {type(other).__name__} ({str(other)[:80]}), "
                    f"which matches a known mistake: {mistake}" + suffix,
                    f"{brief()} must raise {expected}, got {type(other).__name__}, which matches a known mistake: "
                    f"{mistake}"
                ) from other
        raise
    raise CheckFailed(f"{label()} must raise {expected}, but it returned {describe(result)}" + suffix,
                      f"{brief()} must raise {expected}, but it returned a value")


LEARNER_EXERCISES = "__learner_exercises__"
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


def _after_cell(result=None) -> None:
    from IPython import get_ipython

    namespace = get_ipython().user_ns
    install_answers(namespace)
    _SKIPPED_NAMES.difference_update(name for name in list(_SKIPPED_NAMES) if name in namespace)


def _watch_learner_answers() -> None:
    """In a notebook, after every cell, :func:`install_answers` of the notebook's names; in
    a student bundle also :class:`SkipUnsolved`, so Run All goes on past an unsolved exercise."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return
    if _after_cell not in shell.events.callbacks["post_run_cell"]:
        shell.events.register("post_run_cell", _after_cell)
    if in_student_bundle() and not any(isinstance(t, SkipUnsolved) for t in shell.ast_transformers):
        shell.user_ns[SkipUnsolved.REPORT] = report_skipped
        shell.ast_transformers.append(SkipUnsolved())


BUNDLE_MARKER = "bundle.json"  # at the root of a student bundle, beside minillm/


def in_student_bundle() -> bool:
    """True when this minillm is a student bundle's (``make student-bundle``)."""
    return (Path(__file__).resolve().parent.parent / BUNDLE_MARKER).is_file()


class NeedsAnswer(NotImplementedError):
    """A cell called an exercise whose answer does not work yet (student bundles only)."""

    def __init__(self, name: str):
        super().__init__(f"skipped: this cell needs your `{name}`, which does not work yet "
                         "(its visible test says why)")


_SKIPPED_NAMES: set[str] = set()  # names that cells skipped for an unsolved exercise would have bound


def report_skipped(error: Exception, bound: tuple[str, ...] = ()) -> None:
    """The one line a cell prints instead of a traceback when it needs an unsolved exercise
    (``NotImplementedError``), or a name that such a skipped cell would have bound
    (``NameError``; any other one is raised as usual). ``bound``: the names this cell binds."""
    if isinstance(error, NameError) and not isinstance(error, NotImplementedError):
        if error.name not in _SKIPPED_NAMES:
            raise error
        print(f"skipped: this cell needs `{error.name}`, from a cell that was skipped")
    elif isinstance(error, NeedsAnswer):
        print(error)
    else:
        frame = error.__traceback__
        while frame is not None and frame.tb_next is not None:
            frame = frame.tb_next
        name = frame.tb_frame.f_code.co_name if frame is not None else "answer"
        print(f"skipped: this cell needs your `{name}`, which is not written yet")
    _SKIPPED_NAMES.update(bound)


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda,
           ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _cell_names(body: list[ast.stmt]) -> set[str]:
    """The names a cell's statements bind in the notebook: assignments, loop and ``with``
    targets, imports, functions and classes; not the names local to a function, a class
    body or a comprehension."""
    names, stack = set(), list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names if alias.name != "*")
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        if not isinstance(node, _SCOPES):
            stack.extend(ast.iter_child_nodes(node))
    return names


class SkipUnsolved(ast.NodeTransformer):
    """Student bundles: a cell that runs into an unsolved exercise (``NotImplementedError``)
    prints one line instead of a traceback, and so does a later cell that needs a name the
    skipped one would have bound; so Run All goes on to the end of the chapter.

    The cell's code runs inside ``try``; its last expression is still shown as the cell's
    value. The graded notebook never runs with this: the grader's package is no bundle.
    """

    REPORT, SHOWN = "__course_report_skipped__", "__course_shown__"

    def visit_Module(self, node: ast.Module) -> ast.Module:
        if not node.body or any(isinstance(s, ast.ImportFrom) and s.module == "__future__" for s in node.body):
            return node
        bound = sorted(_cell_names(node.body))
        body, last = list(node.body), None
        if isinstance(body[-1], ast.Expr):
            last = body.pop().value
            body.append(ast.Assign([ast.Name(self.SHOWN, ast.Store())], last))
        report = ast.Expr(ast.Call(ast.Name(self.REPORT, ast.Load()),
                                   [ast.Name("_skipped", ast.Load()),
                                    ast.Tuple([ast.Constant(name) for name in bound], ast.Load())], []))
        errors = ast.Tuple([ast.Name("NotImplementedError", ast.Load()), ast.Name("NameError", ast.Load())], ast.Load())
        guarded: list[ast.stmt] = [ast.Try(body, [ast.ExceptHandler(errors, "_skipped", [report])], [], [])]
        if last is not None:
            guarded = ([ast.Assign([ast.Name(self.SHOWN, ast.Store())], ast.Constant(None))] + guarded
                       + [ast.Expr(ast.Name(self.SHOWN, ast.Load()))])
        node.body = guarded
        return ast.fix_missing_locations(node)


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


def _waiting_for(name: str, learner: Callable) -> Callable:
    """``learner``, whose failures in later cells become :class:`NeedsAnswer` (a bundle's
    stand-in when there is no reference to fall back on)."""
    if isinstance(learner, type) or not callable(learner):
        return learner

    @functools.wraps(learner)
    def waiting(*args, **kwargs):
        try:
            return learner(*args, **kwargs)
        except Exception as error:  # the learner's code may fail in any way
            raise NeedsAnswer(name) from error

    return waiting


def keep_going(name: str, learner: Callable, reference: Callable, check: Callable[[Callable], object]) -> Callable:
    """``learner`` when ``check(learner)`` runs without error, else ``reference``.

    Later cells use the returned function, so a learner who is stuck can read on. The
    graded name is never rebound: grading always scores the learner's own function.

    In a student bundle the reference of a chapter not yet due is a stub. Then a working
    ``learner`` also takes the stub's place inside ``minillm`` (so the package's own code
    runs on it), and a failing one is returned anyway, with a message that says so; the
    cells that then call it print one "skipped" line instead of a traceback.
    """
    module = _bundle_module(reference)
    try:
        check(learner)
    except Exception as error:  # the learner's code may fail in any way
        reason = textwrap.shorten(f"{type(error).__name__}: {error}", width=100, placeholder=" ...")
        if unanswered(error):
            said = not_answered(name, error)
            if module:
                print(f"{said}; this installation has no reference for it, so the cells that use it print "
                      "'skipped' until your answer works")
                return _waiting_for(name, learner)
            print(f"{said}; the cells below use the package's reference")
            return reference
        if module:
            print(f"{name}: not working yet ({reason}); this installation has no reference "
                  f"for it, so the cells that use it print 'skipped' until your answer works")
            return _waiting_for(name, learner)
        print(f"{name}: using the package's reference ({reason})")
        return reference
    if module:
        install_answers({reference.__name__: learner})
        print(f"{name}: using your implementation, also inside {module}")
        return learner
    print(f"{name}: using your implementation")
    return learner
