"""The run stage: a submission's planned kernels, the learner's cells in a sandbox and the
checks in a judge beside each.

For each kernel of the plan (:mod:`autograder.plan`) the judge process starts first and
imports what the checks need while the learner's kernel starts and runs its notebook; then
the judge runs the planned cells of the master with the learner's answers as proxies. Both
processes are gone when :func:`execute` returns. One deadline (:mod:`autograder.wall`)
bounds all the kernels of a submission together.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from .chapters import Chapter
from .judges import JUDGE_ENV, judge_memory, kill_judge, partial_verdicts, start_judge
from .kernel import StudentKernel
from .plan import KernelPlan, RunPlan
from .processes import claim
from .sandbox import Limits, Sandbox
from .wall import Deadline

# The flags of a verdict-only kernel that the submission's results show: they end the whole run.
SUBMISSION_FLAGS = ("submission-timeout", "message-over-limit")


@dataclass
class Execution:
    """What happened: the executed learner notebook, the judge's verdicts, and flags."""

    notebook: nbformat.NotebookNode
    verdicts: dict[int, dict]            # master cell index → the judge's verdict
    cells: dict[int, dict]               # learner cell index → status in the learner's kernel
    described: dict[str, dict]
    flags: list[dict] = field(default_factory=list)
    reason: str = ""                     # why the learner's process stopped early, if it did
    seconds: dict[str, float] = field(default_factory=dict)
    seed: int = 0
    judge_error: str = ""
    judge_flags: list[dict] = field(default_factory=list)  # the flags the judge raised (also in ``flags``)
    failure: str = ""                    # why the whole submission fails (a message over the size limit)
    timed_out: str = ""                  # why checks were not reached: the submission's deadline passed


async def execute(planned: RunPlan, limits: Limits, *, jobs: int = 1, seed: int | None = None,
                  scratch: Path | None = None) -> Execution:
    """Carry out ``planned`` (:mod:`autograder.plan`): its kernels in turn, each verdict
    taken from the kernel that counts it. The notebook's own run is the result's (its
    outputs, flags and reason); the verdict-only kernels add their verdicts, their judges'
    flags, and their times.

    ``scratch``: the folder for the sandboxes and the judges' files (default: the system's).
    One deadline, ``limits.notebook_timeout`` from now, bounds all the kernels together: a
    kernel of the plan that it leaves no time for is not started.
    """
    seed = secrets.randbelow(2**31) if seed is None else int(seed)
    chapter = planned.chapter
    deadline = Deadline(limits.notebook_timeout)
    merged = None
    for number, kernel in enumerate(planned.kernels, 1):
        if merged is not None and deadline.expired:
            merged.timed_out = merged.timed_out or deadline.reason()
            break
        part = await _execute_once(chapter, kernel, limits, deadline, jobs=jobs, seed=seed, scratch=scratch)
        counted = {i: v for i, v in part.verdicts.items() if kernel.counts_verdict_of(chapter.cells[i].exercise)}
        if merged is None:
            merged, part.verdicts = part, counted
            continue
        merged.verdicts.update(counted)
        merged.flags += part.judge_flags + [f for f in part.flags if f["kind"] in SUBMISSION_FLAGS]
        merged.judge_flags += part.judge_flags
        merged.seconds.update({f"{key} {number}": value for key, value in part.seconds.items()})
        merged.judge_error = "; ".join(e for e in (merged.judge_error, part.judge_error) if e)
        merged.failure = merged.failure or part.failure
        merged.timed_out = merged.timed_out or part.timed_out
    return merged


@dataclass
class _Talk:
    """What one kernel's run has gathered so far: kept when the deadline cuts it short."""

    flags: list[dict]
    seconds: dict = field(default_factory=dict)
    verdicts: list[dict] = field(default_factory=list)
    described: dict = field(default_factory=dict)
    judge_error: str = ""
    judge_flags: list[dict] = field(default_factory=list)
    judge: tuple[int, str] | None = None
    fallback: asyncio.subprocess.Process | None = None


