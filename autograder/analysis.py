"""Static analysis of notebook cells: which names a cell binds and which it reads first.

Used for two things:

- the grader's plan: the judge runs the test cells plus only the earlier cells they need
  (the cells that bind a name a needed cell reads before binding it), so figures, timing
  loops and training runs are not repeated outside the learner's process;
- spotting an answer cell that uses the chapter's reference implementation.

The analysis is conservative where it matters: a name bound only inside a loop, branch or
``try`` counts as *maybe* bound, so an earlier binding is kept too.

A learner's source is analyzed only through :func:`autograder.bounded.bounded`: in a
child process with a deadline and a memory limit, because a hostile cell can make the
analysis slow (IPython rewrites magics one at a time, rescanning the cell each time), deep
(``RecursionError``) or large (``MemoryError``).
"""
from __future__ import annotations

import ast
import builtins
from dataclasses import dataclass, field

BUILTINS = frozenset(dir(builtins)) | {"get_ipython", "display", "__file__"}
STAR = "*"


def python_source(source: str) -> str:
    """A cell's source as plain Python: IPython magics and ``!`` lines become calls."""
    if "%" not in source and "!" not in source and "?" not in source:
        return source
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:  # pragma: no cover - IPython ships with the course
        return source
    try:
        return TransformerManager().transform_cell(source)
    except Exception:  # a cell IPython cannot transform is left for the parser to refuse
        return source


def parse(source: str) -> ast.Module | None:
    """The cell's syntax tree, or None when it does not parse."""
    try:
        return ast.parse(python_source(source))
    except (SyntaxError, ValueError):
        return None


def target_names(node: ast.AST) -> set[str]:
    """Names bound by an assignment target (``a``, ``a, (b, *c)``; not ``a.x`` or ``a[i]``)."""
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, (ast.Tuple, ast.List)):
        return set().union(*(target_names(e) for e in node.elts)) if node.elts else set()
    if isinstance(node, ast.Starred):
        return target_names(node.value)
    return set()


def _import_names(node: ast.Import | ast.ImportFrom) -> set[str]:
    names = set()
    for alias in node.names:
        if alias.name == "*":
            names.add(STAR)
        elif alias.asname:
            names.add(alias.asname)
        elif isinstance(node, ast.Import):
            names.add(alias.name.split(".")[0])
        else:
            names.add(alias.name)
    return names


def _scoped_locals(node: ast.AST) -> set[str]:
    """Names local to functions, lambdas and comprehensions inside ``node``."""
    local: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = sub.args
            for arg in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
                if arg is not None:
                    local.add(arg.arg)
            if not isinstance(sub, ast.Lambda):
                for inner in ast.walk(sub):
                    if inner is not sub and isinstance(inner, ast.Name) and isinstance(inner.ctx, ast.Store):
                        local.add(inner.id)
                    elif inner is not sub and isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                        local.add(inner.name)  # a helper def inside a function (which may call itself)
                    elif isinstance(inner, (ast.Import, ast.ImportFrom)):
                        local |= _import_names(inner)
        elif isinstance(sub, ast.comprehension):
            local |= target_names(sub.target)
    return local


def loads(node: ast.AST) -> set[str]:
    """Names ``node`` reads from the enclosing (module) scope, approximately."""
    if node is None:
        return set()
    read = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return read - _scoped_locals(node)


