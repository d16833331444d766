# %% [markdown]
# # Chapter 04 · Attention: scaled dot-product, multi-head, GQA
#
# **Where this sits on the tee:** the *MHA* box of the left sleeve's encoder layer, the
# sleeve's attention map of "Code is art...", and six terms of the Tech Band: *Softmax*,
# *Q,K,V*, *Self-Attention*, *Scaled Dot-Product*, *MHA* and *GQA*. This is the core of
# the shirt, and of every Transformer.
#
# **You will be able to**
# - write a softmax that does not overflow, and say why the naive one does;
# - implement scaled dot-product attention with boolean masks, additive masks and biases,
#   with the masking conventions of PyTorch, and a causal mask for language models;
# - measure why the scores are divided by $\sqrt{d_k}$: variance, saturation, gradients;
# - split a width-$d$ projection into heads and merge them back, without mixing heads up;
# - build multi-head attention with one fused Q/K/V projection, check it against
#   `torch.nn.MultiheadAttention`, and use its hooks for positions, a KV cache and
#   alternative kernels;
# - explain grouped-query and multi-query attention, and compute the memory they save.
#
# **Prerequisites:** chapter 00 (`ModelConfig`, the attention formula in its simplest
# form). Chapters 01–03 help for the last section but are not needed: this chapter works
# on characters and learned positions.
#
# **Time:** about 50 minutes of reading, 70 minutes of exercises.
#
# **How the exercises work.** Each exercise has an answer cell (replace
# `raise NotImplementedError()` with your code), a *visible test* that explains what is
# wrong when it fails, and a *hidden test* that runs only when the notebook is graded.
# Each exercise is graded on its own: where one builds on another, its tests use the
# course's reference for the other. A cell after the tests binds a new name to your
# function when it passes the visible test, or else to the course's reference, so you can
# always read on; in a student bundle where that reference is not released yet, the cells
# that need your answer wait for it and say so.

# %%
import math
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

import course_runtime as course
from minillm.config import ModelConfig, attention_parameters, count_parameters

device = course.setup(seed=0)

# %% [markdown]
# Everything this chapter builds goes into the module `minillm/attention.py`. Its first
# cell holds the module's docstring and imports.

# %%
#| export minillm/attention.py
"""Attention: a stable softmax, scaled dot-product attention, multi-head and grouped-query attention (chapter 04).

Shapes: activations are ``(batch, seq, d_model)``; heads are ``(batch, heads, seq, head_dim)``.
Boolean masks mean what they mean in ``torch.nn.functional.scaled_dot_product_attention``:
``True`` = may attend. Float masks and biases are added to the scores before the softmax.
A query whose every key is masked gets zero weights and a zero output, never NaN.

Hooks for later chapters: ``MultiHeadAttention(rotary=...)`` takes a rotary position
module (chapter 03), ``forward(..., kv_cache=...)`` takes a cache (chapter 09; ``ConcatCache``
is the smallest one), and ``ATTENTION_BACKENDS`` names the attention kernels, chapter 10's
"flash" and "triton" among them.
"""

import math
from typing import Callable, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from minillm.checks import boolean, integer, non_negative_int, positive_int, probability
from minillm.markers import mark_residual_projection
from minillm.registry import Registry

# %% [markdown]
# ## A stable softmax
#
# Attention turns a row of scores into weights that are positive and sum to one. The
# function that does it is the **softmax**:
#
# $$\operatorname{softmax}(x)_i = \frac{e^{x_i}}{\sum_j e^{x_j}}.$$
#
# Large scores get most of the weight, but every entry gets some. Multiplying the scores
# by a factor larger than one sharpens the distribution towards the maximum (an
# "argmax"); a factor smaller than one flattens it towards uniform.
#
# Written as the formula says, it breaks. A float32 holds numbers up to about
# $3.4 \times 10^{38} \approx e^{88.7}$, so $e^{x}$ overflows to `inf` for $x > 88.7$, and
# $\infty / \infty$ is `NaN`. Scores of a few hundred are not exotic: wide attention heads
# produce them from the first step when the scale of a later section is missing, and the
# scores of large models drift upwards during long training runs.

# %%
def naive_softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    return x.exp() / x.exp().sum(dim=dim, keepdim=True)


logits = torch.tensor([1000.0, 999.0, 998.0])
print("naive softmax of [1000, 999, 998]:", naive_softmax(logits, dim=-1))
print("torch.softmax of [1000, 999, 998]:", torch.softmax(logits, dim=-1))
print("naive softmax of [0, -1, -2]:     ", naive_softmax(logits - 1000, dim=-1))

# %% [markdown]
# The last line gives the fix away. Subtracting a constant $c$ from every entry changes
# nothing, because the factor $e^{-c}$ cancels:
#
# $$\frac{e^{x_i - c}}{\sum_j e^{x_j - c}} = \frac{e^{-c}\, e^{x_i}}{e^{-c} \sum_j e^{x_j}} = \operatorname{softmax}(x)_i.$$
#
# Choosing $c = \max_j x_j$ makes the largest exponent $e^0 = 1$: nothing overflows, and
# the denominator is at least 1, so nothing divides by zero either. Entries far below the
# maximum underflow to 0, which is the right answer to float precision. An entry of
# $-\infty$ (a masked score, later) gets $e^{-\infty} = 0$: exactly no weight.
#
# ### Exercise 1 · A numerically stable softmax
#
# Implement `softmax(x, dim)`: subtract the maximum *along `dim`* (one maximum per slice,
# not one for the whole tensor), exponentiate, divide by the sum along `dim`. Use tensor
# operations only (`torch.softmax` is what we test against, so not that).
#
# Difficulty ●○○ · Importance ●●● · about 10 minutes
#
# <details><summary>Hint 1</summary><code>x.amax(dim=dim, keepdim=True)</code> gives one maximum per slice, with a shape that broadcasts against <code>x</code>.</details>
# <details><summary>Hint 2</summary>Without <code>keepdim=True</code>, the maximum over the last dimension of a <code>(rows, cols)</code> tensor has shape <code>(rows,)</code>, which lines up with the columns, not the rows: an error, or for a square tensor a silently wrong answer.</details>
# <details><summary>Hint 3</summary><code>e = (x - x.amax(dim=dim, keepdim=True)).exp()</code>, then <code>e / e.sum(dim=dim, keepdim=True)</code>.</details>

