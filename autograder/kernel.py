"""The learner's kernel: an IPython kernel started inside the sandbox, driven by nbclient.

- The kernel talks over Unix sockets in the sandbox folder (``ipc`` transport), so it
  needs no network at all, and is interrupted by a message (it may be PID 1 of its own
  namespace, where signals from outside are not the way in).
- Each cell has a wall-clock limit, and the whole submission has one deadline
  (:class:`autograder.wall.Deadline`). A cell that runs over is interrupted; a kernel that
  ignores the interrupt is killed and the rest of the notebook is not run. A kernel that
  dies (``os._exit``, a crash) ends the run at once.
- Every message is counted before it is decoded (:func:`autograder.wall.receive`): one over
  :data:`autograder.wall.MAX_MESSAGE`, or one frame that zmq refuses unread, fails the
  submission and the kernel is killed at once. Output is counted while it streams in
  (:mod:`autograder.capped`): past the limits of a cell or the notebook it is dropped (a
  note says so); a flood of output interrupts the cell.
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time

import zmq
import zmq.asyncio
from jupyter_client import AsyncKernelManager
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from traitlets import Type

from . import wall
from .capped import CappedClient, CappedKernelClient
from .cpu import load_note
from .sandbox import Limits, Sandbox, die_with_parent

class SandboxKernelManager(AsyncKernelManager):
    """Starts the kernel through the sandbox's launcher."""

    sandbox: Sandbox | None = None
    client_factory = Type(CappedKernelClient)

    def format_kernel_cmd(self, extra_arguments=None):
        command = super().format_kernel_cmd(extra_arguments)
        return self.sandbox.command(command, connection_file=self.connection_file)

    def client(self, **kwargs):
        # The client's sockets are made by this manager's context, which refuses large frames.
        kwargs.setdefault("context", self.context)
        return super().client(**kwargs)

    @property
    def kernel_spec(self):
        spec = super().kernel_spec
        if spec is not None and spec.interrupt_mode != "message":
            spec.interrupt_mode = "message"
        return spec


