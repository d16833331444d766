"""Command line: ``python -m autograder grade PATH... --out DIR [--chapter NN]``.

PATH is a notebook or a folder of notebooks. Each submission gets
``DIR/<name>/results.json`` (Gradescope's shape) and ``DIR/<name>/feedback.html``, and
the command exits 0 once grading completed, whatever the scores.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def notebooks_in(paths: list[str]) -> list[Path]:
    """The notebook files named or contained (recursively) in ``paths``."""
    found = []
    for name in paths:
        path = Path(name)
        if path.is_dir():
            found.extend(sorted(p for p in path.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts))
        elif path.is_file():
            found.append(path)
        else:
            raise SystemExit(f"error: {name} is neither a notebook nor a folder")
    if not found:
        raise SystemExit("error: no notebooks to grade")
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    grade = commands.add_parser("grade", help="grade submitted notebooks")
    grade.add_argument("paths", nargs="+", help="notebooks or folders of notebooks")
    grade.add_argument("--out", required=True, type=Path, help="folder for results.json and feedback.html")
    grade.add_argument("--chapter", help="chapter slug or number (default: from each file name)")
    args = parser.parse_args(argv)

    from .grade import grade_files

    files = notebooks_in(args.paths)
    try:
        outcomes = grade_files(files, args.out, args.chapter)
    except ValueError as error:
        raise SystemExit(f"error: {error}")
    for path, outcome in zip(files, outcomes):
        print(f"{path}: {outcome['score']:g} / {outcome['max_score']:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
