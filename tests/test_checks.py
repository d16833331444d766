"""minillm.checks and minillm.markers: clear errors naming the argument; marks that survive wrapping."""
import math

import pytest
from torch import nn

from minillm import checks
from minillm.markers import is_residual_projection, mark_residual_projection


@pytest.mark.parametrize("value", [0, -3, True, 1.0, "2", None])
def test_positive_int_refuses(value):
    with pytest.raises(ValueError, match=r"d_model must be an int >= 1, got"):
        checks.positive_int("d_model", value)


def test_ints_pass_through():
    assert checks.positive_int("n", 3) == 3
    assert checks.non_negative_int("n", 0) == 0
    assert checks.integer("seed", -5) == -5


def test_boolean_refuses_ints():
    assert checks.boolean("bias", False) is False
    with pytest.raises(TypeError, match="bias must be True or False, got 1"):
        checks.boolean("bias", 1)


@pytest.mark.parametrize("value", [1.0, -0.1, math.nan, True, "0.1"])
def test_probability_refuses(value):
    with pytest.raises(ValueError, match=r"dropout must be a number in \[0.0, 1.0\)"):
        checks.probability("dropout", value)


def test_numbers():
    assert checks.probability("dropout", 0) == 0.0
    assert checks.positive_number("eps", 1e-5) == 1e-5
    for bad in (0, math.inf, -1):
        with pytest.raises(ValueError, match="eps must be a number in"):
            checks.positive_number("eps", bad)
    assert checks.number("x", 5, low=0, high=5) == 5.0
    with pytest.raises(ValueError):
        checks.number("x", 5, low=0, high=5, high_open=True)


def test_one_of():
    assert checks.one_of("norm_placement", "pre", ("pre", "post")) == "pre"
    with pytest.raises(ValueError, match=r"norm_placement must be one of \('pre', 'post'\), got 'mid'"):
        checks.one_of("norm_placement", "mid", ("pre", "post"))


def test_eager_only_outside_compile():
    assert checks.eager_only()


def test_residual_mark_survives_wrapping():
    linear = mark_residual_projection(nn.Linear(2, 2))
    wrapper = nn.Sequential(linear)
    assert is_residual_projection(linear) and not is_residual_projection(wrapper)
    assert [name for name, m in wrapper.named_modules() if is_residual_projection(m)] == ["0"]
    assert not is_residual_projection(nn.Linear(2, 2))
