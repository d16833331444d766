"""One notebook session: quick mode, seeding, the device, threads and timing.

- ``QUICK``: true when ``COURSE_QUICK=1``; chapters shrink their experiments then.
- ``seed_everything`` and ``pick_device``: one way to seed, one way to choose the device.
- ``one_thread``: run a block on one CPU thread (small models and fair timings).
- ``best_seconds``: the fastest of a few runs, the timing to compare on a busy machine.
- ``setup``: the first code cell of every chapter.
"""
from __future__ import annotations

import os
import random
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import torch

from minillm.checks import positive_int

from .fallback import skip_unsolved_in_bundles

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

    In a student bundle it also lets Run All go on past an unsolved exercise
    (``fallback.skip_unsolved_in_bundles``).
    """
    seed_everything(seed)
    skip_unsolved_in_bundles()
    device = pick_device()
    mode = "quick mode (COURSE_QUICK=1): experiments shrunk" if QUICK else "full mode"
    print(f"torch {torch.__version__} · device {device} · {mode} · seed {seed}")
    return device
