"""The install resolves where learners are: from PyPI alone, for every platform docs/platforms.md
names, at the lowest and the highest Python of ``requires-python``.

Here pip finds a CPU wheel of torch on disk (no triton, no nvidia packages) and pip's
configuration adds local indexes, so an install that works here proves nothing about a
learner's. Each case resolves the learner's install (``pip install -c constraints.txt -e .``)
and the test extra (``-e '.[test]'``) with ``uv pip compile --python-platform P
--python-version V -c constraints.txt``: no uv or pip configuration, no local wheels, PyPI's
default index, metadata only (no wheel is downloaded, no source distribution built, so every
package must have a wheel for the target). The test extra's resolve must be exactly the pins
of constraints.txt whose markers hold on the target, so the lock is complete and its markers
true everywhere; the learner's is a part of it.

It needs PyPI. Where PyPI cannot be reached it is skipped and says so, except under
CI=true, where that is a failure. The eight resolves of the test extra run at once, with
uv's own cache, then the learner's eight from what those fetched (``--offline``): about 25 s
on two busy cores. Under pytest-xdist the first worker to ask runs them and writes what it
got to a folder all workers share; the others wait for it and read that (tests/conftest.py,
grading_root).
"""
from __future__ import annotations

import fcntl
import json
import os
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from packaging.markers import default_environment
from packaging.utils import canonicalize_name

from coursebuild import constraints

pytestmark = [pytest.mark.network, pytest.mark.xdist_group(name="resolution")]

PYTHONS = constraints.python_bounds()
CASES = [(target, python) for target in constraints.TARGETS for python in PYTHONS]
TEST_ONLY = {"pytest", "transformers", "jupyter-book", "playwright", "uv"}


def _reach_pypi() -> None:
    try:
        request = urllib.request.Request(f"{constraints.INDEX}/torch/",
                                         headers={"Accept": "application/vnd.pypi.simple.v1+json"})
        with urllib.request.urlopen(request, timeout=20) as response:
            response.read(1)
    except OSError as error:
        message = f"PyPI ({constraints.INDEX}) cannot be reached: {error}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}; CI=true, so the resolution tests may not skip")
        pytest.skip(f"{message}: the install's resolution is not checked here")


def _environment() -> dict:
    """No UV_ or PIP_ variable (an index, find-links, a constraint of this machine's)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "PIP_", "VIRTUAL_ENV"))}


def _resolve(target: str, python: str, extras: tuple[str, ...], offline: bool = False) -> dict:
    env = _environment()
    if target.startswith("macos"):
        env["MACOSX_DEPLOYMENT_TARGET"] = constraints.MACOS_DEPLOYMENT_TARGET
    start = time.monotonic()
    command = constraints.target_command(target, python, constraints.FILE, extras) + (["--offline"] if offline else [])
    done = subprocess.run(command, cwd=constraints.ROOT, env=env, capture_output=True, text=True, timeout=300)
    crashed = ""
    if done.returncode < 0:
        # uv 0.13.9 has once died here of a segfault (signal 11, in libc, on its main2 thread)
        # with eight resolves at once, and then resolved the same case; once more tells a crash
        # from an answer.
        crashed = f"(uv died of signal {-done.returncode} and was run again) "
        done = subprocess.run(command, cwd=constraints.ROOT, env=env, capture_output=True, text=True, timeout=300)
    pins = {}
    for line in done.stdout.splitlines():
        name, sep, version = line.strip().partition("==")
        if sep and not line.startswith("#"):
            pins[canonicalize_name(name)] = version.split(";")[0].strip()
    return {"returncode": done.returncode, "stderr": crashed + done.stderr.strip(), "pins": pins,
            "seconds": time.monotonic() - start}


@pytest.fixture(scope="session")
def resolved(tmp_path_factory) -> dict:
    """{(target, python, install): result} for every case, resolved once per session."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    done = shared / "resolution.json"
    with open(shared / "resolution.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            _reach_pypi()
            with ThreadPoolExecutor(max_workers=8) as pool:
                full = list(pool.map(lambda case: _resolve(*case, ("test",)), CASES))
                # The learner's install is a part of the test extra's: the index pages and
                # the metadata it needs are those that uv has just fetched into its cache.
                learner = list(pool.map(lambda case: _resolve(*case, (), offline=True), CASES))
            results = [[[*case, "test"], result] for case, result in zip(CASES, full)]
            results += [[[*case, "learner"], result] for case, result in zip(CASES, learner)]
            done.write_text(json.dumps(results))
    return {tuple(job): result for job, result in json.loads(done.read_text())}


def _applicable(target: str, python: str) -> dict:
    """The pins of constraints.txt whose markers hold on ``target`` with CPython ``python``."""
    _, markers = constraints.TARGETS[target]
    environment = default_environment() | markers | {
        "python_version": ".".join(python.split(".")[:2]), "python_full_version": python,
        "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
    found = {}
    for pin in constraints.read():
        if pin.marker is None or pin.marker.evaluate(environment):
            (specifier,) = pin.specifier
            found[canonicalize_name(pin.name)] = specifier.version
    return found


@pytest.mark.parametrize("target, python", CASES)
def test_the_install_resolves_from_pypi_with_the_pins(resolved, target, python):
    learner, full = resolved[(target, python, "learner")], resolved[(target, python, "test")]
    for name, result in (("learner's install", learner), ("test extra", full)):
        assert result["returncode"] == 0, f"{target}, Python {python}, the {name} does not resolve:\n{result['stderr']}"
    expected = _applicable(target, python)
    unpinned = sorted(set(full["pins"]) - set(expected))
    assert not unpinned, f"{target}, Python {python}: resolved but not pinned for it: {unpinned}"
    unused = sorted(set(expected) - set(full["pins"]))
    assert not unused, f"{target}, Python {python}: pinned for it, but not part of its install: {unused}"
    assert full["pins"] == expected
    assert learner["pins"].items() <= full["pins"].items()
    assert not TEST_ONLY & set(learner["pins"]), "the learner's install holds none of the test extra"
    assert learner["pins"]["torch"] == "2.13.0"


@pytest.mark.parametrize("target", list(constraints.TARGETS))
def test_triton_and_the_cuda_packages_come_on_linux_only(resolved, target):
    """PyPI's torch 2.13.0 for Linux is a CUDA build: it brings triton 3.7.1 and the nvidia
    packages, on aarch64 too; on macOS and Windows it needs neither."""
    for python in PYTHONS:
        pins = resolved[(target, python, "learner")]["pins"]
        nvidia = [name for name in pins if name.startswith("nvidia-")]
        if target.startswith("linux"):
            assert pins.get("triton") == "3.7.1" and len(nvidia) >= 10, (target, python, sorted(pins))
        else:
            assert "triton" not in pins and not nvidia, (target, python, sorted(pins))
