"""A check of one exercise never runs the learner's answer to another, and never lets an
answer reach its own reference.

Chapter 04's attention exercise may be written with a call of the learner's own `softmax`
by its bare name. While the judge checks the attention exercise, the learner's calls see
`softmax` bound to the package's version (autograder.view.package_names), so a wrong
softmax costs the softmax exercise its points and nothing else.

The chapter's own code needs the solutions of its held exercises (softmax among them), so
the learner's kernel has them; their checks run in a second kernel whose package view has
them as stubs (autograder.view.held_groups). An answer that reaches its own reference by a
name made at run time, or by running the package's source read from disk, finds a stub.
"""
import pytest

from autograder import chapters, view
from autograder.grade import grade_files
from autograder.sandbox import Limits, isolation

from . import grading_fixture as fx

pytestmark = [pytest.mark.grading, pytest.mark.xdist_group(name="independent-checks")]
SLUG = "04_attention"
DELEGATES = {
    "softmax": "import importlib\n"
               "def softmax(x, dim):\n"
               "    return getattr(importlib.import_module('minillm.atten' + 'tion'), 'soft' + 'max')(x, dim)\n",
    "split_heads": "import minillm, pathlib\nheld = {}\n"
                   "exec((pathlib.Path(minillm.__file__).parent / ('atten' + 'tion.py')).read_text(), held)\n"
                   "def split_heads(x, n_heads):\n    return held['split_' + 'heads'](x, n_heads)\n",
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("independent")
    chapter = chapters.load(SLUG)
    master_attention = chapter.by_id["scaled_dot_product_attention"].source
    assert "torch.softmax(" in master_attention
    cases = {
        "wrong_softmax": {
            "softmax": "def softmax(x, dim):\n    return torch.zeros_like(x)\n",
            # the model answer, calling the learner's own softmax by its bare name
            "scaled_dot_product_attention": master_attention.replace("torch.softmax(", "softmax("),
        },
        "delegates": DELEGATES,
    }
    for name, answers in cases.items():
        fx.write(fx.submission(chapter, answers, solved=True), root / "subs" / f"{name}__{SLUG}.ipynb")
    batch = grade_files([root / "subs"], root / "out", jobs=2,
                        limits=Limits(cell_timeout=60, notebook_timeout=300, call_timeout=30), course=False)
    return {name: {t["name"]: t["score"] for t in batch.of(name)["tests"]} for name in cases}


def test_a_wrong_softmax_costs_only_its_own_points(graded):
    scores = graded["wrong_softmax"]
    assert scores["softmax_visible"] == scores["softmax_hidden"] == 0, scores
    assert scores["scaled_dot_product_attention_visible"] == 1 and scores["scaled_dot_product_attention_hidden"] == 3, scores
    lost = {name for name, score in scores.items() if not score}
    assert lost == {"softmax_visible", "softmax_hidden"}, scores


def test_a_held_exercise_cannot_reach_its_own_reference(graded):
    if not isolation().namespaces:
        pytest.skip("without namespaces the grader cannot lay the package view over the package")
    held = set().union(*view.held_groups(chapters.load(SLUG)))
    assert set(DELEGATES) <= held, "the case must attack exercises the chapter's code needs"
    scores = graded["delegates"]
    lost = {name for name, score in scores.items() if not score}
    assert lost == {f"{name}_{kind}" for name in DELEGATES for kind in ("visible", "hidden")}, scores
