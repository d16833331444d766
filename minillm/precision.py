"""The dtype a computation runs in (infrastructure; no chapter teaches this module).

The package's rule is to promote, never downcast: a reduction that loses precision in
half precision (a softmax, a loss, a router's logits, attention's running sums) runs in
at least float32, and a float64 model keeps float64 all the way through. Chapters 07, 10,
11 and 13 follow it through ``compute_dtype``, so the rule is written once.
"""
import torch


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The floating dtype to compute in for inputs of ``dtype``: float32 for float16, bfloat16
    and float32, float64 for float64 (never less precise than the input, never below float32).

    ``TypeError`` unless ``dtype`` is a floating ``torch.dtype``.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    # Decided in Python: torch.promote_types would be one more dispatched operator a step.
    return torch.float64 if dtype == torch.float64 else torch.float32
