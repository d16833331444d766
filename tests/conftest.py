"""Shared fixtures: the chapters present, and one grading run per chapter."""
import fcntl
import json
import os
import shutil
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
            # A flat folder of <student>__<chapter>.ipynb, one of the layouts the grader reads.
            folder = root / f"{slug}-submitted"
            folder.mkdir(exist_ok=True)
            for student, source in (("solution", paths.solution_notebook(slug)),
                                    ("untouched", paths.release_notebook(slug))):
                shutil.copyfile(source, folder / f"{student}__{slug}.ipynb")
            batch = grade_files([folder], out)
            marker.write_text(json.dumps({"solution": batch.of("solution"), "untouched": batch.of("untouched")}))
    return json.loads(marker.read_text()) | {"out": str(out)}
