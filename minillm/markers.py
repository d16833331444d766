"""Marks that a module carries for the model around it (infrastructure; no chapter teaches this module).

- A residual projection, the last linear map of a branch that adds into the residual
  stream (attention's output, the FFN's down-projection, each expert's), is marked where
  it is built, ``mark_residual_projection(linear)``. The model's initialization gives every
  marked module GPT-2's scaled standard deviation, whatever the module is called and
  however deep it sits (inside an expert, or wrapped by an adapter that keeps its base).
- A module of a student bundle lists the exercises it leaves to the learner (its stubs) in
  ``__learner_exercises__`` (``LEARNER_EXERCISES``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the grader reads LEARNER_EXERCISES without importing torch (over a second)
    from torch import nn

RESIDUAL_PROJECTION = "residual_projection"
LEARNER_EXERCISES = "__learner_exercises__"  # written by make student-bundle, read by the notebook runtime


def mark_residual_projection(module: nn.Module) -> nn.Module:
    """Mark ``module`` as a residual projection and return it."""
    setattr(module, RESIDUAL_PROJECTION, True)
    return module


def is_residual_projection(module: nn.Module) -> bool:
    """Whether ``module`` was marked by ``mark_residual_projection``."""
    return getattr(module, RESIDUAL_PROJECTION, False) is True

