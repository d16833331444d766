"""Chapter 10's checks: each visible test names the misconception a wrong answer shows, and the
hidden tests take points from near misses that the exercise text rules out (a forward that
builds a (q_len, k_len) tensor, one error message naming both bounds)."""
import math

import pytest
import torch
import torch.nn.functional as F

import course_runtime as course
from autograder import chapters
from course_runtime.memory import peak_growth
from minillm import flash


@pytest.fixture(scope="module")
def chapter():
    return chapters.load("10_flash_attention")


def run_cell(chapter, grade_id: str, namespace: dict, **answers) -> None:
    """Run a test cell of the chapter in ``namespace`` with ``answers`` bound to the exercise names."""
    namespace.update(course=course, torch=torch, math=math, F=F, flash=flash, peak_growth=peak_growth, **answers)
    torch.manual_seed(0)
    exec(compile(chapter.by_id[grade_id].source, grade_id, "exec"), namespace)


def failure(chapter, grade_id: str, **answers) -> str:
    """The message of the check of ``grade_id`` on ``answers``; a hidden cell runs after its visible
    cell has defined its helpers with the course's reference."""
    namespace = {}
    if grade_id.endswith("_hidden"):
        name = grade_id.removesuffix("_hidden")
        run_cell(chapter, name + "_visible", namespace, **{name: getattr(flash, name)})
    with pytest.raises(AssertionError) as caught:  # CheckFailed is an AssertionError
        run_cell(chapter, grade_id, namespace, **answers)
    return str(caught.value)


def forward_with_scores(q, k, v, causal=False, block_q=64, block_k=64):
    """The whole (q_len, k_len) matrix of scores, as chapter 04: right values, the memory the text forbids."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        q_len, k_len = scores.shape[-2:]
        scores = scores.masked_fill(torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len).logical_not(),
                                    float("-inf"))
    return torch.softmax(scores, -1) @ v, torch.logsumexp(scores, -1)


def forward_with_additive_mask(q, k, v, causal=False, block_q=64, block_k=64):
    """Tiles, but a (q_len, k_len) additive mask of -inf built "to be safe" first."""
    allowed = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril(k.shape[-2] - q.shape[-2])
    torch.zeros(allowed.shape, dtype=q.dtype).masked_fill(~allowed, float("-inf"))
    return flash.tiled_attention_forward(q, k, v, causal, block_q, block_k)


def visibility_one_message(q_start, q_stop, k_start, k_stop, offset):
    if q_stop <= q_start or k_stop <= k_start:
        raise ValueError(f"q_stop ({q_stop}) and k_stop ({k_stop}) must be greater than q_start and k_start")
    return flash.tile_visibility(q_start, q_stop, k_start, k_stop, offset)


def visibility_without_offset(q_start, q_stop, k_start, k_stop, offset):
    return flash.tile_visibility(q_start, q_stop, k_start, k_stop, 0)


def visibility_exclusive(q_start, q_stop, k_start, k_stop, offset):
    """Query i sees key j only when j < i + offset: its own position left out."""
    return flash.tile_visibility(q_start, q_stop, k_start + 1, k_stop + 1, offset)


def score_grad_along_keys(p, dp, row_term):
    return p * (dp - row_term[..., None, :])


def score_grad_own_rowsum(p, dp, row_term):
    return p * (dp - (p * dp).sum(-1, keepdim=True))


def score_grad_without_correction(p, dp, row_term):
    return p * dp


def test_memory_is_read_from_the_process_and_sees_a_large_allocation():
    _, small = peak_growth(torch.zeros, 16)
    result, grown = peak_growth(lambda: torch.ones(64 * 2**20, dtype=torch.uint8).sum())
    if grown is None:
        pytest.skip("the peak resident memory cannot be reset here (not Linux?)")
    assert result == 64 * 2**20
    assert grown >= 48 * 2**20 > small


@pytest.mark.parametrize("grade_id", ["tiled_attention_forward_visible", "tiled_attention_forward_hidden"])
@pytest.mark.parametrize("answer", [forward_with_scores, forward_with_additive_mask])
def test_a_forward_that_builds_a_query_by_key_tensor_loses_its_points(chapter, grade_id, answer):
    if peak_growth(torch.zeros, 1)[1] is None:
        pytest.skip("the peak resident memory cannot be reset here (not Linux?)")
    assert "(q_len, k_len) tensor" in failure(chapter, grade_id, tiled_attention_forward=answer)


@pytest.mark.parametrize("grade_id", ["tile_visibility_visible", "tile_visibility_hidden"])
def test_one_message_naming_both_bounds_loses_its_points(chapter, grade_id):
    assert "name the bound at fault alone" in failure(chapter, grade_id, tile_visibility=visibility_one_message)


def test_an_answer_that_ignores_the_offset_is_told_so(chapter):
    message = failure(chapter, "tile_visibility_visible", tile_visibility=visibility_without_offset)
    assert "the offset is ignored" in message and "off-by-one" not in message


def test_an_off_by_one_is_called_an_off_by_one(chapter):
    message = failure(chapter, "tile_visibility_visible", tile_visibility=visibility_exclusive)
    assert "off-by-one" in message and "offset is ignored" not in message


@pytest.mark.parametrize("answer, named", [
    (score_grad_along_keys, "subtracted along the keys"),
    (score_grad_own_rowsum, "the tile's own rowsum(P * dP)"),
    (score_grad_without_correction, "the correction - D is missing"),
])
def test_each_score_grad_mistake_gets_its_hint(chapter, answer, named):
    assert named in failure(chapter, "score_grad_visible", score_grad=answer)


def test_the_row_term_along_the_keys_loses_the_hidden_points(chapter):
    namespace = {}
    run_cell(chapter, "score_grad_visible", namespace, score_grad=flash.score_grad)
    with pytest.raises((AssertionError, RuntimeError)):  # wrong values on square tiles, a shape error on the others
        run_cell(chapter, "score_grad_hidden", namespace, score_grad=score_grad_along_keys)


@pytest.mark.parametrize("name", ["online_softmax", "tile_update", "tile_visibility", "tiled_attention_forward",
                                  "score_grad"])
def test_the_reference_passes_every_check(chapter, name):
    namespace = {}
    for kind in ("visible", "hidden"):
        run_cell(chapter, f"{name}_{kind}", namespace, **{name: getattr(flash, name)})
