"""Shared fixtures: the chapters present, and one grading run per chapter."""
import fcntl
import json
import os
import random
import shutil
from pathlib import Path

import pytest
import torch

from coursebuild import paths

SLUGS = paths.present_slugs()

# The machine-independence run (`make test-numerics`) sets these: torch's thread count for every
# test, and the tests in reverse order, so that no result leans on one machine's rounding or on
# what an earlier test left behind.
THREADS = int(os.environ.get("MINILLM_TEST_THREADS", "0"))


def pytest_collection_modifyitems(config, items):
    if os.environ.get("MINILLM_TEST_ORDER") == "reversed":
        items.reverse()


@pytest.fixture(autouse=True)
def restore_global_state():
    """Give every test the process as the last one found it: torch's thread count, default dtype
    and random state, Python's random state and the environment are put back afterwards, so no
    test's result depends on which tests ran before it in the same worker."""
    if THREADS:
        torch.set_num_threads(THREADS)
    threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
    torch_rng, python_rng, environ = torch.get_rng_state(), random.getstate(), dict(os.environ)
    yield
    torch.set_num_threads(threads)
    torch.set_default_dtype(dtype)
    torch.set_rng_state(torch_rng)
    random.setstate(python_rng)
    if dict(os.environ) != environ:
        os.environ.clear()
        os.environ.update(environ)


@pytest.fixture(scope="session")
def grading_root(tmp_path_factory) -> Path:
    """A folder shared by every pytest-xdist worker of the session, so each chapter is graded
    once whichever worker asks first (its xdist_group keeps a chapter's tests on one worker
    under `--dist loadgroup`; other modes share this folder)."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "graded"
    root.mkdir(exist_ok=True)
    return root


def graded(slug: str, root: Path) -> dict:
    """Grade the solution and the untouched learner notebook of ``slug`` once per session."""
    from autograder.grade import grade_files

    out = root / slug
    marker = out / "done.json"
    with open(root / f"{slug}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not marker.exists():
            # A flat folder of <student>__<chapter>.ipynb, one of the layouts the grader reads.
            folder = root / f"{slug}-submitted"
            folder.mkdir(exist_ok=True)
            for student, source in (("solution", paths.solution_notebook(slug)),
                                    ("untouched", paths.release_notebook(slug))):
                shutil.copyfile(source, folder / f"{student}__{slug}.ipynb")
            batch = grade_files([folder], out)
            marker.write_text(json.dumps({"solution": batch.of("solution"), "untouched": batch.of("untouched")}))
    return json.loads(marker.read_text()) | {"out": str(out)}
