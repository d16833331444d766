"""A learner's commands as an ordinary user, as on a learner's own machine.

CI runs as root, where nothing is refused. Here a user id made for the test, with a finite
process limit, runs the learner's commands in a copy of this working tree that it owns, with
a virtual environment of its own that `make` installs as README says (Debian's or the
system's ``python3``; pip takes torch from this machine's wheel source, as CI does). Two
chapters: 00 answered from the solution, 04 untouched. Then a student bundle's commands, in a
venv that shares the clone's installed packages (so the suite pays for one install), and the
self-check once more as root without the capabilities a container's root lacks.
"""
from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest

from coursebuild import bundle, paths

from . import labserver
from .test_bundle import with_answers
from .test_gradescope import CONTAINER_ROOT

ROOT = Path(__file__).resolve().parent.parent
PROCESSES = 4096  # the user's hard limit on processes: finite, as on a learner's machine
pytestmark = [pytest.mark.grading, pytest.mark.xdist_group(name="ordinary-user")]  # one user, one install


def _system_python() -> str | None:
    """A python3 outside this test's own environment that the new user can run, within the
    Python range pyproject.toml states."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(candidate, os.X_OK):
            done = subprocess.run([candidate, "-c", "import sys, venv; print(sys.version_info >= (3, 11))"],
                                  capture_output=True, text=True)
            if done.stdout.strip() == "True":
                return candidate
    return None


def _unavailable() -> str:
    if os.geteuid() != 0:
        return "making a user for the test needs root"
    missing = [tool for tool in ("useradd", "userdel", "runuser", "setpriv") if shutil.which(tool) is None]
    if missing:
        return f"missing {', '.join(missing)}"
    if _system_python() is None:
        return "no system python3 of 3.11 or newer with venv for the new user"
    return ""


class Learner:
    """A user made for the test, and how to run a shell command as that user."""

    def __init__(self, base: Path):
        self.name = f"mlc{secrets.token_hex(4)}"
        self.home = base / "home"
        subprocess.run(["useradd", "--create-home", "--home-dir", str(self.home), "--shell", "/bin/bash",
                        "--user-group", self.name], check=True, capture_output=True)
        passed = {k: v for k, v in os.environ.items() if k.startswith("PIP_") or k in ("LANG", "TZ")}
        self.env = {**passed, "HOME": str(self.home), "PATH": "/usr/local/bin:/usr/bin:/bin",
                    "PYTHON": _system_python(), "CI": os.environ.get("CI", "")}

    def command(self, script: str) -> list[str]:
        return ["runuser", "-u", self.name, "--", "env", "-i", *(f"{k}={v}" for k, v in self.env.items()),
                "bash", "-c", f"ulimit -Su {PROCESSES} && ulimit -Hu {PROCESSES} && {script}"]

    def run(self, script: str, cwd: Path, timeout: float = 600) -> tuple[int, str]:
        done = subprocess.run(self.command(script), cwd=cwd, capture_output=True, text=True, timeout=timeout)
        return done.returncode, done.stdout + done.stderr

    def give(self, path: Path) -> None:
        subprocess.run(["chown", "-R", f"{self.name}:{self.name}", str(path)], check=True)

    def remove(self) -> None:
        subprocess.run(["pkill", "-KILL", "-u", self.name], capture_output=True)
        subprocess.run(["userdel", "--remove", self.name], capture_output=True)


def _copy_working_tree(target: Path) -> None:
    """The files git tracks or would track (what a clone of this tree holds), nothing ignored."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


@pytest.fixture(scope="module")
def learner():
    reason = _unavailable()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the learner's commands as an ordinary user: {reason}")
        pytest.skip(reason)
    base = Path(tempfile.mkdtemp(prefix="mlc-user-", dir="/tmp"))
    base.chmod(0o711)
    person = Learner(base)
    try:
        clone = person.home / "course"
        _copy_working_tree(clone)
        work = clone / "mywork"
        for slug in ("00_history", "04_attention"):
            (work / slug).mkdir(parents=True)
            shutil.copy2(paths.release_notebook(slug), work / slug / f"{slug}.ipynb")
        nbformat.write(with_answers("00_history"), work / "00_history" / "00_history.ipynb")
        person.give(person.home)
        status, output = person.run("make doctor", clone, timeout=900)  # installs .venv as `make lab` does
        assert status == 0 and "FAIL" not in output, output[-3000:]
        yield person, clone
    finally:
        person.remove()
        shutil.rmtree(base, ignore_errors=True)


