# %% [markdown]
# # Chapter 08 · Scaling laws and data-parallel training

# %%
#| export minillm/scaling.py
"""Scaling: what training and inference cost in FLOPs, and scaling-law fits (chapter 08).

FLOPs (floating-point operations, a multiply and an add counting two) of a decoder-only
``GPTConfig``. N, the parameters that cost FLOPs, is the non-embedding count of
``minillm.model.count_parameters`` (active parameters for a mixture of experts) plus the
output head's matrix when it is tied to the token table: the head is a real
(d_model x vocab) matrix product for every token, while the embedding lookup is an index
and costs nothing. Then, for D training tokens in windows of T,

    training_flops = 6 N D  +  12 n_layers T d_attn D,

6 N D for the matrix products (2 per parameter and token forward, 4 backward) and the
attention term for the scores Q K^T and the weighted values A V, which have no
parameters (d_attn = n_heads * head_dim). Dense kernels compute the whole T x T score
matrix of a causal model, so the full square is counted (``torch.utils.flop_counter``
counts the same). ``inference_flops`` is one forward step of a new token over a context.

Fits: ``fit_power_law(n, loss)`` fits L(N) = a N^(-alpha) + c with standard errors from
the fit's covariance, and warns (``UnpinnedOffsetWarning``) when the data cannot pin down
c. ``fit_isoflop(compute, n, loss)`` finds the loss-optimal size of each compute budget
(a parabola in log N, Chinchilla's approach 2) and fits N_opt = k C^a.
"""
import math
import warnings
from dataclasses import dataclass

import numpy as np

from minillm.checks import non_negative_int, positive_int
from minillm.model import GPTConfig, count_parameters

# %%
#| answer training_flops_6nd
#| export minillm/scaling.py
def training_flops_6nd(config: GPTConfig, tokens: int) -> int:
    """6 N D: the FLOPs of the matrix products of training on ``tokens`` tokens.

    N: the non-embedding parameters (``count_parameters(config, non_embedding=True,
    active=True)``) plus the output head's (vocab_size x d_model) matrix when
    ``config.tie_embeddings`` is True (then the count above left it out with the token table).
    """
    ### BEGIN SOLUTION
    if not isinstance(config, GPTConfig):
        raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
    non_negative_int("tokens", tokens)
    n = count_parameters(config, non_embedding=True, active=True)
    if config.tie_embeddings:
        n += config.vocab_size * config.d_model
    return 6 * n * tokens
    ### END SOLUTION

# %%
#| answer attention_training_flops
#| export minillm/scaling.py
def attention_training_flops(config: GPTConfig, tokens: int, seq_len: int | None = None) -> int:
    """The FLOPs of attention's parameter-free products, Q K^T and A V, in training on ``tokens``
    tokens cut into windows of ``seq_len`` (default: ``config.context_length``):
    12 n_layers seq_len d_attn tokens, with d_attn = n_heads * head_dim (the whole
    seq_len x seq_len score matrix, as a dense kernel computes it; backward twice forward).
    """
    ### BEGIN SOLUTION
    if not isinstance(config, GPTConfig):
        raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
    non_negative_int("tokens", tokens)
    seq_len = config.context_length if seq_len is None else positive_int("seq_len", seq_len)
    if seq_len > config.context_length:
        raise ValueError(f"seq_len must be <= the config's context_length ({config.context_length}), got {seq_len}")
    d_attn = config.n_heads * config.head_dim
    return 3 * 4 * config.n_layers * seq_len * d_attn * tokens
    ### END SOLUTION

# %%
#| export minillm/scaling.py
def training_flops(config: GPTConfig, tokens: int, seq_len: int | None = None) -> int:
    """The FLOPs of training ``GPT(config)`` on ``tokens`` tokens in windows of ``seq_len``
    (default: the context): 6 N D plus the attention term (see the module's docstring)."""
    return training_flops_6nd(config, tokens) + attention_training_flops(config, tokens, seq_len)


def inference_flops(config: GPTConfig, context: int) -> int:
    """The FLOPs of one forward step for one new token that attends over ``context``
    positions (itself included; a KV cache holds the others): 2 N + 4 n_layers context d_attn."""
    if not isinstance(config, GPTConfig):
        raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
    positive_int("context", context)
    if context > config.context_length:
        raise ValueError(f"context must be <= the config's context_length ({config.context_length}), got {context}")
    return training_flops_6nd(config, 1) // 3 + 4 * config.n_layers * context * config.n_heads * config.head_dim


