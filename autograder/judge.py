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

import builtins
import json
import os
import random
import re
import secrets
import stat
import sys
import time
from pathlib import Path

from . import wire

MAX_TEXT = 8000
MAX_REPLY = 256 * 2**20
# The judge's sockets to the learner's kernel carry only small replies (the data of a call
# goes through files): a larger message makes zmq drop the connection instead of holding it.
MAX_MESSAGE = 4 * 2**20


class StudentError(Exception):
    """Raised in a check when the learner's code raised, or could not be reached."""


_exception_types: dict[str, type] = {}


def student_exception(name: str, message: str, summary: str | None = None) -> StudentError:
    """An exception that is a ``StudentError`` and, for built-in types, that type too.

    A check that expects ``ValueError`` from the learner's code still catches it; any
    other type becomes a plain ``StudentError``. Nothing is rebuilt from the learner's
    own classes. ``summary`` is what a hidden check may show of it: no message of the
    learner's, so no argument that the message could echo.
    """
    base = getattr(builtins, name, None)
    if not (isinstance(base, type) and issubclass(base, Exception)) or issubclass(base, StudentError):
        base = None
    if name not in _exception_types:
        bases = (StudentError, base) if base is not None else (StudentError,)
        try:
            _exception_types[name] = type(name if base is not None else "StudentError", bases, {})
        except TypeError:  # layout conflicts (e.g. OSError subclasses): keep StudentError
            _exception_types[name] = type("StudentError", (StudentError,), {})
    error = _exception_types[name](message)
    error.summary = summary
    return error


class Unavailable(StudentError):
    """The learner's process cannot answer (it died, hung, or was never started)."""


class CheckTimeout(StudentError):
    """A check ran past its own time budget, spent in the learner's calls: the learner's failure."""


class JudgeTimeout(Exception):
    """A check ran past its own time budget (raised by the alarm; who is to blame is decided after)."""


def kernel_client(info: dict):
    """A blocking client of the learner's kernel (``info``: its connection), whose sockets
    drop a peer that sends a message over :data:`MAX_MESSAGE` instead of holding it."""
    import zmq
    from jupyter_client import BlockingKernelClient

    context = zmq.Context()
    context.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE)
    context.setsockopt(zmq.LINGER, 0)
    kc = BlockingKernelClient(context=context)
    kc.load_connection_info(info)
    return kc


def shell_reply(kc, msg_id: str, timeout: float) -> dict | None:
    """The reply to ``msg_id`` on ``kc``'s shell socket, if it comes within ``timeout`` s.

    The learner's kernel may send anything there: a message whose parent header does not
    name ``msg_id`` is dropped unread (only that header's bytes are looked at), so a flood of
    other messages costs the judge no decoding.
    """
    socket, session = kc.shell_channel.socket, kc.session
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not socket.poll(max(1, int(left * 1000))):
            return None
        try:
            _, parts = session.feed_identities(socket.recv_multipart())
        except ValueError:
            continue
        # signature, header, parent header, metadata, content, buffers...
        if len(parts) < 5 or msg_id.encode() not in parts[2]:
            continue
        try:
            reply = session.deserialize(parts)
        except Exception:  # noqa: BLE001 - a malformed message is no answer
            continue
        parent = reply.get("parent_header")
        if isinstance(parent, dict) and parent.get("msg_id") == msg_id:
            return reply