class StudentKernel:
    """One learner's kernel, from start to kill."""

    def __init__(self, sandbox: Sandbox, limits: Limits, notebook):
        self.sandbox, self.limits, self.notebook = sandbox, limits, notebook
        self.km = SandboxKernelManager(context=wall.cap(zmq.asyncio.Context()), transport="ipc", kernel_name="python3")
        self.km.sandbox = sandbox
        self.km.connection_file = str(sandbox.kernel_dir / "kernel.json")
        self.km.ip = str(sandbox.kernel_dir / "k")
        self.client = CappedClient(
            notebook, km=self.km, limit=limits.output, timeout=int(limits.cell_timeout), allow_errors=True,
            interrupt_on_timeout=False, record_timing=False, store_widget_state=False, iopub_timeout=10,
            raise_on_iopub_timeout=False, startup_timeout=60, shutdown_kernel="immediate",
            extra_arguments=["--HistoryManager.enabled=False"],
        )
        self.alive = False
        self.reason = ""
        self.failure = ""  # why the whole submission fails: a message over the limit
        self.flags: list[dict] = []
        self.cells: dict[int, dict] = {}
        self.seconds = 0.0
        self._watching: asyncio.Task | None = None

    async def start(self) -> None:
        log = open(self.sandbox.base / "launch.log", "wb")
        try:
            await self.client.async_start_new_kernel(
                cwd=str(self.sandbox.work), stdout=subprocess.DEVNULL, stderr=log, preexec_fn=die_with_parent)
        finally:
            log.close()
        await self.client.async_start_new_kernel_client()
        process = getattr(getattr(self.km, "provisioner", None), "process", None)
        self.sandbox.pid = getattr(process, "pid", None)
        self.sandbox.hold_pid_namespace()
        self.alive = True
        for channel in self.client.kc.channels():
            channel.refused = self.refuse
        self._watching = asyncio.ensure_future(self._watch_drops())

    async def _watch_drops(self) -> None:
        """Refuse the submission when zmq drops a connection to a kernel still alive: it
        refused a frame over the limit unread."""
        monitors = [wall.monitor(channel.socket) for channel in self.client.kc.channels()]
        try:
            while not any([wall.dropped(monitor) for monitor in monitors]):
                await asyncio.sleep(0.25)
            await asyncio.sleep(1.0)  # a kernel that dies drops its connections too
            if await self.km.is_alive():
                self.refuse(None)
        finally:
            for monitor in monitors:
                monitor.close(linger=0)

    def refuse(self, size: int | None) -> None:
        """The kernel sent a message over the limit: the submission fails, the kernel is killed."""
        if not self.failure:
            self.failure = wall.over_limit(size)
            self.flags.append({"kind": "message-over-limit", "detail": self.failure})
        self.kill()

    def kill(self) -> None:
        """Kill the kernel and everything it started, now (safe from any thread)."""
        self.alive = False
        pgid = getattr(getattr(self.km, "provisioner", None), "pgid", None)
        try:
            if pgid:
                os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass
        self.sandbox.kill_all()

    async def _responsive(self, grace: float) -> bool:
        """After an interrupt: does the kernel answer a trivial request within ``grace`` s?"""
        kc = self.client.kc
        msg_id = kc.execute("None", silent=True, store_history=False)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                reply = await kc.get_shell_msg(timeout=max(0.05, deadline - time.monotonic()))
            except Exception:
                if not await self.km.is_alive():
                    return False
                continue
            if reply.get("parent_header", {}).get("msg_id") == msg_id:
                return True
        return False

    async def run(self, deadline: wall.Deadline) -> None:
        """Run every code cell of the notebook within the limits and before ``deadline``."""
        try:
            await self._run(deadline)
        finally:
            if self.client.truncated_cells:
                self.flags.append({"kind": "output-truncated", "detail": f"output past {self.limits.output:,} bytes "
                                   f"was dropped (cells {sorted(self.client.truncated_cells)})"})

    async def _run(self, deadline: wall.Deadline) -> None:
        count = 0
        for index, cell in enumerate(self.notebook.cells):
            if cell.cell_type != "code" or not cell.source.strip():
                continue
            if self.failure:
                self.reason = self.failure
                self._skip_rest(index, "not run: " + self.failure)
                return
            left = deadline.left()
            if left <= 0:
                self.flags.append({"kind": "notebook-timeout", "detail": f"your notebook ran longer than "
                                   f"{self.limits.notebook_timeout:g} s; the cells after cell {index} were not run"})
                self.reason = (f"not run: your notebook reached its time limit of {self.limits.notebook_timeout:g} s "
                               "before the end")
                self._skip_rest(index, "not run: the notebook's time limit was reached")
                return
            self.client.timeout = max(1, int(min(self.limits.cell_timeout, left)))
            count += 1
            start = time.monotonic()
            before = self.sandbox.cpu_sample()
            try:
                await self.client.async_execute_cell(cell, index, execution_count=count)
                errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
                self.cells[index] = {"status": "error" if errors else "ok",
                                     "error": f"{errors[0].get('ename')}: {errors[0].get('evalue', '')}"[:500] if errors else ""}
            except CellTimeoutError:
                self.cells[index] = {"status": "timeout"}
                if self.failure:
                    continue  # the kernel was killed for it: the next turn says why
                grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
                note, loaded = load_note(before, self.sandbox.cpu_sample())
                self.flags.append({"kind": "cell-timeout", "cell": grade_id,
                                   "detail": f"cell {index} ran longer than {self.client.timeout} s and was stopped"
                                   + (f"; {note}" if note else "")})
                if loaded:
                    self.flags.append({"kind": "limit-under-load", "cell": grade_id,
                                       "detail": f"the time limit of cell {index}: {note}"})
                await self.km.interrupt_kernel()
                if not await self._responsive(grace=5.0):
                    self.alive = False
                    self.reason = (f"not run: your notebook's process was stuck in cell {index}, which ran longer than "
                                   f"{self.client.timeout} s and ignored the interrupt")
                    self.flags.append({"kind": "kernel-stuck", "detail": self.reason})
                    self._skip_rest(index + 1, "not run: an earlier cell could not be stopped")
                    return
            except DeadKernelError:
                self.cells[index] = {"status": "died"}
                self.alive = False
                self.reason = self.failure or (f"not run: your notebook's process died in cell {index} (os._exit, "
                                               "a crash, or the memory limit)")
                if not self.failure:
                    self.flags.append({"kind": "kernel-died", "detail": self.reason})
                self._skip_rest(index + 1, "not run: the kernel died in an earlier cell")
                return
            finally:
                self.cells.setdefault(index, {})["seconds"] = round(time.monotonic() - start, 3)
                self.seconds += time.monotonic() - start
        if not await self.km.is_alive():
            self.alive = False
            self.reason = "your notebook's process exited at the end of the notebook"

    def _skip_rest(self, start: int, why: str) -> None:
        for index in range(start, len(self.notebook.cells)):
            cell = self.notebook.cells[index]
            if cell.cell_type == "code" and cell.source.strip() and index not in self.cells:
                self.cells[index] = {"status": "skipped", "error": why}

    async def stop(self) -> None:
        """Kill the kernel and everything it started."""
        if self._watching is not None:
            self._watching.cancel()
            await asyncio.gather(self._watching, return_exceptions=True)
        try:
            if self.client.kc is not None:
                self.client.kc.stop_channels()
        except Exception:
            pass
        self.kill()
        try:
            await asyncio.wait_for(self.km.shutdown_kernel(now=True), timeout=10)
        except Exception:
            pass
        try:
            await self.km.cleanup_resources()
        except Exception:
            pass
        self.km.context.destroy(linger=0)
