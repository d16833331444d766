"""Chapter 12's checks: each visible test names the misconception a wrong answer shows, and the
hidden tests take points from near misses that the exercise text rules out."""
import pytest
import torch

import course_runtime as course
from autograder import chapters
from minillm import lora as reference_lora
from minillm.model import GPT, GPTConfig


@pytest.fixture(scope="module")
def chapter():
    return chapters.load("12_lora")


def run_cell(chapter, grade_id: str, **answers) -> None:
    """Run a test cell of the chapter with ``answers`` bound to the exercise names."""
    namespace = {"course": course, "torch": torch, "reference_lora": reference_lora, "GPT": GPT, "GPTConfig": GPTConfig,
                 **answers}
    torch.manual_seed(0)
    exec(compile(chapter.by_id[grade_id].source, grade_id, "exec"), namespace)


def failure(chapter, grade_id: str, **answers) -> str:
    with pytest.raises(AssertionError) as caught:  # CheckFailed is an AssertionError
        run_cell(chapter, grade_id, **answers)
    return str(caught.value)


def rank_from_lora_B(x, lora_A, lora_B, alpha):
    return (alpha / lora_B.shape[0]) * ((x @ lora_A.T) @ lora_B.T)


def product_formed(x, lora_A, lora_B, alpha):
    reference_lora.lora_update(x, lora_A, lora_B, alpha)  # its shape errors
    return (alpha / lora_A.shape[0]) * (x @ (lora_B @ lora_A).T)


def merge_rank_from_lora_B(weight, lora_A, lora_B, alpha):
    return weight + (alpha / lora_B.shape[0]) * (lora_B @ lora_A)


def merge_without_cast(weight, lora_A, lora_B, alpha):
    reference_lora.merge_weight(weight, lora_A, lora_B, alpha)  # its shape errors
    return weight + (alpha / lora_A.shape[0]) * (lora_B @ lora_A)


def count_without_gqa(config, r, targets):
    shapes = {"q": 2 * config.d_model, "k": 2 * config.d_model, "v": 2 * config.d_model, "o": 2 * config.d_model,
              "w1": config.d_model + config.d_ff, "w2": config.d_model + config.d_ff, "w3": config.d_model + config.d_ff}
    reference_lora.lora_parameter_count(config, r, targets)  # its errors
    return config.n_layers * r * sum(shapes[role] for role in targets)


def test_rank_read_from_lora_B_is_named(chapter):
    assert "r read from lora_B.shape[0]" in failure(chapter, "lora_update_visible", lora_update=rank_from_lora_B)
    assert "r read from lora_B.shape[0]" in failure(chapter, "merge_weight_visible", merge_weight=merge_rank_from_lora_B)


def test_gqa_ignored_for_k_and_v_is_named(chapter):
    assert "grouped-query attention" in failure(chapter, "lora_parameter_count_visible",
                                                lora_parameter_count=count_without_gqa)


def test_forming_the_product_B_A_loses_the_hidden_points(chapter):
    run_cell(chapter, "lora_update_visible", lora_update=product_formed)  # right on ordinary inputs
    assert "never be formed" in failure(chapter, "lora_update_hidden", lora_update=product_formed)


def test_merge_weight_without_the_cast_loses_the_hidden_points(chapter):
    run_cell(chapter, "merge_weight_visible", merge_weight=merge_without_cast)
    assert "weight's dtype" in failure(chapter, "merge_weight_hidden", merge_weight=merge_without_cast)


@pytest.mark.parametrize("grade_id, name", [
    ("lora_update_visible", "lora_update"), ("lora_update_hidden", "lora_update"),
    ("merge_weight_visible", "merge_weight"), ("merge_weight_hidden", "merge_weight"),
    ("lora_parameter_count_visible", "lora_parameter_count"), ("lora_parameter_count_hidden", "lora_parameter_count"),
])
def test_the_reference_passes_every_check(chapter, grade_id, name):
    run_cell(chapter, grade_id, **{name: getattr(reference_lora, name)})
