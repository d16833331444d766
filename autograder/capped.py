"""The grader's capped client of a learner's kernel: channels that count each message's bytes
before decoding it (:func:`autograder.wall.receive`), and nbclient keeping at most so much
output of a cell and of the notebook.
"""
from __future__ import annotations

import asyncio
import json
import time
from queue import Empty

import zmq
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from nbclient import NotebookClient
from traitlets import Type

from . import wall

# Output kept of one cell. The largest cell output of the 14 solved chapters is 177 KB
# (a figure of chapter 11): this is 5.9 times that.
CELL_OUTPUT = 2**20


class CappedChannel(AsyncZMQSocketChannel):
    """A channel of the grader's client that counts a message's bytes before decoding it:
    one over the limit is dropped unread, and ``refused`` is told its size."""

    refused = staticmethod(lambda size: None)  # set by the kernel's driver

    async def get_msg(self, timeout: float | None = None) -> dict:
        end = None if timeout is None else time.monotonic() + timeout
        frames_of = zmq.Socket.shadow(self.socket.underlying)
        while True:
            left = None if end is None else max(0.0, end - time.monotonic())
            if not await self.socket.poll(None if left is None else int(left * 1000)):
                raise Empty
            frames = wall.receive(frames_of)
            if isinstance(frames, int):
                self.refused(frames)
                continue
            _, message = self.session.feed_identities(frames)
            return self.session.deserialize(message)


class CappedKernelClient(AsyncKernelClient):
    """The grader's client of a learner's kernel: every channel but the heartbeat capped."""

    shell_channel_class = Type(CappedChannel)
    iopub_channel_class = Type(CappedChannel)
    stdin_channel_class = Type(CappedChannel)
    control_channel_class = Type(CappedChannel)

    def channels(self) -> list[CappedChannel]:
        return [self.shell_channel, self.iopub_channel, self.stdin_channel, self.control_channel]


def _size(msg: dict) -> int:
    content = msg.get("content", {})
    try:
        return len(json.dumps(content, default=str))
    except (TypeError, ValueError):
        return 0


class CappedClient(NotebookClient):
    """nbclient, keeping at most ``limit`` bytes of output across the whole notebook, and
    :data:`CELL_OUTPUT` of one cell."""

    def __init__(self, *args, limit: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.limit = limit
        self.kept = 0
        self.kept_in: dict[int, int] = {}  # cell index → bytes of output kept
        self.received = 0
        self.truncated_cells: set[int] = set()
        self.flooded = False

    def _keeps(self, size: int, cell_index: int) -> bool:
        """Whether ``size`` more bytes of ``cell_index``'s output fit in both limits (counted if so)."""
        in_cell = self.kept_in.get(cell_index, 0) + size
        if self.kept + size > self.limit or in_cell > CELL_OUTPUT:
            return False
        self.kept += size
        self.kept_in[cell_index] = in_cell
        return True

    def output(self, outs, msg, display_id, cell_index):
        size = _size(msg)
        self.received += size
        if msg["msg_type"] == "error":
            content = msg["content"]
            content["traceback"] = [line[:2000] for line in content.get("traceback", [])[-20:]]
            content["evalue"] = str(content.get("evalue", ""))[:4000]
            self.kept += min(size, 8000)
        elif not self._keeps(size, cell_index):
            if cell_index not in self.truncated_cells:
                self.truncated_cells.add(cell_index)
                note = {"output_type": "stream", "name": "stderr",
                        "text": f"[output cut: the grader keeps at most {CELL_OUTPUT:,} bytes of a cell's output "
                                f"and {self.limit:,} bytes of a notebook's]\n"}
                from nbformat import from_dict
                outs.append(from_dict(note))
            if self.received > 16 * self.limit and not self.flooded:
                self.flooded = True
                asyncio.ensure_future(self.km.interrupt_kernel())
            return None
        return super().output(outs, msg, display_id, cell_index)

    def _update_display_id(self, display_id, msg):
        # An update rewrites every output that showed this display: it is counted once for
        # each, against the notebook's limit, and dropped when it does not fit.
        shown = sum(len(outputs) for outputs in self._display_id_map.get(display_id, {}).values())
        size = _size(msg) * shown
        self.received += size
        if self.kept + size <= self.limit:
            self.kept += size
            super()._update_display_id(display_id, msg)
