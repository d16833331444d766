"""A check of one exercise never runs the learner's answer to another.

Chapter 04's attention exercise may be written with a call of the learner's own `softmax`
by its bare name. While the judge checks the attention exercise, the learner's calls see
`softmax` bound to the package's version (autograder.view.package_names), so a wrong
softmax costs the softmax exercise its points and nothing else.
"""
import pytest

from autograder import chapters
from autograder.grade import grade_files
from autograder.sandbox import Limits

from . import grading_fixture as fx

pytestmark = [pytest.mark.grading, pytest.mark.xdist_group(name="independent-checks")]
SLUG = "04_attention"


def test_a_wrong_softmax_costs_only_its_own_points(tmp_path):
    chapter = chapters.load(SLUG)
    master_attention = chapter.by_id["scaled_dot_product_attention"].source
    assert "torch.softmax(" in master_attention
    answers = {
        "softmax": "def softmax(x, dim):\n    return torch.zeros_like(x)\n",
        # the model answer, calling the learner's own softmax by its bare name
        "scaled_dot_product_attention": master_attention.replace("torch.softmax(", "softmax("),
    }
    fx.write(fx.submission(chapter, answers, solved=True), tmp_path / "subs" / f"learner__{SLUG}.ipynb")
    batch = grade_files([tmp_path / "subs"], tmp_path / "out", jobs=1,
                        limits=Limits(cell_timeout=60, notebook_timeout=300, call_timeout=30), course=False)
    scores = {t["name"]: t["score"] for t in batch.of("learner")["tests"]}
    assert scores["softmax_visible"] == scores["softmax_hidden"] == 0, scores
    assert scores["scaled_dot_product_attention_visible"] == 1 and scores["scaled_dot_product_attention_hidden"] == 3, scores
    lost = {name for name, score in scores.items() if not score}
    assert lost == {"softmax_visible", "softmax_hidden"}, scores