# %%
#| answer softmax
#| export minillm/attention.py
def softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Softmax along ``dim``, computed stably as exp(x - max) / sum(exp(x - max)).

    x: any shape. Returns a tensor of x's shape and dtype whose slices along ``dim`` are
    non-negative and sum to 1. Entries equal to -inf get weight 0. A slice that is -inf
    everywhere has no softmax (the result there is NaN, as with ``torch.softmax``);
    ``scaled_dot_product_attention`` handles such fully masked rows itself.
    """
    ### BEGIN SOLUTION
    exps = (x - x.amax(dim=dim, keepdim=True)).exp()
    return exps / exps.sum(dim=dim, keepdim=True)
    ### END SOLUTION

# %%
#| test softmax_visible points=1
def _softmax_case():
    # row 0 has logits near 1000 and one far below them; row 1 is ordinary
    return torch.tensor([[1000.0, 999.0, 998.0, 0.0], [-2.0, 0.0, 3.0, 1.0]])


@course.visible_check("softmax")
def check_softmax(softmax):
    x = _softmax_case()
    try:
        got = softmax(x, dim=-1)
    except RuntimeError as error:
        raise course.CheckFailed(f"softmax raised RuntimeError: {error}. A size mismatch here usually means the maximum "
                                 "or the sum lost its dimension: pass keepdim=True so it broadcasts against x") from error
    if not torch.equal(x, _softmax_case()):
        raise course.CheckFailed("softmax changed its input x in place (x -= ..., x.exp_(), ...): the caller's tensor must "
                                 "stay as it was. Use out-of-place operations (x - m, .exp()) and return a new tensor")
    if isinstance(got, torch.Tensor) and got.shape == x.shape and not torch.isfinite(got).all():
        bad_rows = sorted({int(i) for i in (~torch.isfinite(got)).nonzero()[:, 0]})
        if bad_rows == [0]:
            raise course.CheckFailed("softmax: NaN or inf in the row [1000, 999, 998, 0]: some exponent was far above 88, "
                                     "and exp overflows float32 there (naive softmax, or subtracting the minimum or the "
                                     "mean?). Subtract the maximum before exp: then every exponent is <= 0.")
        raise course.CheckFailed(f"softmax: NaN or inf in rows {bad_rows}. If the ordinary row (1) is broken, you "
                                 "subtracted one maximum for the whole tensor: its exps all underflow to 0 and 0/0 is "
                                 "NaN. Take the maximum along dim, with keepdim=True.")
    course.expect_close(
        got, torch.softmax(x, dim=-1), "softmax(x, dim=-1)",
        mistakes={"softmax over the wrong dimension (columns sum to 1, rows do not)": torch.softmax(x, dim=0)},
    )
    x = _softmax_case()[:, :3].T.double()  # (3, 2) in float64: now the slices run along dim 0
    got = softmax(x, dim=0)
    if isinstance(got, torch.Tensor) and got.dtype != x.dtype:
        raise course.CheckFailed(f"softmax of a float64 tensor returned {got.dtype}: keep the input's dtype "
                                 "(no .float() or torch.tensor(...) that picks a new one)")
    course.expect_close(
        got, torch.softmax(x, dim=0), "softmax(x, dim=0)",
        mistakes={"dim is ignored: the softmax always runs over the last dimension": torch.softmax(x, dim=-1)},
    )


check_softmax(softmax)
print("softmax: visible test passed")

# %%
#| test softmax_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
for shape, dim, dtype in [((3, 7), 1, torch.float64), ((2, 5, 6), 1, torch.float32), ((4, 3, 2), 0, torch.float32),
                          ((2, 3, 4, 9), -1, torch.float64), ((6, 1), -1, torch.float32)]:
    x = 5 * torch.randn(*shape, dtype=dtype)
    before = x.clone()
    got = softmax(x, dim=dim)
    assert torch.equal(x, before), "softmax changed its input x in place"
    assert isinstance(got, torch.Tensor) and got.dtype == dtype, "softmax must keep the dtype"
    course.expect_close(got, torch.softmax(x, dim=dim), "softmax", atol=1e-6)
    # the defining property: shift invariance along dim
    shift = 50 * torch.randn(*[1 if i == dim % len(shape) else n for i, n in enumerate(shape)], dtype=dtype)
    course.expect_close(softmax(x + shift, dim=dim), got, "softmax is shift-invariant", atol=1e-6)
# very large and very negative logits stay finite and exact (float64: exp overflows beyond 709 there, and
# float32 could not even hold -3e4 + 1 to better than 0.002)
x = torch.tensor([[1e4, 1e4 - 2.0, -1e4], [-3e4, -3e4 + 1.0, -3e4 + 2.0]], dtype=torch.float64)
got = softmax(x, dim=-1)
assert torch.isfinite(got).all(), "softmax returned NaN or inf for logits of +-1e4"
course.expect_close(got, torch.softmax(x, dim=-1), "softmax with logits of +-1e4", atol=1e-12)
# -inf entries (masked scores) get exactly zero weight
x = torch.tensor([[0.5, float("-inf"), 2.0, float("-inf")]])
got = softmax(x, dim=-1)
assert (got[0, [1, 3]] == 0).all(), "an entry of -inf must get weight exactly 0"
course.expect_close(got, torch.softmax(x, dim=-1), "softmax with -inf entries")
# a slice of length one has weight one
course.expect_close(softmax(torch.tensor([[3.0], [-700.0]]), dim=1), torch.ones(2, 1), "softmax over a length-1 dim")
### END HIDDEN TESTS

# %%
from minillm import attention as reference_attention

stable_softmax = course.keep_going("softmax", softmax, reference_attention.softmax, check_softmax)

# %% [markdown]
# How sharp is a softmax? The figure shows the weights of the same ten scores multiplied
# by growing factors. This is the phenomenon the $\sqrt{d_k}$ section measures: when
# scores grow, the softmax turns into an argmax.

# %%
scores = torch.tensor([1.2, -0.3, 0.8, 2.0, 0.1, -1.0, 1.7, 0.4, -0.6, 0.9])
fig, ax = plt.subplots(figsize=(7, 3.5))
for i, factor in enumerate((0.25, 1.0, 4.0, 16.0)):
    ax.bar(torch.arange(10) + (i - 1.5) * 0.2, stable_softmax(factor * scores, dim=-1), width=0.2,
           label=f"softmax({factor:g} × scores)")
ax.set_xlabel("position j")
ax.set_ylabel("weight")
ax.set_xticks(range(10))
ax.set_title("Scaling the scores up turns the softmax into an argmax")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# At a factor of 16 the largest score (position 3) takes almost all the weight; at 0.25
# the weights are nearly uniform. Every softmax in a Transformer sits somewhere on this
# scale, and where it sits decides how much gradient flows back through it.
#
# ## Queries, keys and values
#
# Attention is a soft dictionary lookup. A Python dictionary maps a *query* to the
# *value* whose *key* equals it exactly. Attention compares the query with every key,
# scores each by a dot product, and returns a blend of all the values, weighted by the
# softmax of the scores: keys similar to the query contribute most.
#
# In a Transformer every token plays all three roles. From the token's vector
# $x_i \in \mathbb{R}^{d}$ three learned linear maps make
#
# - a **query** $q_i = W_Q x_i$: what this token is looking for;
# - a **key** $k_i = W_K x_i$: what this token offers to be found by;
# - a **value** $v_i = W_V x_i$: what this token hands over when it is found.
#
# Stacking the tokens as the rows of $X \in \mathbb{R}^{n \times d}$ (so $x_i^\top$ is a
# row, and `torch.nn.Linear` computes $X W^\top$):
#
# $$Q = X W_Q^\top, \quad K = X W_K^\top, \quad V = X W_V^\top, \qquad
# \operatorname{Attention}(Q, K, V) = \operatorname{softmax}\!\left(\frac{Q K^\top}{\sqrt{d_k}}\right) V.$$
#
# Row $i$ of $Q K^\top$ holds query $i$'s scores against every key; the softmax runs along
# that row (over the keys); the product with $V$ averages the values with those weights.
# Separating keys from values matters: what makes a token *relevant* (its key) need not
# be what it *contributes* (its value).
#
# A lookup by hand: three keys, three values, and a query close to the second key.

# %%
#| stable
keys = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
values = torch.tensor([[10.0, 0.0, 0.0], [0.0, 10.0, 0.0], [0.0, 0.0, 10.0]])
for sharpness in (1.0, 5.0):
    query = sharpness * torch.tensor([0.1, 1.0])
    weights = torch.softmax(query @ keys.T, dim=-1)
    print(f"query {[round(c, 2) for c in query.tolist()]}: weights {[round(w, 3) for w in weights.tolist()]}, "
          f"output {[round(o, 2) for o in (weights @ values).tolist()]}")

# %% [markdown]
# The query points at the second key, so the second value dominates the output. A longer
# query (the same direction, five times the length) gives sharper weights and an output
# closer to a hard lookup. Because $W_Q$ and $W_K$ are learned, the model decides both
# what to look for and how sharply.
#
# ## Self-attention
#
# In **self-attention** the queries, keys and values all come from the same sequence:
# every token attends to every token of its own sequence, itself included. (In
# cross-attention, the queries come from one sequence and the keys and values from
# another, as in the 2017 paper's decoder reading the encoder's output.)
#
# **Masks** say which keys a query may see. Two conventions exist, and mixing them up is
# the most common attention bug:
#
# - a **boolean mask** with `True` where the query *may attend*: the convention of
#   `torch.nn.functional.scaled_dot_product_attention`, and of this course.
#   (`torch.nn.MultiheadAttention` uses the opposite: `True` = *blocked*.)
# - an **additive (float) mask**: $0$ where allowed, $-\infty$ where blocked, added to
#   the scores. Any other float is a soft preference; a **bias** such as ALiBi's distance
#   penalty (chapter 03) is added the same way.
#
# $$\operatorname{Attention}(Q, K, V) = \operatorname{softmax}\!\left(\frac{Q K^\top}{\sqrt{d_k}} + B + M\right) V,
# \qquad M_{ij} = \begin{cases} 0 & \text{query } i \text{ may see key } j \\ -\infty & \text{otherwise.} \end{cases}$$
#
# The mask must act **before** the softmax: a blocked score of $-\infty$ gets weight
# exactly 0, and the remaining weights still sum to 1. Zeroing weights *after* the
# softmax leaves rows that no longer sum to 1.
#
# A language model predicts token $i+1$ from tokens $0..i$, so query $i$ must not see
# keys $j > i$: the **causal mask** is lower-triangular. When keys of earlier tokens are
# cached (chapter 09), the $q$ new queries are the *last* $q$ of $k$ positions, and query
# $i$ may see key $j$ when $j \le i + (k - q)$. Given code:

# %%
#| export minillm/attention.py
def causal_mask(seq_len: int, device=None, *, k_len: int | None = None) -> torch.Tensor:
    """Boolean (seq_len, k_len) mask, True where a query may attend to a key (key <= query).

    The queries are the last ``seq_len`` of ``k_len`` positions (``k_len`` defaults to
    ``seq_len``; a larger ``k_len`` means ``k_len - seq_len`` earlier keys are cached), so
    query i may attend to key j when j <= i + k_len - seq_len.
    """
    positive_int("seq_len", seq_len)
    k_len = seq_len if k_len is None else integer("k_len", k_len, least=seq_len)
    return torch.ones(seq_len, k_len, dtype=torch.bool, device=device).tril(diagonal=k_len - seq_len)


def check_mask_shape(mask: torch.Tensor, scores_shape: torch.Size, name: str = "mask") -> None:
    """Raise unless ``mask`` is a bool or float tensor that broadcasts to ``scores_shape``.

    ``ValueError`` for a shape that does not broadcast to the scores ``(..., q_len, k_len)``
    (or would enlarge them), ``TypeError`` for another dtype or a non-tensor.
    """
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(f"{name} must be a bool or float tensor, got dtype {mask.dtype}")
    try:
        fits = torch.broadcast_shapes(mask.shape, scores_shape) == scores_shape
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(f"{name} of shape {tuple(mask.shape)} does not broadcast to the attention scores' "
                         f"shape {tuple(scores_shape)} (..., q_len, k_len)")

# %%
fig, axes = plt.subplots(1, 3, figsize=(10, 3.2))
padding = torch.tensor([True, True, True, True, False, False]).expand(6, 6)
for ax, mask, title in zip(axes, (causal_mask(6), padding, causal_mask(2, k_len=6)),
                           ("causal_mask(6)", "key padding: last 2 keys are padding", "causal_mask(2, k_len=6):\n4 cached keys, 2 new queries")):
    ax.imshow(mask, cmap="Greys", vmin=-0.3, vmax=1.3)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("key position j")
    ax.set_ylabel("query position i")
    ax.set_xticks(range(mask.shape[1]))
    ax.set_yticks(range(mask.shape[0]), range(mask.shape[1] - mask.shape[0], mask.shape[1]))
fig.suptitle("Boolean attention masks: dark = True = may attend")
plt.tight_layout()
plt.show()

# %% [markdown]
# The causal mask is the lower triangle; a padding mask blocks whole columns (keys that
# are padding, in every row); with a cache, the new queries see every cached key and the
# causal triangle among themselves.
#
# One edge case needs a decision: a query row whose **every** key is blocked (this
# happens with padding, and with some sparse patterns). The softmax of a row of $-\infty$
# is $0/0 = $ `NaN`, and one NaN spreads through every later layer. This course's
# attention returns **zero weights and a zero output** for such a row (PyTorch 2.5 and
# later do the same in `F.scaled_dot_product_attention`).
#
# ### Exercise 2 · Scaled dot-product attention
#
# Implement `scaled_dot_product_attention(q, k, v, mask=None, bias=None, return_weights=False)`:
#
# 1. scores $= q k^\top / \sqrt{d_k}$ with $d_k$ = `q.shape[-1]`, shape `(..., q_len, k_len)`;
# 2. add `bias` when given; apply `mask` when given: a bool mask blocks the entries where
#    it is `False` (fill them with $-\infty$), a float mask is added;
# 3. before applying them, call the given `check_mask_shape(mask, scores.shape, "mask")`
#    (and likewise for `bias`): a mask of the wrong shape must raise `ValueError`, not
#    broadcast silently;
# 4. weights = `torch.softmax` over the keys (it computes what your `softmax` of exercise 1
#    does; this exercise uses PyTorch's so that it is graded on its own); rows that are
#    blocked everywhere get zero weights (not NaN);
# 5. return `weights @ v`, and the weights too when `return_weights` is true.
#
# Difficulty ●●○ · Importance ●●● · about 20 minutes
#
# <details><summary>Hint 1</summary>The keys are the last dimension of the scores: <code>k.transpose(-2, -1)</code> swaps the last two axes of <code>k</code>, whatever the leading (batch, head) axes.</details>
# <details><summary>Hint 2</summary><code>scores.masked_fill(~mask, float("-inf"))</code> blocks where the mask is False. A float mask: <code>scores + mask</code>.</details>
# <details><summary>Hint 3</summary>Fully blocked rows: <code>empty = torch.isneginf(scores).all(dim=-1, keepdim=True)</code>; take the softmax of <code>scores.masked_fill(empty, 0.0)</code> and then <code>.masked_fill(empty, 0.0)</code> on the weights.</details>

# %%
#| answer scaled_dot_product_attention
#| export minillm/attention.py
def scaled_dot_product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                                 bias: torch.Tensor | None = None, return_weights: bool = False):
    """softmax(q k^T / sqrt(d_k) + bias + mask) v, written out.

    q: (..., q_len, d_k); k: (..., k_len, d_k); v: (..., k_len, d_v); the leading (batch,
    head) dimensions broadcast. ``mask``: None, a bool tensor (True = may attend) or a
    float tensor added to the scores (0 = attend, -inf = blocked). ``bias``: None or a
    float tensor added to the scores (for example ALiBi's). Both must broadcast to the
    scores (..., q_len, k_len), else ``ValueError``.

    Returns the output (..., q_len, d_v), or ``(output, weights)`` with the weights
    (..., q_len, k_len) when ``return_weights`` is true. A query whose every key is blocked
    gets zero weights and a zero output, never NaN.
    """
    ### BEGIN SOLUTION
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if bias is not None:
        check_mask_shape(bias, scores.shape, "bias")
        scores = scores + bias
    if mask is not None:
        check_mask_shape(mask, scores.shape, "mask")
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    empty = torch.isneginf(scores).all(dim=-1, keepdim=True)
    weights = torch.softmax(scores.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    out = weights @ v
    return (out, weights) if return_weights else out
    ### END SOLUTION

# %%
#| test scaled_dot_product_attention_visible points=1
def _sdpa_case():
    g = torch.Generator().manual_seed(4)
    q, k, v = torch.randn(1, 5, 4, generator=g), torch.randn(1, 5, 4, generator=g), torch.randn(1, 5, 3, generator=g)
    return q, k, v


def _sdpa_reference(q, k, v, mask=None, scale=True, dim=-1, use_mask=True, invert=False, after=False, as_numbers=False,
                    by_d_k=False):
    """What correct code computes, and (with the switches) what each known mistake computes."""
    scores = q @ k.transpose(-2, -1) / (q.shape[-1] if by_d_k else math.sqrt(q.shape[-1]) if scale else 1.0)
    if mask is not None and use_mask and not after:
        if as_numbers:
            scores = scores + mask.float()
        else:
            scores = scores.masked_fill(mask if invert else ~mask, float("-inf"))
    weights = torch.softmax(scores, dim=dim)
    if mask is not None and after:
        weights = weights * mask
    return weights @ v


@course.visible_check("scaled_dot_product_attention")
def check_scaled_dot_product_attention(scaled_dot_product_attention):
    q, k, v = _sdpa_case()
    got = scaled_dot_product_attention(q, k, v)
    if not all(torch.equal(a, b) for a, b in zip((q, k, v), _sdpa_case())):
        raise course.CheckFailed("scaled_dot_product_attention changed q, k or v in place (q /= ..., q.mul_(...)): the "
                                 "caller's tensors must stay as they were. Scale the scores, or write q = q / ...")
    course.expect_close(
        got, _sdpa_reference(q, k, v), "scaled_dot_product_attention(q, k, v)",
        mistakes={
            "the scale 1/sqrt(d_k) is missing": _sdpa_reference(q, k, v, scale=False),
            "divided by d_k instead of sqrt(d_k)": _sdpa_reference(q, k, v, by_d_k=True),
            "softmax over the wrong dimension (over the queries; columns sum to 1, rows do not)": _sdpa_reference(q, k, v, dim=-2),
        },
    )
    padding = torch.tensor([True, True, True, False, False])  # the last two keys are padding
    course.expect_close(
        scaled_dot_product_attention(q, k, v, mask=padding), _sdpa_reference(q, k, v, padding),
        "scaled_dot_product_attention with a key-padding mask",
        mistakes={"the mask is inverted: True must mean 'may attend' (as in F.scaled_dot_product_attention), "
                  "not 'blocked' (as in nn.MultiheadAttention)": _sdpa_reference(q, k, v, padding, invert=True)},
    )
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    course.expect_close(
        scaled_dot_product_attention(q, k, v, mask=causal), _sdpa_reference(q, k, v, causal),
        "scaled_dot_product_attention with a causal mask",
        mistakes={
            "the causal mask is missing: future positions get weight (is the mask applied at all?)": _sdpa_reference(q, k, v, causal, use_mask=False),
            "the mask is applied after the softmax: blocked weights are zeroed, but rows no longer sum to 1": _sdpa_reference(q, k, v, causal, after=True),
            "the bool mask is added as numbers (0/1) instead of blocking with -inf": _sdpa_reference(q, k, v, causal, as_numbers=True),
            "the scale 1/sqrt(d_k) is missing": _sdpa_reference(q, k, v, causal, scale=False),
        },
    )
    result = scaled_dot_product_attention(q, k, v, mask=causal, return_weights=True)
    if not (isinstance(result, tuple) and len(result) == 2):
        raise course.CheckFailed(f"with return_weights=True, return (output, weights); got {course.describe(result)}")
    expected_weights = torch.softmax((q @ k.transpose(-2, -1) / 2.0).masked_fill(~causal, float("-inf")), dim=-1)
    course.expect_close(result[1], expected_weights, "the weights returned with return_weights=True")
    bias = torch.tensor([0.0, -1.0, -2.0, -3.0, -4.0])  # an additive bias: later keys are penalized
    course.expect_close(
        scaled_dot_product_attention(q, k, v, bias=bias), F.scaled_dot_product_attention(q, k, v, attn_mask=bias),
        "scaled_dot_product_attention with a bias", mistakes={"the bias is ignored: add it to the scores": _sdpa_reference(q, k, v)},
    )
    blocked = causal.clone()
    blocked[2] = False  # query 2 may attend to no key at all
    out = scaled_dot_product_attention(q, k, v, mask=blocked)
    if isinstance(out, torch.Tensor) and not torch.isfinite(out).all():
        raise course.CheckFailed("a query whose every key is blocked gave NaN: its row of scores is all -inf and the softmax "
                                 "divides 0 by 0. Find such rows (torch.isneginf(scores).all(-1, keepdim=True)) and give "
                                 "them zero weights")
    expected = _sdpa_reference(q, k, v, causal).index_fill(1, torch.tensor([2]), 0.0)
    course.expect_close(out, expected, "scaled_dot_product_attention with a fully blocked query (row 2 must be zeros)")
    course.expect_close(scaled_dot_product_attention(q, k, v, mask=torch.zeros(5, 5).masked_fill(~blocked, float("-inf"))),
                        expected, "the same with a float mask (row 2 all -inf) must give zeros too",
                        hint="look for rows of -inf in the scores after the mask is added, whatever its dtype")
    course.expect_raises(ValueError, scaled_dot_product_attention, q, k, v, mask=torch.ones(5, 4, dtype=torch.bool),
                         what="scaled_dot_product_attention with a (5, 4) mask for 5 queries and 5 keys",
                         mistakes={"the mask's shape is not checked: call check_mask_shape(mask, scores.shape, 'mask')": RuntimeError})


check_scaled_dot_product_attention(scaled_dot_product_attention)
print("scaled_dot_product_attention: visible test passed")

# %%
#| test scaled_dot_product_attention_hidden points=3
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS


def _r(*shape, dtype=torch.float64):
    return torch.randn(*shape, dtype=dtype)


# no mask; q_len != k_len; d_v != d_k; batch and head dimensions
q, k, v = _r(2, 3, 5, 8), _r(2, 3, 7, 8), _r(2, 3, 7, 6)
course.expect_close(scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v),
                    "attention without a mask (2, 3, 5|7, 8)", atol=1e-10)
# random boolean mask (every query keeps at least one key), full shape and broadcast shape
mask = torch.rand(2, 3, 5, 7) < 0.5
mask[..., 2] = True
course.expect_close(scaled_dot_product_attention(q, k, v, mask=mask), F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                    "attention with a random bool mask", atol=1e-10)
mask2 = torch.rand(5, 7) < 0.5
mask2[:, 0] = True
course.expect_close(scaled_dot_product_attention(q, k, v, mask=mask2), F.scaled_dot_product_attention(q, k, v, attn_mask=mask2),
                    "attention with a (q_len, k_len) bool mask broadcast over batch and heads", atol=1e-10)
# float (additive) mask with finite values and -inf
fmask = _r(1, 3, 5, 7).masked_fill(torch.rand(1, 3, 5, 7) < 0.3, float("-inf"))
fmask[..., 0] = 0.0
course.expect_close(scaled_dot_product_attention(q, k, v, mask=fmask), F.scaled_dot_product_attention(q, k, v, attn_mask=fmask),
                    "attention with an additive float mask", atol=1e-10)
# causal, float32
q32, k32, v32 = _r(3, 2, 9, 16, dtype=torch.float32), _r(3, 2, 9, 16, dtype=torch.float32), _r(3, 2, 9, 16, dtype=torch.float32)
course.expect_close(scaled_dot_product_attention(q32, k32, v32, mask=torch.ones(9, 9, dtype=torch.bool).tril()),
                    F.scaled_dot_product_attention(q32, k32, v32, is_causal=True), "causal attention, float32", atol=1e-5)
# a bias (ALiBi-like, one per head) is added to the scores, with and without a mask
bias = -0.5 * (torch.arange(7) - torch.arange(5)[:, None]).abs().double() * torch.tensor([0.5, 0.25, 1.0]).double()[:, None, None]
course.expect_close(scaled_dot_product_attention(q, k, v, bias=bias), F.scaled_dot_product_attention(q, k, v, attn_mask=bias),
                    "attention with a bias", atol=1e-10)
course.expect_close(scaled_dot_product_attention(q, k, v, mask=mask, bias=bias),
                    F.scaled_dot_product_attention(q, k, v, attn_mask=bias.masked_fill(~mask, float("-inf"))),
                    "attention with a bias and a bool mask", atol=1e-10)
# return_weights: the weights reproduce the output, rows sum to 1, blocked keys get 0
out, weights = scaled_dot_product_attention(q, k, v, mask=mask, return_weights=True)
course.expect_close(weights @ v, out, "weights @ v equals the output", atol=1e-10)
course.expect_close(weights.sum(-1), torch.ones(2, 3, 5, dtype=torch.float64), "every row of weights sums to 1", atol=1e-10)
assert (weights[~mask.expand_as(weights)] == 0).all(), "blocked keys must get weight exactly 0"
# a fully blocked query row gives zeros, never NaN (bool and float masks)
mask3 = torch.ones(5, 7, dtype=torch.bool)
mask3[1] = False
out, weights = scaled_dot_product_attention(q, k, v, mask=mask3, return_weights=True)
assert torch.isfinite(out).all() and torch.isfinite(weights).all(), "a fully masked row produced NaN or inf"
assert (out[:, :, 1] == 0).all() and (weights[:, :, 1] == 0).all(), "a fully masked row must give zero weights and zero output"
course.expect_close(out[:, :, [0, 2, 3, 4]], F.scaled_dot_product_attention(q, k, v)[:, :, [0, 2, 3, 4]],
                    "the other rows are unaffected by a fully masked row", atol=1e-10)
fmask3 = torch.zeros(5, 7, dtype=torch.float64)
fmask3[3] = float("-inf")
out = scaled_dot_product_attention(q, k, v, mask=fmask3)
assert torch.isfinite(out).all() and (out[:, :, 3] == 0).all(), "a row of -inf in a float mask must give a zero output"
# large scores do not overflow
big = 100 * _r(1, 1, 6, 32, dtype=torch.float32)
out = scaled_dot_product_attention(big, big, big)
assert torch.isfinite(out).all(), "attention gave NaN or inf for large scores"
course.expect_close(out, F.scaled_dot_product_attention(big, big, big), "attention with large scores", atol=1e-3)
# a mask of the wrong shape is a ValueError
for wrong in (torch.ones(5, 6, dtype=torch.bool), torch.ones(4, 3, 5, 7, dtype=torch.bool)):
    course.expect_raises(ValueError, scaled_dot_product_attention, q, k, v, mask=wrong,
                         what="a mask whose shape does not fit the scores")
### END HIDDEN TESTS

# %%
attend = course.keep_going("scaled_dot_product_attention", scaled_dot_product_attention,
                           reference_attention.scaled_dot_product_attention, check_scaled_dot_product_attention)

# %% [markdown]
# PyTorch ships the same function, `F.scaled_dot_product_attention`, which picks a fused
# kernel when it can (chapter 10 writes one). Same inputs, same outputs:

# %%
q, k, v = torch.randn(2, 4, 10, 16), torch.randn(2, 4, 10, 16), torch.randn(2, 4, 10, 16)
padding = torch.rand(2, 1, 1, 10) < 0.8
padding[..., 0] = True
for name, mask, reference in [
    ("no mask", None, F.scaled_dot_product_attention(q, k, v)),
    ("causal", causal_mask(10), F.scaled_dot_product_attention(q, k, v, is_causal=True)),
    ("key padding", padding, F.scaled_dot_product_attention(q, k, v, attn_mask=padding)),
]:
    print(f"{name:12s}: largest difference from F.scaled_dot_product_attention "
          f"{(attend(q, k, v, mask=mask) - reference).abs().max().item():.1e}")

# %% [markdown]
# ## Why divide by the square root of d_k
#
# Take a query and a key whose $d_k$ components are independent, with mean 0 and
# variance 1 (what a freshly initialized layer produces, roughly). Their dot product is a
# sum of $d_k$ independent terms $q_m k_m$, each with mean 0 and variance
# $\mathbb{E}[q_m^2]\,\mathbb{E}[k_m^2] = 1$, so
#
# $$\operatorname{Var}(q \cdot k) = \sum_{m=1}^{d_k} \operatorname{Var}(q_m k_m) = d_k,
# \qquad \operatorname{Var}\!\left(\frac{q \cdot k}{\sqrt{d_k}}\right) = 1.$$
#
# The scores' spread grows like $\sqrt{d_k}$: at $d_k = 64$ (GPT-2's heads) a typical
# score is 8 times larger than at $d_k = 1$, and the softmax figure above showed what
# factors of 4 and 16 do. Dividing by $\sqrt{d_k}$ keeps the scores at unit variance, whatever
# the width. Measured:

# %%
#| stable
g = torch.Generator().manual_seed(0)
print(f"{'d_k':>6s} {'Var(q.k)':>10s} {'Var(q.k / sqrt(d_k))':>22s}")
for d_k in (4, 16, 64, 256, 1024):
    q, k = torch.randn(10_000, d_k, generator=g), torch.randn(10_000, d_k, generator=g)
    dots = (q * k).sum(-1)
    print(f"{d_k:6d} {dots.var().item():10.1f} {(dots / math.sqrt(d_k)).var().item():22.3f}")

# %% [markdown]
# Why do large scores hurt? Through the gradient. The softmax's Jacobian is
# $\partial p_i / \partial s_j = p_i(\delta_{ij} - p_j)$. When one weight is close to 1 and
# the rest close to 0 (a *saturated* softmax), every entry is close to 0: almost no
# gradient reaches that query's scores, and so almost none reaches its query, its keys,
# and through them $W_Q$ and $W_K$. What $W_Q$ receives is the gradient at the queries
# ($q = W_Q x$), and by the chain rule it is the gradient at the scores times the keys:
#
# $$\frac{\partial L}{\partial q_i} = \frac{1}{c} \sum_j \frac{\partial L}{\partial s_{ij}}\, k_j,
# \qquad s_{ij} = \frac{q_i \cdot k_j}{c}, \quad c = \sqrt{d_k} \text{ with the scale, } 1 \text{ without}.$$
#
# Without the scale two effects compete as $d_k$ grows: the keys get longer (their norm is
# about $\sqrt{d_k}$), and the softmax saturates. The experiment: 512 queries (128 in
# quick mode) against 64 keys, random unit-variance vectors, the attention output pushed
# back with a random upstream gradient; we record how often a query's softmax is
# saturated (largest weight above 0.99), and the size of the gradient at the scores and
# at the queries, with and without the scale.

# %%
def saturation_experiment(d_k: int, scaled: bool, generator: torch.Generator, n_queries: int = 512, n_keys: int = 64):
    """Variance of the scores, fraction of saturated softmax rows, median gradient norms at the scores and the queries."""
    q, k = torch.randn(n_queries, d_k, generator=generator), torch.randn(n_keys, d_k, generator=generator)
    v, upstream = torch.randn(n_keys, 16, generator=generator), torch.randn(n_queries, 16, generator=generator)
    q.requires_grad_(True)
    scores = q @ k.T / (math.sqrt(d_k) if scaled else 1.0)
    scores.retain_grad()  # keep the gradient at this intermediate tensor too
    weights = stable_softmax(scores, dim=-1)
    (weights @ v * upstream).sum().backward()
    saturated = (weights.max(dim=-1).values > 0.99).float().mean().item()
    return (scores.var().item(), saturated, scores.grad.norm(dim=-1).median().item(),
            q.grad.norm(dim=-1).median().item())


widths = [4, 16, 64, 256, 1024, 4096]
g = torch.Generator().manual_seed(1)
n_queries = 128 if course.QUICK else 512
results = {scaled: [saturation_experiment(d, scaled, g, n_queries) for d in widths] for scaled in (False, True)}

fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
for scaled, style, label in ((False, "o-", "q·k (no scale)"), (True, "s-", "q·k / √d_k")):
    axes[0].loglog(widths, [var for var, _, _, _ in results[scaled]], style, label=label)
    axes[1].semilogx(widths, [100 * sat for _, sat, _, _ in results[scaled]], style, label=label)
    axes[2].loglog(widths, [grad_q for _, _, _, grad_q in results[scaled]], style, label=label)
axes[0].set_ylabel("variance of the scores")
axes[1].set_ylabel("queries with a saturated softmax (%)")
axes[2].set_ylabel("median gradient norm at the queries")
for ax, title in zip(axes, ("Scores grow with d_k", "…so the softmax saturates", "…and W_Q's gradient depends on d_k")):
    ax.set_xlabel("d_k (width of a head)")
    ax.set_title(title)
    ax.legend(fontsize=8)
plt.tight_layout()
plt.show()
print("no scale vs scale:")
for d, (_, s0, g0, q0), (_, s1, g1, q1) in zip(widths, results[False], results[True]):
    print(f"d_k = {d:4d}: saturated {100 * s0:5.1f}% vs {100 * s1:4.1f}%; gradient at the scores {g0:.1e} vs {g1:.1e}; "
          f"at the queries {q0:.1e} vs {q1:.1e}")

# %% [markdown]
# Without the scale, the share of saturated queries climbs with the width: about one in
# five at $d_k = 64$, half at 256, more than two thirds at 1024. The gradient at the scores
# falls with it, by seven orders of magnitude at $d_k = 4096$. The gradient that reaches
# the queries, and so $W_Q$, tells a subtler story (right panel): up to $d_k = 64$ the
# longer keys win and the unscaled queries get a few times *more* gradient than the scaled
# ones (about 4 times at 64); from $d_k \approx 256$ on the saturation wins and the
# gradient collapses, by about five orders of magnitude at 4096. With the scale, all three
# panels are flat.
#
# So the scale does not rescue GPT-2-sized heads from a dead gradient; at $d_k = 64$ an
# unscaled model still learns (with a fifth of its queries saturated). What the
# $\sqrt{d_k}$ in "Scaled Dot-Product" buys is *width independence*: the scores keep unit
# variance, the softmax stays in its sensitive range, and the gradient has the same size
# at initialization whatever the head width, so one initialization and one learning rate
# work for narrow and wide heads alike. Without it the gradient is too large at one width
# and vanishes at another. (Why $\sqrt{d_k}$ and not $d_k$? $\sqrt{d_k}$ is exactly what
# cancels the growth of the *standard deviation*; dividing by $d_k$ would shrink the scores
# towards 0 and every softmax towards uniform.)
#
# ### Written question 1
#
# $W_Q$ and $W_K$ are learned. A model without the $1/\sqrt{d_k}$ factor could, in
# principle, learn weights $\sqrt{d_k}$ times smaller and compute exactly the same
# function. Why is the fixed scale still worth having? Answer in three to five sentences,
# using the measurements above.

# %% [markdown]
# #| written why_scale_by_sqrt_dk points=2
# ### BEGIN SOLUTION
# *Model answer.* The two parameterizations can represent the same functions, but
# training has to reach them from the initialization, and without the scale the model
# starts with scores of variance $d_k$. Saturated rows pass almost no gradient: in the
# measurement a fifth of the queries are saturated at $d_k = 64$, half at 256, and from
# $d_k \approx 1024$ on the gradient reaching the queries (and $W_Q$) is orders of
# magnitude smaller, so wide heads would have to shrink $W_Q$ and $W_K$ through a region
# where they hardly learn. At small widths the opposite happens (the unscaled gradient is
# several times larger), so without the scale the right initialization and learning rate
# depend on $d_k$; a smaller initialization could fix one width but must be retuned for
# every other. The fixed scale makes the scores' variance, the softmax's regime and the
# gradient's size independent of the width, so one initialization and one learning rate
# work across model sizes. It also keeps the scores in a range where float16/bfloat16
# arithmetic is safe.
#
# *Grading:* 1 point for the optimization argument (saturated softmax rows pass almost
# no gradient; for wide heads the gradient reaching $W_Q$, $W_K$ collapses at
# initialization); 1 point for the width-independence argument (the gradient's size and
# the right initialization or learning rate would depend on $d_k$) or the numerical-range
# argument. An answer claiming that GPT-2-sized heads ($d_k = 64$) could not learn at all
# without the scale contradicts the measurement: no point for that part.
# ### END SOLUTION

# %% [markdown]
# ## Multi-head attention
#
# One attention computes one set of weights per query: each token can look in one
# blended direction. **Multi-head attention** runs $h$ attentions side by side, each in
# its own subspace of width $d_k = d/h$, so one head can follow the previous token while
# another looks for the subject of the sentence:
#
# $$\operatorname{head}_i = \operatorname{Attention}(Q_i, K_i, V_i), \qquad
# \operatorname{MHA}(X) = \operatorname{Concat}(\operatorname{head}_1, \dots, \operatorname{head}_h)\, W_O^\top,$$
#
# where $Q_i$ is the slice of columns $i d_k \dots (i+1) d_k - 1$ of $Q = X W_Q^\top$ (and
# likewise $K_i$, $V_i$). The cost is the same as one attention of width $d$: the heads
# split the width, they do not multiply it.
#
# In code nothing loops over heads. One matrix product computes Q, K and V for every head
# at once (a *fused* projection, $W_{QKV} \in \mathbb{R}^{3d \times d}$); the result is cut
# into Q, K and V, each reshaped so that the heads become a batch dimension, and
# attention runs on `(batch, heads, seq, head_dim)` tensors. At the end the heads are
# merged back into `(batch, seq, d)` for $W_O$.
#
# The reshape is where heads get mixed up. The last axis of `(batch, seq, d)` holds head
# 0's features, then head 1's, and so on. `view(batch, seq, heads, head_dim)` cuts it
# exactly there; `transpose(1, 2)` then moves the head axis in front of the sequence.
# Reshaping straight to `(batch, heads, seq, head_dim)` keeps the numbers in memory order
# and so cuts the *sequence* into pieces: "head 0" then holds the first few tokens, all
# features. The shapes are right and the values wrong, and nothing fails.
#
# ### Exercise 3 · Split and merge heads
#
# Implement `split_heads(x, n_heads)`: `(batch, seq, n_heads * head_dim)` →
# `(batch, n_heads, seq, head_dim)`, where head $h$ holds features
# `h * head_dim : (h + 1) * head_dim` of every position; a width that `n_heads` does not
# divide is a `ValueError`. And `merge_heads(x)`, its inverse.
#
# Difficulty ●●○ · Importance ●●● · about 12 minutes
#
# <details><summary>Hint 1</summary>Two steps each way: split the last axis into <code>(n_heads, head_dim)</code>, then swap the sequence and head axes.</details>
# <details><summary>Hint 2</summary>After <code>transpose</code> the tensor is not contiguous in memory: <code>view</code> refuses it, <code>reshape</code> copies when it must.</details>
# <details><summary>Hint 3</summary><code>x.reshape(batch, seq, n_heads, width // n_heads).transpose(1, 2)</code>, and back: <code>x.transpose(1, 2).reshape(batch, seq, n_heads * head_dim)</code>.</details>

# %%
#| answer split_heads
#| export minillm/attention.py
def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(batch, seq, n_heads * head_dim) → (batch, n_heads, seq, head_dim).

    Head h holds features h * head_dim : (h + 1) * head_dim of every position.
    ``ValueError`` when x is not 3-dimensional or n_heads does not divide its width.
    """
    ### BEGIN SOLUTION
    if x.dim() != 3:
        raise ValueError(f"x must have shape (batch, seq, width), got {tuple(x.shape)}")
    batch, seq, width = x.shape
    if not isinstance(n_heads, int) or n_heads < 1 or width % n_heads:
        raise ValueError(f"n_heads must be a positive int dividing the width {width}, got {n_heads!r}")
    return x.reshape(batch, seq, n_heads, width // n_heads).transpose(1, 2)
    ### END SOLUTION


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(batch, n_heads, seq, head_dim) → (batch, seq, n_heads * head_dim), the inverse of ``split_heads``."""
    ### BEGIN SOLUTION
    if x.dim() != 4:
        raise ValueError(f"x must have shape (batch, n_heads, seq, head_dim), got {tuple(x.shape)}")
    batch, n_heads, seq, head_dim = x.shape
    return x.transpose(1, 2).reshape(batch, seq, n_heads * head_dim)
    ### END SOLUTION

# %%
#| test split_heads_visible points=1
def _heads_case():
    return torch.arange(2 * 3 * 8, dtype=torch.float32).reshape(2, 3, 8)  # batch 2, seq 3, width 8


@course.visible_check("split_heads")
def check_split_heads(split_heads):
    x = _heads_case()
    expected = torch.stack([x[:, :, 0:4], x[:, :, 4:8]], dim=1)  # 2 heads of width 4: (2, 2, 3, 4)
    course.expect_close(
        split_heads(x, 2), expected, "split_heads(x, n_heads=2)",
        mistakes={
            "heads mixed up: reshaped to (batch, heads, seq, head_dim) without the transpose, "
            "so each 'head' holds pieces of several positions": x.reshape(2, 2, 3, 4),
            "heads mixed up: the width was split as (head_dim, n_heads), so head h holds every n_heads-th "
            "feature instead of a contiguous block": x.reshape(2, 3, 4, 2).permute(0, 3, 1, 2),
        },
        hint="the result has shape (batch, n_heads, seq, head_dim)",
    )
    course.expect_raises(ValueError, split_heads, _heads_case(), 3, what="split_heads(x of width 8, n_heads=3)",
                         mistakes={"3 heads do not divide a width of 8: check it and raise ValueError (an assert is not "
                                   "an error message, and reshape's RuntimeError does not name n_heads)": (AssertionError, RuntimeError)})


@course.visible_check("merge_heads")
def check_merge_heads(merge_heads):
    heads = torch.arange(2 * 2 * 3 * 4, dtype=torch.float32).reshape(2, 2, 3, 4)
    course.expect_close(
        merge_heads(heads), torch.cat([heads[:, 0], heads[:, 1]], dim=-1), "merge_heads",
        mistakes={"heads mixed up: reshaped to (batch, seq, width) without moving the head axis back first": heads.reshape(2, 3, 8)},
        hint="the result has shape (batch, seq, n_heads * head_dim)",
    )
    x = _heads_case()
    split = x.unflatten(-1, (4, 2)).transpose(1, 2)  # 4 heads of width 2, as split_heads makes them: not contiguous
    try:
        got = merge_heads(split)
    except RuntimeError as error:
        raise course.CheckFailed(f"merge_heads fails on heads that split_heads made ({str(error)[:60]}): after the "
                                 "transpose they are not contiguous, so use reshape, not view") from error
    course.expect_close(got, x, "merge_heads of split heads must give x back")


check_split_heads(split_heads)
check_merge_heads(merge_heads)
course.expect_close(merge_heads(split_heads(_heads_case(), 4)), _heads_case(), "merge_heads(split_heads(x, 4)) must give x back")
print("split_heads and merge_heads: visible test passed")

# %%
#| test split_heads_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
for batch, seq, n_heads, head_dim, dtype in [(3, 5, 4, 6, torch.float32), (1, 1, 1, 8, torch.float64),
                                             (2, 7, 8, 1, torch.float32), (4, 2, 3, 5, torch.float16)]:
    wide = torch.randn(batch, seq, 3 * n_heads * head_dim).to(dtype)
    x = wide[..., n_heads * head_dim: 2 * n_heads * head_dim]  # a slice of a fused projection: not contiguous
    got = split_heads(x, n_heads)
    assert isinstance(got, torch.Tensor) and got.shape == (batch, n_heads, seq, head_dim), \
        "split_heads returned the wrong shape: it should be (batch, n_heads, seq, head_dim)"
    for h in range(n_heads):
        assert torch.equal(got[:, h], x[..., h * head_dim:(h + 1) * head_dim]), "a head does not hold its own features"
    assert torch.equal(merge_heads(got), x), "merge_heads(split_heads(x)) must equal x"
    y = torch.randn(batch, n_heads, seq, head_dim).to(dtype)
    assert torch.equal(merge_heads(y), torch.cat(list(y.unbind(1)), dim=-1)), "merge_heads must concatenate heads in order"
    assert torch.equal(split_heads(merge_heads(y), n_heads), y), "split_heads(merge_heads(y)) must equal y"
# the heads of split_heads feed attention exactly as torch.nn.MultiheadAttention splits them
d, h = 12, 3
mha = torch.nn.MultiheadAttention(d, h, batch_first=True, bias=False)
x = torch.randn(2, 6, d)
w_q, w_k, w_v = mha.in_proj_weight.detach().chunk(3)
heads = F.scaled_dot_product_attention(split_heads(x @ w_q.T, h), split_heads(x @ w_k.T, h), split_heads(x @ w_v.T, h))
course.expect_close(merge_heads(heads) @ mha.out_proj.weight.detach().T, mha(x, x, x, need_weights=False)[0].detach(),
                    "attention built from split_heads/merge_heads matches nn.MultiheadAttention", atol=1e-5)
# a width that the heads do not divide is an error
course.expect_raises(ValueError, split_heads, torch.zeros(1, 2, 10), 4, what="split_heads with width 10 and 4 heads")
### END HIDDEN TESTS

# %%
split = course.keep_going("split_heads", split_heads, reference_attention.split_heads, check_split_heads)
merge = course.keep_going("merge_heads", merge_heads, reference_attention.merge_heads, check_merge_heads)

# %% [markdown]
# With `split_heads`, `merge_heads` and attention, multi-head attention is five lines.
# Here it runs with the weights of PyTorch's `torch.nn.MultiheadAttention`, which stores
# $W_Q$, $W_K$, $W_V$ stacked as one `(3d, d)` matrix, `in_proj_weight`: one fused
# product computes Q, K and V for every head. (Its boolean masks mean *blocked*, the
# opposite of ours, so it gets `~mask`.)

# %%
d_model, n_heads = 32, 4
torch_mha = torch.nn.MultiheadAttention(d_model, n_heads, batch_first=True)
W_qkv, b_qkv = torch_mha.in_proj_weight.detach(), torch_mha.in_proj_bias.detach()
W_o, b_o = torch_mha.out_proj.weight.detach(), torch_mha.out_proj.bias.detach()

x = torch.randn(3, 7, d_model)
q, k, v = (x @ W_qkv.T + b_qkv).split(d_model, dim=-1)  # one matrix product for Q, K and V
heads = attend(split(q, n_heads), split(k, n_heads), split(v, n_heads), mask=causal_mask(7))  # (3, 4, 7, 8)
out = merge(heads) @ W_o.T + b_o
with torch.no_grad():
    expected, _ = torch_mha(x, x, x, attn_mask=~causal_mask(7), need_weights=False)
print(f"heads: {tuple(heads.shape)}; largest difference from nn.MultiheadAttention: {(out - expected).abs().max().item():.1e}")

# %% [markdown]
# ## Grouped-query attention
#
# At generation time the cache holds, for every layer, the keys and values of every
# earlier token: $2 \times n_{\text{layers}} \times \text{seq} \times n_{\text{heads}} \times
# d_k$ numbers per sequence. For large models at long contexts this cache outgrows the
# model's weights, and reading it at every step, not the arithmetic, limits the speed of
# decoding.
#
# Two variants shrink it by letting several query heads share one key/value head:
#
# - **multi-query attention** (MQA, Shazeer 2019): all query heads share a single K/V head;
# - **grouped-query attention** (GQA, Ainslie et al. 2023): $n_{kv}$ K/V heads, each
#   shared by a group of $n_{\text{heads}} / n_{kv}$ consecutive query heads. $n_{kv} = n_{\text{heads}}$
#   is ordinary multi-head attention, $n_{kv} = 1$ is MQA. Llama 2 70B uses 8 K/V heads for
#   64 query heads.
#
# The queries are never cached (each is used once, when its token is processed), so
# sharing *keys and values* is what saves memory. In the computation, the K/V heads are
# repeated to match the query heads, and attention runs as before: query head $h$ uses
# K/V head $\lfloor h / r \rfloor$, with $r = n_{\text{heads}} / n_{kv}$.
#
# ### Exercise 4 · Repeat the key/value heads
#
# Implement `repeat_kv(x, n_rep)`: `(batch, n_kv_heads, seq, head_dim)` →
# `(batch, n_kv_heads * n_rep, seq, head_dim)`, each K/V head repeated `n_rep` times
# *consecutively*, so the result's head $h$ is the input's head $\lfloor h / r \rfloor$ (for 2 K/V
# heads and `n_rep=3`: heads 0, 0, 0, 1, 1, 1). `n_rep` below 1 is a `ValueError`.
#
# Difficulty ●○○ · Importance ●●○ · about 8 minutes
#
# <details><summary>Hint 1</summary>Compare <code>torch.tensor([0, 1]).repeat(3)</code> with <code>torch.tensor([0, 1]).repeat_interleave(3)</code>: only one gives 0, 0, 0, 1, 1, 1.</details>
# <details><summary>Hint 2</summary><code>x.repeat_interleave(n_rep, dim=1)</code> works. Without a copy: <code>x[:, :, None].expand(batch, n_kv, n_rep, seq, head_dim)</code>, then reshape.</details>

# %%
#| answer repeat_kv
#| export minillm/attention.py
def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(batch, n_kv_heads, seq, head_dim) → (batch, n_kv_heads * n_rep, seq, head_dim).

    Head h of the result is head h // n_rep of x: each key/value head serves a group of
    n_rep consecutive query heads. ``ValueError`` when n_rep < 1.
    """
    ### BEGIN SOLUTION
    if not isinstance(n_rep, int) or n_rep < 1:
        raise ValueError(f"n_rep must be a positive int, got {n_rep!r}")
    if n_rep == 1:
        return x
    batch, n_kv_heads, seq, head_dim = x.shape
    return x[:, :, None].expand(batch, n_kv_heads, n_rep, seq, head_dim).reshape(batch, n_kv_heads * n_rep, seq, head_dim)
    ### END SOLUTION

# %%
#| test repeat_kv_visible points=1
def _kv_case():
    return torch.arange(1 * 2 * 3 * 2, dtype=torch.float32).reshape(1, 2, 3, 2)  # 2 K/V heads


@course.visible_check("repeat_kv")
def check_repeat_kv(repeat_kv):
    x = _kv_case()
    course.expect_close(
        repeat_kv(x, 3), torch.stack([x[:, 0], x[:, 0], x[:, 0], x[:, 1], x[:, 1], x[:, 1]], dim=1), "repeat_kv(x, n_rep=3)",
        mistakes={"the K/V heads are tiled (0, 1, 0, 1, 0, 1) instead of repeated consecutively (0, 0, 0, 1, 1, 1): "
                  "query head h must use K/V head h // n_rep, so groups are consecutive": x.repeat(1, 3, 1, 1)},
        hint="the result has shape (batch, n_kv_heads * n_rep, seq, head_dim)",
    )
    course.expect_close(repeat_kv(x, 1), x, "repeat_kv(x, n_rep=1) must return x unchanged")
    course.expect_raises(ValueError, repeat_kv, x, 0, what="repeat_kv(x, n_rep=0)",
                         hint="n_rep below 1 makes no sense (repeat_interleave(0) silently returns zero heads): raise ValueError")


check_repeat_kv(repeat_kv)
print("repeat_kv: visible test passed")

# %%
#| test repeat_kv_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
for shape, n_rep, dtype in [((2, 4, 5, 3), 2, torch.float32), ((1, 1, 7, 8), 8, torch.float64), ((3, 3, 1, 4), 4, torch.float16)]:
    x = torch.randn(*shape).to(dtype)
    got = repeat_kv(x, n_rep)
    assert isinstance(got, torch.Tensor) and got.dtype == dtype, "repeat_kv must keep the dtype"
    course.expect_close(got, x.repeat_interleave(n_rep, dim=1), "repeat_kv", atol=0, rtol=0)
# GQA through repeat_kv equals PyTorch's own grouped-query attention
q, k, v = torch.randn(2, 8, 6, 4), torch.randn(2, 2, 6, 4), torch.randn(2, 2, 6, 4)
course.expect_close(F.scaled_dot_product_attention(q, repeat_kv(k, 4), repeat_kv(v, 4), is_causal=True),
                    F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                    "attention with repeat_kv equals F.scaled_dot_product_attention(enable_gqa=True)", atol=1e-6)
for bad in (0, -2):
    course.expect_raises(ValueError, repeat_kv, k, bad, what="repeat_kv with an n_rep that is not valid")
### END HIDDEN TESTS

# %%
repeat = course.keep_going("repeat_kv", repeat_kv, reference_attention.repeat_kv, check_repeat_kv)

# %% [markdown]
# ### Exercise 5 · How much memory does the KV cache take?
#
# Implement `kv_cache_bytes(config, batch_size, seq_len, bytes_per_element=2)`: the bytes
# of a decoder's KV cache holding `seq_len` tokens for each of `batch_size` sequences. Every
# layer stores a key and a value for every token and every **K/V** head
# (`config.n_kv_heads`), each `config.head_dim` numbers of `bytes_per_element` bytes
# (2 for float16 and bfloat16). Negative sizes are a `ValueError`.
#
# $$\text{bytes} = 2 \times n_{\text{layers}} \times \text{batch} \times \text{seq} \times n_{kv} \times d_k \times \text{bytes per element}.$$
#
# Difficulty ●○○ · Importance ●●○ · about 6 minutes
#
# <details><summary>Hint 1</summary>The leading 2 counts the keys and the values.</details>
# <details><summary>Hint 2</summary><code>config.n_kv_heads</code> is already <code>n_heads</code> for a model without GQA, so one formula serves all.</details>

# %%
#| answer kv_cache_bytes
#| export minillm/attention.py
def kv_cache_bytes(config, batch_size: int, seq_len: int, bytes_per_element: int = 2) -> int:
    """Bytes of a decoder's KV cache: keys and values of ``seq_len`` tokens in every layer.

    config: a ``minillm.config.ModelConfig`` (uses n_layers, n_kv_heads, head_dim).
    Equals 2 * n_layers * batch_size * seq_len * n_kv_heads * head_dim * bytes_per_element.
    """
    ### BEGIN SOLUTION
    for name, value in (("batch_size", batch_size), ("seq_len", seq_len), ("bytes_per_element", bytes_per_element)):
        non_negative_int(name, value)
    per_token = 2 * config.n_layers * config.n_kv_heads * config.head_dim * bytes_per_element
    return batch_size * seq_len * per_token
    ### END SOLUTION

# %%
#| test kv_cache_bytes_visible points=1
def _llama2_70b():
    return ModelConfig(name="llama-2-70b", vocab_size=32000, context_length=4096, d_model=8192, n_layers=80, n_heads=64,
                       n_kv_heads=8, d_ff=28672, positions="rope", norm="rmsnorm", ffn="swiglu", bias=False, tie_embeddings=False)


_LLAMA2_70B_CACHE = 2 * 80 * 1 * 4096 * 8 * 128 * 2  # bytes: 2 (K, V) x layers x batch x seq x n_kv x d_k x 2


@course.visible_check("kv_cache_bytes")
def check_kv_cache_bytes(kv_cache_bytes):
    expected = _LLAMA2_70B_CACHE
    course.expect_equal(
        kv_cache_bytes(_llama2_70b(), 1, 4096), expected, "kv_cache_bytes(Llama-2-70B, batch 1, 4096 tokens)",
        mistakes={
            "half the bytes: only keys or only values counted (the factor 2 is missing), or bytes_per_element "
            "ignored (that counts numbers, not bytes)": expected // 2,
            "n_heads used instead of n_kv_heads: the query heads are not cached, only the K/V heads": expected * 8,
            "the layers are missing: every layer has its own cache": expected // 80,
        },
    )
    per_sequence = 2 * 80 * 1000 * 8 * 128
    course.expect_equal(
        kv_cache_bytes(_llama2_70b(), 3, 1000, bytes_per_element=4), 3 * per_sequence * 4,
        "kv_cache_bytes(Llama-2-70B, batch 3, 1000 tokens, bytes_per_element=4)",
        mistakes={
            "batch_size ignored: every sequence of the batch has its own cache": per_sequence * 4,
            "bytes_per_element ignored: 2 bytes assumed whatever the argument says": 3 * per_sequence * 2,
            "bytes_per_element ignored (this counts numbers, not bytes)": 3 * per_sequence,
        },
    )
    course.expect_raises(ValueError, kv_cache_bytes, _llama2_70b(), 1, -4096, what="kv_cache_bytes with seq_len=-4096")


check_kv_cache_bytes(kv_cache_bytes)
print(f"kv_cache_bytes: visible test passed ({_LLAMA2_70B_CACHE / 2**30:.2f} GiB)")

# %%
#| test kv_cache_bytes_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
def _meta_cache_bytes(cfg, batch, seq, dtype):
    """An independent count: allocate the cache on the meta device and add up its bytes."""
    shape = (batch, cfg.n_kv_heads, seq, cfg.d_model // cfg.n_heads)
    return sum(2 * torch.empty(shape, dtype=dtype, device="meta").nbytes for _ in range(cfg.n_layers))


for cfg, batch, seq, dtype in [
    (ModelConfig(d_model=768, n_layers=12, n_heads=12), 4, 1024, torch.float16),
    (ModelConfig(d_model=4096, n_layers=32, n_heads=32, n_kv_heads=1), 2, 3000, torch.float32),
    (ModelConfig(d_model=96, n_layers=3, n_heads=6, n_kv_heads=3), 5, 17, torch.float64),
    (ModelConfig(d_model=64, n_layers=2, n_heads=4), 3, 0, torch.bfloat16),
]:
    element = torch.empty((), dtype=dtype).element_size()
    course.expect_equal(kv_cache_bytes(cfg, batch, seq, element), _meta_cache_bytes(cfg, batch, seq, dtype),
                        "kv_cache_bytes")
course.expect_equal(kv_cache_bytes(ModelConfig(), 1, 1), 2 * 12 * 768 * 2, "kv_cache_bytes default bytes_per_element is 2")
for batch, seq, element in [(-1, 10, 2), (1, -3, 2), (2, 5, -4)]:
    course.expect_raises(ValueError, kv_cache_bytes, ModelConfig(), batch, seq, element,
                         what="kv_cache_bytes with a batch_size, seq_len or bytes_per_element that is not valid")

### END HIDDEN TESTS

# %%
cache_bytes = course.keep_going("kv_cache_bytes", kv_cache_bytes, reference_attention.kv_cache_bytes, check_kv_cache_bytes)

# %% [markdown]
# What GQA and MQA save, for Llama 2 70B's shape at its full context of 4,096 tokens, in
# bfloat16, against the 138 GB of the weights themselves:

# %%
#| stable
import dataclasses

base = _llama2_70b()
weights_gb = 2 * count_parameters(base) / 1e9
print(f"weights: {count_parameters(base) / 1e9:.1f}B parameters = {weights_gb:.0f} GB in bfloat16")
for n_kv, label in ((64, "MHA (64 K/V heads)"), (8, "GQA (8 K/V heads)"), (1, "MQA (1 K/V head)")):
    cfg = dataclasses.replace(base, n_kv_heads=n_kv)
    per_token = cache_bytes(cfg, 1, 1)
    print(f"{label:20s}: {per_token / 2**20:5.2f} MiB per token; batch 1 × 4,096 tokens: "
          f"{cache_bytes(cfg, 1, 4096) / 1e9:6.2f} GB; batch 32: {cache_bytes(cfg, 32, 4096) / 1e9:7.1f} GB")

# %%
contexts = [2**i for i in range(9, 18)]
fig, ax = plt.subplots(figsize=(7, 4))
for n_kv, label in ((64, "MHA: 64 K/V heads"), (8, "GQA: 8 K/V heads"), (1, "MQA: 1 K/V head")):
    cfg = dataclasses.replace(base, n_kv_heads=n_kv)
    ax.loglog(contexts, [cache_bytes(cfg, 8, n) / 1e9 for n in contexts], "o-", label=label)
ax.axhline(weights_gb, color="0.3", linestyle="--", label="the weights (bfloat16)")
ax.set_xlabel("context length (tokens)")
ax.set_ylabel("KV cache, batch of 8 (GB)")
ax.set_title("Llama 2 70B's shape: KV cache by number of K/V heads")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# With full multi-head attention, the cache of a batch of 8 sequences outgrows the
# weights beyond about 6,600 tokens of context; GQA's 8 K/V heads divide the cache by 8
# (it outgrows the weights beyond about 53,000 tokens), MQA by 64 (it stays below them
# over the whole plot). The price is
# capacity: fewer distinct keys and values per layer. Ainslie et al. found that GQA with 8
# groups keeps almost all of the quality of full multi-head attention, while MQA loses
# some; that is why most open models since 2023 use GQA.
#
# ### Written question 2
#
# Grouped-query attention shares keys and values between query heads, but never shares
# queries. In three to five sentences: why is sharing K/V, not Q, what saves memory during
# generation, and what does the model give up?

# %% [markdown]
# #| written why_share_keys_and_values points=2
# ### BEGIN SOLUTION
# *Model answer.* During generation each new token's query is used once, at that step,
# and then thrown away, while the keys and values of every earlier token are needed again
# at every later step: they are what the KV cache stores, layer by layer. Sharing one K/V
# head among $r$ query heads divides the cache (and the memory traffic of reading it at
# every step, which limits decoding speed) by $r$; sharing queries would save nothing that
# is kept. The cost is expressiveness: heads in a group must attend with their own queries
# over the *same* keys and read the *same* values, so the layer has fewer distinct
# subspaces to retrieve from; with a moderate number of groups (GQA) the measured quality
# loss is small, with a single K/V head (MQA) it is larger.
#
# *Grading:* 1 point for "K/V are cached and reused at every step, queries are not"; 1
# point for a correct cost (less capacity/quality, fewer distinct key/value subspaces).
# ### END SOLUTION

# %% [markdown]
# ## The attention module
#
# All the pieces exist: `scaled_dot_product_attention`, `split_heads` and `merge_heads`,
# `repeat_kv`. This section assembles them into the module every later chapter uses,
# with three hooks for the chapters to come.
#
# ### Attention backends
#
# The same attention can be computed by different kernels: the explicit math of
# Exercise 2, PyTorch's fused `F.scaled_dot_product_attention`, and (chapter 10) a tiled
# FlashAttention. `MultiHeadAttention` looks its kernel up by name in a registry,
# `ATTENTION_BACKENDS`, so a later chapter adds one without patching this module, and a
# model's configuration can name it.
#
# An entry of the registry is a *forward reference*, a string `"module:attribute"` that is
# imported only when the name is looked up. That lets this chapter declare the names of
# kernels that do not exist yet: "flash" and "triton" point into chapter 10's modules, and
# looking them up before chapter 10 is installed says where they come from. (Chapter 05
# meets a second registry and explains why its entries are forward references.)
#
# A backend receives the keys and values *un-repeated*, one head per K/V head, so that a
# kernel written for grouped-query attention reads each K/V head once instead of
# `n_heads / n_kv_heads` copies: the memory traffic GQA exists to save. The "math" backend
# repeats them with your `repeat_kv`; the "sdpa" backend lets PyTorch's kernel share them
# (`enable_gqa=True`). It also receives a `causal` flag rather than a materialized mask, so
# that a kernel can skip blocked tiles instead of reading a mask. With cached keys, causal
# means the queries are the *last* positions: PyTorch's `is_causal=True` aligns the
# triangle to the top-left corner instead, so the "sdpa" backend builds the offset mask
# itself when the lengths differ. The registry's docstring is the contract every backend
# follows.

# %%
#| export minillm/attention.py
AttentionBackend = Callable[..., torch.Tensor]

ATTENTION_BACKENDS = Registry("attention backend")
"""The attention kernels, by name: ``MultiHeadAttention(backend=name)`` calls ``ATTENTION_BACKENDS.get(name)``.

The contract of a backend, the one place it is written (the rest of the package refers here):

    fn(q, k, v, mask=None, causal=False, dropout_p=0.0) -> (batch, n_heads, q_len, head_dim)

- q: (batch, n_heads, q_len, head_dim); k, v: (batch, n_kv_heads, k_len, head_dim), *not*
  repeated: n_kv_heads divides n_heads, and query head h uses K/V head
  h // (n_heads // n_kv_heads) (grouped-query attention; the group size follows from the
  shapes). A backend repeats K/V only if its kernel needs it, so a GQA-aware kernel reads
  each K/V head once.
- mask: None, bool (True = may attend) or float (added to the scores), broadcastable to
  (batch, n_heads, q_len, k_len); ``ValueError`` (``TypeError`` for a dtype) otherwise.
- causal: query i may attend to key j when j <= i + k_len - q_len: the queries are the
  *last* q_len positions, as with a KV cache (torch's ``is_causal`` aligns the triangle
  to the top-left corner instead). With a mask, both apply.
- dropout_p: the probability of dropping an attention weight (0 outside training).
- A query whose every key is masked gets a zero output, never NaN.
- A backend that does not support an argument (a mask, dropout, a head count) raises a
  ``ValueError`` that says so, rather than computing something else.

Entries: "math" and "sdpa" (this chapter); "flash" and "triton", declared here as forward
references into chapter 10's modules.
"""


def register_attention_backend(name: str, fn: AttentionBackend | str, *, replace: bool = False) -> None:
    """Make ``fn`` available as ``MultiHeadAttention(backend=name)``.

    fn: a callable that follows the contract of ``ATTENTION_BACKENDS``, or a forward
    reference "module:attribute". A name that is taken by another entry is a ValueError
    unless ``replace=True``.
    """
    ATTENTION_BACKENDS.register(name, fn, replace=replace)


def get_attention_backend(name: str) -> AttentionBackend:
    """The backend registered as ``name``, resolved now; ``ValueError`` for an unknown name
    (listing the known ones) or for a later chapter's backend this installation lacks."""
    return ATTENTION_BACKENDS.get(name)


def _with_causal(mask: torch.Tensor | None, q_len: int, k_len: int, device) -> torch.Tensor:
    """``mask`` (already checked against the scores' shape) combined with the (offset) causal
    mask of ``q_len`` queries and ``k_len`` keys. A bool mask stays bool; a float mask gets
    -inf where the causal mask forbids."""
    allowed = causal_mask(q_len, device, k_len=k_len)
    if mask is None:
        return allowed
    if mask.dtype == torch.bool:
        return mask & allowed
    return torch.where(allowed, mask, float("-inf"))


def _checked_mask(mask: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``mask`` checked against the scores' shape (batch, n_heads, q_len, k_len) (``ValueError``,
    ``TypeError``), a float mask cast to q's dtype (a float64 bias on a float32 model)."""
    check_mask_shape(mask, torch.Size((*q.shape[:-1], k.shape[-2])), "mask")
    return mask.to(q.dtype) if mask.is_floating_point() else mask


def kv_groups(q: torch.Tensor, k: torch.Tensor) -> int:
    """How many query heads share each K/V head, for q (..., n_heads, q_len, d) and k (..., n_kv_heads,
    k_len, d): n_heads // n_kv_heads. ``ValueError`` naming k and v unless n_kv_heads divides n_heads.
    Every backend checks grouped-query attention's shapes with it (chapter 10's too)."""
    n_heads, n_kv_heads = q.shape[-3], k.shape[-3]
    if n_heads % n_kv_heads:
        raise ValueError(f"k and v have {n_kv_heads} heads, which must divide the {n_heads} query heads")
    return n_heads // n_kv_heads


def math_attention(q, k, v, mask=None, causal=False, dropout_p=0.0):
    """The "math" backend (contract: ``ATTENTION_BACKENDS``), from this chapter's pieces: the
    K/V heads repeated by ``repeat_kv``, then Exercise 2's ``scaled_dot_product_attention``
    when a mask is given, else the scores and ``softmax`` directly; dropout on the weights.

    Without a mask no query is blocked from every key (the causal triangle keeps each
    query's own position), so that path skips the guard against fully masked queries and
    its passes over the scores.
    """
    n_rep = kv_groups(q, k)
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
    q_len, k_len = q.shape[-2], k.shape[-2]
    causal = causal and q_len > 1  # a single query is the last position: it may see every key
    if mask is not None:
        mask = _checked_mask(mask, q, k)
        if causal:
            mask = _with_causal(mask, q_len, k_len, q.device)
        if dropout_p == 0.0:
            return scaled_dot_product_attention(q, k, v, mask=mask)
        weights = scaled_dot_product_attention(q, k, v, mask=mask, return_weights=True)[1]
    else:
        scores = (q / math.sqrt(q.shape[-1])) @ k.transpose(-2, -1)
        if causal:
            scores = scores.masked_fill(~causal_mask(q_len, q.device, k_len=k_len), float("-inf"))
        weights = softmax(scores, dim=-1)
    return (F.dropout(weights, dropout_p) if dropout_p > 0.0 else weights) @ v


def sdpa_attention(q, k, v, mask=None, causal=False, dropout_p=0.0):
    """The "sdpa" backend (contract: ``ATTENTION_BACKENDS``): PyTorch's fused
    ``F.scaled_dot_product_attention``, which shares the K/V heads itself (``enable_gqa``)
    and gives zeros for fully masked queries (PyTorch 2.5 and later).

    Causal attention over as many keys as queries, without a mask, builds no mask: the
    kernel's own ``is_causal`` then means the same.
    """
    gqa = kv_groups(q, k) > 1  # only then: some of torch's kernels do not take enable_gqa
    q_len, k_len = q.shape[-2], k.shape[-2]
    causal = causal and q_len > 1  # a single query is the last position: it may see every key
    if causal and mask is None and q_len == k_len:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, enable_gqa=gqa)
    if mask is not None:
        mask = _checked_mask(mask, q, k)
        if mask.dim() < 2:
            mask = mask.expand(q_len, k_len)  # a (k_len,) or scalar mask: torch wants at least (q_len, k_len)
    if causal:
        mask = _with_causal(mask, q_len, k_len, q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, enable_gqa=gqa)


ATTENTION_BACKENDS.register("math", "minillm.attention:math_attention")
ATTENTION_BACKENDS.register("sdpa", "minillm.attention:sdpa_attention")
ATTENTION_BACKENDS.register("flash", "minillm.flash:flash_backend", chapter="10_flash_attention")
ATTENTION_BACKENDS.register("triton", "minillm.flash_triton:triton_backend", chapter="10_flash_attention")

# %% [markdown]
# The registry lists every name it knows, the declared ones included, without importing
# anything; a lookup imports what the name points to. Until chapter 10 is installed, asking
# for "flash" says where it will come from; once it is (as in the course's own build of
# this notebook), the lookup finds the kernel:

# %%
print(ATTENTION_BACKENDS)
print("math →", get_attention_backend("math").__name__)
try:
    get_attention_backend("flash")
    print("flash → chapter 10's kernel is installed")
except ValueError as error:
    print(f"flash → ValueError: {error}")

# %% [markdown]
# ### The module
#
# `MultiHeadAttention` puts the pieces together. Read `forward` from top to bottom: one
# fused projection, a cut into Q, K and V, `split_heads`, the optional rotary positions
# (chapter 03) on Q and K, the optional cache (chapter 09), which stores the K/V heads
# un-repeated, the backend, `merge_heads`, and the output projection.
#
# The two hooks are documented in the docstring: any callable `rotary(x, positions)`
# works (chapter 03's `RotaryEmbedding` is one), and any object with a method
# `update(k, v) -> (k_all, v_all)` works as a cache (chapter 09's `KVCache` is one).
# `fused_qkv=False` swaps the fused projection for three, `q`, `k` and `v`: the same
# function with the weights copied across, and a clean target for chapter 12's adapters,
# which wrap the query and value projections alone. The module checks its configuration
# once, in the constructor; its `forward` trusts its input, which the model checks once
# at its own entry, so the check is not repeated in every layer at every step.

# %%
#| export minillm/attention.py
class KVCacheLike(Protocol):
    """What ``MultiHeadAttention.forward`` needs from a KV cache (chapter 09 implements one)."""

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new keys and values, (batch, n_kv_heads, new, head_dim); return all of
        them so far, cached first: (batch, n_kv_heads, cached + new, head_dim) each."""
        ...


class MultiHeadAttention(nn.Module):
    """Multi-head self-attention with grouped-query attention and hooks for later chapters.

    d_model: width of the activations. n_heads: query heads; head_dim = d_model // n_heads.
    n_kv_heads: key/value heads, dividing n_heads (default n_heads: multi-head attention;
    1: multi-query; in between: grouped-query). bias: biases on the projections.
    dropout: probability of dropping attention weights while training. backend: a name in
    the attention-backend registry ("math", "sdpa"; chapter 10 adds "flash"). causal: each
    position attends only to itself and earlier positions (cached ones included).
    rotary: None or a callable ``rotary(x, positions) -> x`` applied to the queries and
    keys, x: (batch, heads, seq, head_dim), positions: (seq,); chapter 03's RotaryEmbedding
    module may be passed as it is (its ``rotate`` is used).

    fused_qkv: one Linear for the queries, keys and values (fast), or three (False), so
    that an adapter can wrap the query and value projections alone (chapter 12).

    Parameters: with ``fused_qkv``, ``qkv``, one Linear d_model → (n_heads + 2 n_kv_heads)
    head_dim whose output rows are [W_Q; W_K; W_V] (for n_kv_heads == n_heads, the layout of
    ``nn.MultiheadAttention.in_proj_weight``); without, ``q`` (d_model → d_model) and ``k``,
    ``v`` (d_model → n_kv_heads head_dim), the same three blocks of rows. ``out``, the Linear
    d_model → d_model, is marked as a residual projection (``minillm.markers``).
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None, bias: bool = True,
                 dropout: float = 0.0, backend: str = "math", causal: bool = False, rotary=None,
                 fused_qkv: bool = True):
        super().__init__()
        positive_int("d_model", d_model)
        positive_int("n_heads", n_heads)
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        n_kv_heads = n_heads if n_kv_heads is None else positive_int("n_kv_heads", n_kv_heads)
        if n_heads % n_kv_heads:
            raise ValueError(f"n_kv_heads ({n_kv_heads}) must divide n_heads ({n_heads})")
        probability("dropout", dropout)
        for name, flag in (("bias", bias), ("causal", causal), ("fused_qkv", fused_qkv)):
            boolean(name, flag)
        rotary = getattr(rotary, "rotate", rotary)  # a RotaryEmbedding: rotate one tensor at a time
        if rotary is not None and not callable(rotary):
            raise TypeError(f"rotary must be None or callable as rotary(x, positions), got {type(rotary).__name__}")
        get_attention_backend(backend)
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.head_dim = d_model // n_heads
        self.dropout, self.backend, self.causal, self.rotary = dropout, backend, causal, rotary
        self.fused_qkv = fused_qkv
        kv_width = n_kv_heads * self.head_dim
        if fused_qkv:
            self.qkv = nn.Linear(d_model, d_model + 2 * kv_width, bias=bias)
        else:
            self.q = nn.Linear(d_model, d_model, bias=bias)
            self.k = nn.Linear(d_model, kv_width, bias=bias)
            self.v = nn.Linear(d_model, kv_width, bias=bias)
        self.out = mark_residual_projection(nn.Linear(d_model, d_model, bias=bias))

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, "
                f"backend={self.backend!r}, causal={self.causal}, fused_qkv={self.fused_qkv}")

    def _heads(self, x: torch.Tensor, positions, kv_cache):
        """Queries (batch, n_heads, seq, head_dim) and keys, values (batch, n_kv_heads, k_len,
        head_dim), un-repeated, as a backend receives them."""
        if self.fused_qkv:
            kv_width = self.n_kv_heads * self.head_dim
            q, k, v = self.qkv(x).split([self.d_model, kv_width, kv_width], dim=-1)
        else:
            q, k, v = self.q(x), self.k(x), self.v(x)
        q, k, v = split_heads(q, self.n_heads), split_heads(k, self.n_kv_heads), split_heads(v, self.n_kv_heads)
        if self.rotary is not None:
            if positions is None:
                if kv_cache is not None:
                    raise ValueError("positions is required with a rotary module and a kv_cache: "
                                     "the positions of the new tokens depend on what is cached")
                positions = torch.arange(x.shape[1], device=x.device)
            q, k = self.rotary(q, positions), self.rotary(k, positions)
        if kv_cache is not None:
            k, v = kv_cache.update(k, v)
        return q, k, v

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, positions: torch.Tensor | None = None,
                kv_cache: KVCacheLike | None = None) -> torch.Tensor:
        """Attend. x: (batch, seq, d_model) → (batch, seq, d_model).

        mask: None, bool (True = may attend) or float (added to the scores, e.g. an ALiBi
        bias), broadcastable to (batch, n_heads, seq, k_len); combined with the causal mask
        when ``causal``. positions: the positions of x's tokens, (seq,) or (batch, seq) (one
        row per sequence, for left-padded batches), passed as given to ``rotary`` (default
        0..seq-1 without a cache; required with a cache and a rotary module).
        kv_cache: None, or an object with ``update(k, v) -> (k_all, v_all)`` (``KVCacheLike``):
        the new keys and values are appended to it and the queries attend to all of them,
        so k_len = cached + seq. The backend gets the heads as ``ATTENTION_BACKENDS`` says.
        The shapes are the caller's to get right (the model checks its input once, at its entry).
        """
        q, k, v = self._heads(x, positions, kv_cache)
        attention = get_attention_backend(self.backend)
        dropout_p = self.dropout if self.training else 0.0
        heads = attention(q, k, v, mask=mask, causal=self.causal, dropout_p=dropout_p)
        return self.out(merge_heads(heads))

    def attention_weights(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                          positions: torch.Tensor | None = None) -> torch.Tensor:
        """The attention maps, (batch, n_heads, seq, seq): row i is query i's weights over the keys."""
        q, k, v = self._heads(x, positions, None)
        n_rep = self.n_heads // self.n_kv_heads
        if mask is not None:
            mask = _checked_mask(mask, q, k)
        if self.causal:
            mask = _with_causal(mask, q.shape[-2], k.shape[-2], q.device)
        return scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), mask=mask, return_weights=True)[1]

