"""Command line of the grader.

``python -m autograder grade PATH... --out DIR [--jobs N] [--chapter NN] [--force]``
    Grade notebooks (files, or folders searched recursively). Each submission gets
    ``DIR/<name>/results.json`` (Gradescope's shape) and ``DIR/<name>/feedback.html``; the
    scores go into the nbgrader gradebook of ``DIR/nbgrader`` (or ``--course``), and
    ``DIR/summary.csv`` lists the batch. A re-run skips what is already graded unless
    ``--force``. Exits 0 once grading completed, whatever the scores; 1 when the grader
    itself failed on a submission (it is graded again on the next run).

``python -m autograder check NOTEBOOK|CHAPTER``
    The learner's own report on a notebook (or on ``work/NN_slug/NN_slug.ipynb`` for a
    chapter number or slug), exercise by exercise, with the visible checks only.
"""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path


def notebooks_in(paths: list[str]) -> list:
    """The notebook files named, and those found (recursively) in folders, as (path, folder)."""
    found = []
    for name in paths:
        path = Path(name)
        if path.is_dir():
            found.extend((p, path) for p in sorted(path.rglob("*.ipynb")) if ".ipynb_checkpoints" not in p.parts)
        elif path.is_file():
            found.append(path)
        else:
            raise SystemExit(f"error: argument PATH: {name} is neither a notebook nor a folder")
    if not found:
        raise SystemExit("error: argument PATH: no notebooks to grade in " + " ".join(paths))
    return found


def _positive(convert, noun: str):
    """An argparse type: ``convert(text)``, refused with a clear message unless it is > 0."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not value > 0:
            raise argparse.ArgumentTypeError(f"must be a positive {noun}, got {text!r}")
        return value
    return parse


_positive_int = _positive(int, "integer")
_positive_float = _positive(float, "number")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    grade = commands.add_parser("grade", help="grade submitted notebooks")
    grade.add_argument("paths", nargs="+", metavar="PATH", help="notebooks or folders of notebooks")
    grade.add_argument("--out", required=True, type=Path, help="folder for results, feedback and summary.csv")
    grade.add_argument("--chapter", help="chapter slug or number (default: from each file name)")
    grade.add_argument("--master", type=Path, help="grade against this master notebook instead of a chapter")
    grade.add_argument("--jobs", type=_positive_int, default=1, help="submissions graded at once (default 1)")
    grade.add_argument("--force", action="store_true", help="grade again what is already graded")
    grade.add_argument("--course", type=Path, help="nbgrader course directory for the gradebook (default OUT/nbgrader)")
    grade.add_argument("--no-gradebook", action="store_true", help="do not write an nbgrader gradebook")
    grade.add_argument("--cell-timeout", type=_positive_float, default=60.0, help="seconds per cell (default 60)")
    grade.add_argument("--notebook-timeout", type=_positive_float, default=300.0,
                       help="seconds per notebook (default 300)")
    grade.add_argument("--memory-gib", type=_positive_float, default=3.0,
                       help="memory the learner's code may use, in GiB (default 3)")
    grade.add_argument("--seed", type=int, help="seed of the checks' random inputs (default: fresh each time)")
    grade.add_argument("--quiet", action="store_true", help="no progress bar")
    check = commands.add_parser("check", help="check your own notebook (visible checks only)")
    check.add_argument("target", metavar="NOTEBOOK|CHAPTER", help="a notebook, or a chapter number or slug")
    check.add_argument("--cell-timeout", type=_positive_float, default=60.0, help="seconds per cell (default 60)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", module="nbgrader")
    warnings.filterwarnings("ignore", message=".*not in session.*")

    from .sandbox import Limits

    if args.command == "check":
        from .check import check_command

        return check_command(args.target, Limits(cell_timeout=args.cell_timeout, call_timeout=args.cell_timeout))

    from .grade import grade_files

    files = notebooks_in(args.paths)
    limits = Limits(cell_timeout=args.cell_timeout, call_timeout=args.cell_timeout,
                    notebook_timeout=args.notebook_timeout, memory=int(args.memory_gib * 2**30))
    try:
        outcomes = grade_files(files, args.out, args.chapter, jobs=args.jobs, force=args.force, limits=limits,
                               course=False if args.no_gradebook else args.course, master=args.master,
                               progress=not args.quiet, seed=args.seed)
    except ValueError as error:
        raise SystemExit(f"error: {error}")
    failed = 0
    for item, outcome in zip(files, outcomes):
        path = item[0] if isinstance(item, tuple) else item
        note = ""
        if outcome["extra_data"].get("grader_error"):
            failed += 1
            note = "  (grader error: graded again on the next run)"
        print(f"{path}: {outcome['score']:g} / {outcome['max_score']:g}{note}")
    print(f"summary: {args.out / 'summary.csv'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
