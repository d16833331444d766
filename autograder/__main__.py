"""Command line of the grader.

``python -m autograder grade PATH... --out DIR [--jobs N] [--chapter NN] [--force]``
    Grade notebooks: a file is one submission; a folder holds nbgrader's
    ``<student>/<NN_slug>/<NN_slug>.ipynb`` (or is a course directory holding
    ``submitted/``) or flat ``<student>__<NN_slug>.ipynb`` files. Any other notebook in a
    folder, link or special file is flagged, never graded, and so is a duplicate. Each
    submission gets ``DIR/submissions/<student>__<chapter>/results.json`` (Gradescope's
    shape) and ``feedback.html``; the scores go into the nbgrader gradebook of
    ``DIR/nbgrader`` (or ``--course``), and ``DIR/summary.csv`` lists the batch, flagged
    files included. A re-run skips what is already graded unless ``--force``. Exits 0 once
    grading completed, whatever the scores; 1 when the grader itself failed on a submission
    (it is graded again on the next run).

``python -m autograder check NOTEBOOK|CHAPTER [--work FOLDER]``
    The learner's own report on a notebook, a chapter's folder (``work/04_attention``), or
    a chapter number or slug (``NN_slug/NN_slug.ipynb`` in ``./work``, else in the current
    folder, or in ``--work``), exercise by exercise, with the visible checks only.
    ``check all``: one line per chapter of the work folder, a progress bar, and the totals;
    a chapter whose notebook, release and grader have not changed since the last
    ``check all`` keeps its last result (kept in ``FOLDER/.progress-cache/``). Exits 0
    once the report is written, however many checks fail; 1 when the grader itself
    failed on a notebook; 2 for a bad argument (no such chapter or notebook).

``python -m autograder feedback OUT [--course DIR]``
    After manual grading in formgrader: every ``results.json`` and ``feedback.html`` under
    ``OUT`` gets the final score, the written answers' grades and comments included.

``python -m autograder gradescope CHAPTER [--root /autograder]``
    Inside a Gradescope container (``make gradescope``): grade the notebook of
    ``ROOT/submission/`` and write ``ROOT/results/results.json``.

``python -m autograder update [--work FOLDER]``
    Bring new or changed chapters into your work folder (default ``./work``), keeping your
    answer cells and written answers; the old notebooks go to ``FOLDER/.backups/``.

``python -m autograder reset CHAPTER [--work FOLDER]``
    Give one chapter the untouched release; the old notebook goes to ``FOLDER/.backups/``, and
    the chapter's exports are withdrawn.

``python -m autograder export CHAPTER [--work FOLDER]``
    Write the chapter's answers that pass their visible tests into your own copy of the
    package, ``FOLDER/.minillm/minillm/``, which the lab's kernels import (``autograder.export``).

``python -m autograder lab [--work FOLDER] [--prepare-only] [JUPYTER_ARGS...]``
    The learner's lab: the chapters copied into your work folder (default ``./work``; files
    already there are kept), then JupyterLab there without nbgrader's instructor tools.
    Other arguments go to ``jupyter lab``; ``--prepare-only`` copies and stops.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import warnings
from pathlib import Path


def check_paths(paths: list[str]) -> None:
    """Refuse a PATH that is neither a notebook nor a folder."""
    for name in paths:
        if not (Path(name).is_dir() or Path(name).is_file()):
            raise SystemExit(f"error: argument PATH: {name} is neither a notebook nor a folder")


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
                       help="seconds for the whole grading of a submission (default 300)")
    grade.add_argument("--memory-gib", type=_positive_float, default=3.0,
                       help="memory the learner's code may use, in GiB (default 3)")
    grade.add_argument("--seed", type=int, help="seed of the checks' random inputs (default: fresh each time)")
    grade.add_argument("--quiet", action="store_true", help="no progress bar")
    check = commands.add_parser(
        "check", help="check your own notebook (visible checks only)",
        description="Your own report on a notebook, exercise by exercise, with the visible checks only "
                    "(hidden checks run when a notebook is graded). CHAPTER 'all': one line per chapter of "
                    "the work folder; a chapter unchanged since the last 'check all' (its notebook, its "
                    "release and the grader) keeps its last result, kept in FOLDER/.progress-cache/.",
        epilog="Exit status: 0 once the report is written, however many checks fail (the report says "
               "how many pass); 1 when the grader itself failed on a notebook; 2 for a bad argument "
               "(no such chapter, no notebook where one was named).")
    check.add_argument("target", metavar="NOTEBOOK|CHAPTER",
                       help="a notebook, a chapter's folder, a chapter number or slug, or 'all'")
    check.add_argument("--work", type=Path, metavar="FOLDER",
                       help="the folder holding your chapters' folders, for a chapter number or slug "
                            "(default: ./work, else the current folder)")
    check.add_argument("--cell-timeout", type=_positive_float, default=60.0, help="seconds per cell (default 60)")
    check.add_argument("--quiet", action="store_true", help="no progress bar (check all)")
    update = commands.add_parser("update", help="bring new or changed chapters into your work folder, "
                                                "keeping your answers")
    update.add_argument("--work", type=Path, default=Path("work"), metavar="FOLDER",
                        help="your work folder (default ./work)")
    reset = commands.add_parser("reset", help="give one chapter of your work folder the untouched release")
    reset.add_argument("chapter", metavar="CHAPTER", help="chapter number or slug")
    reset.add_argument("--work", type=Path, default=Path("work"), metavar="FOLDER",
                       help="your work folder (default ./work)")
    export = commands.add_parser("export", help="write a chapter's working answers into your own copy of the package")
    export.add_argument("chapter", metavar="CHAPTER", help="a notebook, a chapter's folder, a chapter number or slug")
    export.add_argument("--work", type=Path, default=Path("work"), metavar="FOLDER",
                        help="your work folder (default ./work)")
    lab = commands.add_parser("lab", help="open your work folder in a learner's JupyterLab (other arguments go "
                                          "to jupyter lab)")
    lab.add_argument("--work", type=Path, default=Path("work"), metavar="FOLDER",
                     help="your work folder (default ./work)")
    lab.add_argument("--prepare-only", action="store_true", help="copy the chapters into FOLDER, start nothing")
    final = commands.add_parser("feedback", help="after manual grading: results and feedback with the final scores")
    final.add_argument("out", type=Path, metavar="OUT", help="the folder a grade run wrote (it holds summary.csv)")
    final.add_argument("--course", type=Path, help="nbgrader course directory of the gradebook (default OUT/nbgrader)")
    gradescope = commands.add_parser("gradescope", help="grade the submission of a Gradescope container")
    gradescope.add_argument("chapter", metavar="CHAPTER", help="chapter number or slug")
    gradescope.add_argument("--root", type=Path, default=Path("/autograder"),
                            help="Gradescope's folder, holding submission/ and results/ (default /autograder)")
    args, jupyter_args = parser.parse_known_args(argv)
    if jupyter_args and args.command != "lab":
        parser.error(f"unrecognized arguments: {' '.join(jupyter_args)}")
    warnings.filterwarnings("ignore", module="nbgrader")
    warnings.filterwarnings("ignore", message=".*not in session.*")

    # Commands that finish, or fail with a message naming the bad argument: module, call.
    simple = {
        "update": ("workspace", lambda module: module.update(args.work)),
        "reset": ("workspace", lambda module: module.reset(args.work, args.chapter)),
        "export": ("export", lambda module: module.export(args.chapter, args.work)),
        "lab": ("lab", lambda module: module.lab(args.work, jupyter_args, args.prepare_only)),
        "feedback": ("final", lambda module: module.refresh(args.out, args.course)),
        "gradescope": ("gradescope", lambda module: module.run(args.chapter, args.root)),
    }
    if args.command in simple:
        name, call = simple[args.command]
        try:
            call(importlib.import_module(f".{name}", __package__))
        except ValueError as error:
            raise SystemExit(f"error: {error}")
        return 0

    from .isolation import isolation
    from .sandbox import Limits

    said = isolation().statement(own_work=args.command == "check")
    if said:
        print(said, file=sys.stderr if args.command == "grade" else sys.stdout, flush=True)
    if args.command == "check":
        from .check import check_command

        return check_command(args.target, Limits(cell_timeout=args.cell_timeout, call_timeout=args.cell_timeout),
                             work=args.work, progress=not args.quiet)

    from .grade import grade_files

    check_paths(args.paths)
    limits = Limits(cell_timeout=args.cell_timeout, call_timeout=args.cell_timeout,
                    notebook_timeout=args.notebook_timeout, memory=int(args.memory_gib * 2**30))
    try:
        batch = grade_files(args.paths, args.out, args.chapter, jobs=args.jobs, force=args.force, limits=limits,
                            course=False if args.no_gradebook else args.course, master=args.master,
                            progress=not args.quiet, seed=args.seed)
    except ValueError as error:
        raise SystemExit(f"error: {error}")
    if not batch.rows and not batch.flagged:
        raise SystemExit("error: argument PATH: no notebooks to grade in " + " ".join(args.paths))
    failed = 0
    for job, outcome in batch.rows:
        note = ""
        if outcome["extra_data"].get("grader_error"):
            failed += 1
            note = "  (grader error: graded again on the next run)"
        elif job.problem:
            note = f"  ({job.problem})"
        print(f"{job.path or job.name}: {outcome['score']:g} / {outcome['max_score']:g}{note}")
    for entry in batch.flagged:
        print(f"{entry.path}: not graded ({entry.kind}): {entry.reason}")
    print(f"summary: {args.out / 'summary.csv'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
