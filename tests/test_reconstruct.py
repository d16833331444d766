"""Trusted reconstruction: only answer cells come from a submission (no kernel needed)."""
import json

import pytest

from autograder.chapters import Chapter
from autograder.reconstruct import SubmissionError, reconstruct

from . import grading_fixture as fx


@pytest.fixture(scope="module")
def chapter(tmp_path_factory):
    return Chapter.from_master(fx.write_master(tmp_path_factory.mktemp("fixture")), fx.SLUG)


def rebuild(chapter, data):
    return reconstruct(chapter, json.dumps(data).encode(), "sub.ipynb")


def kinds(rebuilt):
    return {f["kind"] for f in rebuilt.flags}


def test_fixture_chapter_roles_and_plan(chapter):
    assert [c.grade_id for c in chapter.answers] == ["scale", "count_weights"]
    assert [c.grade_id for c in chapter.tests] == ["scale_visible", "scale_hidden",
                                                   "count_weights_visible", "count_weights_hidden"]
    assert chapter.autograded_points == 6
    assert chapter.proxied_names == ["count_weights", "scale"]
    assert chapter.reference_modules == ["minillm.fixture_ref"]
    planned = {chapter.cells[i].source.split("\n")[0] for i in chapter.plan}
    assert not any("scaled_twice" in s for s in planned), "a cell no test needs is not replayed"
    assert all(c.index in chapter.plan for c in chapter.tests)
    assert fx.HIDDEN_MARKER not in json.dumps([c.learner_source for c in chapter.cells])


