"""Keep going when stuck: the fallback after an exercise, and Run All past unsolved ones.

- ``keep_going``: after an exercise, binds a new name to the learner's function when it
  passes the visible test's checks, else to the package's reference, and says which. In a
  student bundle, where the reference of a chapter not yet due is a stub, it says how a
  working answer becomes the package's own: by export.
- ``SkipUnsolved`` and ``report_skipped``: in a student bundle, a cell that needs an
  unsolved exercise, or a stub of the package not exported over yet, prints one "skipped"
  line instead of a traceback.
"""
from __future__ import annotations

import ast
import functools
import textwrap
from typing import Callable

from .bundle import NeedsAnswer, export_hint, in_student_bundle, stub_module
from .diagnosis import not_answered, unanswered

_SKIPPED_NAMES: set[str] = set()  # names that cells skipped for an unsolved exercise would have bound


def _forget_bound_names(result=None) -> None:
    """After a cell: the names it bound are no longer missing for a skipped cell's sake."""
    from IPython import get_ipython

    namespace = get_ipython().user_ns
    _SKIPPED_NAMES.difference_update(name for name in list(_SKIPPED_NAMES) if name in namespace)


def skip_unsolved_in_bundles() -> None:
    """In a student bundle's notebook, :class:`SkipUnsolved`, so Run All goes on past an
    unsolved exercise. Elsewhere nothing: no hook, no transformer."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None or not in_student_bundle():
        return
    if _forget_bound_names not in shell.events.callbacks["post_run_cell"]:
        shell.events.register("post_run_cell", _forget_bound_names)
    if not any(isinstance(t, SkipUnsolved) for t in shell.ast_transformers):
        shell.user_ns[SkipUnsolved.REPORT] = report_skipped
        shell.ast_transformers.append(SkipUnsolved())


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
        module = frame.tb_frame.f_globals.get("__name__", "") if frame is not None else ""
        if module.startswith("minillm."):  # the package's stub: the learner's answer, if any, is not exported yet
            print(f"skipped: this cell needs your `{name}` in the package, which holds its stub until you "
                  f"export your answer ({export_hint(module)})")
        else:
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
    ``learner`` is returned with a line that says how to export it (the package's own code
    runs the stub until then), and a failing one is returned anyway, with a message that
    says so; the cells that then call it print one "skipped" line instead of a traceback.
    """
    module = stub_module(reference)
    try:
        check(learner)
    except Exception as error:  # the learner's code may fail in any way
        reason = textwrap.shorten(f"{type(error).__name__}: {error}", width=100, placeholder=" ...")
        said = not_answered(name, error) if unanswered(error) else f"{name}: not working yet ({reason})"
        if module:
            print(f"{said}; this installation has no reference for it, so the cells that use it print "
                  "'skipped' until your answer works")
            return _waiting_for(name, learner)
        print(f"{said}; the cells below use the package's reference" if unanswered(error)
              else f"{name}: using the package's reference ({reason})")
        return reference
    if module:
        print(f"{name}: using your implementation; the package's own code ({module}) runs it once you "
              f"export it: {export_hint(module)}")
        return learner
    print(f"{name}: using your implementation")
    return learner
