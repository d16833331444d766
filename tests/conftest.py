"""Shared fixtures: the chapters present, and one grading run per chapter."""
import fcntl
import json
import os
from pathlib import Path

import pytest

from coursebuild import paths

SLUGS = paths.present_slugs()


@pytest.fixture(scope="session")
def grading_root(tmp_path_factory) -> Path:
    """A folder shared by every pytest-xdist worker of the session, so each chapter is graded
    once whichever worker asks first (xdist_group does not group under pytest 9.2)."""
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
            files = [paths.solution_notebook(slug), paths.release_notebook(slug)]
            solution, untouched = grade_files(files, out)
            marker.write_text(json.dumps({"solution": solution, "untouched": untouched}))
    return json.loads(marker.read_text()) | {"out": str(out)}
