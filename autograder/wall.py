"""One wall-clock deadline for a whole submission, and a size cap on every message of a
learner's kernel.

- :class:`Deadline` is set once, when a submission's run starts (monotonic clock). Every
  kernel of the run's plan takes its time from it: the kernel's start, the notebook's cells,
  the judge's checks. :meth:`Deadline.watch` calls a function in a thread of its own when
  the deadline passes, whatever the event loop is doing, so a loop kept busy by a flood
  still has its kernel killed on time.
- :func:`receive` takes one message from a zmq socket frame by frame and counts its bytes
  before anything is decoded. Past :data:`MAX_MESSAGE` it drops the rest of the message
  and returns the size instead. :func:`cap` makes zmq itself refuse any one frame over the
  same limit: zmq then drops the connection without reading the frame, and a monitor
  socket (:data:`DROPPED`) sees the drop. The grader's side (:mod:`autograder.kernel`) and
  the judge's side (:mod:`autograder.remote`) use both.

zmq delivers a message only once all its frames have arrived, and it holds them until then:
the count bounds what is decoded and kept, not what zmq buffers for one message of many
frames (each at most the limit). docs/grading.md says so.
"""
from __future__ import annotations

import secrets
import threading
import time

import zmq

# The largest message the grader or the judge reads from a learner's kernel, all frames
# together. The largest message in the 14 solved chapters' stored outputs is 177 KB (a
# figure of chapter 11), so this is 47 times that.
MAX_MESSAGE = 8 * 2**20
# Messages zmq may queue for one of the grader's sockets before it stops reading the
# kernel's (a bound on what a flood of messages can make the grader hold).
QUEUED = 32
DROPPED = zmq.EVENT_DISCONNECTED


class OverLimit(Exception):
    """A learner's kernel sent a message over the limit (``size`` bytes; None: one frame
    that zmq refused unread)."""

    def __init__(self, size: int | None):
        super().__init__(over_limit(size))
        self.size = size


class Deadline:
    """The wall-clock limit of one submission, set once."""

    def __init__(self, seconds: float):
        self.seconds = float(seconds)
        self.end = time.monotonic() + self.seconds

    def left(self) -> float:
        return max(0.0, self.end - time.monotonic())

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self.end

    def reason(self) -> str:
        return (f"not run: grading your notebook reached its time limit of {self.seconds:g} s (the notebook, "
                "the checks and every kernel of the run together), and its process was stopped")

    def watch(self, expire) -> threading.Timer:
        """Call ``expire()`` in a thread once the deadline passes (cancel the timer to stop it)."""
        timer = threading.Timer(self.left(), expire)
        timer.daemon = True
        timer.start()
        return timer


def cap(context: zmq.Context) -> zmq.Context:
    """``context``'s sockets refuse a frame over :data:`MAX_MESSAGE`, queue at most
    :data:`QUEUED` messages and never linger."""
    context.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE)
    context.setsockopt(zmq.RCVHWM, QUEUED)
    context.setsockopt(zmq.LINGER, 0)
    return context


def over_limit(size: int | None) -> str:
    """Why a submission failed: its kernel sent a message over the limit (``size`` bytes, or
    one frame that zmq refused unread when ``size`` is None)."""
    what = "a message larger than that" if size is None else f"a message of {size / 2**20:,.1f} MiB"
    return (f"the grader reads at most {MAX_MESSAGE // 2**20} MiB in one message from your notebook's process, "
            f"and it sent {what}, so this submission scores 0 (print less at a time, or save large data to a file)")


def receive(socket: zmq.Socket, limit: int = MAX_MESSAGE) -> list[bytes] | int:
    """The frames of the message waiting on ``socket`` (a readable one: zmq delivers all of
    a message's frames at once), or its size in bytes when that is over ``limit``: then no
    frame is decoded or kept."""
    frames, size = [], 0
    while True:
        frame = socket.recv(zmq.NOBLOCK, copy=False)
        size += len(frame)
        if size <= limit:
            frames.append(frame.bytes)
        else:
            frames = []
        if not socket.get(zmq.RCVMORE):
            return frames if size <= limit else size


def monitor(socket: zmq.Socket) -> zmq.Socket:
    """A plain (blocking) socket that receives ``socket``'s :data:`DROPPED` events; ``socket``
    may be an asyncio one (the grader's) or a plain one (the judge's)."""
    address = f"inproc://dropped-{secrets.token_hex(8)}"
    zmq.Socket.shadow(socket.underlying).monitor(address, DROPPED)
    watcher = zmq.Context.shadow(socket.context.underlying).socket(zmq.PAIR)
    watcher.connect(address)
    return watcher


def dropped(monitor: zmq.Socket) -> bool:
    """Whether a monitor socket (``get_monitor_socket(DROPPED)``) has seen a connection
    dropped; reads every event waiting there."""
    seen = False
    while monitor.poll(0):
        event = monitor.recv_multipart()
        seen = seen or int.from_bytes(event[0][:2], "little") == DROPPED
    return seen
