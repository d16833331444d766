"""Near misses of chapters 10, 11 and 13, graded by the hardened grader: each loses its own
exercise's points and nothing else (the solutions' full marks are tests/test_grading.py's).

The cases run through the chapters' hidden cells directly in tests/test_moe_checks.py and
tests/test_dpo_checks.py; here they go through ``grade_files``, where the answers run in the
learner's sandbox and the checks in the judge, which sees only the data that comes back.
Two checks measure a call rather than its result, and both measure it where it runs:
chapter 10's reads the peak memory of the learner's processes (course_runtime/memory.py),
chapter 11's counts the lines of Python that run in the learner's kernel
(course_runtime/opcount.py).
"""
import inspect
import textwrap

import pytest

from autograder import chapters
from autograder.grade import grade_files
from autograder.isolation import isolation
from autograder.sandbox import Limits

from . import grading_fixture as fx
from .test_dpo_checks import kl_in_float32
from .test_flash_checks import forward_with_scores
from .test_moe_checks import combine_in_weights_dtype, plan_by_token_loop

pytestmark = [pytest.mark.grading, pytest.mark.xdist_group(name="near-miss-grading")]

# name: (chapter, exercise, the answer: a near miss written for the checks' own tests, renamed)
CASES = {"scores-matrix": ("10_flash_attention", "tiled_attention_forward", forward_with_scores),
         "loop": ("11_mixture_of_experts", "dispatch_plan", plan_by_token_loop),
         "weights-dtype": ("11_mixture_of_experts", "combine", combine_in_weights_dtype),
         "kl-float32": ("13_dpo", "kl_estimate", kl_in_float32)}


def answer_source(exercise: str, near_miss) -> str:
    """The near miss's source as an answer cell defining ``exercise``."""
    source = textwrap.dedent(inspect.getsource(near_miss))
    return source.replace(f"def {near_miss.__name__}(", f"def {exercise}(", 1)


@pytest.fixture(scope="module")
def scores(tmp_path_factory):
    root = tmp_path_factory.mktemp("near-misses")
    for name, (slug, exercise, near_miss) in CASES.items():
        submission = fx.submission(chapters.load(slug), {exercise: answer_source(exercise, near_miss)}, solved=True)
        fx.write(submission, root / "subs" / f"{name}__{slug}.ipynb")
    batch = grade_files([root / "subs"], root / "out", jobs=2,
                        limits=Limits(cell_timeout=120, notebook_timeout=600, call_timeout=60), course=False)
    return {name: {t["name"]: t["score"] for t in batch.of(name)["tests"]} for name in CASES}


@pytest.mark.parametrize("name", list(CASES))
def test_a_near_miss_loses_its_own_exercise_and_nothing_else(scores, name):
    if name == "scores-matrix" and not isolation().namespaces:
        pytest.skip(f"the learner's processes are found by their PID namespace: {isolation().reason}")
    exercise = CASES[name][1]
    lost = {test for test, score in scores[name].items() if not score}
    assert lost == {f"{exercise}_visible", f"{exercise}_hidden"}, scores[name]
