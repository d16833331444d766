"""make gradescope: the zip's run_autograder grades in Gradescope's layout, from the zip alone."""
import json
import os
import subprocess
import sys
import zipfile

import nbformat
import pytest

from coursebuild import gradescope, paths

from .test_bundle import with_answers

SLUG = "00_history"
pytestmark = pytest.mark.grading


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """The zip, unpacked where Gradescope puts it: /autograder/source."""
    archive = gradescope.build("00", tmp_path_factory.mktemp("dist"))
    root = tmp_path_factory.mktemp("autograder")
    with zipfile.ZipFile(archive) as unpacked:
        unpacked.extractall(root / "source")
        names = unpacked.namelist()
        modes = {info.filename: info.external_attr >> 16 for info in unpacked.infolist()}
    assert {"setup.sh", "run_autograder", f"solutions/{SLUG}/{SLUG}.ipynb"} <= set(names)
    assert modes["run_autograder"] & 0o111 and modes["setup.sh"] & 0o111
    assert not [n for n in names if n.startswith("solutions/") and not n.endswith(f"{SLUG}.ipynb")]
    assert not [n for n in names if n.startswith("minillm/") and n.rsplit("/", 1)[1] in ("attention.py", "model.py")], \
        "later chapters stay out"
    return root / "source"


def grade(source, tmp_path, files: dict) -> dict:
    root = tmp_path / "autograder"
    (root / "submission").mkdir(parents=True)
    os.symlink(source, root / "source")
    for name, notebook in files.items():
        nbformat.write(notebook, root / "submission" / name)
    env = {**os.environ, "AUTOGRADER_ROOT": str(root), "PYTHON": sys.executable, "PYTHONPATH": str(source)}
    env.pop("MINILLM_COURSE_ROOT", None)
    done = subprocess.run(["bash", str(root / "source" / "run_autograder")], env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((root / "results" / "results.json").read_text())


def test_an_honest_submission_earns_full_marks(source, tmp_path):
    results = grade(source, tmp_path, {f"{SLUG}.ipynb": with_answers(SLUG)})
    assert results["score"] == results["max_score"] > 0
    assert all(t["status"] == "passed" for t in results["tests"])


def test_an_empty_submission_earns_nothing_and_says_why(source, tmp_path):
    results = grade(source, tmp_path, {})
    assert results["score"] == 0 and "no notebook was submitted" in results["output"]


def test_a_hostile_submission_earns_nothing(source, tmp_path):
    notebook = nbformat.read(paths.release_notebook(SLUG), as_version=4)
    for cell in notebook.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and cell.cell_type == "code":
            cell.source = ("import importlib\nreference = importlib.import_module('minillm.history')\n"
                           "globals().update(vars(reference))\nimport torch\ntorch.allclose = lambda *a, **k: True")
    results = grade(source, tmp_path, {"anything.ipynb": notebook})
    assert results["score"] == 0, [(t["name"], t["score"]) for t in results["tests"]]