def _expect(person: Learner, script: str, cwd: Path, *wanted: str) -> str:
    status, output = person.run(script, cwd)
    assert status == 0, f"{script}: exit {status}\n{output[-3000:]}"
    assert "Traceback" not in output, f"{script}:\n{output[-3000:]}"
    for text in wanted:
        assert text in output, f"{script}: {text!r} not in\n{output[-3000:]}"
    return output


def test_the_process_limit_is_finite_and_cannot_be_raised(learner):
    person, clone = learner
    status, output = person.run("ulimit -Hu; ulimit -Hu unlimited", clone)
    assert output.split()[0] == str(PROCESSES) and status != 0, output


def test_self_check_progress_update_and_reset_work_as_an_ordinary_user(learner):
    person, clone = learner
    said = _expect(person, "make self-check CHAPTER=00 WORK=mywork", clone, "5 of 5 visible checks pass")
    assert said.count("A self-check needs none") == 1, said
    _expect(person, "make self-check CHAPTER=04 WORK=mywork", clone, "0 of 5 visible checks pass", "not answered yet")
    _expect(person, "make progress WORK=mywork", clone, "00_history: 5 of 5 visible checks pass",
            "04_attention: 0 of 5 visible checks pass")
    _expect(person, ".venv/bin/python -m autograder check mywork/04_attention", clone, "0 of 5 visible checks pass")
    _expect(person, "make update WORK=mywork", clone)
    _expect(person, "make reset CHAPTER=00 WORK=mywork", clone, "reset to the chapter as released")
    assert list((clone / "mywork" / ".backups").glob("*/00_history/00_history.ipynb")), "reset kept no backup"


def test_make_lab_serves_a_learners_lab_as_an_ordinary_user(learner):
    person, clone = learner
    port = labserver.free_port()
    command = person.command(f"make lab LAB_ARGS='{labserver.server_args(port)}'")
    with labserver.serving(command, port, cwd=clone, env=None) as server:
        assert server.get("/formgrader")[0] == 404, "the learner's lab serves formgrader"
        assert server.json("/api/contents/00_history")["type"] == "directory", "the lab is not rooted at work/"
    assert (clone / "work" / "04_attention" / "04_attention.ipynb").is_file()


def test_a_student_bundles_commands_work_as_an_ordinary_user(learner, tmp_path):
    person, clone = learner
    folder = bundle.build("00", tmp_path)
    target = person.home / "bundle"
    shutil.copytree(folder, target)
    # The bundle's own venv shares the clone's installed packages (one install for the suite):
    # its make rule then installs only the bundle's own package, as it would after any install.
    shared = next((clone / ".venv" / "lib").glob("python3*/site-packages"))
    person.give(target)
    status, output = person.run(f"$PYTHON -m venv .venv && echo {shared} > "
                                f"$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path(\"purelib\"))')"
                                "/shared-course-packages.pth", target)
    assert status == 0, output
    _expect(person, "make doctor", target, "OK   torch")  # its install rule: the bundle's own package
    # The shared packages' console scripts live in the clone's venv: the bundle's venv gets its own.
    for script in ("jupyter", "jupyter-lab"):
        body = (clone / ".venv" / "bin" / script).read_text().split("\n", 1)[1]
        (target / ".venv" / "bin" / script).write_text(f"#!{target}/.venv/bin/python\n{body}")
        (target / ".venv" / "bin" / script).chmod(0o755)
    person.give(target)
    _expect(person, "mkdir -p work && cp -rn chapters/. work/ && make self-check CHAPTER=00", target,
            "0 of 5 visible checks pass")
    port = labserver.free_port()
    with labserver.serving(person.command(f"make lab LAB_ARGS='{labserver.server_args(port)}'"), port,
                           cwd=target, env=None) as server:
        assert server.get("/formgrader")[0] == 404, "the bundle's lab serves formgrader"


def test_self_check_runs_as_a_containers_root():
    """Root without CAP_SYS_ADMIN (no namespaces) and CAP_SYS_RESOURCE (no raised limits)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to play a container's root")
    done = subprocess.run([*CONTAINER_ROOT, sys.executable, "-m", "autograder", "check",
                           str(paths.release_notebook("04_attention"))], capture_output=True, text=True, timeout=600)
    assert "Traceback" not in done.stdout + done.stderr, done.stderr[-3000:]
    assert "0 of 5 visible checks pass" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("A self-check needs none") == 1