async def _execute_once(chapter: Chapter, kernel_plan: KernelPlan, limits: Limits, deadline: Deadline, *,
                        jobs: int, seed: int, scratch: Path | None) -> Execution:
    """One learner kernel and its judge, as ``kernel_plan`` says, until ``deadline``: then
    the kernel, its sandbox and the judge are killed (from a thread of their own, whatever
    the event loop is doing) and the verdicts the judge reached are kept."""
    started = time.monotonic()
    notebook = kernel_plan.notebook
    sandbox = Sandbox(limits, jobs=jobs, parent=scratch)
    sandbox.show_package_view(chapter, dict(kernel_plan.answers), kernel_plan.references)
    private = Path(tempfile.mkdtemp(prefix="mj-", dir=scratch))
    os.chmod(private, 0o700)
    claim(private)
    (private / "work").mkdir()
    notebook_path = sandbox.work / f"{chapter.slug}.ipynb"
    nbformat.write(notebook, notebook_path)
    sandbox.chown(notebook_path)
    plan = {
        "cells": list(kernel_plan.judge_cells),
        "verdict_only": kernel_plan.verdict_only,
        "names": list(kernel_plan.names), "uid": sandbox.uid, "pidns_file": str(sandbox.base / "pidns"),
        "req_dir": str(sandbox.req), "rep_dir": str(sandbox.rep),
        "call_timeout": limits.call_timeout, "check_timeout": limits.check_budget, "seed": seed,
        "memory": judge_memory(limits), "out": str(private / "verdicts.json"),
        "verdicts": str(private / "verdicts.jsonl"), "workdir": str(private / "work"),
    }
    (private / "plan.json").write_text(json.dumps(plan))
    env = {k: os.environ[k] for k in JUDGE_ENV if k in os.environ}
    env.update({"COURSE_QUICK": "1", "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg", "MALLOC_ARENA_MAX": "2",
                "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // max(1, jobs)))})
    judge_env = {**env, "IPYTHONDIR": str(private / "ipython")}
    loop = asyncio.get_running_loop()
    connected = loop.create_future()

    async def on_connect(reader, writer):
        if not connected.done():
            connected.set_result((reader, writer))
        else:
            writer.close()

    channel = private / "judge.sock"
    listener = await asyncio.start_unix_server(on_connect, path=str(channel))
    os.chmod(channel, 0o600)
    judge_start = asyncio.create_task(start_judge(private, channel, env, judge_env))
    kernel = StudentKernel(sandbox, limits, notebook)
    talk = _Talk(flags=list(sandbox.flags))
    timed_out = ""

    def expire() -> None:
        kernel.kill()
        kill_judge(talk.judge)

    watchdog = deadline.watch(expire)
    try:
        await asyncio.wait_for(_talk(kernel, talk, plan, limits, deadline, judge_start, connected, private, started),
                               deadline.left())
    except asyncio.TimeoutError:
        timed_out = deadline.reason()
        talk.flags.append({"kind": "submission-timeout", "detail": timed_out})
        kernel.reason = kernel.reason or timed_out
        talk.verdicts = partial_verdicts(private / "verdicts.jsonl")
    finally:
        watchdog.cancel()
        if talk.judge is None:
            with contextlib.suppress(OSError, ValueError, RuntimeError):
                talk.judge, talk.fallback = await judge_start
        kill_judge(talk.judge)
        if talk.fallback is not None:
            await talk.fallback.wait()
        listener.close()
        await kernel.stop()
        sandbox.remove()
        shutil.rmtree(private, ignore_errors=True)
    talk.seconds["total"] = time.monotonic() - started
    failure = kernel.failure or next((e["detail"] for e in talk.judge_flags if e["kind"] == "message-over-limit"), "")
    return Execution(notebook, {v["index"]: v for v in talk.verdicts}, kernel.cells, talk.described, talk.flags,
                     kernel.reason, talk.seconds, seed, talk.judge_error, talk.judge_flags, failure, timed_out)


async def _talk(kernel: StudentKernel, talk: _Talk, plan: dict, limits: Limits, deadline: Deadline, judge_start,
                connected, private: Path, started: float) -> None:
    """Start the learner's kernel, run its notebook, then hand it to the judge and gather
    the judge's verdicts into ``talk``."""
    try:
        await kernel.start()
    except Exception as error:  # noqa: BLE001
        log = (kernel.sandbox.base / "launch.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"the learner's kernel did not start: {error}\n{log}") from error
    talk.seconds["start"] = time.monotonic() - started
    await kernel.run(deadline)
    talk.seconds["notebook"] = kernel.seconds
    talk.flags += kernel.flags
    judge_started = time.monotonic()
    try:
        talk.judge, talk.fallback = await judge_start
        reader, writer = await asyncio.wait_for(connected, 120)
        ready = await asyncio.wait_for(reader.readline(), 120)
        if ready.strip() != b"ready":
            raise RuntimeError("the judge did not start")
        connection = {k: (v.decode() if isinstance(v, bytes) else v)
                      for k, v in kernel.km.get_connection_info().items()}
        status = {"alive": kernel.alive, "reason": kernel.reason, "connection": connection}
        writer.write(b"go " + json.dumps(status).encode() + b"\n")
        await writer.drain()
        # Each cell has a budget of its own in the judge; this only stops a judge that hangs.
        budget = (len(plan["cells"]) + 1) * limits.check_budget + 2 * limits.call_timeout + 60
        await asyncio.wait_for(reader.read(), budget)  # the judge closes the channel when it exits
        outcome = json.loads((private / "verdicts.json").read_text())
        talk.verdicts, talk.described = outcome["cells"], outcome["described"]
        talk.flags += outcome["events"]
        talk.judge_flags = outcome["events"]
        faults = [v["judge_fault"] for v in talk.verdicts if v.get("judge_fault")]
        if faults:
            talk.judge_error = "; ".join(faults)
    except (asyncio.TimeoutError, OSError, ValueError, RuntimeError) as error:
        log = (private / "judge.log").read_text(errors="replace")[-3000:] if (private / "judge.log").exists() else ""
        talk.judge_error = f"{type(error).__name__}: {error}\n{log}".strip()
        talk.verdicts = partial_verdicts(private / "verdicts.jsonl")
    talk.seconds["judge"] = time.monotonic() - judge_started


def execute_sync(*args, **kwargs) -> Execution:
    return asyncio.run(execute(*args, **kwargs))
