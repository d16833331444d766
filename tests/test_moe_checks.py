"""Chapter 11's checks: each visible test names the misconception a wrong answer shows, and the
hidden tests take points from near misses that the exercise text rules out (a Python loop over
tokens in the dispatch plan, a combine in the weights' dtype); the reference passes them all."""
import math

import pytest
import torch
import torch.nn.functional as F

import course_runtime as course
from coursebuild import notebooks
from minillm import moe as reference_moe

from .chapter_cells import cell_sources, failure_of

SLUG = "11_mixture_of_experts"


@pytest.fixture(scope="module")
def cells():
    return cell_sources(SLUG)


def run_cell(cells, grade_id: str, **answers) -> None:
    """Run a test cell with ``answers`` bound to the exercise names. A hidden cell runs after
    its visible cell (whose helpers it uses), which is given the reference."""
    exercise = grade_id.rsplit("_", 1)[0]
    namespace = {"course": course, "torch": torch, "F": F, "math": math, "reference_moe": reference_moe,
                 exercise: getattr(reference_moe, exercise)}
    torch.manual_seed(0)
    if grade_id.endswith("_hidden"):
        exec(compile(cells[f"{exercise}_visible"], f"{exercise}_visible", "exec"), namespace)
    namespace.update(answers)
    exec(compile(cells[grade_id], grade_id, "exec"), namespace)


def failure(cells, grade_id: str, **answers) -> str:
    return failure_of(run_cell, cells, grade_id, **answers)


def softmax_over_tokens(logits, top_k, normalize=True):
    reference_moe.top_k_routing(logits, top_k)  # its errors
    weights, experts = torch.softmax(logits, dim=0).topk(top_k, dim=-1)
    return (weights / weights.sum(-1, keepdim=True) if normalize else weights), experts


def _plan_keeping(experts, n_experts, capacity, keep_counts):
    """The reference's plan with ``place <= capacity``; counts clamped (keep_counts) or counted from what is kept."""
    tokens = experts.shape[0]
    flat = experts.T.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=n_experts)
    if capacity is not None:
        starts = counts.cumsum(0) - counts
        order = order[torch.arange(len(flat)) - starts[flat[order]] <= capacity]
        counts = counts.clamp(max=capacity) if keep_counts else torch.bincount(flat[order], minlength=n_experts)
    return order % tokens, order // tokens, counts


def capacity_inclusive(experts, n_experts, capacity=None):
    return _plan_keeping(experts, n_experts, capacity, keep_counts=True)


def capacity_inclusive_counted(experts, n_experts, capacity=None):
    return _plan_keeping(experts, n_experts, capacity, keep_counts=False)


def plan_by_token_loop(experts, n_experts, capacity=None):
    """Right, but in Python: each expert's queue walked assignment by assignment."""
    queues = [[] for _ in range(n_experts)]
    for j, choices in enumerate(experts.T.tolist()):
        for t, e in enumerate(choices):
            if capacity is None or len(queues[e]) < capacity:
                queues[e].append((t, j))
    rows = torch.tensor([t for queue in queues for t, _ in queue], dtype=torch.long)
    slots = torch.tensor([j for queue in queues for _, j in queue], dtype=torch.long)
    return rows, slots, torch.tensor([len(queue) for queue in queues], dtype=torch.long)


def combine_in_weights_dtype(outputs, rows, slots, weights, n_tokens):
    y = torch.zeros(n_tokens, outputs.shape[-1], dtype=weights.dtype)
    return y.index_add_(0, rows, outputs.to(weights.dtype) * weights[rows, slots, None])


def test_softmax_over_the_tokens_is_named(cells):
    assert "softmax ran over the tokens (dim 0)" in failure(cells, "top_k_routing_visible",
                                                           top_k_routing=softmax_over_tokens)


@pytest.mark.parametrize("answer", [capacity_inclusive, capacity_inclusive_counted])
def test_capacity_with_less_or_equal_is_named(cells, answer):
    assert "not <= (places count from 0)" in failure(cells, "dispatch_plan_visible", dispatch_plan=answer)


def test_a_python_loop_over_tokens_loses_the_dispatch_points(cells):
    assert "loops over the tokens in Python" in failure(cells, "dispatch_plan_visible", dispatch_plan=plan_by_token_loop)
    assert "must be vectorised" in failure(cells, "dispatch_plan_hidden", dispatch_plan=plan_by_token_loop)


def test_combine_in_the_weights_dtype_loses_the_combine_points(cells):
    assert "not the weights'" in failure(cells, "combine_visible", combine=combine_in_weights_dtype)
    assert "not the weights'" in failure(cells, "combine_hidden", combine=combine_in_weights_dtype)


@pytest.mark.parametrize("exercise", ["top_k_routing", "load_balancing_loss", "router_z_loss", "dispatch_plan",
                                      "combine"])
@pytest.mark.parametrize("kind", ["visible", "hidden"])
def test_the_reference_passes_every_check(cells, exercise, kind):
    run_cell(cells, f"{exercise}_{kind}", **{exercise: getattr(reference_moe, exercise)})


def test_the_step_count_sees_a_loop_and_not_a_vectorised_plan():
    from course_runtime.opcount import grows_with_size, python_steps

    small, large = torch.randint(0, 4, (16, 2)), torch.randint(0, 4, (256, 2))
    assert grows_with_size(reference_moe.dispatch_plan, (small, 4, None), (large, 4, None), slack=0) is None
    few, many = grows_with_size(plan_by_token_loop, (small, 4, None), (large, 4, None), slack=0)
    assert many - few >= 2 * (256 - 16)  # at least one line per assignment
    lines, result = python_steps(lambda n: sum(i for i in range(n)), 10)
    assert result == 45 and lines >= 10


def _given_cell(marker: str) -> str:
    (source,) = [cell.source for cell in notebooks.build_notebook(SLUG).cells if marker in cell.source]
    return source


@pytest.mark.parametrize("wrong, adopted", [({}, "yours"), ({"dispatch_plan": capacity_inclusive}, "reference"),
                                            ({"combine": combine_in_weights_dtype}, "yours")])
def test_the_layer_keeps_going_with_the_reference_when_an_answer_it_calls_is_wrong(cells, wrong, adopted, capsys):
    """The layer's given code calls the exercises by name: the notebook runs it as ``Layer``,
    the notebook's class when it matches the formula, else the course's. (A combine in the
    weights' dtype is right within one dtype, as the layer uses it.)"""
    namespace = {"__name__": "chapter_11"}
    exec(compile(open(reference_moe.__file__).read(), reference_moe.__file__, "exec"), namespace)
    exec(compile(cells["dispatch_plan_visible"].split("\n@course.visible_check")[0], "helpers", "exec"), namespace)
    namespace.update(course=course, torch=torch, math=math, reference_moe=reference_moe, **wrong)
    exec(compile(_given_cell("def _layer_check("), "keep going", "exec"), namespace)
    expected = namespace["MoEFeedForward"] if adopted == "yours" else reference_moe.MoEFeedForward
    assert namespace["Layer"] is expected, capsys.readouterr().out
