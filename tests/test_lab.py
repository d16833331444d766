"""`make lab` copies the chapters into the learner's folder and serves JupyterLab."""
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request

from coursebuild import paths


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_make_lab_serves_the_course_and_keeps_the_learners_work(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    mine = work / "00_history"
    mine.mkdir()
    (mine / "00_history.ipynb").write_text("my answers")
    port, token = free_port(), "course-test-token"
    args = f"--no-browser --ip=127.0.0.1 --port={port} --ServerApp.port_retries=0 --IdentityProvider.token={token}"
    lab = subprocess.Popen(
        ["make", "--no-print-directory", "lab", f"WORK={work}", f"LAB_ARGS={args}"],
        cwd=paths.ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt")},
    )
    try:
        status = None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and lab.poll() is None:
            try:
                request = urllib.request.Request(f"http://127.0.0.1:{port}/api/status",
                                                 headers={"Authorization": f"token {token}"})
                with urllib.request.urlopen(request, timeout=2) as response:
                    status = json.loads(response.read())
                break
            except OSError:
                time.sleep(0.5)
        assert status is not None, f"JupyterLab did not answer: {lab.stdout.read1().decode() if lab.poll() is not None else ''}"
        assert "started" in status
    finally:
        try:
            os.killpg(lab.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        lab.wait(timeout=30)
    assert (mine / "00_history.ipynb").read_text() == "my answers", "make lab overwrote the learner's work"
    for slug in paths.present_slugs():
        assert (work / slug / f"{slug}.ipynb").exists(), f"make lab did not copy {slug}"
