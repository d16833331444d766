"""The judges of a run: the zygote that forks them, how one is started, killed and read.

A judge (:mod:`autograder.judge`) runs a kernel's checks in a clean process of the
grader's own; the run stage (:mod:`autograder.run`) starts one beside each learner's
kernel, reads its verdicts, and kills it when the kernel's turn ends.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from .processes import start_time
from .sandbox import Limits, die_with_parent

# Variables of the grader's own environment that the judge keeps (the judge runs trusted
# code, but it has no need of anything else either).
JUDGE_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "MINILLM_DATA", "TRITON_INTERPRET", "VIRTUAL_ENV")


def judge_memory(limits: Limits) -> int:
    """Address space the judge may map beyond what it has when it starts: room for the
    checks and for the data of the learner's replies, never unbounded."""
    from .remote import MAX_REPLY

    return max(limits.memory, 2**31) + 2 * MAX_REPLY


class Zygote:
    """A pre-warmed judge parent (``python -m autograder.judge --zygote``), one per process.

    Importing torch and IPython costs seconds of CPU; the zygote pays it once and forks a
    fresh judge for each submission.
    """

    _running: dict[tuple, "Zygote"] = {}

    def __init__(self, env: dict):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "autograder.judge", "--zygote"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, env=env, cwd=tempfile.gettempdir(), preexec_fn=die_with_parent, text=True)
        self.ready = False
        self.lock = threading.Lock()  # one request and its answer at a time on the pipes

    @classmethod
    def get(cls, env: dict) -> "Zygote":
        key = tuple(sorted((k, v) for k, v in env.items() if k != "IPYTHONDIR"))
        zygote = cls._running.get(key)
        if zygote is None or zygote.process.poll() is not None:
            zygote = cls._running[key] = cls(env)
        return zygote

    def spawn(self, plan: Path, channel: Path, log: Path, env: dict) -> int:
        """Fork a judge; the first call waits until the zygote has imported what it needs.
        It blocks: the run stage calls it in a thread, while the learner's kernel starts."""
        request = {"plan": str(plan), "channel": str(channel), "log": str(log), "env": env}
        with self.lock:
            if not self.ready:
                if self.process.stdout.readline().strip() != "zygote":
                    raise RuntimeError("the judges' zygote did not start")
                self.ready = True
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            return int(self.process.stdout.readline())


def kill_judge(judge: tuple[int, str] | None) -> None:
    """Kill the judge (a pid and its start time, so that a reused pid is never hit)."""
    if not judge or not judge[0]:
        return
    pid, started = judge
    if start_time(pid) == started:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


async def start_judge(private: Path, channel: Path, env: dict, judge_env: dict):
    """The judge of one kernel, forked by the zygote (or started afresh where that fails):
    ``(pid, start time)`` and the fallback process, if one was started."""
    try:
        pid = await asyncio.to_thread(Zygote.get(env).spawn, private / "plan.json", channel,
                                      private / "judge.log", judge_env)
        return (pid, start_time(pid)), None
    except (OSError, ValueError, RuntimeError):
        fallback = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "autograder.judge", str(private / "plan.json"), str(channel),
            stdin=asyncio.subprocess.DEVNULL, stdout=open(private / "judge.log", "wb"), stderr=subprocess.STDOUT,
            cwd=str(private / "work"), env=judge_env, preexec_fn=die_with_parent, start_new_session=True)
        return (fallback.pid, start_time(fallback.pid)), fallback


def partial_verdicts(path: Path) -> list[dict]:
    """The verdicts a judge wrote, cell by cell, before it died or hung (a last line cut
    short is dropped)."""
    found = []
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return found
    for line in lines:
        try:
            verdict = json.loads(line)
        except ValueError:
            continue
        if isinstance(verdict, dict) and isinstance(verdict.get("index"), int):
            found.append(verdict)
    return found
