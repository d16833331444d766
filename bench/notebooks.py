"""Time every solution notebook in quick mode (and, with --full, in full mode), and measure
the peak memory of its kernel.

    python bench/notebooks.py [--full] [CHAPTER ...]

The course's budget: under 30 s per notebook in quick mode (COURSE_QUICK=1), under
2 minutes in full mode, on 2 CPU cores. Each run has a fresh process of its own, so the
peak resident memory of its children (the kernel, and the processes the kernel starts, such
as chapter 08's two data-parallel workers) is that notebook's alone: the figure to size a
learner's server by (docs/grading.md). Prints a table; asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from coursebuild import execute, notebooks, paths  # noqa: E402


def _children_rss() -> int:
    """The resident memory of all this process's descendants now, in bytes."""
    import psutil

    total = 0
    for child in psutil.Process().children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.Error:  # it ended while we looked
            pass
    return total


def run_here(slug: str, quick: bool) -> dict:
    """Execute the chapter in this process: its seconds, and the peak memory (MiB) of its
    kernel and the processes the kernel starts, together: the larger of the largest child's
    own peak and the peak of their sum, sampled every 0.1 s."""
    notebook = notebooks.build_notebook(slug)
    peak, done = [0], threading.Event()

    def sample():
        while not done.wait(0.1):
            peak[0] = max(peak[0], _children_rss())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        execute.execute(notebook, Path(tmp), quick=quick)
        seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    largest = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return {"seconds": seconds, "peak_mib": max(largest, peak[0]) / 2**20}


def measure(slug: str, quick: bool) -> dict:
    """:func:`run_here` in a fresh process."""
    done = subprocess.run([sys.executable, __file__, "--one", slug, *([] if quick else ["--full"])],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("chapters", nargs="*")
    parser.add_argument("--full", action="store_true", help="also time full mode")
    parser.add_argument("--one", metavar="CHAPTER", help=argparse.SUPPRESS)  # measure() runs itself with it
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_here(args.one, quick=not args.full)))
        return
    header = f"{'chapter':26s} {'quick (s)':>10s} {'budget':>7s} {'peak MiB':>9s}"
    print(header + (f" {'full (s)':>10s} {'budget':>7s} {'peak MiB':>9s}" if args.full else ""))
    for slug in paths.resolve_slugs(args.chapters):
        quick = measure(slug, quick=True)
        row = f"{slug:26s} {quick['seconds']:10.1f} {'ok' if quick['seconds'] < 30 else 'OVER':>7s} {quick['peak_mib']:9.0f}"
        if args.full:
            full = measure(slug, quick=False)
            row += f" {full['seconds']:10.1f} {'ok' if full['seconds'] < 120 else 'OVER':>7s} {full['peak_mib']:9.0f}"
        print(row, flush=True)


if __name__ == "__main__":
    main()