# %% [markdown]
# `MultiHeadAttention` above calls your `split_heads` and `merge_heads`, and through the
# "math" backend your `repeat_kv`, your `softmax` and, whenever a mask is given, your
# `scaled_dot_product_attention` (`attention_weights` always uses it). The cell below
# compares it with the course's reference on a small grouped-query case and binds `MHA`
# to the class that works.

# %%
def _mha_check(cls):
    torch.manual_seed(5)
    reference = reference_attention.MultiHeadAttention(16, 4, n_kv_heads=2, causal=True)
    mine = cls(16, 4, n_kv_heads=2, causal=True)
    mine.load_state_dict(reference.state_dict())
    x = torch.randn(2, 6, 16)
    course.expect_close(mine(x), reference(x), "MultiHeadAttention")


MHA = course.keep_going("MultiHeadAttention", MultiHeadAttention, reference_attention.MultiHeadAttention, check=_mha_check)

# %% [markdown]
# **Parity with PyTorch.** `torch.nn.MultiheadAttention` stores its Q, K, V projections
# as one `(3d, d)` matrix, `in_proj_weight`, with the same row layout as our `qkv`; its
# output projection is `out_proj`. Copy the weights across and the two modules compute
# the same function (remember its boolean mask means *blocked*, so we pass `~mask`):

