"""The Colab set-up cell: a no-op here, and in a Colab-like runtime an install that keeps torch.

The install test builds a fresh environment, so it runs in ``make test-install`` only.
"""
import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import nbformat
import pytest

from coursebuild import colab, paths

from .conftest import SLUGS

INSTALL = os.environ.get("MINILLM_TEST_INSTALL") == "1"


@pytest.mark.parametrize("slug", SLUGS)
def test_every_chapter_sets_itself_up_in_its_first_code_cell(slug):
    for path in (paths.solution_notebook(slug), paths.release_notebook(slug)):
        code = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
        assert code[0].source == colab.cell_source(), f"{path}: run `make build`"


def test_the_cell_does_nothing_outside_colab(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"the set-up cell ran a command outside Colab: {args}")

    monkeypatch.setattr(subprocess, "run", refuse)
    path = list(sys.path)
    exec(colab.cell_source(), {})
    assert sys.path == path


def test_the_cell_clones_the_address_that_pyproject_gives():
    import tomllib

    with open(paths.ROOT / "pyproject.toml", "rb") as file:
        url = tomllib.load(file)["project"]["urls"]["Repository"]
    assert url.startswith("https://") and json.dumps(url) in colab.cell_source()


def test_colab_keeps_its_own_torch_and_installs_the_rest():
    wanted = colab.requirements(paths.ROOT)
    assert not any(r.startswith(("torch", "triton")) for r in wanted)
    assert any(r.startswith("numpy") for r in wanted) and any(r.startswith("nbgrader") for r in wanted)


@pytest.mark.skipif(not INSTALL, reason="builds a fresh environment: runs in `make test-install`")
def test_the_cell_installs_the_course_in_a_fresh_runtime_and_keeps_its_torch(tmp_path):
    runtime = tmp_path / "runtime"
    venv.EnvBuilder(with_pip=True).create(runtime)
    python = runtime / "bin" / "python"
    # The runtime's own torch, as Colab has one before the cell runs.
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "torch==2.13.0"],
                   check=True)
    clone = tmp_path / "content" / "minillm-course"
    cell = (colab.cell_source().replace(json.dumps(colab.repository()), json.dumps(str(paths.ROOT)))
            .replace(colab.CLONE, str(clone)))
    fake_colab = tmp_path / "fake" / "google" / "colab"
    fake_colab.mkdir(parents=True)
    (fake_colab.parent / "__init__.py").write_text("")
    (fake_colab / "__init__.py").write_text("")
    program = (f"import sys; sys.path.insert(0, {str(fake_colab.parent.parent)!r}); import google.colab\n" + cell
               + "\nimport torch, minillm.data\nprint(torch.__version__, len(minillm.data.corpus_text()))")
    done = subprocess.run([python, "-c", program], capture_output=True, text=True, cwd=tmp_path, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    version, characters = done.stdout.split()[-2:]
    assert version.startswith("2.13.0") and int(characters) > 1_000_000
    listed = subprocess.run([python, "-m", "pip", "list", "--format=json"], capture_output=True, text=True, check=True)
    names = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert {"minillm-course", "nbgrader", "matplotlib"} <= names
