# %% [markdown]
# # Chapter 00 · From recurrence to attention: a short history
#
# **Where this sits on the tee:** the whole shirt. The back graphic is the pipeline of a
# large language model; this chapter redraws it as the map of the course, and every term
# of the Tech Band gets a chapter.
#
# **You will be able to**
# - explain what the 2017 Transformer replaced, count the sequential steps of a recurrent
#   network and of attention, and time both on this machine;
# - place the milestones from the Transformer to DPO on a timeline;
# - count the parameters of any model in the course's family from its configuration,
#   exactly, and explain why published figures differ;
# - find every Tech Band term in the course.
#
# **Prerequisites:** Python, a first acquaintance with PyTorch tensors and matrix
# products. No earlier chapter.
#
# **Time:** about 30 minutes of reading, 60 minutes of exercises (five coded, one written).
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

import matplotlib.pyplot as plt
import torch
from tqdm.auto import tqdm

import course_runtime as course

device = course.setup(seed=0)

# %% [markdown]
# ## What the 2017 Transformer replaced
#
# Before 2017, the best sequence models were **recurrent neural networks** (RNNs, and
# their gated forms, LSTMs and GRUs). An RNN reads a sequence one position at a time and
# carries everything it has seen in a hidden state $h_t$:
#
# $$h_t = \tanh\left(W_{xh}\, x_t + W_{hh}\, h_{t-1} + b_h\right), \qquad h_0 = 0.$$
#
# The state $h_t$ cannot be computed before $h_{t-1}$: a sequence of $n$ tokens needs $n$
# steps, one after the other, however many cores the machine has. The Transformer
# ("Attention Is All You Need", Vaswani et al., 2017) dropped recurrence. Every position
# looks at every other position through **attention**, which is a handful of matrix
# products over the whole sequence at once.
#
# ### Exercise 1 · An RNN as a loop
#
# Implement `rnn_forward`. Weights are stored as `torch.nn.Linear` stores them: `W_xh` has
# shape `(d_hidden, d_in)`, so $W_{xh} x_t$ is `x_t @ W_xh.T` for a row vector `x_t`.
# Return every hidden state $h_1, \dots, h_n$, not just the last.
#
# Difficulty ●○○ · Importance ●●○ · about 10 minutes
#
# <details><summary>Hint 1</summary>Start from <code>h = x.new_zeros(batch, d_hidden)</code> (zeros of the same dtype and device as <code>x</code>; <code>d_hidden = W_hh.shape[0]</code>) and loop over <code>t in range(seq_len)</code>.</details>
# <details><summary>Hint 2</summary>Collect each <code>h</code> in a list and <code>torch.stack(states, dim=1)</code> at the end, so the sequence axis is axis 1.</details>
# <details><summary>Hint 3</summary><code>h = torch.tanh(x[:, t] @ W_xh.T + h @ W_hh.T + b_h)</code></details>

# %% [markdown]
# Cells that begin with `#| export` are the chapter's contribution to the `minillm`
# package: the course's own solutions to them are `minillm/history.py`. This one starts
# that module.

# %%
#| export minillm/history.py
"""What the Transformer replaced: a recurrent network and attention, side by side (chapter 00)."""
import torch

# %%
#| answer rnn_forward
#| export minillm/history.py
def rnn_forward(x: torch.Tensor, W_xh: torch.Tensor, W_hh: torch.Tensor, b_h: torch.Tensor) -> torch.Tensor:
    """Run an Elman RNN over a sequence, one position at a time.

    x: (batch, seq, d_in); W_xh: (d_hidden, d_in); W_hh: (d_hidden, d_hidden); b_h: (d_hidden,).
    Returns every hidden state, (batch, seq, d_hidden), in x's dtype, with h_0 = 0 and
    h_t = tanh(W_xh x_t + W_hh h_{t-1} + b_h). Shapes that do not fit raise ValueError.
    """
    ### BEGIN SOLUTION
    if x.dim() != 3:
        raise ValueError(f"x must have shape (batch, seq, d_in), got {tuple(x.shape)}")
    batch, seq_len, d_in = x.shape
    d_hidden = W_hh.shape[0]
    if W_hh.shape != (d_hidden, d_hidden):
        raise ValueError(f"W_hh must be square, (d_hidden, d_hidden), got {tuple(W_hh.shape)}")
    if W_xh.shape != (d_hidden, d_in):
        raise ValueError(f"W_xh must have shape (d_hidden, d_in) = {(d_hidden, d_in)}, got {tuple(W_xh.shape)}")
    if b_h.shape != (d_hidden,):
        raise ValueError(f"b_h must have shape (d_hidden,) = {(d_hidden,)}, got {tuple(b_h.shape)}")
    h = x.new_zeros(batch, d_hidden)
    states = []
    for t in range(seq_len):
        h = torch.tanh(x[:, t] @ W_xh.T + h @ W_hh.T + b_h)
        states.append(h)
    return torch.stack(states, dim=1)
    ### END SOLUTION

# %%
#| test rnn_forward_visible points=1
def _rnn_case():
    """Batch 2, 3 steps, d_in = 3, d_hidden = 2, and the expected states, computed by hand."""
    x = torch.tensor([[[1.0, 0.0, -1.0], [0.0, 1.0, 0.5], [0.5, -0.5, 2.0]],
                      [[-1.0, 2.0, 0.0], [0.3, 0.3, 0.3], [0.0, -1.0, 1.0]]])
    W_xh = torch.tensor([[0.5, -0.3, 0.1], [0.2, 0.8, -0.5]])
    W_hh = torch.tensor([[0.1, 0.9], [-0.4, 0.3]])
    b_h = torch.tensor([0.05, -0.1])
    expected = torch.tensor([[[0.421899, 0.537050], [0.314503, 0.415595], [0.783930, -0.885594]],
                             [[-0.781806, 0.861723], [0.684414, 0.551990], [0.767918, -0.906613]]])
    return (x, W_xh, W_hh, b_h), expected


@course.visible_check("rnn_forward")
def check_rnn_forward(rnn_forward):
    args, expected = _rnn_case()
    course.expect_close(
        rnn_forward(*args), expected, "rnn_forward",
        mistakes={
            "the previous state h_{t-1} is never used (no recurrence)": torch.tensor(
                [[[0.421899, 0.537050], [-0.197375, 0.421899], [0.571670, -0.885352]],
                 [[-0.781806, 0.861723], [0.139092, 0.049958], [0.421899, -0.885352]]]),
            "tanh is missing": torch.tensor(
                [[[0.4500, 0.6000], [0.3850, 0.4500], [1.0935, -1.4190]],
                 [[-1.0500, 1.3000], [1.2050, 0.8600], [1.3445, -1.6240]]]),
            "W_hh is applied transposed (h @ W_hh instead of h @ W_hh.T)": torch.tensor(
                [[[0.421899, 0.537050], [-0.356290, 0.757713], [0.301606, -0.903939]],
                 [[-0.781806, 0.861723], [-0.275559, -0.375756], [0.517374, -0.942585]]]),
            "the first axis read as time, as in nn.RNN's default layout (seq, batch, d_in); "
            "here x is (batch, seq, d_in), so step t reads x[:, t]": torch.tensor(
                [[[0.421899, 0.537050], [-0.197375, 0.421899], [0.571670, -0.885352]],
                 [[-0.481139, 0.859742], [0.462095, 0.250100], [-0.281812, -0.955745]]]),
        },
        hint="return all states stacked on axis 1: shape (batch, seq, d_hidden)",
    )
    try:
        out64 = rnn_forward(*(a.double() for a in args))
    except RuntimeError as error:
        raise course.CheckFailed(f"rnn_forward fails on float64 inputs ({str(error)[:80]}). Hint: create h_0 with "
                                 "x.new_zeros(...), which takes x's dtype; torch.zeros(...) without dtype= is float32") from None
    course.expect_equal(out64.dtype, torch.float64, "rnn_forward's output dtype for float64 inputs",
                        hint="create h_0 with x.new_zeros(...), which takes x's dtype")


check_rnn_forward(rnn_forward)
print("rnn_forward: visible test passed")