# %%
d_model, n_heads = 32, 4
ours = MHA(d_model, n_heads)
theirs = torch.nn.MultiheadAttention(d_model, n_heads, batch_first=True)
with torch.no_grad():
    ours.qkv.weight.copy_(theirs.in_proj_weight)
    ours.qkv.bias.copy_(theirs.in_proj_bias)
    ours.out.weight.copy_(theirs.out_proj.weight)
    ours.out.bias.copy_(theirs.out_proj.bias)
x = torch.randn(3, 7, d_model)
mask = causal_mask(7)
with torch.no_grad():
    expected, _ = theirs(x, x, x, attn_mask=~mask, need_weights=False)
    print(f"largest difference from nn.MultiheadAttention (causal): {(ours(x, mask=mask) - expected).abs().max().item():.1e}")
    ours.backend = "sdpa"
    print(f"the same with backend='sdpa':                          {(ours(x, mask=mask) - expected).abs().max().item():.1e}")

# %% [markdown]
# **The KV cache hook.** To generate text, a model appends one token at a time. The keys
# and values of earlier tokens do not change, so instead of recomputing them for the
# whole prefix at each step, a cache keeps them (chapter 09 measures what that saves).
# The smallest cache that satisfies the hook concatenates; with it, feeding the tokens one
# by one must give exactly what one pass over the whole sequence gives, *provided* the
# causal mask accounts for the cached keys: the single new query is the last position
# and may see every cached key.

