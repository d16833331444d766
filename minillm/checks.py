"""Argument checks shared by the package's public entry points (infrastructure; no chapter teaches this module).

Each check raises a ``ValueError`` (or ``TypeError``) that names the argument and says
what was expected, and returns the value, so a constructor can write
``self.d_model = positive_int("d_model", d_model)``. They read Python values only, never
tensor contents, so they cost nothing on the hot path; checks that must read a tensor's
values (ids in range) live at the model's entry and are skipped while compiling
(``eager_only``).
"""
from __future__ import annotations

import math

import torch


def integer(name: str, value, least: int | None = None) -> int:
    """``value`` when it is an int (not a bool) and at least ``least`` (when given)."""
    if isinstance(value, bool) or not isinstance(value, int) or (least is not None and value < least):
        bound = "" if least is None else f" >= {least}"
        raise ValueError(f"{name} must be an int{bound}, got {value!r}")
    return value


def positive_int(name: str, value) -> int:
    """``value`` when it is an int >= 1."""
    return integer(name, value, least=1)


def non_negative_int(name: str, value) -> int:
    """``value`` when it is an int >= 0."""
    return integer(name, value, least=0)


def boolean(name: str, value) -> bool:
    """``value`` when it is True or False (``TypeError`` otherwise: 0 and 1 are not flags)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def number(name: str, value, *, low: float = -math.inf, high: float = math.inf, low_open: bool = False,
           high_open: bool = False) -> float:
    """``value`` as a float when it is a real number (not a bool) in the interval from
    ``low`` to ``high`` (closed ends unless ``low_open`` / ``high_open``)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
    ok = ok and (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ValueError(f"{name} must be a number in {interval}, got {value!r}")
    return float(value)


def positive_number(name: str, value) -> float:
    """``value`` as a float when it is a finite number > 0."""
    return number(name, value, low=0.0, high=math.inf, low_open=True, high_open=True)


def probability(name: str, value) -> float:
    """``value`` as a float when it lies in [0, 1) (a dropout rate)."""
    return number(name, value, low=0.0, high=1.0, high_open=True)


def one_of(name: str, value, allowed) -> object:
    """``value`` when it is one of ``allowed`` (a collection of names)."""
    if value not in allowed:
        raise ValueError(f"{name} must be one of {tuple(allowed)}, got {value!r}")
    return value


def eager_only() -> bool:
    """True outside ``torch.compile``: where a check may read a tensor's values."""
    return not torch.compiler.is_compiling()
