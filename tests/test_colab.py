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


def _published_copy(tmp_path: Path, url: str) -> Path:
    """A folder whose pyproject.toml is the course's with ``url`` as its Repository address."""
    text = (paths.ROOT / "pyproject.toml").read_text()
    (tmp_path / "pyproject.toml").write_text(text.replace(colab.repository(), url))
    return tmp_path


def test_the_cell_clones_the_address_that_pyproject_gives(tmp_path):
    root = _published_copy(tmp_path, "https://github.com/someone/course")
    assert colab.published(root)
    assert 'git", "clone", "--depth", "1", "https://github.com/someone/course"' in colab.cell_source(root)


def _run_in_fake_colab(cell: str, tmp_path: Path, python=sys.executable, timeout=60) -> subprocess.CompletedProcess:
    """``cell`` run by ``python`` with a ``google.colab`` module to import, as Colab's runtime has."""
    fake = tmp_path / "fake" / "google" / "colab"
    fake.mkdir(parents=True)
    (fake.parent / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    program = f"import sys; sys.path.insert(0, {str(fake.parent.parent)!r}); import google.colab\n" + cell
    return subprocess.run([python, "-c", program], capture_output=True, text=True, cwd=tmp_path, timeout=timeout)


def test_while_the_address_is_a_placeholder_the_cell_stops_in_colab_and_says_why(tmp_path, monkeypatch):
    assert not colab.published(), "pyproject.toml holds a real address: this test is for the placeholder"
    cell = colab.cell_source()
    assert "clone" not in cell.replace(colab.UNPUBLISHED, "")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail(f"the cell ran a command: {a}"))
    exec(cell, {})  # outside Colab: nothing
    monkeypatch.undo()
    done = _run_in_fake_colab(cell, tmp_path)
    assert done.returncode != 0 and "RuntimeError" in done.stderr and "make lab" in done.stderr, done.stderr[-600:]


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
    url = "https://github.com/someone/course"
    cell = (colab.cell_source(_published_copy(tmp_path, url)).replace(json.dumps(url), json.dumps(str(paths.ROOT)))
            .replace(colab.CLONE, str(clone)))
    done = _run_in_fake_colab(cell + "\nimport torch, minillm.data\nprint(torch.__version__, len(minillm.data.corpus_text()))",
                              tmp_path, python, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    version, characters = done.stdout.split()[-2:]
    assert version.startswith("2.13.0") and int(characters) > 1_000_000
    listed = subprocess.run([python, "-m", "pip", "list", "--format=json"], capture_output=True, text=True, check=True)
    names = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert {"minillm-course", "nbgrader", "matplotlib"} <= names
