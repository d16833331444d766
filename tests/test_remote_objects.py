"""Classes across the wall: a learner's torch module built, called and loaded from the judge."""
import nbformat
import pytest

from autograder.chapters import Chapter
from autograder.grade import grade_files
from autograder.sandbox import Limits

from . import grading_fixture as fx

pytestmark = [pytest.mark.grading, pytest.mark.xdist_group(name="grade-classes")]

WRONG = ("class Affine(torch.nn.Module):\n    def __init__(self, d_in, d_out):\n        super().__init__()\n"
         "        self.linear = torch.nn.Linear(d_in, d_out, bias=False)\n    def forward(self, x):\n"
         "        return self.linear(x)\n")


def test_a_class_answer_is_constructed_called_and_loaded_through_proxies(tmp_path):
    master = tmp_path / f"{fx.CLASS_SLUG}.ipynb"
    nbformat.write(fx.class_master_notebook(), master)
    chapter = Chapter.from_master(master, fx.CLASS_SLUG)
    assert chapter.proxied_names == ["Affine"]
    solved = fx.write(fx.submission(chapter, solved=True), tmp_path / "subs" / f"solved__{fx.CLASS_SLUG}.ipynb")
    wrong = fx.write(fx.submission(chapter, {"affine": WRONG}), tmp_path / "subs" / f"wrong__{fx.CLASS_SLUG}.ipynb")
    good, bad = grade_files([solved, wrong], tmp_path / "out", master=master, course=False,
                            limits=Limits(cell_timeout=30, call_timeout=30)).outcomes
    assert good["score"] == 3, good["tests"]
    assert bad["score"] == 0
    assert "8 parameters" in bad["tests"][0]["output"]
