"""`--dist loadgroup` runs each xdist_group on one worker (tests/xdist_groups.py), on a tiny
suite of its own: two groups of six tests, and eight tests in no group."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SUITE = textwrap.dedent('''
    import os, time
    import pytest

    def _log(name):
        time.sleep(0.05)
        with open(os.environ["GROUPS_LOG"], "a") as log:
            log.write(f"{name} {os.environ['PYTEST_XDIST_WORKER']}\\n")

    @pytest.mark.xdist_group(name="first")
    @pytest.mark.parametrize("i", range(6))
    def test_first(i):
        _log(f"first-{i}")

    @pytest.mark.parametrize("i", range(8))
    def test_free(i):
        _log(f"free-{i}")

    @pytest.mark.xdist_group(name="second")
    @pytest.mark.parametrize("i", range(6))
    def test_second(i):
        _log(f"second-{i}")
''')


def test_each_group_runs_on_one_worker_and_the_rest_spreads(tmp_path):
    (tmp_path / "test_suite.py").write_text(SUITE)
    log = tmp_path / "log"
    env = {**os.environ, "GROUPS_LOG": str(log), "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.xdist_groups",
                          "-n", "2", "--dist", "loadgroup", "--rootdir", str(tmp_path), str(tmp_path)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    ran = dict(line.split() for line in log.read_text().splitlines())
    assert len(ran) == 20, ran
    for group in ("first", "second"):
        workers = {worker for name, worker in ran.items() if name.startswith(group)}
        assert len(workers) == 1, f"group {group} ran on {sorted(workers)}"
    assert {worker for name, worker in ran.items()} == {"gw0", "gw1"}, ran
