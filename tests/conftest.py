"""Shared fixtures: the chapters present, and one grading run per chapter."""
import json
from pathlib import Path

import pytest

from coursebuild import paths

SLUGS = paths.present_slugs()


@pytest.fixture(scope="session")
def grading_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("graded")


def graded(slug: str, root: Path) -> dict:
    """Grade the solution and the untouched learner notebook of ``slug`` once per session."""
    from autograder.grade import grade_files

    out = root / slug
    marker = out / "done.json"
    if not marker.exists():
        files = [paths.solution_notebook(slug), paths.release_notebook(slug)]
        solution, untouched = grade_files(files, out)
        marker.write_text(json.dumps({"solution": solution, "untouched": untouched}))
    return json.loads(marker.read_text()) | {"out": str(out)}