# %%
#| test rnn_forward_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
for batch, seq_len, d_in, d_hidden in [(3, 7, 5, 4), (1, 1, 3, 6), (2, 33, 8, 8)]:
    reference = torch.nn.RNN(d_in, d_hidden, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        reference.bias_hh_l0.zero_()
    x = torch.randn(batch, seq_len, d_in, dtype=torch.float64)
    expected, _ = reference(x)
    got = rnn_forward(x, reference.weight_ih_l0.detach(), reference.weight_hh_l0.detach(), reference.bias_ih_l0.detach())
    course.expect_close(got, expected.detach(), "rnn_forward's states", atol=1e-10, rtol=1e-8)
# causality: changing the last input leaves every earlier state unchanged
x2 = x.clone()
x2[:, -1] += 1.0
got2 = rnn_forward(x2, reference.weight_ih_l0.detach(), reference.weight_hh_l0.detach(), reference.bias_ih_l0.detach())
assert torch.equal(got2[:, :-1], got[:, :-1]), "an input changed states before it"
# the docstring's promises: the states in x's dtype, and ValueError for shapes that do not fit
x, W_xh, W_hh, b_h = torch.randn(2, 4, 3), torch.randn(5, 3), torch.randn(5, 5), torch.randn(5)
course.expect_equal(rnn_forward(x, W_xh, W_hh, b_h).dtype, torch.float32, "rnn_forward's dtype for float32 inputs")
for args, what in [((x, W_xh, torch.randn(5, 4), b_h), "rnn_forward with a W_hh that is not square"),
                   ((x, torch.randn(5, 2), W_hh, b_h), "rnn_forward with a W_xh whose width is not the inputs' width"),
                   ((x, W_xh, W_hh, torch.randn(4)), "rnn_forward with a b_h whose length is not the number of hidden units"),
                   ((x[0], W_xh, W_hh, b_h), "rnn_forward with an x without its batch axis")]:
    course.expect_raises(ValueError, rnn_forward, *args, what=what)
### END HIDDEN TESTS

# %% [markdown]
# Keep going: the next cell binds `rnn` to your `rnn_forward` when it passes the visible
# test (the same checks, run again), else to the course's reference.

# %%
from minillm import history as reference_history

rnn = course.keep_going("rnn_forward", rnn_forward, reference_history.rnn_forward, check_rnn_forward)

# %% [markdown]
# ### Exercise 2 · Attention as matrix products
#
# The simplest self-attention has no learned weights at all. Each position $i$ scores
# every position $j$ by the dot product of their vectors, turns the scores into weights
# with a softmax over $j$, and returns the weighted average of the vectors:
#
# $$\operatorname{Attention}(X) = \operatorname{softmax}\!\left(\frac{X X^\top}{\sqrt{d}}\right) X,
# \qquad X \in \mathbb{R}^{n \times d}.$$
#
# The division by $\sqrt{d}$ keeps the scores from growing with the width; chapter 04
# measures why that matters. Write it for a batch, with two matrix products and one
# softmax, and no loop over positions. Use `torch.softmax` rather than writing
# $e^{s} / \sum e^{s}$ yourself: the scores can be large, and the output must stay finite
# (chapter 04 builds a softmax that is safe from overflow). Do not change `x` in place.
#
# Difficulty ●○○ · Importance ●●● · about 10 minutes
#
# <details><summary>Hint 1</summary>For <code>x</code> of shape <code>(batch, n, d)</code>, <code>x @ x.transpose(-2, -1)</code> has shape <code>(batch, n, n)</code>: row <i>i</i> holds the scores of query <i>i</i>.</details>
# <details><summary>Hint 2</summary>Each row of weights must sum to 1: the softmax runs over the last dimension, the keys. The width <i>d</i> is <code>x.shape[-1]</code>; <code>x.shape[1]</code> is the sequence length.</details>
# <details><summary>Hint 3</summary><code>d = x.shape[-1]</code>, then <code>torch.softmax(x @ x.transpose(-2, -1) / math.sqrt(d), dim=-1) @ x</code>.</details>

# %%
#| answer self_attention
#| export minillm/history.py
def self_attention(x: torch.Tensor) -> torch.Tensor:
    """Parameter-free scaled dot-product self-attention.

    x: (batch, seq, d), or more generally (..., seq, d). Returns softmax(x x^T / sqrt(d)) x,
    of x's shape, with the softmax over the keys (the last axis of the scores).
    """
    ### BEGIN SOLUTION
    if x.dim() < 2:
        raise ValueError(f"x must have shape (batch, seq, d), got {tuple(x.shape)}")
    d = x.shape[-1]
    scores = x @ x.transpose(-2, -1) / d**0.5
    return torch.softmax(scores, dim=-1) @ x
    ### END SOLUTION

# %%
#| test self_attention_visible points=1
def _attention_case():
    """One sequence of 4 positions with d = 3, and the expected output, computed by hand."""
    x = torch.tensor([[[1.0, 0.0, 2.0], [0.0, 1.0, -1.0], [1.0, 1.0, 0.0], [0.5, -2.0, 1.0]]])
    expected = torch.tensor([[[0.899753, -0.262646, 1.639705], [0.401164, 0.844685, -0.434383],
                              [0.721697, 0.574757, 0.307691], [0.587637, -1.598370, 1.135428]]])
    return x, expected


@course.visible_check("self_attention")
def check_self_attention(self_attention):
    x, expected = _attention_case()
    got = self_attention(x)
    if not torch.equal(x, _attention_case()[0]):
        raise course.CheckFailed("self_attention changed its input x in place: compute new tensors (x / s, not x /= s)")
    course.expect_close(
        got, expected, "self_attention",
        mistakes={
            "the scale 1/sqrt(d) is missing": torch.tensor(
                [[[0.961905, -0.131609, 1.889721], [0.279672, 0.972339, -0.686774],
                  [0.783133, 0.740383, 0.225417], [0.530430, -1.875955, 1.058416]]]),
            "divided by d instead of sqrt(d)": torch.tensor(
                [[[0.824935, -0.283331, 1.302177], [0.495419, 0.617233, -0.130903],
                  [0.682185, 0.398520, 0.374548], [0.640622, -1.166646, 1.106167]]]),
            "softmax over the wrong dimension (columns sum to 1, rows do not)": torch.tensor(
                [[[1.070870, -0.024696, 1.586046], [0.265364, 0.817661, -0.549696],
                  [0.525032, 0.737531, -0.163785], [0.638735, -1.530496, 1.127434]]]),
            "the softmax is missing": torch.tensor(
                [[[4.185790, -3.464102, 8.371579], [-1.443376, 5.196153, -5.196153],
                  [1.299038, 3.464102, -0.288675], [2.092895, -8.660254, 7.649891]]]),
            "divided by sqrt(n), the sequence length (x.shape[1]), instead of sqrt(d) (x.shape[-1])": torch.tensor(
                [[[0.880547, -0.280624, 1.553890], [0.429238, 0.790789, -0.354858],
                  [0.709482, 0.527470, 0.326920], [0.603933, -1.496000, 1.142949]]]),
        },
    )
    big = 10 * x  # scores up to about 300: each position attends (almost) only to itself
    out = self_attention(big)
    if not torch.isfinite(out).all():
        raise course.CheckFailed("self_attention(10 * x) holds NaN or inf: its scores reach about 300, and exp(300) "
                                 "overflows float32. A softmax written as exp(s) / exp(s).sum() fails there: use "
                                 "torch.softmax, which subtracts each row's maximum first")
    course.expect_close(out, big, "self_attention(10 * x), where each position attends only to itself")


check_self_attention(self_attention)
print("self_attention: visible test passed")

# %%
#| test self_attention_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
import torch.nn.functional as F
for shape, dtype in [((2, 5, 8), torch.float64), ((1, 1, 4), torch.float32), ((3, 17, 16), torch.float32)]:
    x = torch.randn(*shape, dtype=dtype)
    before = x.clone()
    got = self_attention(x)
    assert torch.equal(x, before), "self_attention changed its input x in place"
    course.expect_equal(getattr(got, "dtype", None), dtype, "self_attention's dtype")
    course.expect_close(got, F.scaled_dot_product_attention(x, x, x), "self_attention", atol=1e-5)
# Large inputs (scores in the thousands) must not overflow. In float32 the outputs are only
# checked to be finite: near-ties between scores that large make the float32 result depend
# on rounding, so the values are compared in float64, where exp() overflows too (past 709).
x = 30 * torch.randn(2, 6, 8)
assert torch.isfinite(self_attention(x)).all(), "self_attention returned NaN or inf for large float32 inputs"
x = x.double()
out = self_attention(x)
assert torch.isfinite(out).all(), "self_attention returned NaN or inf for large float64 inputs"
course.expect_close(out, F.scaled_dot_product_attention(x, x, x), "self_attention, large inputs", atol=1e-8, rtol=1e-8)
# permutation equivariance: attention has no notion of order
perm = torch.randperm(6)
course.expect_close(self_attention(x[:, perm]), out[:, perm], "self_attention is permutation-equivariant", atol=1e-8, rtol=1e-8)
### END HIDDEN TESTS

# %%
attend = course.keep_going("self_attention", self_attention, reference_history.self_attention, check_self_attention)

# %% [markdown]
# ### Counting sequential steps
#
# How many operations must run one after the other? PyTorch lets us watch every torch
# function a piece of code calls (`torch.overrides.TorchFunctionMode`). Counting the calls
# of each function, for growing sequence lengths, exposes its structure: the RNN's count
# grows with $n$, because each step is a separate small operation that waits for the one
# before; the attention's count does not.

# %%
class CountTorchCalls(torch.overrides.TorchFunctionMode):
    """Counts the torch functions called inside a ``with`` block."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def count_calls(fn, *args) -> int:
    with CountTorchCalls() as counter:
        fn(*args)
    return counter.calls


d = 32
W_xh, W_hh, b_h = torch.randn(d, d) / d**0.5, torch.randn(d, d) / d**0.5, torch.zeros(d)
for n in (8, 64, 512):
    x = torch.randn(1, n, d)
    rnn_calls = count_calls(rnn, x, W_xh, W_hh, b_h)
    print(f"n = {n:4d}: RNN {rnn_calls:5d} torch calls ({rnn_calls / n:.1f} per position), "
          f"attention {count_calls(attend, x):2d} torch calls")

# %% [markdown]
# Counting calls says nothing yet about time, because the two do different amounts of
# arithmetic. Attention multiplies an $n \times d$ matrix by a $d \times n$ one and the
# $n \times n$ weights by an $n \times d$ one: $2n^2 d$ multiply-adds. The RNN does two
# matrix-vector products per step, $x_t W_{xh}^\top$ and $h_{t-1} W_{hh}^\top$: $2nd^2$
# in all (with $d_{in} = d$). Attention does $n/d$ times the RNN's arithmetic: as much
# when $n = d$, 64 times as much at $n = 2048$ with $d = 32$. So let us time both on this
# machine, for growing $n$. We time on a single thread, so that the comparison is about
# the chain of dependent steps and not about how many cores each can use, and keep the
# fastest of 21 runs of each, in three sweeps over the lengths, because the machine may
# be busy with other work.

# %%
lengths = [32, 64, 128, 256] if course.QUICK else [32, 64, 128, 256, 512, 1024, 2048]
rnn_seconds, attention_seconds = [math.inf] * len(lengths), [math.inf] * len(lengths)
with course.one_thread(), torch.no_grad():
    for sweep in tqdm(range(3), desc="timing sweeps"):  # three passes: a burst of other work spoils at most one
        for i, n in enumerate(lengths):
            x = torch.randn(1, n, d)
            rnn_seconds[i] = min(rnn_seconds[i], course.best_seconds(lambda: rnn(x, W_xh, W_hh, b_h), 7))
            attention_seconds[i] = min(attention_seconds[i], course.best_seconds(lambda: attend(x), 7))

fig, ax = plt.subplots(figsize=(6.5, 4))
ax.loglog(lengths, [s * 1e3 for s in rnn_seconds], "o-", label="RNN, a loop over positions")
ax.loglog(lengths, [s * 1e3 for s in attention_seconds], "s-", label="attention, matrix products")
ax.set_xlabel("sequence length n (tokens)")
ax.set_ylabel("time per forward pass (ms)")
ax.set_title(f"One layer, d = {d}, batch 1, one CPU thread")
ax.legend()
plt.show()
print(f"{'n':>5s} {'RNN (ms)':>9s} {'attention (ms)':>15s} {'time, RNN / attention':>22s} "
      f"{'arithmetic, attention / RNN':>28s}")
for n, r, a in zip(lengths, rnn_seconds, attention_seconds):
    print(f"{n:5d} {r * 1e3:9.3f} {a * 1e3:15.3f} {r / a:21.1f}x {n / d:27.1f}x")

# %% [markdown]
# Read the table under the figure. At $n = 32$ the two do the same arithmetic, yet the
# loop takes ten to twenty times as long. The call counts above say why: eight small
# operations per position, each waiting for the one before, and on a CPU most of the cost
# of a small operation is the fixed overhead of launching it, not arithmetic. Attention
# makes the same handful of calls (seven above) whatever $n$ is. As $n$ grows, attention's
# extra arithmetic catches up with the loop's overhead: at $n = 2048$ it does 64 times the
# RNN's multiply-adds, and by two thousand tokens the gap of ten times or more has shrunk
# to a few times at most. There the $n \times n$ matrices of scores and weights (4 MB
# each in float32 at $n = 1024$, 16 MB at 2048) outgrow the processor's fast caches, and
# attention's time starts to depend on memory traffic as well as arithmetic: it varies
# most from run to run (across our runs the ratio at $n = 2048$ lay anywhere between 0.6
# and 4, while the gap of ten times or more at short lengths came back every time).
# FlashAttention (chapter 10) is about avoiding exactly that traffic.
#
# What one CPU thread cannot show is the hardware the Transformer was built for. A GPU
# has thousands of cores: a few large matrix products fill them, while a chain of $n$
# small steps uses a sliver of them, one step at a time. That is the trade the
# Transformer made: more arithmetic, but no chain of $n$ dependent steps, so training on
# long sequences parallelizes.
#
# ### Written question 1
#
# Difficulty ●●○ · Importance ●●● · about 10 minutes
#
# The attention operation costs $O(n^2 d)$ arithmetic per layer and an RNN $O(n d^2)$. For
# $n = 512$ and $d = 512$ the two are equal, yet the Transformer trained much faster
# than the recurrent models of 2017. In three to five sentences, explain why, and name
# one cost the Transformer pays that the RNN does not.

# %% [markdown]
# #| written why_attention_trains_faster points=2
# ### BEGIN SOLUTION
# *Model answer.* Training time is set by how long the longest chain of dependent
# operations is, and by how well the hardware is used, not by the arithmetic count alone.
# An RNN must compute $h_1, h_2, \dots, h_n$ one after the other: $n$ sequential steps,
# each a small matrix-vector product that leaves most of a GPU idle. Attention computes
# all positions at once in a few large matrix products (a constant number of sequential
# steps per layer), which run near the hardware's peak. The cost: attention's memory and
# time grow as $n^2$ with the context, and at generation time it must keep (or recompute)
# the keys and values of every earlier token, where an RNN carries a fixed-size state.
#
# *Grading:* 1 point for the sequential dependency / parallelism argument, 1 point for a
# correct cost (quadratic memory or time in n, or the growing KV cache at inference).
# ### END SOLUTION

# %% [markdown]
# ## The milestones
#
# Six years separate the Transformer from the techniques that make today's chat models.
# Each milestone below is a chapter of this course.

# %%
#| export minillm/history.py
MILESTONES = (
    # (year, name, what it brought, chapter)
    (2017, "Transformer", "attention replaces recurrence; encoder-decoder", "04"),
    (2017, "Sparsely-gated MoE", "many experts, a router picks a few per token", "11"),
    (2018, "GPT", "decoder-only, generative pre-training", "07"),
    (2018, "BERT", "encoder-only, masked-language-model pre-training", "07"),
    (2019, "GPT-2", "1.5B parameters, zero-shot tasks", "07"),
    (2020, "Scaling laws", "loss falls as a power law in parameters, data, compute", "08"),
    (2020, "GPT-3", "175B parameters, few-shot learning in context", "08"),
    (2021, "RoPE", "rotary position embeddings", "03"),
    (2021, "LoRA", "fine-tuning through low-rank adapters", "12"),
    (2022, "FlashAttention", "exact attention, tiled to the memory hierarchy", "10"),
    (2022, "RLHF (InstructGPT)", "reward model + reinforcement learning from human preferences", "13"),
    (2023, "DPO", "preference alignment without a reward model", "13"),
)

# %%
from minillm.history import MILESTONES

fig, ax = plt.subplots(figsize=(9, 4.2))
years = sorted({year for year, *_ in MILESTONES})
row_of_year = {year: 0 for year in years}
for year, name, _, chapter in MILESTONES:
    row = row_of_year[year]
    row_of_year[year] += 1
    height = 0.6 + 0.55 * row
    ax.vlines(year, 0, height, color="0.6", linewidth=1)
    ax.plot(year, 0, "o", color="C0")
    ax.annotate(f"{name}\n(ch. {chapter})", (year, height), ha="center", va="bottom", fontsize=8.5)
ax.axhline(0, color="0.3", linewidth=1)
ax.set_ylim(-0.3, 1.9)
ax.set_xlim(2016.4, 2023.6)
ax.set_yticks([])
ax.set_xlabel("year of publication")
ax.set_title("From the Transformer to DPO: each milestone and the chapter that teaches it")
for side in ("left", "right", "top"):
    ax.spines[side].set_visible(False)
plt.show()

# %% [markdown]
# Two branches split in 2018: **GPT** kept only the Transformer's decoder (each token sees
# only the tokens before it, so the model can generate), **BERT** kept only the encoder
# (each token sees the whole sentence: good for understanding, but not trained to generate
# text left to right). The
# chat models of today descend from the GPT branch, with the refinements of 2020–2023
# layered on top. The timeline also shows how quickly the pieces arrived: four of the six
# chapters after 07 (08, 10, 12, 13) teach a technique from 2020 or later; the mixture of
# experts of chapter 11 goes back to 2017.
#
# ## Model sizes through history
#
# A Transformer's shape is fixed by a handful of numbers: the vocabulary size $V$, the
# context length $C$, the width $d$ (`d_model`), the number of layers $L$, of heads $h$,
# and the hidden width $d_{ff}$ of the feed-forward network. A few switches say which
# variant is built: learned or computed positions, LayerNorm or RMSNorm, GELU or SwiGLU,
# biases or none, an output head tied to the embedding or separate. `ModelConfig` holds
# them all; later chapters build real models from it.

# %%
#| export minillm/config.py
"""Model shapes and their exact parameter counts (chapter 00)."""
from dataclasses import dataclass

CHOICES = {
    "architecture": ("decoder", "encoder", "encoder-decoder"),
    "positions": ("learned", "sinusoidal", "rope", "alibi"),
    "norm": ("layernorm", "rmsnorm"),
    "norm_placement": ("pre", "post"),
    "ffn": ("gelu", "gelu_tanh", "relu", "swiglu"),
}


@dataclass(frozen=True)
class ModelConfig:
    """The hyper-parameters that fix a Transformer's shape, hence its parameter count.

    ``n_kv_heads`` defaults to ``n_heads`` (multi-head attention); fewer gives grouped-query
    attention. ``d_ff`` is the real hidden width of the feed-forward network. An
    ``encoder-decoder`` model has ``n_layers`` encoder and ``n_decoder_layers`` decoder
    layers; the decoder layers add cross-attention and a third norm.
    """

    name: str = "custom"
    vocab_size: int = 50257
    context_length: int = 1024
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    d_ff: int = 3072
    n_kv_heads: int | None = None
    architecture: str = "decoder"
    n_decoder_layers: int = 0
    positions: str = "learned"
    norm: str = "layernorm"
    norm_placement: str = "pre"
    ffn: str = "gelu"
    bias: bool = True
    tie_embeddings: bool = True
    final_norm: bool = True
    embedding_norm: bool = False
    n_token_types: int = 0
    pooler: bool = False

    def __post_init__(self):
        for name in ("vocab_size", "context_length", "d_model", "n_layers", "n_heads", "d_ff",
                     "n_decoder_layers", "n_token_types"):
            value, least = getattr(self, name), 0 if name in ("n_decoder_layers", "n_token_types") else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
        for name in ("bias", "tie_embeddings", "final_norm", "embedding_norm", "pooler"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        for name, allowed in self.choices().items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if (isinstance(self.n_kv_heads, bool) or not isinstance(self.n_kv_heads, int) or self.n_kv_heads < 1
                or self.n_heads % self.n_kv_heads):
            raise ValueError(f"n_heads ({self.n_heads}) must be divisible by n_kv_heads ({self.n_kv_heads})")
        if (self.architecture == "encoder-decoder") != (self.n_decoder_layers > 0):
            raise ValueError("n_decoder_layers must be > 0 exactly when architecture is 'encoder-decoder', "
                             f"got {self.n_decoder_layers} with {self.architecture!r}")

    def choices(self) -> dict[str, tuple[str, ...]]:
        """The allowed values of each switch: ``CHOICES``. (Chapter 07's model config answers
        with the names registered for its components, so that a new FFN needs no new list.)"""
        return CHOICES

    @property
    def head_dim(self) -> int:
        """Width of one attention head, d_model // n_heads."""
        return self.d_model // self.n_heads


def norm_parameters(config: ModelConfig) -> int:
    """Parameters of one normalization layer: a scale, plus a shift for LayerNorm with biases."""
    has_shift = config.norm == "layernorm" and config.bias
    return config.d_model * (2 if has_shift else 1)

# %% [markdown]
# ### Exercise 3 · Parameters of one attention layer
#
# An attention layer has four projections, each a `torch.nn.Linear`:
#
# - $W_Q$: $d \to d$ (one query per head, $h$ heads of width $d/h$);
# - $W_K$ and $W_V$: $d \to n_{kv} \cdot d/h$ (with grouped-query attention, fewer
#   key/value heads than query heads; chapter 04);
# - $W_O$: $d \to d$, mixing the heads' outputs.
#
# A linear map from $m$ to $k$ features has $k m$ weights, plus $k$ biases when
# `config.bias` is true. Return the total.
#
# Difficulty ●○○ · Importance ●●○ · about 8 minutes
#
# <details><summary>Hint 1</summary>Compute <code>kv_width = config.n_kv_heads * config.head_dim</code> first.</details>
# <details><summary>Hint 2</summary>Weights: <code>2 * d * d + 2 * d * kv_width</code>. Biases, when present: <code>2 * d + 2 * kv_width</code>.</details>

# %%
#| answer attention_parameters
#| export minillm/config.py
def attention_parameters(config: ModelConfig) -> int:
    """Parameters of one attention layer: Q, K, V and output projections, with biases if any."""
    ### BEGIN SOLUTION
    d = config.d_model
    kv_width = config.n_kv_heads * config.head_dim
    weights = 2 * d * d + 2 * d * kv_width
    biases = 2 * d + 2 * kv_width if config.bias else 0
    return weights + biases
    ### END SOLUTION

# %%
#| test attention_parameters_visible points=1


@course.visible_check("attention_parameters")
def check_attention_parameters(attention_parameters):
    gpt2_small = ModelConfig(name="gpt2", ffn="gelu_tanh")  # ModelConfig's defaults are GPT-2 small's shape
    got = attention_parameters(gpt2_small)
    course.expect_equal(
        got, 4 * 768 * 768 + 4 * 768, "attention_parameters(GPT-2 small)",
        mistakes={
            "biases are missing": 4 * 768 * 768,
            "the output projection W_O is missing": 3 * 768 * 768 + 3 * 768,
            "one head's width (d/h) used instead of d": 4 * 768 * 64 + 4 * 64,
        },
    )
    course.expect_equal(type(got), int, "the type of attention_parameters' result",
                        hint="a parameter count is an int; / always gives a float: use // or config.head_dim")
    gqa = ModelConfig(d_model=256, n_heads=8, n_kv_heads=2, d_ff=1024, bias=False)  # K, V: 2 heads of width 32
    course.expect_equal(
        attention_parameters(gqa), 2 * 256 * 256 + 2 * 256 * 64, "attention_parameters(8 query heads, 2 key/value heads)",
        mistakes={"n_kv_heads is ignored: K and V counted at full width": 4 * 256 * 256,
                  "biases counted though config.bias is False": 2 * 256 * 256 + 2 * 256 * 64 + 2 * 256 + 2 * 64},
    )
    gqa_bias = ModelConfig(d_model=256, n_heads=8, n_kv_heads=2, d_ff=1024, bias=True)
    course.expect_equal(
        attention_parameters(gqa_bias), 2 * 256 * 256 + 2 * 256 * 64 + 2 * 256 + 2 * 64,
        "attention_parameters(8 query heads, 2 key/value heads, with biases)",
        mistakes={"the biases of K and V counted at full width d: they have n_kv_heads * head_dim entries":
                  2 * 256 * 256 + 2 * 256 * 64 + 4 * 256},
    )


check_attention_parameters(attention_parameters)
print("attention_parameters: visible test passed")

# %%
#| test attention_parameters_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
def _linears(shapes, bias):
    """Parameters of torch.nn.Linear(i, o) for each (i, o), built on the meta device (no memory)."""
    return sum(p.numel() for i, o in shapes for p in torch.nn.Linear(i, o, bias=bias, device="meta").parameters())

for d, h, bias in [(64, 4, True), (96, 3, False), (512, 8, True)]:
    cfg = ModelConfig(d_model=d, n_heads=h, d_ff=4 * d, bias=bias)
    expected = sum(p.numel() for p in torch.nn.MultiheadAttention(d, h, bias=bias, device="meta").parameters())
    course.expect_equal(attention_parameters(cfg), expected, "attention_parameters")
# grouped-query attention: K and V have n_kv_heads heads; fixed cases, then random shapes
cases = [(8192, 64, 8, False), (128, 8, 2, True), (96, 6, 1, True)]
for _ in range(4):
    h = int(torch.randint(1, 17, ()))
    divisors = [k for k in range(1, h + 1) if h % k == 0]
    kv = divisors[int(torch.randint(len(divisors), ()))]
    cases.append((h * int(torch.randint(1, 65, ())), h, kv, bool(torch.randint(0, 2, ()))))
for d, h, kv, bias in cases:
    cfg = ModelConfig(d_model=d, n_heads=h, n_kv_heads=kv, d_ff=4 * d, bias=bias)
    kv_width = kv * (d // h)
    got = attention_parameters(cfg)
    course.expect_equal(got, _linears([(d, d), (d, kv_width), (d, kv_width), (d, d)], bias),
                        "attention_parameters with grouped-query attention")
    course.expect_equal(type(got), int, "the type of attention_parameters' result")
### END HIDDEN TESTS

# %% [markdown]
# ### Exercise 4 · Parameters of one feed-forward network
#
# The position-wise feed-forward network (chapter 05) comes in two shapes:
#
# - **GELU or ReLU:** $\mathrm{FFN}(x) = W_2\, \phi(W_1 x + b_1) + b_2$ with
#   $W_1: d \to d_{ff}$ and $W_2: d_{ff} \to d$;
# - **SwiGLU:** $\mathrm{FFN}(x) = W_2\,\big(\mathrm{SiLU}(W_1 x) \odot W_3 x\big)$, with
#   two input projections $W_1, W_3: d \to d_{ff}$ and one output projection
#   $W_2: d_{ff} \to d$, each with a bias when `config.bias` is true.
#
# Return the parameter count for `config.ffn` in `("gelu", "gelu_tanh", "relu", "swiglu")`
# (`gelu_tanh` is GELU's tanh approximation, which GPT-2 uses: same shape as GELU).
#
# Difficulty ●○○ · Importance ●●○ · about 8 minutes
#
# <details><summary>Hint 1</summary>Count the linear maps: two for GELU and ReLU, three for SwiGLU.</details>
# <details><summary>Hint 2</summary>Each input projection has <code>d * d_ff</code> weights and <code>d_ff</code> biases; the output projection <code>d_ff * d</code> weights and <code>d</code> biases.</details>

# %%
#| answer ffn_parameters
#| export minillm/config.py
def ffn_parameters(config: ModelConfig) -> int:
    """Parameters of one feed-forward network (GELU/ReLU: 2 linear maps; SwiGLU: 3)."""
    ### BEGIN SOLUTION
    d, d_ff = config.d_model, config.d_ff
    n_inputs = 2 if config.ffn == "swiglu" else 1
    weights = (n_inputs + 1) * d * d_ff
    biases = n_inputs * d_ff + d if config.bias else 0
    return weights + biases
    ### END SOLUTION

# %%
#| test ffn_parameters_visible points=1


@course.visible_check("ffn_parameters")
def check_ffn_parameters(ffn_parameters):
    gpt2_small = ModelConfig(name="gpt2", ffn="gelu_tanh")
    course.expect_equal(
        ffn_parameters(gpt2_small), 2 * 768 * 3072 + 3072 + 768, "ffn_parameters(GPT-2 small, ffn='gelu_tanh')",
        mistakes={"biases are missing": 2 * 768 * 3072, "only one bias vector counted": 2 * 768 * 3072 + 3072,
                  "gelu_tanh counted like SwiGLU, with three linear maps (it has GELU's two)": 3 * 768 * 3072 + 2 * 3072 + 768,
                  "ffn='gelu_tanh' is not handled (the function returned None)": None},
    )
    swiglu = ModelConfig(d_model=64, n_heads=4, d_ff=172, ffn="swiglu", bias=False)
    course.expect_equal(
        ffn_parameters(swiglu), 3 * 64 * 172, "ffn_parameters(SwiGLU, no bias)",
        mistakes={"SwiGLU counted with two linear maps instead of three": 2 * 64 * 172},
    )
    swiglu_bias = ModelConfig(d_model=64, n_heads=4, d_ff=172, ffn="swiglu", bias=True)
    course.expect_equal(
        ffn_parameters(swiglu_bias), 3 * 64 * 172 + 2 * 172 + 64, "ffn_parameters(SwiGLU, with biases)",
        mistakes={"one input projection's bias is missing: W_1 and W_3 each have d_ff biases": 3 * 64 * 172 + 172 + 64},
    )


check_ffn_parameters(ffn_parameters)
print("ffn_parameters: visible test passed")

# %%
#| test ffn_parameters_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
def _linears(shapes, bias):
    """Parameters of torch.nn.Linear(i, o) for each (i, o), built on the meta device (no memory)."""
    return sum(p.numel() for i, o in shapes for p in torch.nn.Linear(i, o, bias=bias, device="meta").parameters())

cases = [(48, 200, "relu", True), (96, 256, "gelu", False), (80, 216, "swiglu", True), (4096, 11008, "swiglu", False),
         (1600, 6400, "gelu_tanh", True), (40, 100, "gelu_tanh", False)]
for ffn in ("gelu", "gelu_tanh", "relu", "swiglu"):
    cases.append((4 * int(torch.randint(1, 200, ())), int(torch.randint(1, 3000, ())), ffn, bool(torch.randint(0, 2, ()))))
for d, d_ff, ffn, bias in cases:
    cfg = ModelConfig(d_model=d, n_heads=4, d_ff=d_ff, ffn=ffn, bias=bias)
    shapes = [(d, d_ff), (d_ff, d)] + ([(d, d_ff)] if ffn == "swiglu" else [])
    course.expect_equal(ffn_parameters(cfg), _linears(shapes, bias), "ffn_parameters")
### END HIDDEN TESTS

# %% [markdown]
# A whole layer (a *block*) is an attention layer, a feed-forward network and two norms;
# a decoder layer of an encoder-decoder model adds cross-attention over the encoder's
# output, with a third norm. This function is given.

# %%
#| export minillm/config.py
def block_parameters(config: ModelConfig, cross_attention: bool = False) -> int:
    """Parameters of one Transformer layer: attention, FFN and their norms (plus cross-attention)."""
    n_attention = 2 if cross_attention else 1
    return (
        n_attention * attention_parameters(config)
        + ffn_parameters(config)
        + (n_attention + 1) * norm_parameters(config)
    )

# %% [markdown]
# ### Exercise 5 · Count a whole model
#
# Add up every parameter of the model `config` describes:
#
# | part | parameters |
# | --- | --- |
# | token embedding | $V d$ |
# | learned positions (only when `positions == "learned"`) | $C d$ |
# | token-type embedding (BERT's sentence A/B) | `n_token_types` $\cdot\, d$ |
# | a norm right after the embeddings (`embedding_norm`) | `norm_parameters` |
# | the layers | $L$ blocks, plus `n_decoder_layers` blocks with cross-attention |
# | final norm (`final_norm`): one per stack (two for an encoder-decoder) | `norm_parameters` each |
# | output head, only when *not* tied to the embedding | $V d$ |
# | BERT's pooler (`pooler`) | $d^2 + d$ |
#
# Sinusoidal, RoPE and ALiBi positions are computed, not learned: they add nothing.
#
# `block_parameters` calls your `attention_parameters` and `ffn_parameters`. The checks
# of this exercise run it with the course's versions of those two instead, so this
# exercise is graded on its own, whatever your answers to exercises 3 and 4 do.
#
# Difficulty ●●○ · Importance ●●● · about 15 minutes
#
# <details><summary>Hint 1</summary>Go down the table, one <code>if</code> per optional row; call <code>block_parameters(config)</code> and <code>block_parameters(config, cross_attention=True)</code>.</details>
# <details><summary>Hint 2</summary>The number of stacks is 2 for <code>"encoder-decoder"</code>, else 1.</details>

# %%
#| answer count_parameters
#| export minillm/config.py
def count_parameters(config: ModelConfig) -> int:
    """Exact number of parameters of the model ``config`` describes (tied weights counted once)."""
    ### BEGIN SOLUTION
    d = config.d_model
    total = config.vocab_size * d + config.n_token_types * d
    if config.positions == "learned":
        total += config.context_length * d
    if config.embedding_norm:
        total += norm_parameters(config)
    total += config.n_layers * block_parameters(config)
    total += config.n_decoder_layers * block_parameters(config, cross_attention=True)
    if config.final_norm:
        stacks = 2 if config.architecture == "encoder-decoder" else 1
        total += stacks * norm_parameters(config)
    if not config.tie_embeddings:
        total += config.vocab_size * d
    if config.pooler:
        total += d * d + d
    return total
    ### END SOLUTION

# %%
#| test count_parameters_visible points=1
from minillm import config as reference_config


def _count_cases():
    """(description, config, expected count): GPT-2 small and a Llama-style and a BERT-style model,
    each counted by building it with the `transformers` library."""
    gpt2_small = ModelConfig(name="gpt2", ffn="gelu_tanh")
    small_llama = ModelConfig(vocab_size=1000, context_length=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                              d_ff=172, positions="rope", norm="rmsnorm", ffn="swiglu", bias=False, tie_embeddings=False)
    small_bert = ModelConfig(vocab_size=1000, context_length=128, d_model=64, n_layers=2, n_heads=4, d_ff=256,
                             architecture="encoder", norm_placement="post", final_norm=False, embedding_norm=True,
                             n_token_types=2, pooler=True)
    return [("GPT-2 small", gpt2_small, 124_439_808), ("a small Llama-style model", small_llama, 218_944),
            ("a small BERT-style model", small_bert, 176_576)]


@course.visible_check("count_parameters", attention_parameters=reference_config.attention_parameters,
                      ffn_parameters=reference_config.ffn_parameters)
def check_count_parameters(count_parameters):
    (_, gpt2, n_gpt2), (_, llama, n_llama), (_, bert, n_bert) = _count_cases()
    got = count_parameters(gpt2)
    course.expect_equal(
        got, n_gpt2, "count_parameters(GPT-2 small)",
        mistakes={
            "the output head counted though it is tied to the embedding": n_gpt2 + 50257 * 768,
            "learned positions are missing": n_gpt2 - 1024 * 768,
            "the final norm is missing": n_gpt2 - 2 * 768,
            "the embeddings are missing": n_gpt2 - 50257 * 768 - 1024 * 768,
        },
        hint="the layers are n_layers * block_parameters(config)",
    )
    course.expect_equal(type(got), int, "the type of count_parameters' result",
                        hint="a parameter count is an int: is one of your counts computed with / ?")
    course.expect_equal(
        count_parameters(llama), n_llama, "count_parameters(a small Llama-style model)",
        mistakes={
            "the untied output head is missing": n_llama - 1000 * 64,
            "positions counted though RoPE has no parameters": n_llama + 256 * 64,
        },
    )
    course.expect_equal(
        count_parameters(bert), n_bert, "count_parameters(a small BERT-style model)",
        mistakes={
            "the pooler is missing": n_bert - (64 * 64 + 64),
            "2 d = 128 parameters short: the token-type embedding (n_token_types * d) "
            "or the norm after the embeddings (embedding_norm) is missing": n_bert - 2 * 64,
            "the token-type embedding and the norm after the embeddings are both missing": n_bert - 4 * 64,
            "a final norm counted though final_norm is False": n_bert + 2 * 64,
        },
    )


check_count_parameters(count_parameters)
print("count_parameters: visible test passed")

# %%
#| test count_parameters_hidden points=3
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
def _n_parameters(module):
    return sum(map(torch.numel, module.parameters()))

# Independent counts: BertModel and LlamaForCausalLM from `transformers` (checked in the
# course's test suite), and torch.nn.Transformer built below.
bert = ModelConfig(vocab_size=30522, context_length=512, norm_placement="post", final_norm=False,
                   embedding_norm=True, n_token_types=2, pooler=True, architecture="encoder")
course.expect_equal(count_parameters(bert), 109_482_240, "count_parameters(BERT-base)")
llama = ModelConfig(vocab_size=32000, context_length=2048, d_model=4096, n_layers=32, n_heads=32, d_ff=11008,
                    positions="rope", norm="rmsnorm", ffn="swiglu", bias=False, tie_embeddings=False)
course.expect_equal(count_parameters(llama), 6_738_415_616, "count_parameters(Llama-style 7B)")
for d, h, layers, d_ff, vocab in [(64, 4, 2, 128, 100), (96, 6, 3, 200, 57)]:
    cfg = ModelConfig(vocab_size=vocab, d_model=d, n_heads=h, n_layers=layers, n_decoder_layers=layers, d_ff=d_ff,
                      architecture="encoder-decoder", positions="sinusoidal", norm_placement="post", ffn="relu")
    with torch.device("meta"):
        built = torch.nn.Transformer(d, h, layers, layers, d_ff, batch_first=True)
    course.expect_equal(count_parameters(cfg), _n_parameters(built) + vocab * d, "count_parameters of an encoder-decoder")


def _decoder(cfg):
    """A decoder-only model of cfg's shape, assembled from torch.nn modules on the meta device."""
    d, kv_width = cfg.d_model, cfg.n_kv_heads * cfg.head_dim
    linear = lambda i, o: torch.nn.Linear(i, o, bias=cfg.bias)
    norm = lambda: torch.nn.LayerNorm(d, bias=cfg.bias) if cfg.norm == "layernorm" else torch.nn.RMSNorm(d)
    with torch.device("meta"):
        parts = [torch.nn.Embedding(cfg.vocab_size, d)]
        if cfg.positions == "learned":
            parts.append(torch.nn.Embedding(cfg.context_length, d))
        for _ in range(cfg.n_layers):
            parts += [linear(d, d), linear(d, kv_width), linear(d, kv_width), linear(d, d), norm(), norm(),
                      linear(d, cfg.d_ff), linear(cfg.d_ff, d)] + ([linear(d, cfg.d_ff)] if cfg.ffn == "swiglu" else [])
        if cfg.final_norm:
            parts.append(norm())
        if not cfg.tie_embeddings:
            parts.append(torch.nn.Linear(d, cfg.vocab_size, bias=False))
        return torch.nn.ModuleList(parts)


def _pick(options):
    return options[int(torch.randint(len(options), ()))]


for _ in range(6):  # random decoder-only models
    h = _pick([1, 2, 3, 4, 6, 8])
    cfg = ModelConfig(vocab_size=int(torch.randint(2, 5000, ())), context_length=int(torch.randint(1, 2048, ())),
                      d_model=h * _pick([8, 16, 24, 64]), n_layers=int(torch.randint(1, 5, ())), n_heads=h,
                      n_kv_heads=_pick([k for k in (1, 2, 3, 4, 6, 8) if h % k == 0]), d_ff=int(torch.randint(1, 700, ())),
                      positions=_pick(["learned", "sinusoidal", "rope", "alibi"]), norm=_pick(["layernorm", "rmsnorm"]),
                      ffn=_pick(["gelu", "gelu_tanh", "relu", "swiglu"]), bias=_pick([True, False]),
                      tie_embeddings=_pick([True, False]), final_norm=_pick([True, False]))
    got = count_parameters(cfg)
    course.expect_equal(got, _n_parameters(_decoder(cfg)), "count_parameters of a random decoder")
    course.expect_equal(type(got), int, "the type of count_parameters' result")
### END HIDDEN TESTS

# %%
count = course.keep_going("count_parameters", count_parameters, reference_config.count_parameters,
                          check_count_parameters)

# %% [markdown]
# ### Famous models, counted
#
# The presets below describe famous models with the published shapes. The count is exact:
# the course's tests build each model (`transformers`' GPT-1, GPT-2, BERT and Llama
# classes and `torch.nn.Transformer`, on PyTorch's `meta` device, which allocates no
# memory) and check that `count_parameters` equals the number of parameters of the built
# model. The ratio column is our count divided by the paper's figure.

# %%
#| export minillm/config.py
GPT2_SIZES = {"gpt2": (768, 12, 12), "gpt2-medium": (1024, 24, 16), "gpt2-large": (1280, 36, 20), "gpt2-xl": (1600, 48, 25)}


def _gpt2(name: str, d: int, layers: int, heads: int, context: int = 1024) -> ModelConfig:
    return ModelConfig(name=name, d_model=d, n_layers=layers, n_heads=heads, d_ff=4 * d, context_length=context,
                       ffn="gelu_tanh")


# GPT-1, GPT-2 and GPT-3 computed GELU with its tanh approximation ("gelu_tanh").
PRESETS = {
    "transformer-base": ModelConfig(
        name="transformer-base", vocab_size=37000, context_length=512, d_model=512, n_layers=6, n_heads=8,
        d_ff=2048, architecture="encoder-decoder", n_decoder_layers=6, positions="sinusoidal",
        norm_placement="post", ffn="relu"),
    "gpt1": ModelConfig(
        name="gpt1", vocab_size=40478, context_length=512, norm_placement="post", final_norm=False, ffn="gelu_tanh"),
    "bert-base": ModelConfig(
        name="bert-base", vocab_size=30522, context_length=512, architecture="encoder", norm_placement="post",
        final_norm=False, embedding_norm=True, n_token_types=2, pooler=True),
    **{name: _gpt2(name, *shape) for name, shape in GPT2_SIZES.items()},
    "gpt3-175b": _gpt2("gpt3-175b", 12288, 96, 96, context=2048),
    "llama-7b": ModelConfig(
        name="llama-7b", vocab_size=32000, context_length=2048, d_model=4096, n_layers=32, n_heads=32,
        d_ff=11008, positions="rope", norm="rmsnorm", ffn="swiglu", bias=False, tie_embeddings=False),
}

# Year and parameter count as the papers state them, for comparison with the exact counts.
PUBLISHED = {
    "transformer-base": (2017, 65e6),
    "gpt1": (2018, 117e6),
    "bert-base": (2018, 110e6),
    "gpt2": (2019, 117e6),
    "gpt2-medium": (2019, 345e6),
    "gpt2-large": (2019, 762e6),
    "gpt2-xl": (2019, 1542e6),
    "gpt3-175b": (2020, 175e9),
    "llama-7b": (2023, 6.7e9),
}

# %%
#| stable
from minillm.config import GPT2_SIZES, PRESETS, PUBLISHED

print(f"{'model':18s} {'year':>4s} {'counted':>17s} {'published':>11s} {'ratio':>6s}")
for name, cfg in PRESETS.items():
    year, published = PUBLISHED[name]
    counted = count(cfg)
    print(f"{name:18s} {year:4d} {counted:17,d} {published / 1e6:10,.0f}M {counted / published:6.3f}")

# %% [markdown]
# Four of the published figures agree with the exact count to within 1%: those of GPT-1,
# BERT, GPT-3 and Llama are the count rounded to two or three significant figures. Two
# families stand out:
#
# - **GPT-2: every size is counted higher than published**, by 1% to 6%. GPT-2 enlarged
#   GPT-1's vocabulary from 40,478 to 50,257 tokens. Count each GPT-2 size with GPT-1's
#   vocabulary instead and all four published figures come out, to the million (the next
#   cell checks it). Four exact matches are hard to get by chance: the paper's figures
#   were most likely computed with the old vocabulary size. The widely quoted "124M" is
#   the true size of the released small model.
# - **Transformer base: 63M counted, 65M published.** The paper's vocabulary depends on
#   the language pair; our preset uses the 37,000 shared tokens of English–German, one
#   embedding matrix shared by encoder, decoder and output (as the paper describes), and
#   the two final norms of `torch.nn.Transformer`. The published figure is rounded from a
#   configuration we cannot reconstruct exactly.

# %%
#| stable
from dataclasses import replace

for name in GPT2_SIZES:
    with_gpt1_vocabulary = replace(PRESETS[name], vocab_size=PRESETS["gpt1"].vocab_size)
    counted = reference_config.count_parameters(with_gpt1_vocabulary)
    print(f"{name:12s} with GPT-1's vocabulary: {counted:>13,d} = {counted / 1e6:6.0f}M; "
          f"published {PUBLISHED[name][1] / 1e6:6.0f}M")

# %%
#| stable
sizes = {name: reference_config.count_parameters(cfg) for name, cfg in PRESETS.items()}
growth = sizes["gpt3-175b"] / sizes["transformer-base"]
print(f"GPT-3 / Transformer base (2017 to 2020): {growth:,.0f}x, {growth ** (1 / 3):.1f}x a year on average")
print(f"GPT-3 / GPT-2-xl (2019 to 2020):         {sizes['gpt3-175b'] / sizes['gpt2-xl']:,.0f}x")
print(f"GPT-3 / Llama-7B (2020 to 2023):          {sizes['gpt3-175b'] / sizes['llama-7b']:,.1f}x")

fig, ax = plt.subplots(figsize=(7, 4.2))
for name, cfg in PRESETS.items():
    year, published = PUBLISHED[name]
    ax.scatter(year, count(cfg), color="C0", zorder=3)
    left = name == "bert-base"  # GPT-1 and BERT-base are almost the same size: label one on each side
    ax.annotate(name, (year, count(cfg)), textcoords="offset points", xytext=(-8 if left else 6, -3),
                ha="right" if left else "left", fontsize=8.5)
ax.set_yscale("log")
ax.set_xlabel("year of publication")
ax.set_ylabel("parameters (exact count, log scale)")
ax.set_title(f"The largest model grew about {round(growth, -2):,.0f}-fold from 2017 to 2020")
ax.set_xlim(2016.5, 2024.2)
ax.grid(True, which="major", alpha=0.3)
plt.show()

# %% [markdown]
# From 2017 to 2020 the largest model grew about 2,800-fold, about 14-fold a year on
# average, though in uneven jumps (GPT-3 alone is 112 times GPT-2-xl). Then the race
# changed: Llama-7B (2023) is 26 times smaller than GPT-3, and its paper reports that the
# 13B model already beats GPT-3 on most benchmarks, having been trained on far more
# tokens per parameter (a trillion tokens for 7B and 13B, against GPT-3's 300 billion).
# Chapter 08 asks what size buys and how to split a compute budget between parameters
# and data; chapter 07 trains a model of about a million parameters on a laptop CPU.
#
# Where do the parameters live? In the small models the embedding matrix is a large
# share; as $d$ grows the layers dominate, because each layer grows as $d^2$ and the
# embedding only as $d$.

# %%
#| stable
for name in ("gpt2", "gpt2-xl", "gpt3-175b", "llama-7b"):
    cfg = PRESETS[name]
    total = reference_config.count_parameters(cfg)
    embeddings = cfg.vocab_size * cfg.d_model * (1 if cfg.tie_embeddings else 2)
    layers = cfg.n_layers * reference_config.block_parameters(cfg)
    ffns = cfg.n_layers * reference_config.ffn_parameters(cfg)
    print(f"{name:10s}: token embedding{'' if cfg.tie_embeddings else ' and head'} {embeddings / total:6.1%}, "
          f"layers {layers / total:6.1%}, of which feed-forward networks {ffns / total:6.1%}")

# %% [markdown]
# ## The tee as the course map
#
# The back of the tee draws the pipeline every chapter builds a piece of. Here it is
# again, each stage labelled with the chapter that implements it.

# %%
from matplotlib.patches import FancyBboxPatch

stages = [
    ("text\n\"Code is\nart...\"", "", "0.92"),
    ("tokenizer\n(BPE)\n→ token ids", "01", "#cfe2f3"),
    ("token\nembedding", "02", "#cfe2f3"),
    ("+ positions\n(sinusoid,\nRoPE, ALiBi)", "03", "#cfe2f3"),
    ("multi-head\nattention\n(Q, K, V,\nsoftmax)", "04", "#f4cccc"),
    ("Add &\nNorm", "06", "#fff2cc"),
    ("feed-\nforward\n(FFN)", "05", "#f4cccc"),
    ("Add &\nNorm", "06", "#fff2cc"),
    ("linear →\nsoftmax →\nsample the\nnext token", "07", "#d9ead3"),
]
fig, ax = plt.subplots(figsize=(11, 4.2))
width, gap = 1.0, 0.18
for i, (label, chapter, colour) in enumerate(stages):
    x0 = i * (width + gap)
    ax.add_patch(FancyBboxPatch((x0, 0), width, 1.2, boxstyle="round,pad=0.03", facecolor=colour, edgecolor="0.3"))
    ax.text(x0 + width / 2, 0.6, label, ha="center", va="center", fontsize=9)
    if chapter:
        ax.text(x0 + width / 2, -0.25, f"ch. {chapter}", ha="center", fontsize=8, color="0.25")
    if i:
        ax.annotate("", (x0, 0.6), (x0 - gap, 0.6), arrowprops={"arrowstyle": "->"})
block_start, block_end = 4 * (width + gap) - 0.08, 8 * (width + gap) - gap + 0.08
ax.add_patch(FancyBboxPatch((block_start, -0.05), block_end - block_start, 1.3, boxstyle="round,pad=0.04",
                            fill=False, linestyle="--", edgecolor="C3"))
ax.text((block_start + block_end) / 2, 1.45, "× N layers: the Transformer block (ch. 04–06)", ha="center", color="C3")
ax.text(len(stages) * (width + gap) / 2, -0.7, "speed and scale: ch. 08 scaling · 09 KV cache · 10 FlashAttention · 11 MoE"
        "   ·   adapting: ch. 12 LoRA · 13 DPO", ha="center", fontsize=8.5)
ax.set_xlim(-0.2, len(stages) * (width + gap))
ax.set_ylim(-0.9, 1.7)
ax.axis("off")
ax.set_title("The tee's back graphic: the LLM pipeline, one chapter per stage")
plt.show()

# %% [markdown]
# Text becomes ids (01), ids become vectors (02) that carry their positions (03); a stack
# of blocks mixes information across positions (04) and transforms each position (05),
# with residual additions and norms keeping the stack trainable (06); a final linear map
# turns the last vectors into next-token probabilities (07). The drawing follows the
# sleeve's post-norm layer; the GPT the course builds in chapter 07 normalizes before
# each sub-layer instead (pre-norm), as GPT-2 and its successors do.

# %% [markdown]
# The **Tech Band** prints twenty terms. Each is taught in one chapter, in a section of
# that name, and lives in `minillm` under the symbol shown. (The course's tests check that
# this index is complete, and that each section and symbol exists once its chapter does.)

# %%
#| stable
from minillm.coursemap import TECH_BAND

for term in TECH_BAND:
    print(f"{term.term:20s} ch. {term.slug:24s} § {term.section:40s} {term.symbol}")

# %% [markdown]
# ## Tee check
#
# > **The shirt:** the left sleeve draws *the* Transformer layer: MHA → Add & Norm →
# > Dense → GELU/ReLU → Dense → Add & Norm, and the back graphic stacks it into an LLM.
#
# **What is right:** that is exactly the 2017 encoder layer, and every model in this
# chapter is a stack of layers built around the same two sub-layers, attention and a
# feed-forward network (encoder-decoder models add cross-attention; Llama swaps the
# GELU network for SwiGLU).
#
# **What is loose:** the sleeve draws an *encoder* layer: post-norm (normalize after the
# residual add) and bidirectional (every token sees every other). A GPT-style LLM runs a
# *decoder* layer: a causal mask, so each token sees only the past, and, since GPT-2,
# pre-norm (normalize before each sub-layer). Neither difference shows in the parameter
# count, which is why the drawing can pass for both: measured below on layers that
# PyTorch builds (`torch.nn.TransformerEncoderLayer`, whose `norm_first` switch moves the
# norms), the sleeve's post-norm layer and a pre-norm layer of GPT-2's width have exactly
# the same parameters, and `block_parameters` agrees. What differs is which tokens attend
# to which, which the second measurement shows: change the last token, and every earlier
# output of bidirectional attention moves, while causal attention's earlier outputs stay
# put (chapter 04). The norm's position matters too: in chapter 06 a deep post-norm stack
# fails to train at a high learning rate without warm-up, where pre-norm trains.

# %%
#| stable
def n_parameters(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


with torch.device("meta"):  # shapes only: no memory, no initialization
    sleeve = torch.nn.TransformerEncoderLayer(768, 12, 3072, activation="gelu", norm_first=False)
    pre_norm = torch.nn.TransformerEncoderLayer(768, 12, 3072, activation="gelu", norm_first=True)
for label, parameters in [("the sleeve's layer (post-norm), built by PyTorch", n_parameters(sleeve)),
                          ("a pre-norm layer of GPT-2's width, built by PyTorch", n_parameters(pre_norm)),
                          ("block_parameters(PRESETS['gpt2'])", reference_config.block_parameters(PRESETS["gpt2"]))]:
    print(f"{label:52s} {parameters:,d} parameters")
for name, cfg in PRESETS.items():
    print(f"{name:18s} {cfg.architecture:16s} {cfg.norm_placement + '-norm':10s} {cfg.norm:9s} {cfg.ffn:9s} "
          f"positions: {cfg.positions}")

tokens = torch.randn(1, 6, 16, generator=torch.Generator().manual_seed(0))
changed = tokens.clone()
changed[:, -1] += 1.0  # change only the last token
for causal in (False, True):
    before = torch.nn.functional.scaled_dot_product_attention(tokens, tokens, tokens, is_causal=causal)
    after = torch.nn.functional.scaled_dot_product_attention(changed, changed, changed, is_causal=causal)
    moved = (before - after).abs().amax(dim=-1)[0, :-1]
    print(f"{'causal' if causal else 'bidirectional':13s} attention: each of the 5 earlier outputs moved by "
          f"{moved.min():.3f} to {moved.max():.3f}")

# %% [markdown]
# ## What `minillm` gained
#
# - `minillm.config`: `ModelConfig`, the presets of famous models, `count_parameters`
#   (your Exercises 3–5), checked against the built models in the test suite;
# - `minillm.history`: `rnn_forward` and `self_attention` (Exercises 1–2) and the
#   milestones.
#
# Every later chapter imports `ModelConfig`; chapter 07's `GPTConfig` extends it, and the
# tests check that `count_parameters` equals the parameter count of the built `GPT`.
#
# ## Further reading
#
# - Elman, *Finding Structure in Time* (1990): the simple recurrent network.
# - Hochreiter & Schmidhuber, *Long Short-Term Memory* (1997).
# - Bahdanau, Cho & Bengio, *Neural Machine Translation by Jointly Learning to Align and Translate* (2014): attention on top of an RNN.
# - Sennrich, Haddow & Birch, *Neural Machine Translation of Rare Words with Subword Units* (2016): BPE for language models.
# - Shazeer et al., *Outrageously Large Neural Networks: The Sparsely-Gated Mixture-of-Experts Layer* (2017).
# - Vaswani et al., *Attention Is All You Need* (2017).
# - Radford et al., *Improving Language Understanding by Generative Pre-Training* (2018): GPT.
# - Devlin et al., *BERT: Pre-training of Deep Bidirectional Transformers for Language Understanding* (2018).
# - Radford et al., *Language Models are Unsupervised Multitask Learners* (2019): GPT-2.
# - Kaplan et al., *Scaling Laws for Neural Language Models* (2020).
# - Brown et al., *Language Models are Few-Shot Learners* (2020): GPT-3.
# - Shazeer, *GLU Variants Improve Transformer* (2020): SwiGLU.
# - Su et al., *RoFormer: Enhanced Transformer with Rotary Position Embedding* (2021).
# - Hu et al., *LoRA: Low-Rank Adaptation of Large Language Models* (2021).
# - Press, Smith & Lewis, *Train Short, Test Long: Attention with Linear Biases Enables Input Length Extrapolation* (2021): ALiBi.
# - Dao et al., *FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness* (2022).
# - Ouyang et al., *Training language models to follow instructions with human feedback* (2022): InstructGPT, RLHF.
# - Touvron et al., *LLaMA: Open and Efficient Foundation Language Models* (2023).
# - Ainslie et al., *GQA: Training Generalized Multi-Query Transformer Models from Multi-Head Checkpoints* (2023).
# - Rafailov et al., *Direct Preference Optimization: Your Language Model is Secretly a Reward Model* (2023).