def tokens_for_compute(config: GPTConfig, compute: float, seq_len: int | None = None) -> int:
    """How many training tokens a budget of ``compute`` FLOPs buys for ``GPT(config)``
    (``training_flops`` per token, rounded down)."""
    if not isinstance(compute, (int, float)) or isinstance(compute, bool) or not compute > 0:
        raise ValueError(f"compute must be a positive number of FLOPs, got {compute!r}")
    return int(compute // training_flops(config, 1, seq_len))


class ScalingFitWarning(UserWarning):
    """A fit the data cannot support: an offset c they do not pin down, an optimum outside the sizes tried."""


def _positive_array(name: str, values, least: int) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or len(array) < least:
        raise ValueError(f"{name} must be a 1-d sequence of at least {least} numbers, got shape {array.shape}")
    if not np.all(np.isfinite(array)) or not np.all(array > 0):
        raise ValueError(f"{name} must hold positive finite numbers")
    return array


@dataclass(frozen=True)
class PowerLawFit:
    """L(N) = a N^(-alpha) + c, with standard errors from the fit's covariance (nan where the
    points leave no degree of freedom; 0 for a c that was given). c_pinned: False when the
    data cannot pin c down (its standard error is half its value or more, or the best c is
    0, the bound); then alpha is only an effective exponent over the range fitted."""

    a: float
    alpha: float
    c: float
    a_std: float
    alpha_std: float
    c_std: float
    c_pinned: bool
    rms_relative_error: float

    def __call__(self, n) -> np.ndarray | float:
        """The fitted loss at ``n`` (a number or an array)."""
        value = self.a * np.asarray(n, dtype=np.float64) ** -self.alpha + self.c
        return float(value) if np.ndim(value) == 0 else value


def _linear_in_a_c(x: np.ndarray, loss: np.ndarray, c: float | None) -> tuple[float, float, float]:
    """For a fixed exponent (x = N^-alpha): the (a, c) of least relative squared error, c >= 0, and that error."""
    if c is None:
        (a, c), *_ = np.linalg.lstsq(np.stack([x / loss, 1 / loss], axis=1), np.ones_like(loss), rcond=None)
        if c < 0:  # the bound: a loss below zero is no loss
            c = 0.0
    if c is not None:
        a = float(np.dot(x / loss, 1 - c / loss) / np.dot(x / loss, x / loss))
    error = float(np.sum(((a * x + c) / loss - 1) ** 2))
    return float(a), float(c), error


def fit_power_law(n, loss, *, c: float | None = None) -> PowerLawFit:
    """Fit L(N) = a N^(-alpha) + c to sizes ``n`` and losses ``loss`` (1-d, the same length),
    minimizing the squared relative error (so every point counts alike, small and large).

    c: None fits it (at least 3 points; 4 for standard errors), with c >= 0; a number fixes
    it (0: a pure power law, a straight line on log-log axes). The exponent is found by a
    search over alpha in (0, 4], (a, c) by linear least squares for each alpha. Warns
    (``ScalingFitWarning``) when the fitted c is not pinned down by the data.
    """
    n = _positive_array("n", n, 2 if c is not None else 3)
    loss = _positive_array("loss", loss, 2 if c is not None else 3)
    if len(n) != len(loss):
        raise ValueError(f"n and loss must have the same length, got {len(n)} and {len(loss)}")
    if len(np.unique(n)) < 2:
        raise ValueError("n must hold at least two different sizes")
    if c is not None and not (isinstance(c, (int, float)) and 0 <= c < loss.min()):
        raise ValueError(f"c must be a number in [0, min(loss)={loss.min():.4g}), got {c!r}")
    scale = math.exp(np.mean(np.log(n)))  # N / its geometric mean keeps N^-alpha near 1
    log_n = np.log(n / scale)

    def error(alpha: float) -> float:
        return _linear_in_a_c(np.exp(-alpha * log_n), loss, c)[2]

    grid = np.linspace(1e-3, 4.0, 800)
    best = int(np.argmin([error(alpha) for alpha in grid]))
    low, high = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    for _ in range(60):  # golden-section search in the grid cell around the best point
        m1, m2 = high - 0.618 * (high - low), low + 0.618 * (high - low)
        low, high = (low, m2) if error(m1) < error(m2) else (m1, high)
    alpha = (low + high) / 2
    a_scaled, c_fit, sse = _linear_in_a_c(np.exp(-alpha * log_n), loss, c)

    # covariance of (log a_scaled, alpha[, c]) from the Jacobian of the relative residuals
    power = a_scaled * np.exp(-alpha * log_n)
    columns = [power / loss, -power * log_n / loss] + ([1 / loss] if c is None else [])
    jacobian = np.stack(columns, axis=1)
    dof = len(n) - jacobian.shape[1]
    cov = np.full((jacobian.shape[1],) * 2, np.nan)
    if dof > 0:
        with np.errstate(all="ignore"):
            cov = (sse / dof) * np.linalg.pinv(jacobian.T @ jacobian)
    log_scale = math.log(scale)
    var_log_a = cov[0, 0] + log_scale ** 2 * cov[1, 1] - 2 * log_scale * cov[0, 1]  # log a = log a_s + alpha log scale
    a = a_scaled * scale ** alpha
    a_std, alpha_std = a * math.sqrt(max(var_log_a, 0.0)), math.sqrt(max(cov[1, 1], 0.0))
    if dof <= 0:
        a_std, alpha_std = math.nan, math.nan
    c_std = 0.0 if c is not None else (math.sqrt(max(cov[2, 2], 0.0)) if dof > 0 else math.nan)
    pinned = c is not None or (c_fit > 0 and c_std < 0.5 * c_fit)
    if not pinned:
        warnings.warn(f"the data cannot pin down the offset c (c = {c_fit:.4g} +- {c_std:.2g}, {len(n)} points): "
                      f"the losses do not bend enough over this range of sizes, so alpha = {alpha:.3g} is an "
                      "effective exponent for this range only; fix c (c=...) or add sizes", ScalingFitWarning,
                      stacklevel=2)
    return PowerLawFit(a=float(a), alpha=float(alpha), c=float(c_fit), a_std=float(a_std), alpha_std=float(alpha_std),
                       c_std=float(c_std), c_pinned=bool(pinned), rms_relative_error=math.sqrt(sse / len(n)))


def isoflop_minimum(n, loss) -> float:
    """The loss-optimal size of one compute budget: the minimum of a parabola in log N fitted
    to the sizes ``n`` and their losses (Hoffmann et al., 2022, approach 2). At least 3
    points; ``ValueError`` when the losses do not curve up; ``ScalingFitWarning`` when the
    minimum lies outside the sizes tried (an extrapolation)."""
    n = _positive_array("n", n, 3)
    loss = _positive_array("loss", loss, 3)
    if len(n) != len(loss):
        raise ValueError(f"n and loss must have the same length, got {len(n)} and {len(loss)}")
    x = np.log(n)
    curvature, slope, _ = np.polyfit(x, loss, 2)
    if not curvature > 0:
        raise ValueError("the losses do not curve up around a minimum: try sizes on both sides of the optimum")
    best = -slope / (2 * curvature)
    if not x.min() <= best <= x.max():
        warnings.warn(f"the optimum (N = {math.exp(best):.3g}) lies outside the sizes tried "
                      f"({n.min():.3g} to {n.max():.3g}): an extrapolation", ScalingFitWarning, stacklevel=2)
    return float(math.exp(best))


@dataclass(frozen=True)
class IsoFLOPFit:
    """N_opt = coefficient * C^exponent, fitted to the loss-optimal size of each budget.
    budgets and n_opt: the budgets (ascending) and their optimal sizes. exponent_std: the
    standard error of the exponent (nan with two budgets)."""

    budgets: tuple[float, ...]
    n_opt: tuple[float, ...]
    exponent: float
    exponent_std: float
    coefficient: float

    def __call__(self, compute) -> np.ndarray | float:
        """The fitted loss-optimal size for ``compute`` FLOPs."""
        value = self.coefficient * np.asarray(compute, dtype=np.float64) ** self.exponent
        return float(value) if np.ndim(value) == 0 else value


def fit_isoflop(compute, n, loss) -> IsoFLOPFit:
    """Fit N_opt = k C^a to IsoFLOP runs: ``compute[i]`` FLOPs spent on a model of ``n[i]``
    parameters reached ``loss[i]`` (1-d, the same length). Runs of one budget share the same
    compute value; each budget needs at least 3 sizes, and at least 2 budgets are needed."""
    compute = _positive_array("compute", compute, 6)
    n = _positive_array("n", n, 6)
    loss = _positive_array("loss", loss, 6)
    if not len(compute) == len(n) == len(loss):
        raise ValueError(f"compute, n and loss must have the same length, got {len(compute)}, {len(n)}, {len(loss)}")
    budgets = np.unique(compute)
    if len(budgets) < 2:
        raise ValueError("compute must hold at least two different budgets")
    n_opt = np.array([isoflop_minimum(n[compute == budget], loss[compute == budget]) for budget in budgets])
    x, y = np.log(budgets), np.log(n_opt)
    exponent, intercept = np.polyfit(x, y, 1)
    std = math.nan
    if len(budgets) > 2:
        residual = y - (exponent * x + intercept)
        std = math.sqrt(np.sum(residual ** 2) / (len(x) - 2) / np.sum((x - x.mean()) ** 2))
    return IsoFLOPFit(budgets=tuple(float(b) for b in budgets), n_opt=tuple(float(v) for v in n_opt),
                      exponent=float(exponent), exponent_std=float(std), coefficient=float(math.exp(intercept)))