# %%
#| export minillm/attention.py
class ConcatCache:
    """The smallest KV cache (a ``KVCacheLike``): keeps every key and value by concatenation.

    ``update(k, v)`` appends k, v of shape (batch, n_kv_heads, new, head_dim) along the
    sequence and returns all keys and values so far, (batch, n_kv_heads, cached + new,
    head_dim). Chapter 09 builds a preallocated cache; this one serves as a reference.
    """

    def __init__(self):
        self.k = self.v = None

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k = k if self.k is None else torch.cat([self.k, k], dim=-2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=-2)
        return self.k, self.v

# %%
layer = MHA(32, 4, causal=True).eval()
x = torch.randn(2, 9, 32)
with torch.no_grad():
    full = layer(x)
    cache = ConcatCache()
    prefill = layer(x[:, :4], kv_cache=cache)  # the prompt, in one pass
    steps = [layer(x[:, t:t + 1], kv_cache=cache) for t in range(4, 9)]  # then one token at a time
incremental = torch.cat([prefill, *steps], dim=1)
print(f"cached keys: {cache.k.shape[-2]}; largest difference, incremental vs full: {(incremental - full).abs().max().item():.1e}")

# %% [markdown]
# GQA in `MultiHeadAttention` is one argument. Its K and V projections shrink with
# $n_{kv}$, and the parameter count matches chapter 00's `attention_parameters`, which
# already knew about `n_kv_heads`:

