"""The judge's connection to the learner's kernel: one request at a time, data only.

A request is a file the judge writes into the kernel's request folder; the kernel's helper
(``autograder.server``) answers with a file in the reply folder, read here with bounds on
its size. The kernel is reached over its shell socket, whose replies are matched by parent
header only, so a flood of other messages costs nothing to decode. A message over
:data:`autograder.wall.MAX_MESSAGE` (counted before it is decoded, or refused unread by zmq)
ends the connection and fails the submission. Each cell of checks has a time budget; a call
past it is interrupted and counted against the learner.
"""
from __future__ import annotations

import os
import secrets
import stat
import time
from pathlib import Path

from . import wall, wire
from .failures import CheckTimeout, StudentError, Unavailable, call_failure
from .proxies import find_dataclass, handle_of, proxy_for

MAX_REPLY = 256 * 2**20


def kernel_client(info: dict):
    """A blocking client of the learner's kernel (``info``: its connection), whose sockets
    drop a peer that sends a frame over :data:`autograder.wall.MAX_MESSAGE` instead of
    holding it (:func:`autograder.wall.cap`)."""
    import zmq
    from jupyter_client import BlockingKernelClient

    kc = BlockingKernelClient(context=wall.cap(zmq.Context()))
    kc.load_connection_info(info)
    return kc


def shell_reply(kc, msg_id: str, timeout: float) -> dict | None:
    """The reply to ``msg_id`` on ``kc``'s shell socket, if it comes within ``timeout`` s.

    The learner's kernel may send anything there: a message whose parent header does not
    name ``msg_id`` is dropped unread (only that header's bytes are looked at), so a flood of
    other messages costs the judge no decoding. One over the size limit raises
    :class:`autograder.wall.OverLimit`.
    """
    socket, session = kc.shell_channel.socket, kc.session
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not socket.poll(max(1, int(left * 1000))):
            return None
        frames = wall.receive(socket)
        if isinstance(frames, int):
            raise wall.OverLimit(frames)
        try:
            _, parts = session.feed_identities(frames)
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
        self.drops = wall.monitor(kc.shell_channel.socket)
        from .server import boot_code

        reply = self._execute(boot_code(self.req, self.rep), self.timeout)
        if reply is None or reply["content"].get("status") != "ok":
            detail = (reply or {}).get("content", {}).get("ename", "no reply")
            raise RuntimeError(f"the grader's helper could not start in it ({detail})")

    # ----------------------------------------------------------------- transport
    def _execute(self, code: str, timeout: float):
        """Execute ``code`` in the learner's kernel; its reply, or None on timeout, death or
        a message over the limit (``down`` says which of the last two)."""
        msg_id = self.kc.execute(code, silent=True, store_history=False, allow_stdin=False, stop_on_error=False)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                reply = shell_reply(self.kc, msg_id, min(0.5, left))
                if wall.dropped(self.drops):
                    time.sleep(2.0)  # a kernel that dies drops its connection too: the heartbeat tells
                    if self.kc.is_alive():
                        raise wall.OverLimit(None)
            except wall.OverLimit as error:
                self.down = str(error)
                self.events.append({"kind": "message-over-limit", "detail": self.down})
                return None
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

    def learner_pids(self) -> list[int] | None:
        """The processes of the learner's sandbox, found by its PID namespace (None when the
        grader runs without PID namespaces, and cannot tell them from its own)."""
        from .processes import pid_namespace_members

        try:
            namespace = Path(self.plan.get("pidns_file") or "").read_text().strip()
        except OSError:
            return None
        return pid_namespace_members(namespace) or None

    def _cpu_sample(self):
        """What the learner's processes got of the CPUs so far (None when they cannot be told)."""
        from .cpu import cpu_sample

        members = self.learner_pids()
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
        data = wire.dumps({"op": what, **fields}, handle_of=handle_of)
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
                from .cpu import load_note

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
                answer = wire.loads(data, make_handle=lambda entry: proxy_for(self, entry),
                                    find_class=find_dataclass)
            except wire.WireError as error:
                raise StudentError(f"{label} returned something the grader cannot read: {error}") from None
        finally:
            try:
                os.unlink(call_id, dir_fd=self.req_fd)
            except OSError:
                pass
        if answer["ok"]:
            return answer.get("value")
        raise call_failure(answer, label)
