"""Start a Jupyter server command, wait until it answers, and stop it (its whole group)."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request

TOKEN = "course-test-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_args(port: int) -> str:
    return f"--no-browser --ip=127.0.0.1 --port={port} --ServerApp.port_retries=0 --IdentityProvider.token={TOKEN}"


class Server:
    def __init__(self, port: int, process: subprocess.Popen):
        self.port, self.process = port, process

    def get(self, path: str, timeout: float = 10) -> tuple[int, bytes]:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}",
                                         headers={"Authorization": f"token {TOKEN}"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def json(self, path: str):
        status, body = self.get(path)
        assert status == 200, f"GET {path}: {status} {body[:500]!r}"
        return json.loads(body)


@contextlib.contextmanager
def serving(command, port: int, *, cwd, env, seconds: float = 120):
    """Run ``command`` (a list, or a string for the shell) in its own process group; yield
    a :class:`Server` once ``/api/status`` answers on ``port``; stop the group after."""
    process = subprocess.Popen(command, cwd=cwd, env=env, shell=isinstance(command, str),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(port, process)
    try:
        deadline = time.monotonic() + seconds
        while True:
            if process.poll() is not None:
                raise AssertionError(f"the server stopped (exit {process.returncode}): "
                                     f"{process.stdout.read().decode(errors='replace')[-3000:]}")
            try:
                if "started" in server.json("/api/status"):
                    break
            except (OSError, AssertionError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"the server did not answer within {seconds:.0f} s")
            time.sleep(0.5)
        yield server
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
