"""minillm.precision: the dtype to compute in promotes, never downcasts."""
import pytest
import torch

from minillm.precision import compute_dtype


@pytest.mark.parametrize("given, expected", [
    (torch.float16, torch.float32), (torch.bfloat16, torch.float32), (torch.float32, torch.float32),
    (torch.float64, torch.float64),
])
def test_compute_dtype_is_at_least_float32_and_keeps_float64(given, expected):
    assert compute_dtype(given) is expected


@pytest.mark.parametrize("bad", [torch.int64, torch.bool, torch.complex64, "float32", None])
def test_compute_dtype_refuses_what_is_not_a_floating_dtype(bad):
    with pytest.raises(TypeError, match="dtype"):
        compute_dtype(bad)
