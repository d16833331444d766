"""The judge: runs a chapter's checks in a clean process of the grader's own.

``python -m autograder.judge PLAN.json`` imports what the checks need, says ``ready``, and
waits for ``go {...}`` on its standard input (the learner's notebook has run by then). It
then binds every name the learner's answer cells define to a proxy, runs the planned cells
of the master notebook (the test cells and the cells they need) in order, and writes each
cell's verdict to the plan's ``out`` file.

A proxy calls into the learner's sandboxed kernel and gets back only data (see ``wire``):
no code the learner wrote runs here, so nothing the learner did in their own process
(patched comparisons, lying tensor subclasses, kernel hooks, fake prints) reaches a check.
Objects that are not data (a module instance, a generator) stay in the learner's process;
the judge holds a reference and forwards calls, attribute reads, ``len``, iteration and
indexing to it.
"""
from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

from .failures import MAX_TEXT, CheckTimeout, StudentError, Unavailable, constant_reason, hidden_reason
from .proxies import bind_answers, use_namespace
from .remote import Remote


class JudgeTimeout(Exception):
    """A check ran past its own time budget (raised by the alarm; who is to blame is decided after)."""


def _seed(seed: int) -> None:
    random.seed(seed)
    try:
        import numpy
        numpy.random.seed(seed % 2**32)
    except ImportError:
        pass
    import torch
    torch.manual_seed(seed)


def shell_for(plan: dict):
    """A clean IPython shell for the checks: no history, no traceback printing."""
    from traitlets.config import Config
    from IPython.core.interactiveshell import InteractiveShell

    config = Config()
    config.HistoryManager.enabled = False
    shell = InteractiveShell.instance(config=config)
    # Tracebacks would quote the checks' code: the verdict keeps the exception only.
    shell.showtraceback = lambda *args, **kwargs: None
    shell.showsyntaxerror = lambda *args, **kwargs: None
    use_namespace(shell.user_ns)
    return shell


def run_cell(shell, plan: dict, position: int, calls, remote: "Remote | None" = None) -> dict:
    """Run one planned cell within its own time budget (``plan["check_timeout"]``): the
    learner's calls from it and its own code together. Past the budget the cell fails; the
    learner's when their calls took most of it, the grader's otherwise (``judge_fault``)."""
    import signal

    from IPython.utils.capture import capture_output

    cell = plan["cells"][position]
    if cell["test"]:
        _seed(plan["seed"] + position)
    budget = float(plan.get("check_timeout") or 0)
    start = time.monotonic()
    calls_before = calls()
    waited_before = remote.call_seconds if remote else 0.0
    if remote is not None:
        remote.deadline = start + budget if budget else None
        remote.cell_label = cell.get("grade_id") or f"cell {cell['index']}"

    def alarm(signum, frame):
        if remote is not None and remote.in_call:  # the call's own timeout ends it in time
            signal.setitimer(signal.ITIMER_REAL, 0.5)
            return
        raise JudgeTimeout(f"the cell ran past its time budget of {budget:g} s")

    previous = signal.signal(signal.SIGALRM, alarm) if budget else None
    try:
        if budget:
            signal.setitimer(signal.ITIMER_REAL, budget)
        with capture_output(display=False) as captured:
            result = shell.run_cell(cell["source"], store_history=False, silent=False)
    finally:
        if budget:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        if remote is not None:
            remote.deadline = None
    error = result.error_in_exec or result.error_before_exec
    elapsed = time.monotonic() - start
    waited = (remote.call_seconds if remote else 0.0) - waited_before
    verdict = {
        "index": cell["index"], "grade_id": cell.get("grade_id"), "test": cell["test"],
        "status": "passed" if error is None else "failed",
        "stdout": captured.stdout[-MAX_TEXT:], "stderr": captured.stderr[-MAX_TEXT:],
        "seconds": round(elapsed, 3), "calls": calls() - calls_before, "waited": round(waited, 3),
    }
    if isinstance(error, JudgeTimeout):
        if waited >= elapsed / 2 and remote is not None:
            error = CheckTimeout(f"{remote.cell_label} ran past its time budget of {budget:g} s, {waited:.1f} s "
                                 "of it in calls of your code")
            remote.events.append({"kind": "check-timeout", "cell": remote.cell_label, "detail": str(error)})
        else:
            verdict["judge_fault"] = (f"the grader's own code in {cell.get('grade_id') or 'cell ' + str(cell['index'])}"
                                      f" ran past the time budget of {budget:g} s ({waited:.1f} s in your code)")
    if plan.get("verdict_only"):
        verdict["stdout"] = verdict["stderr"] = ""
    if error is not None:
        verdict["ename"] = type(error).__name__
        if plan.get("verdict_only"):
            verdict["evalue"] = constant_reason(error, cell["source"])
        elif cell.get("hidden"):
            verdict["evalue"] = hidden_reason(error, cell["source"])[:MAX_TEXT]
        else:
            verdict["evalue"] = str(error)[:MAX_TEXT]
        verdict["student"] = isinstance(error, StudentError)
        verdict["unavailable"] = isinstance(error, Unavailable)
    return verdict