def _function_reads(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> set[str]:
    """Module names a def or class reads: its decorators, defaults and body."""
    return loads(node) if not isinstance(node, ast.ClassDef) else loads(node) - {
        t for stmt in node.body for t in _bound_by_statement(stmt)}


def _bound_by_statement(stmt: ast.stmt) -> set[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    if isinstance(stmt, ast.Assign):
        return set().union(*(target_names(t) for t in stmt.targets))
    if isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
        return target_names(stmt.target)
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return _import_names(stmt)
    return set()


def all_bindings(tree: ast.Module) -> set[str]:
    """Every module-level name the cell may bind, branches, loops and walrus included."""
    bound: set[str] = set()

    def visit(stmts):
        for stmt in stmts:
            bound.update(_bound_by_statement(stmt))
            if isinstance(stmt, (ast.For, ast.AsyncFor)):
                bound.update(target_names(stmt.target))
            if isinstance(stmt, (ast.With, ast.AsyncWith)):
                for item in stmt.items:
                    if item.optional_vars is not None:
                        bound.update(target_names(item.optional_vars))
            if isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
                for handler in stmt.handlers:
                    if handler.name:
                        bound.add(handler.name)
            if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                for sub in ast.walk(stmt):
                    if isinstance(sub, ast.NamedExpr):
                        bound.update(target_names(sub.target))
                for name in ("body", "orelse", "finalbody"):
                    visit(getattr(stmt, name, []) or [])
                for handler in getattr(stmt, "handlers", []) or []:
                    visit(handler.body)
                for case in getattr(stmt, "cases", []) or []:
                    visit(case.body)

    visit(tree.body)
    return bound


def _definite_bindings(tree: ast.Module) -> set[str]:
    """Names bound by straight-line module-level statements (certainly bound after the cell)."""
    bound: set[str] = set()
    for stmt in tree.body:
        bound |= _bound_by_statement(stmt)
        if isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                if item.optional_vars is not None:
                    bound |= target_names(item.optional_vars)
    return bound


def free_reads(tree: ast.Module) -> set[str]:
    """Names the cell may read before binding them itself (builtins excluded)."""
    everything = all_bindings(tree)
    free: set[str] = set()

    def scan(stmts, bound: set[str]) -> None:
        for stmt in stmts:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                # A body runs later, usually after the rest of the cell has bound its names.
                outer = set()
                for deco in stmt.decorator_list:
                    outer |= loads(deco)
                if isinstance(stmt, ast.ClassDef):
                    for base in stmt.bases + [k.value for k in stmt.keywords]:
                        outer |= loads(base)
                else:
                    for default in stmt.args.defaults + [d for d in stmt.args.kw_defaults if d is not None]:
                        outer |= loads(default)
                free.update(outer - bound)
                free.update(_function_reads(stmt) - bound - everything)
                bound.add(stmt.name)
            elif isinstance(stmt, (ast.For, ast.AsyncFor)):
                free.update(loads(stmt.iter) - bound)
                scan(stmt.body, bound | target_names(stmt.target))
                scan(stmt.orelse, set(bound))
            elif isinstance(stmt, ast.While):
                free.update(loads(stmt.test) - bound)
                scan(stmt.body, set(bound))
                scan(stmt.orelse, set(bound))
            elif isinstance(stmt, ast.If):
                free.update(loads(stmt.test) - bound)
                scan(stmt.body, set(bound))
                scan(stmt.orelse, set(bound))
            elif isinstance(stmt, (ast.With, ast.AsyncWith)):
                for item in stmt.items:
                    free.update(loads(item.context_expr) - bound)
                    if item.optional_vars is not None:
                        bound |= target_names(item.optional_vars)
                scan(stmt.body, bound)
            elif isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
                scan(stmt.body, set(bound))
                for handler in stmt.handlers:
                    if handler.type is not None:
                        free.update(loads(handler.type) - bound)
                    scan(handler.body, bound | ({handler.name} if handler.name else set()))
                scan(stmt.orelse, set(bound))
                scan(stmt.finalbody, set(bound))
            elif isinstance(stmt, ast.Assign):
                free.update(loads(stmt.value) - bound)
                for target in stmt.targets:
                    if not isinstance(target, (ast.Name, ast.Tuple, ast.List, ast.Starred)):
                        free.update(loads(target) - bound)
                    else:
                        for sub in ast.walk(target):  # a[i], b = ...: reads a and i
                            if isinstance(sub, (ast.Attribute, ast.Subscript)):
                                free.update(loads(sub) - bound)
                for target in stmt.targets:
                    bound |= target_names(target)
            elif isinstance(stmt, ast.AugAssign):
                free.update((loads(stmt.value) | loads(stmt.target) | target_names(stmt.target)) - bound)
                bound |= target_names(stmt.target)
            elif isinstance(stmt, ast.AnnAssign):
                if stmt.value is not None:
                    free.update(loads(stmt.value) - bound)
                    bound |= target_names(stmt.target)
            elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
                bound |= _import_names(stmt)
            elif isinstance(stmt, ast.Delete):
                free.update(loads(stmt) - bound)
                for target in stmt.targets:
                    bound -= target_names(target)
            else:
                free.update(loads(stmt) - bound)
                for sub in ast.walk(stmt):
                    if isinstance(sub, ast.NamedExpr):
                        bound |= target_names(sub.target)

    scan(tree.body, set())
    return free - BUILTINS


@dataclass
class CellFacts:
    """What one code cell binds and reads (all sets of names)."""

    parsed: bool
    binds: set[str] = field(default_factory=set)      # maybe bound (anywhere at module level)
    definite: set[str] = field(default_factory=set)   # certainly bound
    reads: set[str] = field(default_factory=set)      # read before bound
    imports: set[str] = field(default_factory=set)    # bound by import statements


def facts(source: str) -> CellFacts:
    tree = parse(source)
    if tree is None:
        return CellFacts(parsed=False)
    imports = set()
    for stmt in tree.body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            imports |= _import_names(stmt)
    return CellFacts(True, all_bindings(tree), _definite_bindings(tree), free_reads(tree), imports)


def needed_cells(cells: list[CellFacts], roots: list[int], provided: set[str] = frozenset()) -> set[int]:
    """Indexes of the cells that ``roots`` need, roots included.

    For each name a needed cell reads, the latest earlier cell that binds it is needed; when
    that cell binds it only maybe (in a branch or loop), the one before is needed too.
    ``provided`` names are bound by other means (the proxies of the learner's answers).
    A cell that does not parse, or holds ``import *``, is needed by any unresolved read.
    """
    needed: set[int] = set()
    todo = list(roots)
    while todo:
        index = todo.pop()
        if index in needed:
            continue
        needed.add(index)
        fact = cells[index]
        for name in fact.reads:
            if name in provided:
                continue
            for earlier in range(index - 1, -1, -1):
                other = cells[earlier]
                if name in other.binds or STAR in other.binds or not other.parsed:
                    todo.append(earlier)
                    if name in other.definite:
                        break
    return needed


def imported_modules(tree: ast.Module) -> list[tuple[str, str | None, str]]:
    """``(module, name, bound_as)`` for each import: ``import a.b as c`` is ("a.b", None, "c")."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append((alias.name, None, alias.asname or alias.name.split(".")[0]))
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                found.append((node.module, alias.name, alias.asname or alias.name))
    return found