# %%
#| stable
for n_kv in (8, 2, 1):
    layer = reference_attention.MultiHeadAttention(256, 8, n_kv_heads=n_kv)
    counted = sum(p.numel() for p in layer.parameters())
    kind = {8: "MHA", 1: "MQA"}.get(n_kv, "GQA")
    print(f"n_kv_heads = {n_kv} ({kind}): {counted:,d} parameters; "
          f"attention_parameters says {attention_parameters(ModelConfig(d_model=256, n_heads=8, n_kv_heads=n_kv)):,d}")

# %% [markdown]
# ## Attention maps of "Code is art..."
#
# The sleeve draws an attention map: for each token of "Code is art...", how much it
# attends to each other token. A map from an untrained model is noise, so we train a
# small model first: two layers of causal multi-head attention (4 heads each) on
# characters of the course's Shakespeare corpus, with learned positions and no
# feed-forward network, for a short time. (Chapter 07 trains the course's real model; its
# checkpoint will replace this one.) Training uses the "sdpa" backend, which computes the
# same function faster; the maps come from `attention_weights`, which always runs the
# explicit math because it needs the weights themselves.

# %%
from minillm.data import corpus_text, split_corpus

text = corpus_text()
train_text, val_text = split_corpus(text)  # the course's one split: the last 10% is held out
chars = sorted(set(text))
char_id = {c: i for i, c in enumerate(chars)}
data = torch.tensor([char_id[c] for c in train_text], dtype=torch.long)
held_out = torch.tensor([char_id[c] for c in val_text], dtype=torch.long)