def prepare(plan: dict, shell) -> list[dict]:
    """While the learner's notebook runs: import what the checks import, and run the
    leading cells of the plan that read none of the learner's names (the set-up)."""
    import ast

    for cell in plan["cells"]:
        try:
            tree = ast.parse(shell.transform_cell(cell["source"]))
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                try:
                    exec(compile(ast.Module([node], []), "<imports>", "exec"), {})
                except BaseException:  # noqa: BLE001 - the cell itself will report it
                    pass
    verdicts = []
    for position, cell in enumerate(plan["cells"]):
        if cell["test"] or not cell.get("early"):
            break
        verdicts.append(run_cell(shell, plan, position, lambda: 0))
    return verdicts


def run(plan: dict, status: dict, shell, verdicts: list[dict]) -> dict:
    """Run the rest of the plan, writing each verdict as soon as it is known (one JSON line
    per cell in ``plan["verdicts"]``): a judge that dies keeps the verdicts it reached."""
    record = open(plan["verdicts"], "a", encoding="utf-8") if plan.get("verdicts") else None

    def keep(verdict: dict) -> None:
        verdicts.append(verdict)
        if record is not None:
            record.write(json.dumps(verdict) + "\n")
            record.flush()

    try:
        early, verdicts[:] = list(verdicts), []
        for verdict in early:
            keep(verdict)
        remote = Remote(plan, status)
        described = bind_answers(remote, plan["names"], shell.user_ns)
        for position in range(len(verdicts), len(plan["cells"])):
            keep(run_cell(shell, plan, position, lambda: remote.calls, remote))
    finally:
        if record is not None:
            record.close()
    return {"cells": verdicts, "described": described, "events": remote.events, "calls": remote.calls,
            "down": remote.down}


def limit_memory(extra: int) -> None:
    """Cap this process's address space at what it maps now plus ``extra`` bytes: what the
    learner's kernel sends, or makes the checks hold, cannot grow the judge past it."""
    import resource

    with open("/proc/self/status") as status:
        size = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (size + extra, size + extra))


def serve(plan_path: str, channel_path: str) -> int:
    """One judge: talk over the Unix socket at ``channel_path`` (``ready``, then ``go {...}``)."""
    import socket

    plan = json.loads(Path(plan_path).read_text())
    if plan.get("memory"):
        limit_memory(int(plan["memory"]))
    os.chdir(plan["workdir"])
    channel = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    channel.connect(channel_path)
    stream = channel.makefile("rwb", buffering=0)
    # Work while the learner's notebook runs: imports, the checks' set-up cells.
    import torch  # noqa: F401
    import jupyter_client  # noqa: F401
    shell = shell_for(plan)
    early = prepare(plan, shell)
    stream.write(b"ready\n")
    line = stream.readline().decode()
    if not line.startswith("go "):
        return 2
    status = json.loads(line[3:])
    outcome = run(plan, status, shell, early)
    out = Path(plan["out"])
    temporary = out.with_name(out.name + ".tmp")
    temporary.write_text(json.dumps(outcome))
    os.replace(temporary, out)
    return 0


def zygote() -> int:
    """A pre-warmed parent of judges: imports once, forks one fresh judge per request.

    Requests on stdin, one JSON line each (``plan``, ``channel``, ``log``, ``env``); the
    answer is the child's pid. Each child is a clean process (nothing ran in the parent but
    imports), with the environment it was asked for; it dies if the zygote dies.
    """
    import ctypes
    import signal

    import torch  # noqa: F401
    import numpy  # noqa: F401
    import safetensors.torch  # noqa: F401
    import jupyter_client  # noqa: F401
    import IPython.core.interactiveshell  # noqa: F401
    import IPython.utils.capture  # noqa: F401
    import traitlets.config  # noqa: F401
    from . import server  # noqa: F401

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    sys.stdout.write("zygote\n")
    sys.stdout.flush()
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            try:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                os.setsid()
                ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # die with the zygote
                log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.dup2(log, 1)
                os.dup2(log, 2)
                os.environ.clear()
                os.environ.update(request["env"])
                code = serve(request["plan"], request["channel"])
            except BaseException:  # noqa: BLE001 - report, then leave without unwinding the parent's state
                import traceback
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        sys.stdout.write(f"{pid}\n")
        sys.stdout.flush()
    return 0


def main(argv: list[str]) -> int:
    if argv[1:2] == ["--zygote"]:
        return zygote()
    return serve(argv[1], argv[2])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
