"""A fresh machine: a clone of the repository, the learner's install (what the chapters need),
the full one (tests, the instructor's tools), and every documented command run as written in
that clone. One clone and its ``.venv`` serve all of it, so this runs in ``make test-install``
only; it prints both installs' size and time, as README quotes them.

The clone is of the committed ``HEAD``: changes not yet committed are not in it.
"""
import os
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
INSTALL = os.environ.get("MINILLM_TEST_INSTALL") == "1"
pytestmark = pytest.mark.skipif(not INSTALL, reason="builds a fresh clone and environment: runs in `make test-install`")


def _size(folder: Path) -> int:
    return sum(p.lstat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def _install(python: Path, clone: Path, target: str) -> float:
    start = time.monotonic()
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-c",
                    str(clone / "constraints.txt"), "-e", target], check=True, cwd=clone)
    return time.monotonic() - start


def _has(python: Path, module: str) -> bool:
    return subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> dict:
    """A clone whose ``.venv`` got the learner's install, then the full one, measured."""
    clone = tmp_path_factory.mktemp("fresh") / "minillm-course"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    environment = clone / ".venv"
    venv.EnvBuilder(with_pip=True).create(environment)
    python = environment / "bin" / "python"
    empty = _size(environment)
    learner = {"seconds": _install(python, clone, str(clone)), "bytes": _size(environment) - empty,
               "has": {m: _has(python, m) for m in ("minillm", "autograder", "jupyterlab", "nbgrader", "torch",
                                                    "matplotlib", "pytest", "transformers", "jupyter_book",
                                                    "playwright")}}
    full = {"seconds": _install(python, clone, f"{clone}[test]"), "bytes": _size(environment) - empty,
            "has": {m: _has(python, m) for m in ("pytest", "transformers", "jupyter_book", "playwright")}}
    # What the Makefile's install recipes leave behind them, so `make` takes this .venv as built.
    for stamp in (".learner-stamp", ".installed-stamp"):
        (environment / stamp).touch()
    return {"clone": clone, "python": python, "learner": learner, "full": full}


def test_the_learner_install_is_lean_and_the_full_one_adds_the_tools(fresh):
    learner, full = fresh["learner"], fresh["full"]
    assert all(learner["has"][m] for m in ("minillm", "autograder", "jupyterlab", "nbgrader", "torch", "matplotlib"))
    assert not any(learner["has"][m] for m in ("pytest", "transformers", "jupyter_book", "playwright"))
    assert all(full["has"].values())
    print(f"\nlearner install (make lab): {learner['bytes'] / 2**30:.2f} GiB in {learner['seconds']:.0f} s; "
          f"full install (make test): {full['bytes'] / 2**30:.2f} GiB, {full['seconds']:.0f} s more", file=sys.stderr)
    assert learner["bytes"] < full["bytes"]


def test_every_documented_command_works_in_the_fresh_clone(fresh):
    """tests/test_documented_commands.py, run by the clone's own python on the clone: each
    command from the clone's folder and from another one."""
    done = subprocess.run([fresh["python"], "-m", "pytest", "-q", "-p", "no:xdist",
                           "tests/test_documented_commands.py"], cwd=fresh["clone"], capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")})
    print(done.stdout[-3000:], file=sys.stderr)
    assert done.returncode == 0 and " passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-6000:]
