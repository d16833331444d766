"""Run functions of untrusted input in a forked child, each with a deadline and a memory limit.

A learner's source can make an analysis slow, deep (``RecursionError``) or large
(``MemoryError``); in the child, such a function fails alone, with a reason, and nothing it
does reaches the grader's process.
"""
from __future__ import annotations

import json
import os
import resource
import select
import signal
import struct
import time
from typing import Callable

ANALYSIS_SECONDS = 3.0        # for each answer cell (an honest one takes milliseconds)
ANALYSIS_MEMORY = 2**30       # address space the analysis may add to the grader's


def _failure(error: BaseException) -> str:
    if isinstance(error, RecursionError):
        return "it is nested too deeply"
    if isinstance(error, MemoryError):
        return "analyzing it needs too much memory"
    return f"the analysis failed on it: {type(error).__name__}"


def _child(work: dict, memory: int, fd: int) -> None:
    """In the forked child: run each function, writing ``[key, ok, value]`` frames to ``fd``."""
    try:
        with open("/proc/self/status") as status:
            size = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = size + memory if hard == resource.RLIM_INFINITY else min(size + memory, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (OSError, ValueError, StopIteration):
        pass
    with os.fdopen(fd, "wb") as stream:
        for key, function in work.items():
            try:
                entry = [key, True, function()]
            except BaseException as error:  # noqa: BLE001 - everything a source does to the analysis is reported
                entry = [key, False, _failure(error)]
            try:
                frame = json.dumps(entry).encode()
            except (TypeError, ValueError, RecursionError, MemoryError) as error:
                frame = json.dumps([key, False, _failure(error)]).encode()
            stream.write(struct.pack(">I", len(frame)) + frame)
            stream.flush()


def bounded(work: dict[str, Callable[[], object]], seconds: float = ANALYSIS_SECONDS,
            memory: int = ANALYSIS_MEMORY) -> dict[str, tuple[bool, object]]:
    """``key → (True, function())`` for each of ``work``, or ``(False, why it failed)``.

    The functions run in order in a forked child (so they see the caller's objects), each
    with ``seconds`` of its own and ``memory`` bytes of address space on top of the
    grader's; each value (JSON data) comes back as soon as it is ready. A function that
    raises, recurses too deeply, runs out of memory or of time fails alone (the rest run on,
    in a new child when needed). Nothing a source does reaches the caller's process.
    """
    found: dict[str, tuple[bool, object]] = {}
    while len(found) < len(work):
        todo = {key: function for key, function in work.items() if key not in found}
        found.update(_run_child(todo, seconds, memory))
    return found


def _run_child(work: dict, seconds: float, memory: int) -> dict[str, tuple[bool, object]]:
    """Run ``work`` in one child until it ends, or one function overruns or kills it: what
    came back, and that function's failure."""
    import IPython.core.inputtransformer2  # noqa: F401 - imported before forking: the child imports nothing

    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe only
        os.close(read_fd)
        try:
            _child(work, memory, write_fd)
        finally:
            os._exit(0)
    os.close(write_fd)
    found: dict[str, tuple[bool, object]] = {}
    buffer, deadline, late = b"", time.monotonic() + seconds, False
    try:
        while len(found) < len(work):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read_fd], [], [], left)[0]:
                late = True
                break
            chunk = os.read(read_fd, 1 << 16)
            if not chunk:
                break
            buffer += chunk
            while len(buffer) >= 4 and len(buffer) >= 4 + struct.unpack(">I", buffer[:4])[0]:
                size = struct.unpack(">I", buffer[:4])[0]
                key, ok, value = json.loads(buffer[4:4 + size])
                found[key] = (ok, value)
                buffer = buffer[4 + size:]
                deadline = time.monotonic() + seconds
    finally:
        os.close(read_fd)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    missing = [key for key in work if key not in found]
    if missing:
        found[missing[0]] = (False, f"analyzing it took more than {seconds:g} s" if late
                             else "the analysis process died on it (it needed more memory than allowed)")
    return found
