"""Grading overhead per submission, and batch throughput with --jobs 2 against --jobs 1.

    python bench/grading.py [--chapter 00_history] [--batch 20]

Overhead is everything but the learner's own notebook cells: the sandboxed kernel's start,
the checks that run after the notebook (the judge), the reconstruction, results, feedback
and the gradebook write. The verdict-only kernels that check the dependent exercises apart
(autograder.view) are reported on their own row: they run none of the notebook's cells,
only the import of the package with the answers exported. It is measured on a chapter's
solution, graded twice in one
process (the second, warm run is the steady state a batch sees; the first includes the
grader's own imports). Throughput is measured on the fixture chapter of the test suite
(tests/grading_fixture.py): a batch of ``--batch`` submissions, half solved, graded with
one job and with two, in the same run, so the ratio compares like with like.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def overhead(slug: str, workdir: Path) -> list[dict]:
    """Grade ``slug``'s solution twice; the timings of each run."""
    from autograder.chapters import Chapter
    from autograder.gradebook import CourseGradebook
    from autograder.collect import batch
    from autograder.grade import grade_submission, write_graded
    from autograder.sandbox import Limits

    from tests import grading_fixture as fx

    chapter = Chapter.load(slug)
    for name in ("first", "second"):
        fx.write(fx.submission(chapter, solved=True), workdir / "subs" / f"{name}__{slug}.ipynb")
    course = CourseGradebook(workdir / "out" / "nbgrader")
    course.ensure_assignment(chapter)
    runs = []
    for job in batch([workdir / "subs"]).jobs:
        start = time.perf_counter()
        graded = grade_submission(job, Limits(), jobs=1)
        graded_at = time.perf_counter()
        write_graded(job, graded, workdir / "out", course)
        end = time.perf_counter()
        seconds = graded["results"]["extra_data"]["seconds"]
        assert graded["results"]["score"] == graded["results"]["max_score"], graded["results"]["tests"]
        apart = [value for key, value in seconds.items() if key.startswith("total ")]  # "total 2", ...
        runs.append({
            "total": end - start,
            "cells": seconds["notebook"],
            "start": seconds["start"],
            "judge": seconds["judge"],
            "apart": sum(apart),
            "kernels": 1 + len(apart),
            "outputs": (graded_at - start - seconds["total"] - sum(apart)) + (end - graded_at),
        })
    return runs


def throughput(batch: int, jobs: int, workdir: Path) -> float:
    """Seconds to grade ``batch`` fixture submissions with ``jobs`` workers."""
    from autograder.chapters import Chapter
    from autograder.grade import grade_files
    from autograder.sandbox import Limits

    from tests import grading_fixture as fx

    master = fx.write_master(workdir / "master")
    chapter = Chapter.from_master(master, fx.SLUG)
    for i in range(batch):
        fx.write(fx.submission(chapter, solved=i % 2 == 0), workdir / "subs" / f"s{i:02d}__{fx.SLUG}.ipynb")
    start = time.perf_counter()
    outcomes = grade_files([workdir / "subs"], workdir / "out", master=master, jobs=jobs, limits=Limits()).outcomes
    elapsed = time.perf_counter() - start
    assert sorted({o["score"] for o in outcomes}) == [0, 6], [o["output"] for o in outcomes]
    return elapsed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chapter", default="00_history", help="chapter whose solution measures the overhead")
    parser.add_argument("--batch", type=int, default=20, help="submissions in the throughput batch (default 20)")
    args = parser.parse_args(argv)
    if args.batch < 2:
        parser.error("argument --batch: must be at least 2")
    from autograder.isolation import baseline_virtual_bytes, isolation

    os.environ.setdefault("COURSE_QUICK", "1")
    scratch = Path(tempfile.mkdtemp(prefix="bench-grading-"))
    try:
        runs = overhead(args.chapter, scratch / "overhead")
        one = throughput(args.batch, 1, scratch / "jobs1")
        two = throughput(args.batch, 2, scratch / "jobs2")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    cold, warm = runs
    rows = [
        (f"{args.chapter} solution, total (warm; cold {cold['total']:.1f} s)", f"{warm['total']:.1f} s"),
        ("  learner's notebook cells, in the sandbox", f"{warm['cells']:.1f} s"),
        (f"  dependent exercises checked apart ({warm['kernels'] - 1} verdict-only kernel"
         f"{'s' * (warm['kernels'] != 2)})",
         f"{warm['apart']:.1f} s"),
        ("  grading overhead (total - cells - apart), target <= 5 s",
         f"{warm['total'] - warm['cells'] - warm['apart']:.1f} s"),
        ("    sandbox and kernel start", f"{warm['start']:.1f} s"),
        ("    checks after the notebook (judge)", f"{warm['judge']:.1f} s"),
        ("    reconstruction, results, feedback, gradebook", f"{warm['outputs']:.1f} s"),
        (f"batch of {args.batch} (fixture chapter), --jobs 1", f"{one:.1f} s ({args.batch / one:.2f}/s)"),
        (f"batch of {args.batch} (fixture chapter), --jobs 2", f"{two:.1f} s ({args.batch / two:.2f}/s)"),
        ("throughput, --jobs 2 / --jobs 1", f"{one / two:.2f}x"),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"grading on {os.cpu_count()} CPUs; sandbox: "
          f"{'namespaces' if isolation().namespaces else 'no namespaces (' + isolation().reason + ')'}; "
          f"RLIMIT_AS base {baseline_virtual_bytes() / 2**30:.2f} GiB + allowance")
    print(f"{'measure':{width}s}  value")
    for label, value in rows:
        print(f"{label:{width}s}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
