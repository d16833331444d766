"""The grader depends only on packaged code and finds chapters from any folder."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from autograder import course
from autograder.check import resolve_target

ROOT = Path(__file__).resolve().parent.parent

# Imports every module of the grader with the build chain made unimportable, from a folder
# outside the repository, then finds a master, a release and a chapter's manifest entry.
NO_BUILD_CHAIN = textwrap.dedent("""
    import importlib, pkgutil, sys

    class Refuse:
        def find_spec(self, name, path=None, target=None):
            if name == "coursebuild" or name.startswith("coursebuild."):
                raise ImportError("the grader imported " + name)

    sys.meta_path.insert(0, Refuse())
    import autograder
    for module in pkgutil.iter_modules(autograder.__path__):
        importlib.import_module("autograder." + module.name)
    from autograder import course
    from autograder.chapters import Chapter
    chapter = Chapter.load("00_history")
    print(course.present_slugs()[0], course.release_notebook("00_history").is_file(), len(chapter.answers) > 0)
""")


def test_the_grader_imports_no_build_chain_from_outside_the_repository(tmp_path):
    run = subprocess.run([sys.executable, "-c", NO_BUILD_CHAIN], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300, env={k: v for k, v in os.environ.items() if k != course.ROOT_VARIABLE})
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["00_history", "True", "True"]


def test_the_course_folder_can_be_named_and_is_refused_with_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv(course.ROOT_VARIABLE, str(tmp_path))
    with pytest.raises(ValueError, match=f"{course.ROOT_VARIABLE}=.* has no solutions/ folder"):
        course.solution_notebook("00_history")
    (tmp_path / "chapters" / "00_history").mkdir(parents=True)
    assert course.release_notebook("00_history") == tmp_path / "chapters" / "00_history" / "00_history.ipynb"
    monkeypatch.delenv(course.ROOT_VARIABLE)
    assert course.release_notebook("00_history") == ROOT / "chapters" / "00_history" / "00_history.ipynb"


@pytest.fixture
def home(tmp_path):
    """A learner's home: ``work/`` holding two chapters' folders."""
    for slug in ("00_history", "03_positional_encoding"):
        (tmp_path / "work" / slug).mkdir(parents=True)
        (tmp_path / "work" / slug / f"{slug}.ipynb").write_text("{}")
    return tmp_path


def test_check_finds_a_chapter_by_number_from_home_and_from_inside_work(home, monkeypatch):
    wanted = Path("work") / "03_positional_encoding" / "03_positional_encoding.ipynb"
    monkeypatch.chdir(home)
    assert resolve_target("03") == wanted
    assert resolve_target("03_positional_encoding") == wanted
    monkeypatch.chdir(home / "work")
    assert resolve_target("03") == Path("03_positional_encoding") / "03_positional_encoding.ipynb"
    monkeypatch.chdir(home.parent)
    assert resolve_target("00", work=home / "work") == home / "work" / "00_history" / "00_history.ipynb"


def test_check_takes_a_chapter_folder_or_a_notebook(home, monkeypatch):
    monkeypatch.chdir(home)
    folder = Path("work") / "03_positional_encoding"
    assert resolve_target("work/03_positional_encoding") == folder / "03_positional_encoding.ipynb"
    assert resolve_target("work/03_positional_encoding/") == folder / "03_positional_encoding.ipynb"
    assert resolve_target(str(folder / "03_positional_encoding.ipynb")) == folder / "03_positional_encoding.ipynb"
    renamed = home / "mine"
    renamed.mkdir()
    (renamed / "00_history.ipynb").write_text("{}")
    assert resolve_target("mine") == Path("mine") / "00_history.ipynb"


@pytest.mark.parametrize("target, message", [
    ("04", "chapter 04_attention has no notebook at"),
    ("99", "is neither a notebook, a chapter's folder nor a chapter"),
    ("work/04_attention", "is neither a notebook, a chapter's folder nor a chapter"),
    ("work", "holds no chapter notebook"),
])
def test_check_says_what_it_looked_for(home, monkeypatch, target, message):
    monkeypatch.chdir(home)
    with pytest.raises(ValueError, match=message):
        resolve_target(target)
