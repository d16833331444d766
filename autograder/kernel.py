"""The learner's kernel: an IPython kernel started inside the sandbox, driven by nbclient.

- The kernel talks over Unix sockets in the sandbox folder (``ipc`` transport), so it
  needs no network at all, and is interrupted by a message (it may be PID 1 of its own
  namespace, where signals from outside are not the way in).
- Each cell has a wall-clock limit, and so has the notebook. A cell that runs over is
  interrupted; a kernel that ignores the interrupt is killed and the rest of the notebook
  is not run. A kernel that dies (``os._exit``, a crash) ends the run at once.
- Output is counted while it streams in: past ``Limits.output`` bytes it is dropped (a note
  says so); a message larger than :data:`MAX_MESSAGE` is refused by the socket itself (the
  manager's and the client's sockets come from one context with ``MAXMSGSIZE`` set: zmq
  drops the connection rather than hold it); a flood of output interrupts the cell.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time

import zmq
import zmq.asyncio
from jupyter_client import AsyncKernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError

from .cpu import load_note
from .sandbox import Limits, Sandbox, die_with_parent

# One message from the learner's kernel is refused past this (or a few times the output
# limit): zmq drops the connection, and the rest of that notebook's output is lost.
MAX_MESSAGE = 48 * 2**20


class SandboxKernelManager(AsyncKernelManager):
    """Starts the kernel through the sandbox's launcher."""

    sandbox: Sandbox | None = None

    def format_kernel_cmd(self, extra_arguments=None):
        command = super().format_kernel_cmd(extra_arguments)
        return self.sandbox.command(command, connection_file=self.connection_file)

    def client(self, **kwargs):
        # The client's sockets are made by this manager's context, which refuses large messages.
        kwargs.setdefault("context", self.context)
        return super().client(**kwargs)

    @property
    def kernel_spec(self):
        spec = super().kernel_spec
        if spec is not None and spec.interrupt_mode != "message":
            spec.interrupt_mode = "message"
        return spec


def _size(msg: dict) -> int:
    content = msg.get("content", {})
    try:
        return len(json.dumps(content, default=str))
    except (TypeError, ValueError):
        return 0


class CappedClient(NotebookClient):
    """nbclient, keeping at most ``limit`` bytes of output across the whole notebook."""

    def __init__(self, *args, limit: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.limit = limit
        self.kept = 0
        self.received = 0
        self.truncated_cells: set[int] = set()
        self.flooded = False

    def output(self, outs, msg, display_id, cell_index):
        size = _size(msg)
        self.received += size
        if msg["msg_type"] == "error":
            content = msg["content"]
            content["traceback"] = [line[:2000] for line in content.get("traceback", [])[-20:]]
            content["evalue"] = str(content.get("evalue", ""))[:4000]
            size = min(size, 8000)
        if self.kept + size > self.limit and msg["msg_type"] != "error":
            if cell_index not in self.truncated_cells:
                self.truncated_cells.add(cell_index)
                note = {"output_type": "stream", "name": "stderr",
                        "text": f"[output cut: the grader keeps at most {self.limit:,} bytes of a notebook's output]\n"}
                from nbformat import from_dict
                outs.append(from_dict(note))
            if self.received > 16 * self.limit and not self.flooded:
                self.flooded = True
                asyncio.ensure_future(self.km.interrupt_kernel())
            return None
        self.kept += size
        return super().output(outs, msg, display_id, cell_index)


class StudentKernel:
    """One learner's kernel, from start to kill."""

    def __init__(self, sandbox: Sandbox, limits: Limits, notebook):
        self.sandbox, self.limits, self.notebook = sandbox, limits, notebook
        context = zmq.asyncio.Context()
        context.setsockopt(zmq.MAXMSGSIZE, max(4 * limits.output + 2**20, MAX_MESSAGE))
        context.setsockopt(zmq.LINGER, 0)
        self.km = SandboxKernelManager(context=context, transport="ipc", kernel_name="python3")
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
        self.flags: list[dict] = []
        self.cells: dict[int, dict] = {}
        self.seconds = 0.0

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

    async def run(self) -> None:
        """Run every code cell of the notebook within the limits."""
        try:
            await self._run()
        finally:
            if self.client.truncated_cells:
                self.flags.append({"kind": "output-truncated", "detail": f"output past {self.limits.output:,} bytes "
                                   f"was dropped (cells {sorted(self.client.truncated_cells)})"})

    async def _run(self) -> None:
        deadline = time.monotonic() + self.limits.notebook_timeout
        count = 0
        for index, cell in enumerate(self.notebook.cells):
            if cell.cell_type != "code" or not cell.source.strip():
                continue
            left = deadline - time.monotonic()
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
                self.reason = (f"not run: your notebook's process died in cell {index} (os._exit, a crash, or "
                               "the memory limit)")
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
        provisioner = getattr(self.km, "provisioner", None)
        pgid = getattr(provisioner, "pgid", None)
        try:
            if self.client.kc is not None:
                self.client.kc.stop_channels()
        except Exception:
            pass
        try:
            if pgid:
                os.killpg(pgid, signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass
        try:
            await asyncio.wait_for(self.km.shutdown_kernel(now=True), timeout=10)
        except Exception:
            pass
        try:
            await self.km.cleanup_resources()
        except Exception:
            pass
        self.sandbox.kill_all()
        self.km.context.destroy(linger=0)
