"""Time every solution notebook in quick mode (and, with --full, in full mode).

    python bench/notebooks.py [--full] [CHAPTER ...]

The course's budget: under 30 s per notebook in quick mode (COURSE_QUICK=1), under
2 minutes in full mode, on 2 CPU cores. Prints a table; asserts nothing.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from coursebuild import execute, notebooks, paths  # noqa: E402


def seconds(slug: str, quick: bool) -> float:
    notebook = notebooks.build_notebook(slug)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        execute.execute(notebook, Path(tmp), quick=quick)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("chapters", nargs="*")
    parser.add_argument("--full", action="store_true", help="also time full mode")
    args = parser.parse_args()
    print(f"{'chapter':26s} {'quick (s)':>10s} {'budget':>7s}" + (f" {'full (s)':>10s} {'budget':>7s}" if args.full else ""))
    for slug in paths.resolve_slugs(args.chapters):
        quick = seconds(slug, quick=True)
        row = f"{slug:26s} {quick:10.1f} {'ok' if quick < 30 else 'OVER':>7s}"
        if args.full:
            full = seconds(slug, quick=False)
            row += f" {full:10.1f} {'ok' if full < 120 else 'OVER':>7s}"
        print(row, flush=True)


if __name__ == "__main__":
    main()
