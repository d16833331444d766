"""The installs of a fresh machine: the learner's (what the chapters need) and the full one
(tests, the instructor's tools). Each builds a new environment, so this runs in
``make test-install`` only; it prints both installs' size and time, as README quotes them."""
import os
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
INSTALL = os.environ.get("MINILLM_TEST_INSTALL") == "1"


def _size(folder: Path) -> int:
    return sum(p.lstat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def _install(python: Path, target: str) -> float:
    start = time.monotonic()
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-c",
                    str(ROOT / "constraints.txt"), "-e", target], check=True, cwd=ROOT)
    return time.monotonic() - start


def _has(python: Path, module: str) -> bool:
    return subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode == 0


@pytest.mark.skipif(not INSTALL, reason="builds fresh environments: runs in `make test-install`")
def test_the_learner_install_is_lean_and_the_full_one_adds_the_tools(tmp_path):
    environment = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(environment)
    python = environment / "bin" / "python"
    empty = _size(environment)
    learner_seconds = _install(python, str(ROOT))
    learner_bytes = _size(environment) - empty
    assert all(_has(python, m) for m in ("minillm", "autograder", "jupyterlab", "nbgrader", "torch", "matplotlib"))
    assert not any(_has(python, m) for m in ("pytest", "transformers", "jupyter_book", "playwright"))
    full_seconds = _install(python, f"{ROOT}[test]")
    full_bytes = _size(environment) - empty
    assert all(_has(python, m) for m in ("pytest", "transformers", "jupyter_book", "playwright"))
    print(f"\nlearner install (make lab): {learner_bytes / 2**30:.2f} GiB in {learner_seconds:.0f} s; "
          f"full install (make test): {full_bytes / 2**30:.2f} GiB, {full_seconds:.0f} s more", file=sys.stderr)
    assert learner_bytes < full_bytes
