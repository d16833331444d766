"""A check of one exercise never runs the learner's answer to another, and never lets an
answer reach its own reference.

Chapter 04's attention exercise may be written with a call of the learner's own `softmax`
by its bare name. The judge checks the attention exercise in a verdict-only kernel whose
package holds the reference of `softmax` (autograder.view.dependent_groups), so a wrong
softmax costs the softmax exercise its points and nothing else.

The kernel that runs the notebook has the submission's answers exported into its package
and no solution of the chapter (autograder.view): an answer that reaches its own reference
by a name made at run time, or by running the package's source read from disk, finds the
learner's own code there, and so do the chapter's own cells (softmax and split_heads are
exercises that the chapter's code calls).
"""
import pytest

from autograder import chapters
from autograder.grade import grade_files
from autograder.isolation import isolation
from autograder.sandbox import Limits

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


def test_an_exercise_the_chapters_code_calls_cannot_reach_its_own_reference(graded):
    if not isolation().namespaces:
        pytest.skip("without namespaces the grader cannot lay the package view over the package")
    scores = graded["delegates"]
    lost = {name for name, score in scores.items() if not score}
    assert lost == {f"{name}_{kind}" for name in DELEGATES for kind in ("visible", "hidden")}, scores