class Remote:
    """The connection to the learner's kernel."""

    def __init__(self, plan: dict, status: dict):
        self.plan, self.status = plan, status
        self.timeout = float(plan["call_timeout"])
        self.req, self.rep = plan["req_dir"], plan["rep_dir"]
        self.calls = 0
        self.down = None if status.get("alive") else status.get("reason") or "your notebook's process is not running"
        self.events: list[dict] = []
        self.deadline: float | None = None   # of the cell running now: each cell has a budget of its own
        self.budget = float(plan.get("check_timeout") or 0)
        self.call_seconds = 0.0              # spent waiting on the learner's calls, all cells together
        self.in_call = False
        self.cell_label = ""
        self.kc = None
        self.rep_fd = None
        if self.down is None:
            try:
                self._connect()
            except Exception as error:  # noqa: BLE001 - any failure means the learner's kernel is unusable
                self.down = f"the grader could not reach your notebook's process ({type(error).__name__}: {error})"

    def _connect(self) -> None:
        self.rep_fd = os.open(self.rep, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        self.req_fd = os.open(self.req, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        info = dict(self.status["connection"])
        # The learner's process owns the folder of its sockets: connect only to sockets it
        # made, never to whatever a path may have been replaced with.
        for name in ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port"):
            where = f"{info['ip']}-{info[name]}"
            found = os.lstat(where)
            if not stat.S_ISSOCK(found.st_mode) or (self.plan.get("uid") is not None
                                                       and found.st_uid != self.plan["uid"]):
                raise RuntimeError(f"{where} is not the kernel's socket")
        kc = kernel_client(info)
        kc.start_channels(shell=True, iopub=False, stdin=False, hb=True, control=True)
        self.kc = kc
        from .server import boot_code

        reply = self._execute(boot_code(self.req, self.rep), self.timeout)
        if reply is None or reply["content"].get("status") != "ok":
            detail = (reply or {}).get("content", {}).get("ename", "no reply")
            raise RuntimeError(f"the grader's helper could not start in it ({detail})")

    # ----------------------------------------------------------------- transport
    def _execute(self, code: str, timeout: float):
        """Execute ``code`` in the learner's kernel; its reply, or None on timeout or death."""
        msg_id = self.kc.execute(code, silent=True, store_history=False, allow_stdin=False, stop_on_error=False)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            reply = shell_reply(self.kc, msg_id, min(0.5, left))
            if reply is not None:
                return reply
            if not self.kc.is_alive():
                self.down = "your notebook's process died (os._exit, a crash, or the memory limit)"
                return None

    def _interrupt(self) -> bool:
        """Interrupt a call that ran too long; True when the kernel answers again."""
        message = self.kc.session.msg("interrupt_request", content={})
        self.kc.control_channel.send(message)
        probe = self._execute("None", 5.0)
        return probe is not None

    def over_budget(self, label: str, note: str = "") -> CheckTimeout:
        """The check running now is out of its time budget while calling the learner's code."""
        detail = (f"{self.cell_label or 'a check'} ran past its time budget of {self.budget:g} s while waiting "
                  f"for your code (the call of {label}; each call took under the {self.timeout:g} s limit of one "
                  f"call, but together they took too long)" + (f"; {note}" if note else ""))
        self.events.append({"kind": "check-timeout", "cell": self.cell_label or None, "detail": detail})
        return CheckTimeout(detail)

    def _cpu_sample(self):
        """What the learner's processes got of the CPUs so far (None when they cannot be told)."""
        from .sandbox import cpu_sample, pid_namespace_members

        try:
            namespace = Path(self.plan.get("pidns_file") or "").read_text().strip()
        except OSError:
            return None
        members = pid_namespace_members(namespace)
        return cpu_sample(members) if members else None

    def _read_reply(self, call_id: str) -> bytes | None:
        try:
            fd = os.open(call_id, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=self.rep_fd)
        except OSError:
            return None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_REPLY:
                return None
            chunks, size = [], 0
            while True:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    break
                size += len(chunk)
                if size > MAX_REPLY:
                    return None
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def request(self, what: str, **fields):
        """Send one request; the decoded value, or raise the learner's error."""
        if self.down:
            raise Unavailable(self.down)
        label = fields.get("name") or fields.get("label") or what
        timeout, cut = self.timeout, False
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise self.over_budget(label)
            if left < timeout:
                timeout, cut = left, True
        self.calls += 1
        call_id = secrets.token_hex(12)
        data = wire.dumps({"op": what, **fields}, handle_of=_handle_of)
        fd = os.open(call_id, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=self.req_fd)
        with os.fdopen(fd, "wb") as stream:
            stream.write(data)
        before = self._cpu_sample()
        try:
            started = time.monotonic()
            self.in_call = True
            try:
                reply = self._execute(f"__grader_serve__({call_id!r})", timeout)
            finally:
                self.in_call = False
                self.call_seconds += time.monotonic() - started
            if reply is None:
                if self.down:
                    self.events.append({"kind": "kernel-died", "detail": f"during a call of {label}"})
                    raise Unavailable(self.down + f" during a call of {label}")
                from .sandbox import load_note

                note, loaded = load_note(before, self._cpu_sample())
                recovered = self._interrupt()
                if cut:
                    if loaded:
                        self.events.append({"kind": "limit-under-load", "detail": f"the check's budget: {note}"})
                    if not recovered:
                        self.down = (f"not run: your notebook's process was still busy with {label} when a check "
                                     f"ran out of its {self.budget:g} s, and could not be stopped")
                    raise self.over_budget(label, note)
                self.events.append({"kind": "call-timeout", "detail": f"{label} did not return within "
                                    f"{self.timeout:g} s" + ("" if recovered else " and could not be stopped")
                                    + (f"; {note}" if note else "")})
                if loaded:
                    self.events.append({"kind": "limit-under-load", "detail": f"the call of {label}: {note}"})
                if not recovered:
                    self.down = (f"not run: your notebook's process was still busy with {label}, which did not "
                                 f"return within {self.timeout:g} s and could not be stopped")
                raise Unavailable(f"{label} did not return within {self.timeout:g} s (stopped)")
            data = self._read_reply(call_id)
            if data is None:
                raise Unavailable(f"your notebook's process did not answer the call of {label} (was the notebook's "
                                  "kernel changed so that it cannot be called?)")
            try:
                answer = wire.loads(data, make_handle=lambda entry: _proxy_for(self, entry),
                                    find_class=_find_dataclass)
            except wire.WireError as error:
                raise StudentError(f"{label} returned something the grader cannot read: {error}") from None
        finally:
            try:
                os.unlink(call_id, dir_fd=self.req_fd)
            except OSError:
                pass
        if not isinstance(answer, dict) or "ok" not in answer:
            raise StudentError(f"{label}: malformed answer from your notebook's process")
        if answer["ok"]:
            return answer.get("value")
        message = str(answer.get("message", ""))[:MAX_TEXT]
        name = str(answer.get("type", "Exception"))[:100]
        where = ""
        frames = answer.get("frames") if isinstance(answer.get("frames"), list) else []
        if frames and isinstance(frames[-1], dict):
            frame = frames[-1]
            where = f" (in {str(frame.get('name'))[:80]}, line {frame.get('line')}: {str(frame.get('code'))[:200]})"
        if name == "InPlaceModification":
            # The summary is built here, not taken from the message: a learner's own class of
            # that name could carry anything in it.
            which = re.match(r"it changed ((?:its argument (?:\d+|\w+=)(?:, )?)+) in place", message)
            raise student_exception(name, f"your {label}: {message}",
                                    f"your {label}: it changed {which.group(1) if which else 'an argument'} in place")
        if name == "NotImplementedError":  # an answer cell's stub: the exercise is not answered yet
            stub = str(frames[-1].get("name", ""))[:80] if frames and isinstance(frames[-1], dict) else ""
            own = stub in ("", *label.split(".")[-1].split()[-1:]) or stub.startswith("__")
            message = f"{label}: not answered yet" if own else f"{label}: it calls {stub}, which is not answered yet"
            raise student_exception(name, message, message)
        raise student_exception(name, f"your {label} raised {name}: {message}{where}", f"your {label} raised {name}")


# --------------------------------------------------------------------- proxies
class Missing:
    """A name the learner's notebook does not define: any use fails with a clear reason."""

    def __init__(self, name: str):
        object.__setattr__(self, "_name", name)

    def _fail(self, *args, **kwargs):
        raise StudentError(f"{self._name} is not defined in your notebook (its answer cell did not define it)")

    __call__ = _fail

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        self._fail()

    def __repr__(self):
        return f"<{self._name}: not defined in your notebook>"


def _local_only(attr: str) -> bool:
    return (attr.startswith("__") and attr.endswith("__")) or attr.startswith("_repr_") or attr.startswith("_ipython")


class RemoteObject:
    """An object that lives in the learner's process; the judge holds a reference."""

    def __init__(self, remote: Remote, entry: dict, label: str | None = None):
        object.__setattr__(self, "_remote", remote)
        object.__setattr__(self, "_id", int(entry["id"]))
        object.__setattr__(self, "_type", str(entry.get("type", "object"))[:100])
        object.__setattr__(self, "_label", label or f"{str(entry.get('type', 'object'))[:100]} object")

    def __getattr__(self, attr):
        if _local_only(attr):
            raise AttributeError(attr)
        try:
            return self._remote.request("getattr", handle=self._id, attr=attr, label=f"{self._label}.{attr}")
        except StudentError as error:
            if isinstance(error, AttributeError):
                raise AttributeError(str(error)) from None
            raise

    def __setattr__(self, attr, value):
        self._remote.request("setattr", handle=self._id, attr=attr, value=value, label=f"{self._label}.{attr}")

    def __call__(self, *args, **kwargs):
        value = self._remote.request("call", handle=self._id, args=list(args), kwargs=kwargs, label=self._label)
        return value

    def __len__(self):
        return self._remote.request("len", handle=self._id, label=f"len({self._label})")

    def __iter__(self):
        return iter(self._remote.request("iter", handle=self._id, label=f"iterating {self._label}"))

    def __getitem__(self, key):
        return self._remote.request("getitem", handle=self._id, key=key, label=f"{self._label}[...]")

    def __repr__(self):
        try:
            return str(self._remote.request("repr", handle=self._id, label=f"repr({self._label})"))[:2000]
        except StudentError:
            return f"<{self._label}>"


class RemoteClass(RemoteObject):
    """A class the learner defined: calling it builds an instance in the learner's process."""

    def __call__(self, *args, **kwargs):
        value = self._remote.request("call", handle=self._id, args=list(args), kwargs=kwargs, label=self._label)
        if isinstance(value, RemoteObject):
            object.__setattr__(value, "_label", f"{self._label} instance")
        return value

    def __instancecheck__(self, instance):
        return isinstance(instance, RemoteObject) and instance._type == self._type

    def __repr__(self):
        return f"<your class {self._label}>"


def _handle_of(value):
    return value._id if isinstance(value, RemoteObject) else None


def _proxy_for(remote: Remote, entry: dict, label: str | None = None):
    if entry.get("is_class"):
        return RemoteClass(remote, entry, label or str(entry.get("type")))
    return RemoteObject(remote, entry, label)


_namespace: dict = {}


def _find_dataclass(name: str):
    import dataclasses

    cls = _namespace.get(name)
    return cls if isinstance(cls, type) and dataclasses.is_dataclass(cls) and not isinstance(cls, RemoteObject) else None


def bind_answers(remote: Remote, names: list[str], namespace: dict) -> dict:
    """Bind each answer name in ``namespace``; what the learner's process said about each."""
    described = {}
    if not names:
        return described
    try:
        info = remote.request("describe", names=names, label="your answers")
    except StudentError as error:
        for name in names:
            namespace[name] = Unreachable(name, str(error))
            described[name] = {"kind": "unreachable", "detail": str(error)}
        return described
    for name in names:
        entry = info.get(name) if isinstance(info, dict) else None
        if not isinstance(entry, dict) or entry.get("kind") == "missing":
            namespace[name] = Missing(name)
            described[name] = {"kind": "missing"}
            continue
        kind = entry.get("kind")
        value = entry.get("value")
        if isinstance(value, RemoteObject):
            object.__setattr__(value, "_label", name)
        namespace[name] = value
        described[name] = {"kind": kind, "module": str(entry.get("module", ""))[:200],
                           "file": str(entry.get("file", ""))[:500]}
    return described


class Unreachable(Missing):
    def __init__(self, name: str, reason: str):
        super().__init__(name)
        object.__setattr__(self, "_reason", reason)

    def _fail(self, *args, **kwargs):
        raise Unavailable(self._reason)

    __call__ = _fail


# --------------------------------------------------------------------- running cells
def hidden_reason(error: BaseException, source: str) -> str:
    """What the learner sees of a failed hidden check: its kind, never a value.

    A hidden check's inputs stay hidden, so its message cannot carry them: a diagnosis of
    the course's checks gives its value-free summary, the learner's own exception only its
    type (its message may quote the arguments it was called with), and an ``assert`` only a
    message that the check's source spells out as a constant, not one formatted from values.
    """
    summary = getattr(error, "summary", None)
    if isinstance(summary, str) and summary:
        return summary
    if isinstance(error, (Unavailable, CheckTimeout)):
        return str(error)
    if isinstance(error, StudentError):
        return "your code failed in a way the check could not read"
    if isinstance(error, AssertionError):
        message = str(error)
        if message and message in _constant_strings(source):
            return message
        return "a hidden check found a wrong value or a property that does not hold"
    return f"{type(error).__name__} while checking what your code returned"


def constant_reason(error: BaseException, source: str) -> str:
    """What the learner sees of a failed check in a verdict-only kernel, which holds the
    references of the exercises the answer builds on: only texts the grader or the check's
    source spells out, never one that the learner's code could fill (an exception's type
    name or message, a frame's code), which could carry a reference back out."""
    if isinstance(error, CheckTimeout):
        return "the check ran past its time budget in calls of your code"
    if isinstance(error, Unavailable):
        return "the check could not reach your answer"
    if isinstance(error, NotImplementedError):
        return "not answered yet"
    if isinstance(error, StudentError):
        return "your code raised an exception while checked with the course's versions of the exercises it builds on"
    if isinstance(error, AssertionError) and str(error) in _constant_strings(source):
        return str(error)
    return "a check found a wrong value or a property that does not hold"


def _constant_strings(source: str) -> set[str]:
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    return {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)}


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
    global _namespace
    _namespace = shell.user_ns
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