def test_solution_answers_are_taken_and_everything_else_comes_from_the_master(chapter):
    data = fx.submission(chapter, solved=True)
    data["metadata"]["nbgrader"] = {"chapter": "13_dpo"}
    for cell in data["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "All tests passed"}]
    rebuilt = rebuild(chapter, data)
    assert rebuilt.status == {"scale": "answered", "count_weights": "answered", "why_bias": "answered"}
    assert not rebuilt.reasons
    assert kinds(rebuilt) == set()
    assert "All tests passed" not in json.dumps(rebuilt.notebook)
    assert rebuilt.notebook.metadata == chapter.learner.metadata


def test_untouched_release_is_unanswered(chapter):
    rebuilt = rebuild(chapter, fx.submission(chapter))
    assert set(rebuilt.status.values()) == {"unanswered"}
    assert all("not answered" in r for r in rebuilt.reasons.values())


def test_deleted_and_renamed_answer_cells_are_missing(chapter):
    data = fx.submission(chapter, solved=True)
    data["cells"] = [c for c in data["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") != "scale"]
    fx.cell_of(data, "count_weights")["metadata"]["nbgrader"]["grade_id"] = "count_weights_v2"
    rebuilt = rebuild(chapter, data)
    assert rebuilt.status["scale"] == rebuilt.status["count_weights"] == "missing"
    assert "missing" in rebuilt.reasons["scale"] and "missing" in rebuilt.reasons["count_weights"]
    assert {"missing-answer", "unknown-grade-id"} <= kinds(rebuilt)


def test_tampered_test_cells_and_points_are_flagged_and_ignored(chapter):
    data = fx.submission(chapter, solved=True)
    visible = fx.cell_of(data, "scale_visible")
    visible["source"] = "print('scale: visible test passed')"
    visible["metadata"]["nbgrader"]["points"] = 100
    data["cells"] = [c for c in data["cells"]
                     if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") != "count_weights_hidden"]
    data["cells"].append(json.loads(json.dumps(visible)))  # re-typed, duplicated grade_id
    rebuilt = rebuild(chapter, data)
    assert {"test-cell-edited", "points-altered", "test-cell-missing", "duplicate-grade-id"} <= kinds(rebuilt)
    master_sources = [c.learner_source for c in chapter.cells]
    assert [c.source for c in rebuilt.notebook.cells if c.cell_type == "code"] == [
        s if c.kind not in ("answer",) else rebuilt.answers[c.grade_id]
        for c, s in zip(chapter.cells, master_sources) if c.cell_type == "code"]


def test_answer_cell_turned_into_markdown_is_missing(chapter):
    data = fx.submission(chapter, solved=True)
    fx.cell_of(data, "scale")["cell_type"] = "markdown"
    rebuilt = rebuild(chapter, data)
    assert rebuilt.status["scale"] == "missing"
    assert "must be a code cell" in rebuilt.reasons["scale"]


def test_reference_import_is_flagged_and_withholds_the_exercise(chapter):
    data = fx.submission(chapter, {"scale": "from minillm.fixture_ref import scale",
                                   "count_weights": "import minillm.fixture_ref as ref\n"
                                                    "def count_weights(a, b, bias=True):\n    return a * b + b * bias"},
                         solved=True)
    rebuilt = rebuild(chapter, data)
    assert "reference-use" in kinds(rebuilt)
    assert "reference" in rebuilt.reasons["scale"]
    assert "count_weights" not in rebuilt.reasons, "importing the module without using it is only noted"
    assert any(f["kind"] == "reference-nearby" and f["cell"] == "count_weights" for f in rebuilt.flags)


def test_reference_use_in_chapter_00_through_the_fallback_names():
    chapter = Chapter.load("00_history")
    uses = dict((d, own) for own, d in chapter.reference_uses(
        "self_attention", "def self_attention(x):\n    return attend(x)"))
    assert uses == {"uses attend, which may be the reference self_attention": True}
    own = [o for o, _ in chapter.reference_uses("rnn_forward", "from minillm import history\nrnn_forward = history.rnn_forward")]
    assert any(own)
    assert not chapter.reference_uses("count_parameters", "def count_parameters(c):\n    return 1")


@pytest.mark.parametrize("data, reason", [
    (b"{ this is not json", "JSON is malformed"),
    (b"\xff\xfe\x00", "not UTF-8"),
    (b"[1, 2]", "no list of cells"),
    (b'{"cells": 3}', "no list of cells"),
    (b"[" * 100000, "nested too deeply"),
])
def test_unreadable_submissions_say_why(chapter, data, reason):
    with pytest.raises(SubmissionError, match=reason):
        reconstruct(chapter, data, "sub.ipynb")


def test_a_notebook_of_another_chapter_is_flagged_wrong_chapter(chapter):
    other = Chapter.load("00_history")
    rebuilt = reconstruct(other, json.dumps(fx.submission(chapter, solved=True)).encode(), "00_history.ipynb")
    assert "wrong-chapter" in kinds(rebuilt)
    assert set(rebuilt.status.values()) == {"missing"}


def test_odd_cells_are_skipped_not_fatal(chapter):
    data = fx.submission(chapter, solved=True)
    data["cells"] += [3, {"cell_type": "code", "source": ["a", 1], "metadata": []},
                      {"cell_type": "code", "source": "x", "metadata": {"nbgrader": {"grade_id": 7}}}]
    rebuilt = rebuild(chapter, data)
    assert rebuilt.status["scale"] == "answered"


def test_no_reference_flag_for_what_the_exercise_asks_for_or_for_a_local_name():
    """The tiled forward may call the course's versions of the two exercises it builds on,
    as chapter 10 says; a local ``w`` is the answer's own, though the master binds ``w`` to a
    reference. Reaching this exercise's own reference, or another's, is still found."""
    flash = Chapter.load("10_flash_attention")
    asked = ("from minillm import flash\n"
             "def tiled_attention_forward(q, k, v, causal=False, block_q=64, block_k=64):\n"
             "    m, l, acc = flash.tile_update(m, l, acc, s, v)\n"
             "    return flash.tile_visibility(0, 0, 1, 1, 0)\n")
    assert flash.reference_uses("tiled_attention_forward", asked) == []
    own = asked.replace("return flash.tile_visibility(0, 0, 1, 1, 0)", "return flash.tiled_attention_forward(q, k, v)")
    assert (True, "uses minillm.flash.tiled_attention_forward") in flash.reference_uses("tiled_attention_forward", own)
    other = asked.replace("flash.tile_update(", "flash.score_grad(")
    assert (False, "uses minillm.flash.score_grad") in flash.reference_uses("tiled_attention_forward", other)
    assert (False, "imports minillm.flash") in flash.reference_uses("tiled_attention_forward", other)
    moe = Chapter.load("11_mixture_of_experts")
    local = ("def combine(outputs, rows, slots, weights, n_tokens):\n"
             "    w = weights[rows, slots, None]\n    e = outputs * w\n"
             "    return outputs.new_zeros(n_tokens, outputs.shape[-1]).index_add(0, rows, e)\n")
    assert moe.reference_uses("combine", local) == []
    free = "def combine(outputs, rows, slots, weights, n_tokens):\n    return outputs * w\n"
    assert [detail for _, detail in moe.reference_uses("combine", free)] == [
        "uses w, which may be the reference top_k_routing"]
    positional = Chapter.load("03_positional_encoding")
    helper = ("def alibi_slopes(n_heads):\n"
              "    def slopes(n):\n"
              "        return [1.0] if n == 1 else slopes(n // 2) + [0.5]\n"
              "    return torch.tensor(slopes(n_heads))\n")
    assert positional.reference_uses("alibi_slopes", helper) == [], "a recursive helper is the answer's own"
    global_read = "def alibi_slopes(n_heads):\n    return slopes[:n_heads]\n"
    assert [detail for _, detail in positional.reference_uses("alibi_slopes", global_read)] == [
        "uses slopes, which may be the reference alibi_slopes"]