class TinyAttentionLM(torch.nn.Module):
    """Character embeddings + learned positions, then pre-norm residual attention layers."""

    def __init__(self, vocab_size: int, d_model: int = 64, n_heads: int = 4, n_layers: int = 2, context: int = 64):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab_size, d_model)
        self.position = torch.nn.Embedding(context, d_model)
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(d_model) for _ in range(n_layers))
        self.attentions = torch.nn.ModuleList(MHA(d_model, n_heads, causal=True, backend="sdpa") for _ in range(n_layers))
        self.final_norm = torch.nn.LayerNorm(d_model)
        self.head = torch.nn.Linear(d_model, vocab_size)

    def forward(self, ids: torch.Tensor, return_maps: bool = False):
        x = self.embed(ids) + self.position(torch.arange(ids.shape[1], device=ids.device))
        maps = []
        for norm, attention in zip(self.norms, self.attentions):
            if return_maps:
                maps.append(attention.attention_weights(norm(x)))
            x = x + attention(norm(x))
        logits = self.head(self.final_norm(x))
        return (logits, maps) if return_maps else logits


context, batch_size = 64, 32
steps = 30 if course.QUICK else 500
torch.manual_seed(0)
model = TinyAttentionLM(len(chars), context=context).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
losses = []
start = time.perf_counter()
with course.one_thread():  # this model's matrix products are too small to gain from sharing them across cores
    for step in tqdm(range(steps), desc="training"):
        starts = torch.randint(len(data) - context - 1, (batch_size,))
        batch = torch.stack([data[s:s + context + 1] for s in starts]).to(device)
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
print(f"{steps} steps in {time.perf_counter() - start:.1f} s; loss {losses[0]:.2f} → {sum(losses[-20:]) / len(losses[-20:]):.2f} "
      f"(uniform guessing: {math.log(len(chars)):.2f})")

