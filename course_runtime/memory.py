"""The peak memory of one call, as the operating system saw it.

``peak_growth(fn, *args, **kwargs)`` runs the call and returns ``(result, grown)``: how far
the resident memory (RSS) of the process that ran ``fn`` rose above where it stood just
before the call, in bytes, read from Linux's ``/proc/PID/status`` (``VmHWM``, the peak,
after writing 5 to ``/proc/PID/clear_refs``, which resets that peak to the memory in use).

The measure is the kernel's, not the measured code's: a tensor that lies about its size,
a patched counter or a dispatch mode switched off cannot change it. The process measured
is the one that runs ``fn``:

- a plain function: this process (a learner's own notebook, nbgrader's in-process run);
- the grader's proxy of a learner's function (``autograder.proxies.RemoteObject``): the
  processes of the learner's sandbox, found by its PID namespace; the largest growth among
  them is the learner's kernel's.

``grown`` is None where it cannot be read: not Linux, a peak that cannot be reset (without
the reset the peak is the process's lifetime peak, which says nothing of this call), or a
grader without PID namespaces, whose learner's processes cannot be told apart. A check
then has no measurement to judge by and says so, rather than guess.

RSS counts pages touched, so the first call of an operation also maps its code and its
library's tables: a check warms the call up once, at the same size, before it measures.
"""
from __future__ import annotations

from typing import Callable


def _status_bytes(pid: int | str, field: str) -> int:
    """A memory field (``VmRSS``, ``VmHWM``) of ``/proc/PID/status``, in bytes."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"/proc/{pid}/status has no {field}")


def _learner_pids(fn: Callable) -> list[int | str] | None:
    """The processes that run ``fn``: this one for a plain function, the learner's sandbox
    for the grader's proxy of one (None when the grader cannot tell them apart)."""
    sandboxed = getattr(type(fn), "_learner_pids", None)  # the grader's proxy names its processes
    return ["self"] if sandboxed is None else sandboxed(fn)


def _reset_peaks(pids: list[int | str]) -> dict[int | str, int] | None:
    """Reset the peak RSS of each process to its current RSS; that RSS by process, or None
    when a peak cannot be reset."""
    before = {}
    try:
        for pid in pids:
            with open(f"/proc/{pid}/clear_refs", "w", encoding="ascii") as clear:
                clear.write("5")
            before[pid] = _status_bytes(pid, "VmRSS")
    except OSError:
        return None
    return before


def peak_growth(fn: Callable, *args, **kwargs) -> tuple[object, int | None]:
    """``(fn(*args, **kwargs), bytes)``: the result, and how far the peak RSS of the process
    that ran the call rose above its RSS before the call (None where it cannot be read)."""
    pids = _learner_pids(fn)
    before = _reset_peaks(pids) if pids else None
    result = fn(*args, **kwargs)
    if before is None:
        return result, None
    try:
        grown = max(_status_bytes(pid, "VmHWM") - rss for pid, rss in before.items())
    except OSError:  # a process of the sandbox ended meanwhile
        return result, None
    return result, max(grown, 0)
