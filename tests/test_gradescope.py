"""make gradescope: the zip's run_autograder grades in Gradescope's layout, from the zip alone."""
import json
import os
import shutil
import subprocess
import sys
import zipfile

import nbformat
import pytest

from coursebuild import gradescope, paths

from .test_bundle import with_answers

SLUG = "00_history"
pytestmark = [pytest.mark.grading, pytest.mark.xdist_group(name="gradescope")]


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


# A Docker container's root, as Gradescope's: without CAP_SYS_ADMIN (so no namespaces) and
# without CAP_SYS_RESOURCE (so no hard limit can be raised).
CONTAINER_ROOT = ["setpriv", "--bounding-set=-sys_admin,-sys_resource", "--inh-caps=-sys_admin,-sys_resource"]


def grade(source, tmp_path, files: dict, prefix: tuple = ()) -> dict:
    """Grade ``files`` as Gradescope would, with ``run_autograder`` started under ``prefix``."""
    root = tmp_path / "autograder"
    (root / "submission").mkdir(parents=True)
    os.symlink(source, root / "source")
    for name, notebook in files.items():
        nbformat.write(notebook, root / "submission" / name)
    env = {**os.environ, "AUTOGRADER_ROOT": str(root), "PYTHON": sys.executable, "PYTHONPATH": str(source)}
    env.pop("MINILLM_COURSE_ROOT", None)
    done = subprocess.run([*prefix, "bash", str(root / "source" / "run_autograder")], env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((root / "results" / "results.json").read_text())
    assert "Traceback" not in json.dumps(results), "a traceback reached the student's results.json"
    return results | {"stdout": done.stdout}


def test_an_honest_submission_earns_full_marks(source, tmp_path):
    results = grade(source, tmp_path, {f"{SLUG}.ipynb": with_answers(SLUG)})
    assert results["score"] == results["max_score"] > 0
    assert all(t["status"] == "passed" for t in results["tests"])


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv to play a container's root")
def test_an_honest_submission_earns_full_marks_where_namespaces_are_denied(source, tmp_path):
    """Gradescope's container: root, but unshare and raising a hard limit are refused. The grader
    still grades, says once that it cannot isolate, and sets only the limits it may."""
    assert subprocess.run([*CONTAINER_ROOT, "unshare", "--net", "true"], capture_output=True).returncode != 0
    results = grade(source, tmp_path, {f"{SLUG}.ipynb": with_answers(SLUG)}, prefix=tuple(CONTAINER_ROOT))
    assert results["score"] == results["max_score"] > 0, [(t["name"], t["output"]) for t in results["tests"]]
    assert results["stdout"].count("isolation: none (unshare failed") == 1, results["stdout"]
    assert {f["kind"] for f in results["extra_data"]["flags"]} >= {"no-network-isolation", "no-filesystem-isolation"}


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


def _python_like(tmp_path, version: tuple[int, int, int]) -> str:
    """A python3 that reports ``version`` to setup.sh's checks and only says what pip would do."""
    fake = tmp_path / "python3"
    fake.write_text(f"#!/bin/bash\nif [ \"$1\" = -m ]; then echo \"would run: ${{*:2}}\"; exit 0; fi\n"
                    f"exec {sys.executable} -c \"import sys; sys.version_info = {version!r}; exec(sys.argv[1])\" \"$2\"\n")
    fake.chmod(0o755)
    return str(fake)


@pytest.mark.parametrize("version, accepted", [((3, 10, 12), False), ((3, 12, 3), True), ((3, 15, 0), False)])
def test_setup_checks_the_base_images_python_and_says_so(source, tmp_path, version, accepted):
    done = subprocess.run(["bash", str(source / "setup.sh")], env={**os.environ, "PYTHON": _python_like(tmp_path, version)},
                          capture_output=True, text=True, timeout=60)
    shown = ".".join(map(str, version))
    if accepted:
        assert done.returncode == 0 and f"with Python {shown}, as this autograder expects" in done.stdout, done
        assert "would run: pip install" in done.stdout and "-c constraints.txt" in done.stdout
    else:
        assert done.returncode == 1 and f"with Python {shown}; this autograder needs Linux with Python 3.11.0 to 3.14" \
            in done.stderr, done