# %%
phrase = "Code is art..."
ids = torch.tensor([[char_id[c] for c in phrase]], device=device)
model.eval()
with torch.no_grad():
    _, maps = model(ids, return_maps=True)
labels = [repr(c)[1:-1] if c != " " else "␣" for c in phrase]
fig, axes = plt.subplots(2, 4, figsize=(13, 7.4), layout="constrained")
for layer, layer_maps in enumerate(maps):
    for head in range(layer_maps.shape[1]):
        ax = axes[layer, head]
        image = ax.imshow(layer_maps[0, head].cpu(), cmap="viridis", vmin=0, vmax=1)
        ax.set_title(f"layer {layer + 1}, head {head + 1}", fontsize=9)
        ax.set_xticks(range(len(phrase)), labels, fontsize=7)
        ax.set_yticks(range(len(phrase)), labels, fontsize=7)
for ax in axes[:, 0]:
    ax.set_ylabel("query (attending) character")
for ax in axes[-1]:
    ax.set_xlabel("key (attended) character")
fig.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
fig.suptitle('Attention maps of "Code is art..." in a 2-layer character model (row = weights of one query)')
plt.show()

# %% [markdown]
# Every map is lower-triangular (the causal mask) and every row sums to 1. After the full
# training run (500 steps; quick mode's 30 steps show little yet) the heads differ. One
# phrase is a small sample, so the table measures the heads over 64 random stretches of
# held-out text (4,032 queries): for each head, the average weight on the previous
# character, on the same character, and the average distance looked back. A head that
# spread its weight evenly over everything it may see would look back 16 characters on
# average.

# %%
with torch.no_grad():
    sample = torch.stack([held_out[s:s + context] for s in torch.randint(len(held_out) - context, (64,))]).to(device)
    _, sample_maps = model(sample, return_maps=True)
distance = (torch.arange(context)[:, None] - torch.arange(context)[None, :]).clamp(min=0).float().to(device)
for layer, layer_maps in enumerate(sample_maps):
    for head in range(layer_maps.shape[1]):
        m = layer_maps[:, head, 1:]  # skip query 0, which can only see itself
        previous = m.diagonal(offset=0, dim1=-2, dim2=-1).mean().item()  # row r is query r + 1
        same = m.diagonal(offset=1, dim1=-2, dim2=-1).mean().item()
        back = (m * distance[1:]).sum(-1).mean().item()
        print(f"layer {layer + 1} head {head + 1}: weight on previous char {previous:.2f}, on itself {same:.2f}, "
              f"mean distance looked back {back:5.1f} chars")

# %% [markdown]
# After the full run, one head (layer 1, head 2) is a *previous-token head*: about three
# quarters of its weight goes to the character just before, the stripe just below the
# diagonal in its map. No head puts most of its weight on the character itself (a quarter
# at most). The others mix the last few characters, looking back 3 to 8 characters on
# average, far less than the 16 of an even spread: in a character model, what predicts
# the next letter lies mostly in the current word. The maps of the phrase show sharper
# single rows than these averages; an average over thousands of queries is what says
# what a head does.

# %% [markdown]
# ## Tee check
#
# > **The shirt:** the Tech Band prints *Scaled Dot-Product*, and the sleeve draws one
# > *attention map* over "Code is art...".
#
# **What is right:** attention is a scaled dot product turned into weights by a softmax,
# and each query's weights form one row of a map like the sleeve's. We computed exactly
# that, and the scale does what the name promises at initialization: unit-variance scores
# at every width (the table in the $\sqrt{d_k}$ section).
#
# **What is loose:**
# - *One* map: a model has one map per head per layer, and they differ: eight above, from
#   previous-token heads to heads that look far back. GPT-2 small has 144.
# - The sleeve's layer is an *encoder* layer, whose map is a full square: every token sees
#   every token. An LLM's maps are lower-triangular: the causal mask.
# - "Scaled" guarantees unit variance only for independent, unit-variance queries and
#   keys, that is, at initialization. A trained model learns to sharpen some heads, so its
#   scaled scores spread more (a standard deviation of about 3.5 to 4.5 after the full
#   training run), measured below on the model we just trained.

# %%
with torch.no_grad():
    x = model.embed(sample) + model.position(torch.arange(context, device=device))
    for layer, (norm, attention) in enumerate(zip(model.norms, model.attentions)):
        h = norm(x)
        q, k, _ = attention.qkv(h).split(attention.d_model, dim=-1)  # the fused projection: Q, K, V
        q, k = split(q, attention.n_heads), split(k, attention.n_heads)
        scores = (q @ k.transpose(-2, -1) / math.sqrt(attention.head_dim))[..., causal_mask(context, device)]
        print(f"layer {layer + 1}: standard deviation of the scaled scores after training: {scores.std().item():.2f} "
              f"(about 1 at initialization, by design)")
        x = x + attention(h)

# %% [markdown]
# ## What `minillm` gained
#
# `minillm.attention`, the heart of every later model:
#
# - `softmax` (Exercise 1), stable for any logits;
# - `scaled_dot_product_attention` (Exercise 2) with boolean and additive masks, biases,
#   zeros for fully masked queries, optional weights; `causal_mask`, also for cached keys;
# - `split_heads`, `merge_heads` (Exercise 3) and `repeat_kv` (Exercise 4);
# - `MultiHeadAttention(d_model, n_heads, n_kv_heads=None, bias=True, dropout=0.0,
#   backend="math", causal=False, rotary=None, fused_qkv=True)` with `forward(x, mask=None,
#   positions=None, kv_cache=None)` and `attention_weights`;
# - the backend registry `ATTENTION_BACKENDS` ("math", "sdpa"; "flash" and "triton"
#   declared for chapter 10), with `register_attention_backend` / `get_attention_backend`;
# - the cache protocol `KVCacheLike` and its smallest implementation, `ConcatCache`;
# - `kv_cache_bytes` (Exercise 5).
#
# Chapter 05 adds the feed-forward network and chapter 06 wraps both in the residual
# block; chapter 03's `RotaryEmbedding` plugs into `rotary=`, chapter 09's `KVCache` into
# `kv_cache=`, and chapter 10's FlashAttention into the registry.
#
# ## Further reading
#
# - Bahdanau, Cho & Bengio, *Neural Machine Translation by Jointly Learning to Align and Translate* (2014): attention as soft alignment.
# - Vaswani et al., *Attention Is All You Need* (2017): scaled dot-product and multi-head attention; the $\sqrt{d_k}$ argument is its footnote 4.
# - Milakov & Gimelshein, *Online normalizer calculation for softmax* (2018): the max trick, in one pass (chapter 10).
# - Shazeer, *Fast Transformer Decoding: One Write-Head is All You Need* (2019): multi-query attention.
# - Elhage et al., *A Mathematical Framework for Transformer Circuits* (2021): attention-only models and what their heads do.
# - Olsson et al., *In-context Learning and Induction Heads* (2022): previous-token and induction heads.
# - Ainslie et al., *GQA: Training Generalized Multi-Query Transformer Models from Multi-Head Checkpoints* (2023).
# - Touvron et al., *Llama 2: Open Foundation and Fine-Tuned Chat Models* (2023): GQA at 70B.
