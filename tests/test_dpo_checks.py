"""Chapter 13's checks: the visible tests name β misplaced in the DPO loss, and the KL
estimate's tests take points from one computed in float32, where the text says float64;
the reference passes them all."""
import math

import pytest
import torch
import torch.nn.functional as F

import course_runtime as course
from minillm import dpo as reference_dpo

from .chapter_cells import cell_sources, failure_of

SLUG = "13_dpo"


@pytest.fixture(scope="module")
def cells():
    return cell_sources(SLUG)


def run_cell(cells, grade_id: str, **answers) -> None:
    """Run a test cell of the chapter with ``answers`` bound to the exercise names."""
    namespace = {"course": course, "torch": torch, "F": F, "math": math, "reference_dpo": reference_dpo, **answers}
    torch.manual_seed(0)
    exec(compile(cells[grade_id], grade_id, "exec"), namespace)


def failure(cells, grade_id: str, **answers) -> str:
    return failure_of(run_cell, cells, grade_id, **answers)


def beta_outside(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
    reference_dpo.dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta)  # its errors
    margin = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    return -beta * F.logsigmoid(margin).mean()


def beta_on_the_policy(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
    reference_dpo.dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta)
    return -F.logsigmoid((beta * policy_chosen - ref_chosen) - (beta * policy_rejected - ref_rejected)).mean()


def kl_in_float32(policy_logps, ref_logps):
    if not isinstance(policy_logps, torch.Tensor) or policy_logps.dim() != 1 or len(policy_logps) < 2:
        raise ValueError("policy_logps must be a 1-D tensor of at least 2 samples")
    if not isinstance(ref_logps, torch.Tensor) or ref_logps.shape != policy_logps.shape:
        raise ValueError("ref_logps must have policy_logps' shape")
    ratios = policy_logps - ref_logps  # float32 inputs stay float32
    return ratios.mean().item(), (ratios.std() / math.sqrt(len(ratios))).item()


def test_beta_outside_the_log_sigmoid_is_named(cells):
    assert "beta outside the log-sigmoid" in failure(cells, "dpo_loss_visible", dpo_loss=beta_outside)


def test_beta_on_the_policy_alone_is_named(cells):
    assert "beta multiplies the policy's log-probabilities only" in failure(cells, "dpo_loss_visible",
                                                                           dpo_loss=beta_on_the_policy)


def test_a_kl_estimate_in_float32_loses_its_points(cells):
    assert "computed in float32" in failure(cells, "kl_estimate_visible", kl_estimate=kl_in_float32)
    assert "kl_estimate computes in float64" in failure(cells, "kl_estimate_hidden", kl_estimate=kl_in_float32)


@pytest.mark.parametrize("exercise", ["response_logprobs", "dpo_loss", "implicit_reward", "kl_estimate"])
@pytest.mark.parametrize("kind", ["visible", "hidden"])
def test_the_reference_passes_every_check(cells, exercise, kind):
    run_cell(cells, f"{exercise}_{kind}", **{exercise: getattr(reference_dpo, exercise)})
