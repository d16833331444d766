# %% [markdown]
# # Chapter 08 · Scaling laws and data-parallel training
#
# **Where this sits on the tee:** the back graphic, made *bigger*. The shirt's history says
# scaling laws "proved that simply making these models larger and feeding them more data
# led to predictable improvements", and that today's models run "across massive
# distributed accelerator clusters". This chapter counts what a model costs, finds a
# scaling law on a laptop, and trains one model on several processes with PyTorch's own
# engine, `torch.distributed`.
#
# **You will be able to**
# - count the FLOPs of training and of inference: $6ND$, which $N$, and the attention term
#   that $6ND$ leaves out, checked against PyTorch's FLOP counter on the real model;
# - fit a power law $L(N) = aN^{-\alpha} + c$ with its uncertainty, and say when the data
#   cannot pin down $c$;
# - run a scaling-law lab on a CPU: loss against size and against compute, an IsoFLOP
#   experiment in the Chinchilla manner, and a prediction of a larger model's loss;
# - train data-parallel with `torchrun` and `DistributedDataParallel`, say what is
#   all-reduced and why the loss equals one process with the whole batch, and what
#   changes on many machines.
#
# **Prerequisites:** chapter 07 (`GPT`, `train`, `BatchSampler`, `count_parameters`).
#
# **Time:** about 40 minutes of reading, 35 minutes of exercises (five coded, one written).
#
# **How the exercises work.** Each exercise has an answer cell (replace
# `raise NotImplementedError()` with your code), a *visible test* that explains what is
# wrong when it fails, and a *hidden test* that runs only when the notebook is graded. Each
# exercise is graded on its own: where one builds on another, its tests use the course's
# reference for the other. A cell after the tests binds a new name to your function when
# it passes the visible test, or else to the course's reference, so you can always read
# on; in a student bundle where that reference is not released yet, the cells that need
# your answer wait for it and say so.

# %%
import contextlib
import io
import json
import math
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

import course_runtime as course
from minillm import data
from minillm import train as training
from minillm.batches import BatchSampler
from minillm.loss import token_nll
from minillm.model import GPT, GPTConfig, count_parameters
from minillm.recipe import recipe_config

device = course.setup(seed=0)  # this chapter's models are small: it runs them on the CPU, whatever `device` says
torch.set_num_threads(1)  # one thread is as fast for them, and robust on a busy machine
QUICK = course.QUICK

# %% [markdown]
# Everything this chapter builds goes into `minillm/scaling.py`; the process-group set-up
# for data-parallel training is `minillm/distributed.py`, a plain module (infrastructure)
# that the last part reads. The first cell holds the module's docstring and imports.

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
c; ``power_law_exponent`` fits a and alpha for a given c, ``predict_loss`` extrapolates.
``fit_isoflop(compute, n, loss)`` finds the loss-optimal size of each compute budget (a
parabola in log N, Chinchilla's approach 2) and fits N_opt = k C^a. ``allreduce_bytes``:
what data-parallel training sends each step.
"""
import math
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from minillm.checks import non_negative_int, positive_int
from minillm.model import GPT, GPTConfig, count_parameters

# %% [markdown]
# ## What training costs: $6ND$
#
# A matrix product of a $(1 \times k)$ row by a $(k \times m)$ matrix does $km$
# multiplications and $km$ additions: **2 FLOPs per weight** for every token that passes
# through. Almost all of a transformer's parameters sit in such matrices (the Q, K, V and
# output projections, the FFN, the output head), so a forward pass costs about $2N$ FLOPs
# a token. The backward pass costs twice that: for every weight matrix it computes the
# gradient with respect to its input (to pass on) *and* with respect to the weights (to
# learn), each another product of the same size. Forward plus backward is $6N$ FLOPs a
# token, and training on $D$ tokens costs
#
# $$C \approx 6ND.$$
#
# **Which $N$?** The token embedding is a lookup, an index into a table: it costs no
# FLOPs, however large the table. So is a learned position table. Kaplan et al. (2020)
# therefore count *non-embedding* parameters, the `non_embedding=True` count of chapter
# 07's `count_parameters`. But the output head is a real $(d_{model} \times V)$ matrix
# product for every token. When it is tied to the embedding (our default, and GPT-2's),
# `non_embedding=True` leaves it out together with the token table, so its
# $V \cdot d_{model}$ weights must be added back. For a mixture of experts (chapter 11)
# only the parameters a token uses cost FLOPs: `active=True`.
#
# Here is the difference for the shipped model's shape:

# %%
shipped = recipe_config(2048)
total, non_embedding = count_parameters(shipped), count_parameters(shipped, non_embedding=True)
head = shipped.vocab_size * shipped.d_model
print(f"all parameters {total:,d}; non-embedding {non_embedding:,d}; tied head {head:,d}")
print(f"N that costs FLOPs: {non_embedding + head:,d} ({(non_embedding + head) / non_embedding:.2f}x the "
      f"non-embedding count: at this size the head is a large share of the work)")

# %% [markdown]
# ### Exercise 1 · The non-embedding count and $6ND$
#
# Write `training_flops_6nd(config, tokens)`: $6ND$ for the model `GPT(config)` trained on
# `tokens` tokens, with $N$ = `count_parameters(config, non_embedding=True, active=True)`,
# plus `config.vocab_size * config.d_model` when `config.tie_embeddings` is True. Return an
# `int`. `TypeError` unless `config` is a `GPTConfig`; `ValueError` naming `tokens` unless
# it is an int $\ge 0$ (`minillm.checks.non_negative_int` does that).
#
# Difficulty ●○○ · Importance ●●● · about 5 minutes
#
# <details><summary>Hint 1</summary>The embedding lookup costs nothing; the tied head is the same tensor but a real matrix product.</details>
# <details><summary>Hint 2</summary><code>n = count_parameters(config, non_embedding=True, active=True)</code>, then <code>n += config.vocab_size * config.d_model</code> if tied; return <code>6 * n * tokens</code>.</details>

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
#| test training_flops_6nd_visible points=1
@course.visible_check("training_flops_6nd")
def check_training_flops_6nd(flops_6nd):
    """Three shapes: tied with biases, untied, and a Llama-style GQA model."""
    tied = GPTConfig(vocab_size=300, context_length=32, d_model=64, n_layers=2, n_heads=4, d_ff=256)
    non_embedding = count_parameters(tied, non_embedding=True)
    everything = count_parameters(tied)
    expected = 6 * (non_embedding + 300 * 64) * 1000
    got = flops_6nd(tied, 1000)
    course.expect_equal(got, expected, "training_flops_6nd of a tied 2-layer model, 1000 tokens",
                        mistakes={"the tied head left out (non-embedding parameters only)": 6 * non_embedding * 1000,
                                  "every parameter counted, the embedding lookup and position table included":
                                      6 * everything * 1000,
                                  "2ND: the forward pass only, no backward": 2 * (non_embedding + 300 * 64) * 1000},
                        hint="N = non-embedding parameters + the tied head's vocab_size * d_model; 6 FLOPs a token each")
    untied = GPTConfig(vocab_size=300, context_length=32, d_model=64, n_layers=2, n_heads=4, d_ff=256,
                       tie_embeddings=False)
    course.expect_equal(flops_6nd(untied, 10), 6 * count_parameters(untied, non_embedding=True) * 10,
                        "an untied model (its head is in the non-embedding count already)",
                        mistakes={"the head added twice": 6 * (count_parameters(untied, non_embedding=True) + 300 * 64) * 10})
    llama = GPTConfig(vocab_size=256, context_length=16, d_model=48, n_layers=1, n_heads=3, n_kv_heads=1,
                      positions="rope", norm="rmsnorm", ffn="swiglu", bias=False)
    course.expect_equal(flops_6nd(llama, 0), 0, "zero tokens")
    course.expect_raises(ValueError, flops_6nd, llama, -5, match="tokens", what="training_flops_6nd(config, -5)")
    course.expect_raises(TypeError, flops_6nd, {"d_model": 48}, 5, what="training_flops_6nd(a dict, 5)")


check_training_flops_6nd(training_flops_6nd)
print("training_flops_6nd: visible test passed")

# %%
#| test training_flops_6nd_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
for _ in range(4):
    d_model = 16 * int(torch.randint(1, 6, ()))
    n_heads = [h for h in (1, 2, 4) if d_model % h == 0][int(torch.randint(0, 3, ())) % 3]
    tie, ffn = bool(torch.randint(0, 2, ())), ["gelu", "swiglu", "relu"][int(torch.randint(0, 3, ()))]
    positions = ["learned", "rope", "sinusoidal", "alibi"][int(torch.randint(0, 4, ()))]
    config = GPTConfig(vocab_size=int(torch.randint(50, 2000, ())), context_length=32, d_model=d_model,
                       n_layers=int(torch.randint(1, 4, ())), n_heads=n_heads, ffn=ffn, positions=positions,
                       tie_embeddings=tie, d_ff=None)
    tokens = int(torch.randint(1, 10**9, ()))
    n = count_parameters(config, non_embedding=True, active=True) + (config.vocab_size * d_model if tie else 0)
    got = training_flops_6nd(config, tokens)
    assert isinstance(got, int) and not isinstance(got, bool), "training_flops_6nd must return an int"
    course.expect_equal(got, 6 * n * tokens, "training_flops_6nd of a random config, exact for large D")
course.expect_raises(ValueError, training_flops_6nd, config, 2.5, match="tokens", what="a float number of tokens")
course.expect_raises(TypeError, training_flops_6nd, "gpt2", 10, what="a config that is a string")
### END HIDDEN TESTS

# %%
from minillm import scaling as reference_scaling

flops_6nd = course.keep_going("training_flops_6nd", training_flops_6nd, reference_scaling.training_flops_6nd,
                              check_training_flops_6nd)

# %% [markdown]
# ## The attention term
#
# $6ND$ counts the products *with weights*. Attention has two products without any: the
# scores $QK^\top$ and the weighted values $AV$. For one token at a context of $T$, in one
# layer, the scores are $T$ dot products of length $d_{attn} = n_{heads} \cdot d_{head}$
# ($2Td_{attn}$ FLOPs), and the values another $2Td_{attn}$. A dense kernel computes the
# whole $T \times T$ score matrix even in a causal model (the masked half is computed, then
# thrown away), so over $n_{layers}$ layers, forward and backward (three times forward):
#
# $$C_{attn} = 3 \cdot 4\, n_{layers}\, T\, d_{attn} \cdot D = 12\, n_{layers}\, T\, d_{attn}\, D .$$
#
# Compared with $6N \approx 6 \cdot 12\, n_{layers} d_{model}^2$ per token, its share is
# about $T / (6 d_{model})$: negligible for GPT-3 ($T = 2048$, $d = 12288$: 3%), but our
# shipped model has $T = 128$ and $d = 128$, so it is not negligible there. (Kaplan et al. count
# $2n_{layers}Td_{attn}$ for the forward pass, half of ours: their count charges the causal
# half only, as a kernel that skips it, FlashAttention, does.)
#
# ### Exercise 2 · The attention FLOP term
#
# Write `attention_training_flops(config, tokens, seq_len=None)`: the training FLOPs of
# $QK^\top$ and $AV$ above, for `tokens` tokens cut into windows of `seq_len` (default
# `config.context_length`), as an `int`. $d_{attn}$ is `config.n_heads * config.head_dim`
# (grouped-query attention shares keys, but every query head still computes its scores).
# `TypeError` unless `config` is a `GPTConfig`; `ValueError` naming `tokens` unless it is an
# int $\ge 0$; `ValueError` naming `seq_len` unless it is an int in $[1, $ context$]$.
#
# Difficulty ●○○ · Importance ●●○ · about 8 minutes
#
# <details><summary>Hint 1</summary>Forward: 2 T d_attn for the scores plus 2 T d_attn for the values, per token and layer. Training is 3 times the forward.</details>
# <details><summary>Hint 2</summary><code>12 * config.n_layers * seq_len * config.n_heads * config.head_dim * tokens</code>, after the checks (<code>minillm.checks.positive_int</code> for seq_len).</details>

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
#| test attention_training_flops_visible points=1
@course.visible_check("attention_training_flops")
def check_attention_training_flops(attention_flops):
    """The term against a hand count, the seq_len default, GQA, and the errors."""
    config = GPTConfig(vocab_size=100, context_length=64, d_model=64, n_layers=3, n_heads=4, d_ff=256)
    expected = 12 * 3 * 32 * 64 * 500
    course.expect_equal(attention_flops(config, 500, 32), expected, "attention_training_flops(config, 500, seq_len=32)",
                        mistakes={"the forward pass only (no backward)": 4 * 3 * 32 * 64 * 500,
                                  "the scores QK^T only, not the weighted values AV": 6 * 3 * 32 * 64 * 500,
                                  "d_head instead of d_attn = n_heads * head_dim": 12 * 3 * 32 * 16 * 500,
                                  "the causal half only": 6 * 3 * 32 * 64 * 500},
                        hint="12 * n_layers * seq_len * n_heads * head_dim * tokens")
    course.expect_equal(attention_flops(config, 500), 12 * 3 * 64 * 64 * 500, "the default seq_len (the context)")
    gqa = GPTConfig(vocab_size=100, context_length=16, d_model=48, n_layers=1, n_heads=6, n_kv_heads=2,
                    positions="rope", d_ff=96)
    course.expect_equal(attention_flops(gqa, 10, 16), 12 * 16 * 48 * 10, "a GQA model (6 query heads, 2 KV heads)",
                        mistakes={"n_kv_heads used: every query head computes its own scores": 12 * 16 * 16 * 10})
    course.expect_raises(ValueError, attention_flops, config, 10, 65, match="seq_len", what="seq_len past the context")
    course.expect_raises(ValueError, attention_flops, config, 10, 0, match="seq_len", what="seq_len=0")
    course.expect_raises(ValueError, attention_flops, config, -1, match="tokens", what="tokens=-1")


check_attention_training_flops(attention_training_flops)
print("attention_training_flops: visible test passed")

# %%
#| test attention_training_flops_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
for _ in range(4):
    n_heads = int(torch.randint(1, 5, ()))
    head_dim = 8 * int(torch.randint(1, 4, ()))
    context = int(torch.randint(8, 200, ()))
    config = GPTConfig(vocab_size=64, context_length=context, d_model=n_heads * head_dim,
                       n_layers=int(torch.randint(1, 5, ())), n_heads=n_heads, d_ff=32, positions="rope")
    seq_len = int(torch.randint(1, context + 1, ()))
    tokens = int(torch.randint(0, 10**9, ()))
    got = attention_training_flops(config, tokens, seq_len)
    assert isinstance(got, int) and not isinstance(got, bool), "attention_training_flops must return an int"
    course.expect_equal(got, 12 * config.n_layers * seq_len * n_heads * head_dim * tokens, "a random config")
    course.expect_equal(attention_training_flops(config, tokens), 12 * config.n_layers * context * n_heads * head_dim *
                        tokens, "a random config, the default seq_len")
# against the FLOP counter: the change when the same tokens come in longer windows
config = GPTConfig(vocab_size=64, context_length=32, d_model=32, n_layers=2, n_heads=2, d_ff=64,
                   attention_backend="math")
model = GPT(config)
counted = []
for batch, seq in ((4, 8), (1, 32)):
    with FlopCounterMode(display=False) as flop_counter:
        model(torch.randint(0, 64, (batch, seq)), torch.randint(0, 64, (batch, seq)))[1].backward()
    counted.append(flop_counter.get_total_flops())
course.expect_equal(attention_training_flops(config, 32, 32) - attention_training_flops(config, 32, 8),
                    counted[1] - counted[0], "what FlopCounterMode sees the longer windows add")
course.expect_raises(ValueError, attention_training_flops, config, 10, 2.0, match="seq_len", what="a float seq_len")
course.expect_raises(TypeError, attention_training_flops, None, 10, what="config=None")
### END HIDDEN TESTS

# %%
attention_flops = course.keep_going("attention_training_flops", attention_training_flops,
                                    reference_scaling.attention_training_flops, check_attention_training_flops)

# %% [markdown]
# The package adds the two (`training_flops`), gives the FLOPs of one decoding step over a
# context (`inference_flops`: $2N$ plus $4 n_{layers} T d_{attn}$, a forward pass for one
# new token whose keys and values are cached), and the tokens a compute budget buys
# (`tokens_for_compute`, which the IsoFLOP experiment below uses).

# %%
#| export minillm/scaling.py
def training_flops(config: GPTConfig, tokens: int, seq_len: int | None = None) -> int:
    """The FLOPs of training ``GPT(config)`` on ``tokens`` tokens in windows of ``seq_len``
    (default: the context): 6 N D plus the attention term (see the module's docstring)."""
    return training_flops_6nd(config, tokens) + attention_training_flops(config, tokens, seq_len)


def inference_flops(config: GPTConfig, context: int) -> int:
    """The FLOPs of one forward step for one new token that attends over ``context``
    positions (itself included; a KV cache holds the others): 2 N + 4 n_layers context d_attn."""
    dense = training_flops_6nd(config, 1) // 3  # 2 N; it also refuses a config that is no GPTConfig
    positive_int("context", context)
    if context > config.context_length:
        raise ValueError(f"context must be <= the config's context_length ({config.context_length}), got {context}")
    return dense + 4 * config.n_layers * context * config.n_heads * config.head_dim


def tokens_for_compute(config: GPTConfig, compute: float, seq_len: int | None = None) -> int:
    """How many training tokens a budget of ``compute`` FLOPs buys for ``GPT(config)``
    (``training_flops`` per token, rounded down)."""
    if not isinstance(compute, (int, float)) or isinstance(compute, bool) or not compute > 0:
        raise ValueError(f"compute must be a positive number of FLOPs, got {compute!r}")
    return int(compute // training_flops(config, 1, seq_len))


# %% [markdown]
# ### Checked against PyTorch's FLOP counter
#
# `torch.utils.flop_counter.FlopCounterMode` counts the FLOPs of every matrix product that
# actually runs, forward and backward. We run one training step of a GPT-2-style model
# (biases, LayerNorm, GELU) through it with the explicit "math" attention backend (the
# counter has no formula for the CPU kernel behind `F.scaled_dot_product_attention`, so
# with "sdpa" it would miss the attention term).

# %%
check_config = GPTConfig(vocab_size=300, context_length=64, d_model=64, n_layers=2, n_heads=4, d_ff=256,
                         attention_backend="math")
check_model = GPT(check_config)
ids = torch.randint(0, 300, (4, 64))
with FlopCounterMode(display=False) as counter:
    check_model(ids, ids)[1].backward()
counted = counter.get_total_flops()
predicted = reference_scaling.training_flops(check_config, ids.numel(), 64)
elementwise = sum(p.numel() for p in check_model.parameters() if p.dim() < 2)  # biases and norm gains
print(f"FlopCounterMode {counted:,d}; training_flops {predicted:,d}; ratio {predicted / counted:.4f}")
print(f"without the {elementwise:,d} biases and gains in N: {predicted - 6 * ids.numel() * elementwise:,d}")

# %% [markdown]
# The two agree to about 1%, and *exactly* once the biases and norm gains are left out of
# $N$: they are parameters, but they add or scale instead of multiplying into a matrix
# product, so they cost a few FLOPs a token, not 6, and the counter ignores elementwise
# work (softmax, GELU, norms) altogether. That is the stated tolerance of the package's
# test (`tests/test_scaling.py`: within 2%, and exact after that correction). How much does
# the attention term add to $6ND$ as the context grows?

# %%
contexts = [128, 512, 2048, 8192]
for name, config in [("shipped shape (d_model 128)", None), ("GPT-2 small (d_model 768)", "gpt2")]:
    shares = []
    for context in contexts:
        if config is None:
            shape = recipe_config(2048, context_length=context)
        else:
            shape = GPTConfig(vocab_size=50257, context_length=context, d_model=768, n_layers=12, n_heads=12,
                              d_ff=3072)
        shares.append(attention_flops(shape, 1, context) / flops_6nd(shape, 1))
    print(f"{name:28s} attention / 6N at context " + ", ".join(f"{c}: {s:.0%}" for c, s in zip(contexts, shares)))

# %% [markdown]
# For the shipped shape the attention term adds 12% to $6N$ at its own context of 128 and
# twice $6N$ at 2,048; for GPT-2 small it adds 8% at 512 and passes $6N$ only at 8,192.
# (Both are a little below $T / 6d_{model}$, because the tied head is part of $N$.)
# Scaling laws quote $6ND$ because for large models at ordinary contexts the correction is
# small, but for a small model (and the sweep below) the package counts both.
#
# ## Fitting a power law
#
# Kaplan et al. (2020) found that a language model's test loss, trained to convergence on
# plenty of data, follows a power law in its non-embedding size, $L(N) = (N_c / N)^{\alpha_N}$
# with $\alpha_N \approx 0.076$, over seven orders of magnitude. A pure power law is a
# straight line on log-log axes. Real curves bend: no model gets below the entropy of the
# text itself (and, with a fixed amount of data, below what that data can teach), so the
# usual form has an offset,
#
# $$L(N) = a N^{-\alpha} + c .$$
#
# With $c$ known, $\log(L - c) = \log a - \alpha \log N$ is a straight line, and ordinary
# least squares gives $a$ and $\alpha$. That is the next exercise.
#
# ### Exercise 3 · Fit a power law
#
# Write `power_law_exponent(n, loss, c=0.0)`: the `(a, alpha)` of the least-squares line
# through the points $(\log N_i, \log(L_i - c))$, where the line is
# $\log(L - c) = \log a - \alpha \log N$; return two Python floats. `n` and `loss` are 1-d
# sequences of the same length (lists, numpy arrays or tensors), at least 2 points.
# `ValueError` naming `n` unless every size is positive, there are at least two different
# sizes and the lengths match; `ValueError` naming `loss` unless every loss is above `c`.
#
# Difficulty ●●○ · Importance ●●● · about 10 minutes
#
# <details><summary>Hint 1</summary>Convert with <code>np.asarray(n, dtype=np.float64)</code>. The natural logarithm and <code>exp</code> go together: mixing <code>log10</code> with <code>exp</code> gives a wrong a.</details>
# <details><summary>Hint 2</summary><code>slope, intercept = np.polyfit(np.log(n), np.log(loss - c), 1)</code>; then <code>alpha = -slope</code> and <code>a = exp(intercept)</code>.</details>

# %%
#| answer power_law_exponent
#| export minillm/scaling.py
def power_law_exponent(n, loss, c: float = 0.0) -> tuple[float, float]:
    """(a, alpha) of the least-squares line log(L - c) = log a - alpha log N through the
    points (n[i], loss[i]): 1-d, the same length, at least 2 points, every loss above c."""
    ### BEGIN SOLUTION
    n = np.asarray(n, dtype=np.float64)
    loss = np.asarray(loss, dtype=np.float64)
    if n.ndim != 1 or loss.shape != n.shape:
        raise ValueError(f"n and loss must be 1-d of the same length, got shapes {n.shape} and {loss.shape}")
    if not np.all(n > 0) or len(np.unique(n)) < 2:
        raise ValueError("n must hold positive sizes, at least two different ones")
    if not np.all(loss > c):
        raise ValueError(f"every loss must be above c={c}: log(loss - c) is undefined otherwise")
    slope, intercept = np.polyfit(np.log(n), np.log(loss - c), 1)
    return float(math.exp(intercept)), float(-slope)
    ### END SOLUTION

# %%
#| test power_law_exponent_visible points=1
@course.visible_check("power_law_exponent")
def check_power_law_exponent(fit):
    """An exact law, with and without an offset, then noisy points against numpy's own line."""
    n = [1e4, 1e5, 1e6, 1e7]
    got = fit(n, [7.0 * x ** -0.25 for x in n])
    if not (isinstance(got, tuple) and len(got) == 2):
        raise course.CheckFailed(f"power_law_exponent must return (a, alpha), got {course.describe(got)}")
    course.expect_close(torch.tensor(got, dtype=torch.float64), torch.tensor([7.0, 0.25], dtype=torch.float64),
                        "(a, alpha) of L = 7 N^-0.25", rtol=1e-6,
                        mistakes={"alpha has the wrong sign (the slope is -alpha)": torch.tensor([7.0, -0.25],
                                                                                                dtype=torch.float64),
                                  "a = 10**intercept of a natural-log fit, or exp of a log10 one":
                                      torch.tensor([math.exp(math.log(7.0) / math.log(10)), 0.25], dtype=torch.float64)},
                        hint="the line is log(L - c) = log(a) - alpha log(N); a = exp(intercept)")
    got = fit(n, [3.0 * x ** -0.5 + 1.2 for x in n], c=1.2)
    course.expect_close(torch.tensor(got, dtype=torch.float64), torch.tensor([3.0, 0.5], dtype=torch.float64),
                        "(a, alpha) of L = 3 N^-0.5 + 1.2 with c=1.2", rtol=1e-6,
                        hint="subtract c from the losses before taking the logarithm")
    noisy = np.array([2.9, 2.6, 2.2, 2.05, 1.8])
    sizes = np.array([1e3, 3e3, 1e4, 3e4, 1e5])
    slope, intercept = np.polyfit(np.log(sizes), np.log(noisy - 1.0), 1)
    course.expect_close(torch.tensor(fit(sizes, noisy, 1.0), dtype=torch.float64),
                        torch.tensor([math.exp(intercept), -slope], dtype=torch.float64), "noisy points, c=1",
                        rtol=1e-6)
    course.expect_raises(ValueError, fit, n, [2.0, 1.5, 1.0, 0.9], c=1.0, match="loss", what="a loss below c")
    course.expect_raises(ValueError, fit, [1e4, 1e4], [2.0, 1.5], match="n", what="two equal sizes")


check_power_law_exponent(power_law_exponent)
print("power_law_exponent: visible test passed")

# %%
#| test power_law_exponent_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
for _ in range(5):
    a, alpha, c = float(torch.rand(()) * 50 + 0.5), float(torch.rand(()) * 0.8 + 0.05), float(torch.rand(()) * 2)
    sizes = torch.logspace(3, 3 + float(torch.rand(()) * 6 + 1), int(torch.randint(2, 9, ())), dtype=torch.float64)
    losses = a * sizes ** -alpha + c
    got = power_law_exponent(sizes.tolist(), losses.numpy(), c)
    assert isinstance(got, tuple) and len(got) == 2, "power_law_exponent must return (a, alpha)"
    assert all(isinstance(v, float) for v in got), "a and alpha must be Python floats"
    course.expect_close(torch.tensor(got, dtype=torch.float64), torch.tensor([a, alpha], dtype=torch.float64),
                        "(a, alpha) of a random exact law", rtol=1e-6, atol=1e-9)
# sizes up to 1e12 with a tiny exponent: a fit in log space stays exact
sizes = torch.logspace(6, 12, 5, dtype=torch.float64)
got = power_law_exponent(sizes, 2.0 * sizes ** -0.01)
course.expect_close(torch.tensor(got, dtype=torch.float64), torch.tensor([2.0, 0.01], dtype=torch.float64),
                    "large sizes, a small exponent", rtol=1e-6)
course.expect_raises(ValueError, power_law_exponent, [1e3, 1e4, 1e5], [2.0, 1.0], match="n", what="lengths differ")
course.expect_raises(ValueError, power_law_exponent, [1e3, -1e4], [2.0, 1.0], match="n", what="a negative size")
course.expect_raises(ValueError, power_law_exponent, [1e3, 1e4], [2.0, 1.0], c=1.0, match="loss",
                     what="a loss equal to c")
### END HIDDEN TESTS

# %%
exponent_fit = course.keep_going("power_law_exponent", power_law_exponent, reference_scaling.power_law_exponent,
                                 check_power_law_exponent)

# %% [markdown]
# What if $c$ is unknown? Then there are three unknowns, and the package's
# `fit_power_law(n, loss)` finds them: for each candidate $\alpha$, $L = a x + c$ with
# $x = N^{-\alpha}$ is linear in $(a, c)$, so a search over $\alpha$ with a small least
# squares inside finds the best fit (of the *relative* error, so that every size counts
# alike). Its standard errors come from the fit's covariance,
# $\sigma^2 (J^\top J)^{-1}$, with $J$ the Jacobian of the residuals. And it says when the
# data cannot pin $c$ down: when the best $c$ is the bound 0, or its standard error is half
# of its value or more. Then the points hardly bend over the range of sizes, any $c$ from
# zero up fits about as well, and $\alpha$ is only an *effective* exponent for that range.
# An exact law shows both cases:

# %%
#| export minillm/scaling.py
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


# %%
sizes = np.logspace(4, 7, 6)
exact = reference_scaling.fit_power_law(sizes, 5.0 * sizes ** -0.3 + 1.5)
print(f"L = 5 N^-0.3 + 1.5 recovered: a = {exact.a:.3f}, alpha = {exact.alpha:.4f}, c = {exact.c:.4f}, "
      f"c pinned: {exact.c_pinned}")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    bent_little = reference_scaling.fit_power_law(sizes, 5.0 * sizes ** -0.3 * (1 + 0.01 * np.sin(sizes)))
print(f"a pure power law with 1% noise: c = {bent_little.c:.3g} +- {bent_little.c_std:.2g}, pinned: "
      f"{bent_little.c_pinned}; warned: {[str(w.message)[:70] + '...' for w in caught]}")

# %% [markdown]
# ## A scaling-law lab on a CPU
#
# `bench/scaling_sweep.py` (`make sweep`) trains GPTs of six sizes, from about 13k to
# 1.3M non-embedding parameters (a factor near 100), all of the course's recipe shape
# (RoPE, RMSNorm, SwiGLU, tied embeddings), on the corpus's bytes (a vocabulary of 256,
# one token a character), windows of 64, batches of 16, and measures the validation
# loss in nats per byte on held-out text. Three experiments:
#
# - **size:** every size on the same fixed budget of tokens;
# - **IsoFLOP:** three compute budgets, four sizes each; each run gets the tokens its budget
#   buys, `tokens_for_compute(config, budget)`;
# - **learning rate:** the rule we use is one learning rate for every size, the recipe's
#   $3 \times 10^{-3}$, with warmup over 10% of the steps and a cosine decay. The sweep
#   checks the rule at the smallest and the largest size against $10^{-3}$ and $10^{-2}$.
#
# It takes many minutes, so its results are cached in `data/scaling_sweep.json`, with the
# command and the time that made them. First, the same kind of run live, three tiny sizes
# for a few steps (so that you see what each point of the sweep is):

# %%
sweep = json.loads(data.path("scaling_sweep.json").read_text())
settings = sweep["settings"]
train_text, val_text = data.split_corpus(data.corpus_text())
train_bytes = torch.tensor(list(train_text.encode("utf-8")))
val_bytes = torch.tensor(list(val_text.encode("utf-8")))[:8192]
live_steps = 15 if QUICK else 60
live = []
for d_model, n_layers in [(16, 1), (32, 1), (48, 2)]:
    config = recipe_config(256, context_length=64, d_model=d_model, n_layers=n_layers, n_heads=d_model // 16)
    torch.manual_seed(0)
    model = GPT(config)
    batches = BatchSampler(train_bytes, 16, 64, seed=0)
    started = time.perf_counter()
    training.train(model, batches, training.TrainConfig(steps=live_steps, lr=3e-3, warmup_steps=live_steps // 10,
                                                        eval_every=live_steps, checkpoint_every=live_steps),
                   progress=False)
    total_nll, count = token_nll(model, val_bytes, context=64)
    live.append((count_parameters(config, non_embedding=True), total_nll / count))
    print(f"d_model {d_model:3d} x {n_layers}: {live[-1][0]:>7,d} non-embedding parameters, {live_steps} steps: "
          f"loss {live[-1][1]:.3f} nats per byte ({time.perf_counter() - started:.1f} s)")
print(f"\nthe cached sweep: {len(sweep['runs'])} runs, made by `{sweep['command']}` in {sweep['minutes']:.0f} minutes")

# %% [markdown]
# ### Loss against size, at a fixed number of tokens

# %%
size_runs = sorted((run for run in sweep["runs"] if run["kind"] == "size"), key=lambda run: run["non_embedding"])
n_sizes = np.array([run["non_embedding"] for run in size_runs], dtype=float)
loss_sizes = np.array([run["val_loss"] for run in size_runs])
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    size_fit = reference_scaling.fit_power_law(n_sizes, loss_sizes)
print(f"{len(size_runs)} sizes, {n_sizes.max() / n_sizes.min():.0f}x apart, {settings['tokens']:,d} tokens each")
for run in size_runs:
    print(f"  N = {run['non_embedding']:>9,d}: loss {run['val_loss']:.4f}, {run['flops']:.2e} FLOPs")
print(f"fit: L = {size_fit.a:.3g} N^-{size_fit.alpha:.3f} + {size_fit.c:.3f}  "
      f"(alpha +- {size_fit.alpha_std:.3f}, c +- {size_fit.c_std:.3f}; c pinned: {size_fit.c_pinned})")
for warning in caught:
    print("warning:", warning.message)

fig, axes = plt.subplots(1, 2, figsize=(11, 4))
grid = np.logspace(math.log10(n_sizes.min()) - 0.2, math.log10(n_sizes.max()) + 0.5, 100)
axes[0].loglog(n_sizes, loss_sizes, "o", label="measured (validation)")
axes[0].loglog(grid, size_fit(grid), "-", label=f"$aN^{{-\\alpha}} + c$, $\\alpha$ = {size_fit.alpha:.2f}")
axes[0].axhline(size_fit.c, color="gray", ls=":", label=f"fitted floor c = {size_fit.c:.2f}")
axes[0].set(xlabel="non-embedding parameters N", ylabel="loss (nats per byte)",
            title=f"Loss against size, {settings['tokens'] / 1e3:.0f}k tokens each")
axes[0].legend()
compute_runs = sorted((run for run in sweep["runs"] if run["kind"] in ("size", "isoflop")), key=lambda r: r["flops"])
for label, kind, marker in [("fixed tokens", "size", "o"), ("IsoFLOP runs", "isoflop", "s")]:
    runs = [run for run in compute_runs if run["kind"] == kind]
    axes[1].loglog([run["flops"] for run in runs], [run["val_loss"] for run in runs], marker, label=label)
axes[1].set(xlabel="training compute C (FLOPs, training_flops)", ylabel="loss (nats per byte)",
            title="Loss against compute")
axes[1].legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# Loss falls with size, but the curve bends toward a floor: with every model on the same
# few hundred thousand tokens, the largest ones are *data-limited*. They have capacity to
# spare and too few steps to use it, so the two largest sizes land within a few
# thousandths of each other. The fit cannot pin that floor down: its $c$ comes with a
# standard error as large as itself, and `fit_power_law` warns (printed above), so its
# $\alpha$ is an effective exponent for this range, not a law. On the right, the envelope
# of the points (the lowest loss at each compute) is what a compute-optimal choice of size
# would give: the IsoFLOP runs, small models trained longer, reach losses the fixed-token
# runs of the same compute do not.
#
# ### Exercise 4 · Predict a larger model's loss
#
# The use of a scaling law: fit it on small, cheap models and predict a large one before
# paying for it. Write `predict_loss(n, loss, n_new)`: fit $L = aN^{-\alpha} + c$ to the
# sizes `n` and losses `loss` with the package's `minillm.scaling.fit_power_law` (call it
# through the module, `scaling.fit_power_law`, so that this exercise is graded on its own),
# and return the fitted loss at `n_new` as a Python float. `ValueError` naming `n_new`
# unless it is a positive number.
#
# Difficulty ●○○ · Importance ●●● · about 5 minutes
#
# <details><summary>Hint 1</summary>A <code>PowerLawFit</code> is callable: <code>fit(n_new)</code> is the fitted loss.</details>
# <details><summary>Hint 2</summary><code>return float(scaling.fit_power_law(n, loss)(n_new))</code>, after checking n_new.</details>

# %%
from minillm import scaling

# %%
#| answer predict_loss
#| export minillm/scaling.py
def predict_loss(n, loss, n_new: float) -> float:
    """The loss of a model of ``n_new`` parameters that L = a N^-alpha + c, fitted to the sizes
    ``n`` and their losses ``loss`` (``fit_power_law``), predicts."""
    ### BEGIN SOLUTION
    if isinstance(n_new, bool) or not isinstance(n_new, (int, float)) or not n_new > 0:
        raise ValueError(f"n_new must be a positive number of parameters, got {n_new!r}")
    return float(fit_power_law(n, loss)(n_new))
    ### END SOLUTION

# %%
#| test predict_loss_visible points=1
@course.visible_check("predict_loss")
def check_predict_loss(predict):
    """Exact laws with a floor: the prediction is the law's value; a bad n_new is refused."""
    sizes = [1e4, 3e4, 1e5, 3e5, 1e6]
    law = [4.0 * x ** -0.3 + 1.2 for x in sizes]
    got = predict(sizes, law, 1e8)
    if not isinstance(got, float):
        raise course.CheckFailed(f"predict_loss must return a Python float, got {course.describe(got)}")
    expected = 4.0 * 1e8 ** -0.3 + 1.2
    course.expect_close(torch.tensor(got, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64),
                        "predict_loss at N = 1e8 of L = 4 N^-0.3 + 1.2", rtol=1e-5,
                        mistakes={"the floor c left out of the prediction": torch.tensor(expected - 1.2, dtype=torch.float64),
                                  "a pure power law (c = 0) fitted, which misses the bend": torch.tensor(
                                      reference_scaling.PowerLawFit(*_pure(sizes, law), 0.0, 0, 0, 0, True, 0)(1e8),
                                      dtype=torch.float64)},
                        hint="fit with scaling.fit_power_law(n, loss) (c free) and call the fit at n_new")
    course.expect_raises(ValueError, predict, sizes, law, 0, match="n_new", what="n_new=0")
    course.expect_raises(ValueError, predict, sizes, law, -1e6, match="n_new", what="a negative n_new")


def _pure(sizes, losses):
    slope, intercept = np.polyfit(np.log(sizes), np.log(losses), 1)
    return math.exp(intercept), -slope


check_predict_loss(predict_loss)
print("predict_loss: visible test passed")

# %%
#| test predict_loss_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
for _ in range(4):
    a, alpha, c = float(torch.rand(()) * 20 + 1), float(torch.rand(()) * 0.4 + 0.2), float(torch.rand(()) * 2 + 0.5)
    sizes = torch.logspace(3, 7, int(torch.randint(5, 9, ())), dtype=torch.float64)
    target = float(10 ** (7 + torch.rand(()) * 2))
    got = predict_loss(sizes.numpy(), (a * sizes ** -alpha + c).numpy(), target)
    assert isinstance(got, float), "predict_loss must return a Python float"
    course.expect_close(torch.tensor(got, dtype=torch.float64), torch.tensor(a * target ** -alpha + c,
                        dtype=torch.float64), "a prediction of a random exact law", rtol=1e-4)
course.expect_raises(ValueError, predict_loss, [1e3, 1e4, 1e5, 1e6], [3.0, 2.5, 2.2, 2.1], "1e8", match="n_new",
                     what="n_new as a string")
course.expect_raises(ValueError, predict_loss, [1e3, 1e4, 1e5, 1e6], [3.0, 2.5, 2.2, 2.1], True, match="n_new",
                     what="n_new=True")
### END HIDDEN TESTS

# %%
predict = course.keep_going("predict_loss", predict_loss, reference_scaling.predict_loss, check_predict_loss)

# %% [markdown]
# Now the real test: fit on the sweep's smaller sizes, predict the next larger one, and
# compare with what training it measured.

# %%
for known in (4, 5):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fits' warning about c: the line below reports c_pinned instead
        fit = reference_scaling.fit_power_law(n_sizes[:known], loss_sizes[:known])
        predicted = predict(n_sizes[:known], loss_sizes[:known], float(n_sizes[known]))
    error = predicted - loss_sizes[known]
    print(f"fit on the {known} smallest sizes (c pinned: {fit.c_pinned}): predicted {predicted:.4f} at "
          f"N = {n_sizes[known]:,.0f}, measured {loss_sizes[known]:.4f}, off by {error:+.4f} nats "
          f"({error / loss_sizes[known]:+.1%})")

# %% [markdown]
# One size ahead (a factor of 1.6 to 2.4), the fits land within a few per cent of the
# measured loss, and both miss on the optimistic side: the fits cannot see the floor that
# the fixed budget of tokens puts under the largest models. A fit whose $c$ the data
# cannot pin down still interpolates, but extrapolates with whatever exponent fits the
# range it saw.
#
# ## IsoFLOP: the best size for a compute budget
#
# Fix a compute budget $C$ and vary the size: a small model gets many tokens, a large one
# few ($D = C / 6N$ roughly). Too small and it lacks capacity; too large and it sees too
# little data. Somewhere between lies the loss-optimal size $N_{opt}(C)$. Hoffmann et al.
# (2022, "Chinchilla", approach 2) fit a parabola to loss against $\log N$ for each budget,
# take its minimum, and fit $N_{opt} \propto C^a$ over the budgets. They found
# $a \approx 0.5$ (approach 2: 0.49; approach 3's law
# $L = E + A/N^{\alpha} + B/D^{\beta}$ gives $a = \beta/(\alpha + \beta) = 0.46$): grow
# parameters and tokens *alike*, about 20 tokens a parameter. Kaplan et al. (2020) had
# found $a \approx 0.73$, mostly because their learning-rate schedule did not adapt to the
# run's length, which penalized the small models trained long.
#
# The package's `isoflop_minimum` and `fit_isoflop` do approach 2. A test
# (`tests/test_scaling.py`) draws IsoFLOP data from the Chinchilla law with noise and
# checks that `fit_isoflop` recovers $a = 0.452$ within 0.02.

# %%
#| export minillm/scaling.py
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

# %%
iso_runs = [run for run in sweep["runs"] if run["kind"] == "isoflop"]
iso_compute = np.array([run["budget"] for run in iso_runs])
iso_n = np.array([run["non_embedding"] for run in iso_runs], dtype=float)
iso_loss = np.array([run["val_loss"] for run in iso_runs])
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    iso = fit_isoflop(iso_compute, iso_n, iso_loss)
fig, axes = plt.subplots(1, 2, figsize=(11, 4))
for budget, optimum in zip(iso.budgets, iso.n_opt):
    mine = iso_compute == budget
    (line,) = axes[0].semilogx(iso_n[mine], iso_loss[mine], "o-", label=f"C = {budget:.0e} FLOPs")
    axes[0].axvline(optimum, color=line.get_color(), ls=":")
axes[0].set(xlabel="non-embedding parameters N", ylabel="loss (nats per byte)",
            title="IsoFLOP curves (dotted: the parabola's minimum)")
axes[0].legend()
axes[1].loglog(iso.budgets, iso.n_opt, "o", label="loss-optimal N per budget")
budgets = np.logspace(math.log10(min(iso.budgets)) - 0.3, math.log10(max(iso.budgets)) + 0.3, 20)
axes[1].loglog(budgets, iso(budgets), "-", label=f"fit: $N_{{opt}} \\propto C^{{{iso.exponent:.2f}}}$")
axes[1].set(xlabel="compute C (FLOPs)", ylabel="N_opt", title="The optimal size grows with compute")
axes[1].legend()
plt.tight_layout()
plt.show()
print(f"fitted a = {iso.exponent:.2f} +- {iso.exponent_std:.2f} over budgets {', '.join(f'{b:.0e}' for b in iso.budgets)};"
      f" Chinchilla 0.46 to 0.50, Kaplan 0.73")
for warning in caught:
    print("warning:", warning.message)

# %% [markdown]
# Read this with care. The shape is Chinchilla's: each budget has a best size, and it
# moves up as the budget grows. The exponent is not: ours is near Kaplan's 0.73, from
# three budgets a factor of 10 apart (Chinchilla used nine, over four orders of magnitude),
# with one learning rate for every size (the check below shows what that costs), and with
# optima among models of a few thousand to a hundred thousand parameters. A budget of
# $10^{11}$ to $10^{12}$ FLOPs is seconds to a minute of CPU. And what **1 MB of text** can
# and cannot show:
#
# - **Repetition.** The corpus has about a million bytes. The smallest model at the
#   largest budget sees its training text several times over; Chinchilla's runs never
#   repeat a token. Repeated data is worth less than fresh data (Muennighoff et al., 2023:
#   up to about 4 epochs is nearly as good, beyond that it decays), so the small models'
#   long runs are flattered less than they would be on fresh text.
# - **Overfitting and saturation.** A large model on a small corpus eventually memorizes
#   it; our runs are too short for that, but the smallest model already gets *worse* from
#   the middle budget to the largest (about 5 and 16 passes over the text): at 4k
#   parameters more of the same data no longer helps.
# - **Small models are not small large models.** At 13k parameters the embedding and the
#   head are a large share of the compute, and the attention term is large at this width
#   (the FLOP section above): the "6N" regime of the papers begins at millions of
#   parameters. An exponent fitted here is an exercise in the method, not a measurement of
#   the law.
#
# ### The learning rate across sizes
#
# Every run above uses one learning rate. Is that fair to both ends of the range? The
# sweep checks it at the smallest and the largest size, on a quarter of the token budget:

# %%
lr_runs = [run for run in sweep["runs"] if run["kind"] == "lr"]
for size in sorted({run["non_embedding"] for run in lr_runs}):
    row = sorted((run for run in lr_runs if run["non_embedding"] == size), key=lambda run: run["lr"])
    print(f"N = {size:>9,d}: " + ", ".join(f"lr {run['lr']:g} -> {run['val_loss']:.3f}" for run in row))

# %% [markdown]
# The rule does not hold across the range: the smallest model does best at the highest
# rate, the largest at the lowest, and the rule's $3 \times 10^{-3}$ sits between them at
# both ends. So every point of our curves is somewhat under-tuned, the ends most, which
# bends a fitted exponent (Kaplan's too-high 0.73 is attributed to a schedule that was
# wrong for part of the range). Large studies tune the rate per size (it falls as models
# grow), or use a parametrization in which one rate transfers across widths (μP, Yang et
# al., 2022). A longer sweep would do that here: the script takes the rates as data.

# %% [markdown]
# ## Data-parallel training
#
# One process trains on one batch at a time. **Data parallelism** runs $W$ copies of the
# model, one a process (a *rank*), each on its own share of every batch. After the backward
# pass each rank holds the gradient of the loss on *its* rows; an **all-reduce** sums the
# gradients over the ranks and gives every rank the sum (DDP divides by $W$: the mean).
# Since the loss of a batch is the mean over its rows, the mean of the ranks' gradients is
# exactly the gradient of the whole batch. Every rank then takes the same optimizer step
# from the same weights, so the copies never drift apart.
#
# PyTorch's `DistributedDataParallel` (DDP) does this. It broadcasts rank 0's weights once,
# when it wraps the model, and then hooks into the backward pass: gradients are grouped
# into *buckets* (25 MB by default), and each bucket is all-reduced as soon as all its
# gradients are ready, while the backward pass goes on with the earlier layers, so the
# communication overlaps the computation.
#
# `minillm` uses it as is: `minillm.distributed` reads the launch that `torchrun`
# describes, joins the process group (gloo on CPUs, nccl on GPUs) and wraps the model;
# chapter 07's `train` needs no change (it averages the logged losses over the ranks, and
# only rank 0 writes checkpoints); `BatchSampler(..., rank=, world_size=)` gives each rank
# its rows of every global batch. `--batch-size` is the **global** batch:
#
# ```
# torchrun --nproc_per_node=2 -m minillm train --batch-size 8 --steps 3000
# ```
#
# trains on the same 8 rows a step as one process would, 4 on each rank. One name had to
# change for this: torchrun accepts abbreviations of its own options, so a training flag
# `--run` would be read as torchrun's `--run-path`. The training checkpoint's flag is
# `--checkpoint`.
#
# ### Exercise 5 · What is all-reduced
#
# Write `allreduce_bytes(config, bytes_per_element=4, frozen=())`: the bytes that DDP
# all-reduces every step when it trains `GPT(config)` with parameters of
# `bytes_per_element` bytes (4 for float32, 2 for bfloat16), as an `int`. That is the
# gradient of every parameter that requires one, each parameter once: a tied weight is one
# tensor with one gradient. Buffers (such as a fixed sinusoidal table) have no gradient and
# are not all-reduced, and neither are frozen parameters: those whose name (in
# `model.named_parameters()`) starts with one of the strings in `frozen`. Build the model
# on the meta device (`with torch.device("meta"): model = GPT(config)`), which allocates
# nothing. `TypeError` unless `config` is a `GPTConfig`; `ValueError` naming
# `bytes_per_element` unless it is an int $\ge 1$.
#
# Difficulty ●○○ · Importance ●●○ · about 5 minutes
#
# <details><summary>Hint 1</summary><code>model.named_parameters()</code> yields a shared parameter once; <code>model.buffers()</code> are not in it. <code>name.startswith(tuple(frozen))</code> tests every prefix at once.</details>
# <details><summary>Hint 2</summary><code>sum(p.numel() for name, p in model.named_parameters() if not name.startswith(tuple(frozen))) * bytes_per_element</code></details>

# %%
#| answer allreduce_bytes
#| export minillm/scaling.py
def allreduce_bytes(config: GPTConfig, bytes_per_element: int = 4, frozen=()) -> int:
    """The bytes of gradients that data-parallel training all-reduces each step for
    ``GPT(config)``: every parameter once, except those whose name starts with a string of
    ``frozen``, at ``bytes_per_element`` bytes each."""
    ### BEGIN SOLUTION
    if not isinstance(config, GPTConfig):
        raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
    positive_int("bytes_per_element", bytes_per_element)
    with torch.device("meta"):
        model = GPT(config)
    prefixes = tuple(frozen)
    return bytes_per_element * sum(p.numel() for name, p in model.named_parameters()
                                   if not (prefixes and name.startswith(prefixes)))
    ### END SOLUTION

# %%
#| test allreduce_bytes_visible points=1
@course.visible_check("allreduce_bytes")
def check_allreduce_bytes(count_bytes):
    """A tied GPT with a sinusoidal table, a frozen block, half precision, and the errors."""
    config = GPTConfig(vocab_size=100, context_length=16, d_model=32, n_layers=2, n_heads=2, d_ff=64,
                       positions="sinusoidal")
    model = GPT(config)
    unique = sum(p.numel() for p in model.parameters())
    everything = sum(p.numel() for _, p in model.named_parameters(remove_duplicate=False))
    buffers = sum(b.numel() for b in model.buffers())
    course.expect_equal(count_bytes(config), 4 * unique, "allreduce_bytes of a tied GPT with a sinusoidal table",
                        mistakes={"parameters counted, not bytes (4 a float32)": unique,
                                  "the tied weight counted twice (it is one tensor with one gradient)": 4 * everything,
                                  "buffers counted (they have no gradient)": 4 * (unique + buffers)},
                        hint="sum numel() over model.named_parameters(), times bytes_per_element")
    block = sum(p.numel() for p in model.blocks[0].parameters())
    course.expect_equal(count_bytes(config, 4, ("blocks.0.",)), 4 * (unique - block), "with blocks.0 frozen",
                        mistakes={"frozen parameters counted": 4 * unique})
    course.expect_equal(count_bytes(config, 2), 2 * unique, "bfloat16 (2 bytes an element)",
                        mistakes={"4 bytes assumed for every element": 4 * unique})
    course.expect_raises(ValueError, count_bytes, config, 0, match="bytes_per_element", what="bytes_per_element=0")
    course.expect_raises(TypeError, count_bytes, {"d_model": 32}, what="allreduce_bytes(a dict)")


check_allreduce_bytes(allreduce_bytes)
print("allreduce_bytes: visible test passed")

# %%
#| test allreduce_bytes_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
for _ in range(3):
    width = 8 * int(torch.randint(1, 5, ()))
    config = GPTConfig(vocab_size=int(torch.randint(20, 200, ())), context_length=16, d_model=width,
                       n_layers=int(torch.randint(1, 4, ())), n_heads=2, d_ff=2 * width,
                       tie_embeddings=bool(torch.randint(0, 2, ())), positions="learned")
    model = GPT(config)  # small: a real one is as quick as the meta device
    frozen = ("blocks.0.", "final_norm") if bool(torch.randint(0, 2, ())) else ()
    size = int(torch.randint(1, 9, ()))
    expected = size * sum(p.numel() for name, p in model.named_parameters() if not (frozen and name.startswith(frozen)))
    got = allreduce_bytes(config, size, frozen)
    assert isinstance(got, int) and not isinstance(got, bool), "allreduce_bytes must return an int"
    course.expect_equal(got, expected, "allreduce_bytes of a random GPT")
    course.expect_equal(allreduce_bytes(config, size, [""]), 0, "every parameter frozen (the empty prefix)")
course.expect_raises(ValueError, allreduce_bytes, config, 2.0, match="bytes_per_element", what="a float element size")
course.expect_raises(TypeError, allreduce_bytes, None, what="allreduce_bytes(None)")
### END HIDDEN TESTS

# %%
gradient_bytes = course.keep_going("allreduce_bytes", allreduce_bytes, reference_scaling.allreduce_bytes,
                                   check_allreduce_bytes)
print(f"the shipped model's shape all-reduces {gradient_bytes(recipe_config(2048)) / 1e6:.2f} MB a step in float32")

# %% [markdown]
# ### Two processes against one, live
#
# The next cells run the command line twice on the first 20,000 characters of the corpus:
# `torchrun` with two processes and a global batch of 8, then one process with the same
# batch, the same seed and the same steps. (This runs in the notebook through
# `sys.executable -m torch.distributed.run`, which is the `torchrun` command run by this
# notebook's Python.)

# %%
folder = Path(tempfile.mkdtemp(prefix="minillm-ddp-"))
(folder / "corpus.txt").write_text(data.corpus_text()[:20_000], encoding="utf-8")
ddp_steps = 3 if QUICK else 6
common = ["train", "--corpus", str(folder / "corpus.txt"), "--steps", str(ddp_steps), "--batch-size", "8",
          "--vocab-size", "260", "--context", "32", "--d-model", "32", "--layers", "1", "--heads", "2",
          "--threads", "1", "--quiet"]
two = ["--out", str(folder / "two.pt"), "--checkpoint", str(folder / "two-run.pt")]
started = time.perf_counter()
done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "-m", "minillm",
                       *common, *two], capture_output=True, text=True, timeout=300)
print("$ torchrun --nproc_per_node=2 -m minillm " + " ".join(common + two))
print(done.stdout.split("\nsample")[0].strip())  # what it printed, up to its sample (6 steps teach no English)
if done.returncode != 0:
    print(done.stderr[-2000:])
print(f"({time.perf_counter() - started:.1f} s, exit status {done.returncode})")

# %%
from minillm.__main__ import main as minillm_main
from minillm.checkpoint import load_checkpoint

one = ["--out", str(folder / "one.pt"), "--checkpoint", str(folder / "one-run.pt")]
printed = io.StringIO()
with contextlib.redirect_stdout(printed):
    minillm_main([*common, *one])
print("$ python -m minillm " + " ".join(common + one))
print(printed.getvalue().split("\nsample")[0].strip())
two_losses = load_checkpoint(folder / "two.pt")["train_loss"]
one_losses = load_checkpoint(folder / "one.pt")["train_loss"]
print("2 processes x 4 rows:", " ".join(f"{loss:.6f}" for loss in two_losses))
print("1 process  x 8 rows:", " ".join(f"{loss:.6f}" for loss in one_losses))
print(f"largest difference {max(abs(a - b) for a, b in zip(two_losses, one_losses)):.1e} nats")

# %% [markdown]
# The two trajectories agree to float rounding (the sums are taken in another order),
# step for step: data parallelism changes *where* the batch is computed, not what is
# learned. `tests/test_train_distributed.py` checks the same at the level of `train`, with
# the weights, and checks that **gradient accumulation** (`TrainConfig(grad_accum_steps=k)`,
# `--grad-accum k`: $k$ batches' gradients averaged before one step, the batch of $k$ steps
# with the memory of one) follows the same trajectory too, alone and under DDP.
#
# One question to think about (graded by your instructor):

# %% [markdown]
# #| written ddp_loss_matches points=2
# **Question.** In the run above, which tensors cross between the two processes during a
# training step, and which never do (name three kinds that stay local)? Why does the loss
# of two processes with 4 rows each equal the loss of one process with 8 rows, step after
# step? What would break that equality if the model had dropout? Answer in four to six
# sentences.
#
# ### BEGIN SOLUTION
# *Model answer.* Every step all-reduces the gradients of the trainable parameters (one
# tensor per bucket; DDP also broadcast the initial weights once, at wrapping, and
# `train` all-reduces the few logged loss values); the activations, the batches, the
# weights themselves and AdamW's moment estimates never cross. The loss of a batch is the
# mean over its rows, so its gradient is the mean of the per-row gradients; each rank
# computes the mean over its own 4 rows, and the all-reduce's average of two such means
# (equal shares) is exactly the mean over all 8. Both ranks then apply the same AdamW
# update to the same weights, so they stay identical to each other and to the single
# process, up to float rounding from the different order of the sums. With dropout each
# rank draws its own random masks (as it must, or the ranks would drop the same units),
# and those draws differ from the single process's, so the trajectories would agree only in
# distribution, not step for step.
#
# *Grading:* 1 point for gradients (only) crossing, with activations, weights or optimizer
# state named as local; 1 point for the mean-of-equal-shares argument (and the same update
# keeping the copies equal), with dropout's random draws as what breaks the exact equality.
# ### END SOLUTION

# %% [markdown]
# ### What it costs: communication
#
# On 2 CPU cores, data parallelism brings no speedup: the two processes share the same two
# cores that one process would use. What it adds is communication. `bench/ddp_comm.py`
# measures it for the shipped model's shape on two gloo processes: the bytes all-reduced
# every step, the all-reduce calls, and the step's time with and without the all-reduce
# (`no_sync()`), with DDP's buckets and with one call a parameter. Its cached table:

# %%
comm = json.loads(data.path("ddp_comm.json").read_text())
print(f"`{comm['command']}` ({comm['seconds']:.0f} s): {comm['parameters']:,d} parameters")
for row in comm["rows"]:
    print(f"  {row['grouping']:40s} {row['calls_per_step']:4.0f} calls, {row['bytes_per_step'] / 1e6:.2f} MB a step; "
          f"step {row['step_s'] * 1e3:6.1f} ms, without the all-reduce {row['step_without_allreduce_s'] * 1e3:6.1f} ms "
          f"({row['communication_share']:.0%} of the step)")

# %% [markdown]
# Every step all-reduces the whole gradient, 4 bytes a parameter, whatever the batch: so
# communication is a fixed cost per step, and a larger batch per rank makes it a smaller
# share. DDP's buckets send it in one call here instead of 30 (one a parameter tensor),
# and that call's share of the step is the smaller one in this table: every call has a
# fixed latency (on a network, tens of microseconds or more), and a bucket can be sent
# while the backward pass still computes earlier layers. The times are medians on a shared
# 2-core machine, so read the shares as rough.
#
# ## Many machines
#
# Nothing in the training code changes on several machines; the launch does. On each of
# $M$ machines with 8 GPUs:
#
# ```
# torchrun --nnodes=M --nproc_per_node=8 --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 \
#     --rdzv-id=my-run -m minillm train --batch-size 512
# ```
#
# - **Rendezvous.** The processes must find each other. torchrun's *c10d rendezvous* runs a
#   small key-value store at `HOST:29500` (one of the machines); every agent registers
#   there, gets its machine's rank, and sets `RANK`, `LOCAL_RANK`, `WORLD_SIZE`,
#   `MASTER_ADDR` and `MASTER_PORT` for its processes, which `minillm.distributed` reads.
#   An *elastic* run (`--nnodes=2:4`, `--max-restarts`) restarts the group when a machine
#   fails, from the last checkpoint: resuming must be exact, which `TrainState` is.
# - **nccl.** On GPUs the backend is nccl: all-reduces run GPU to GPU, over NVLink inside
#   a machine and InfiniBand or RoCE between machines, as ring or tree algorithms whose
#   time is about $2(W-1)/W$ times the gradient's bytes over the link's bandwidth, nearly
#   independent of $W$. `minillm.distributed` picks nccl when there are GPUs, one process a
#   GPU (`cuda:LOCAL_RANK`).
# - **What changes at scale.** The network is much slower than the GPUs, so overlapping
#   the all-reduce with the backward pass (DDP's buckets) becomes essential; the global
#   batch grows with $W$ until it passes the *critical batch size* (McCandlish et al., 2018)
#   beyond which more data per step no longer saves steps; and a failure somewhere in
#   thousands of GPUs becomes a daily event.
#
# Data parallelism keeps a full copy of the weights, gradients and optimizer state on every
# rank: with AdamW in mixed precision about 16 bytes a parameter, so a 7-billion-parameter
# model needs about 112 GB before any activation, more than one GPU holds. The next steps:
#
# - **FSDP** (fully sharded data parallel; ZeRO, Rajbhandari et al., 2020):
#   `torch.distributed.fsdp` shards the weights, gradients and optimizer state over the
#   ranks, and gathers each layer's weights just before it runs. Memory per rank falls by
#   about $W$, for more communication.
# - **Tensor parallelism** (Megatron-LM, Shoeybi et al., 2019): split each matrix product
#   across GPUs of one machine (the columns of the first FFN matrix, the rows of the
#   second), with an all-reduce inside every layer; it needs NVLink's bandwidth.
# - **Pipeline parallelism**: different layers on different GPUs, micro-batches flowing
#   through them. Large runs combine all three ("3D parallelism").
#
# All of these exist in PyTorch (`torch.distributed.fsdp`, `torch.distributed.tensor`,
# `torch.distributed.pipelining`); none needs a home-made launcher.
#
# ## Tee check: "simply making these models larger and feeding them more data led to predictable improvements"
#
# **Right:** within the range we measured, loss is a smooth function of size and
# compute, and a power law fitted on small models predicted the next size's loss to
# within a few per cent (the prediction cell above). That predictability is why labs plan
# a large run from a sweep of small ones.
#
# **Loose:** "simply larger" is not enough. At a *fixed* amount of data our largest two
# models are no better than each other: size helps only when the data grows with it. The
# Chinchilla result is the correction: for a compute budget there is a best size, and
# parameters and tokens should grow about equally ($N_{opt} \propto C^{0.5}$), so several
# famous models of the time (GPT-3, Gopher) were too large for the data they saw. And the
# "improvements" are in the loss: abilities measured on tasks can look abrupt even while
# the loss falls smoothly. The shirt's "massive distributed accelerator clusters" are real,
# but data parallelism alone does not get there: once the model does not fit on one
# device, FSDP and tensor parallelism take over.
#
# ## What `minillm` gained
#
# - `minillm.scaling`: `training_flops` ($6ND$ plus the attention term, checked against
#   `FlopCounterMode`), `inference_flops`, `tokens_for_compute`; `fit_power_law` with
#   standard errors and a warning when the floor is not pinned, `power_law_exponent`,
#   `predict_loss`; `isoflop_minimum` and `fit_isoflop`; `allreduce_bytes`.
# - `minillm.distributed` (infrastructure): the torchrun launch, gloo or nccl, the global
#   batch's share per rank, clear errors for bad launches.
# - `torchrun --nproc_per_node=N -m minillm train`, `--grad-accum`, and
#   `TrainConfig.grad_accum_steps` in chapter 07's `train`.
# - `make sweep`: the scaling lab, cached in `data/scaling_sweep.json`.
#
# ## Further reading
#
# - Kaplan et al., *Scaling Laws for Neural Language Models* (2020).
# - Hoffmann et al., *Training Compute-Optimal Large Language Models* ("Chinchilla", 2022).
# - Besiroglu et al., *Chinchilla Scaling: A Replication Attempt* (2024): refitting approach 3.
# - Muennighoff et al., *Scaling Data-Constrained Language Models* (2023): repeated data.
# - McCandlish et al., *An Empirical Model of Large-Batch Training* (2018).
# - Li et al., *PyTorch Distributed: Experiences on Accelerating Data Parallel Training* (2020): DDP's buckets.
# - Rajbhandari et al., *ZeRO: Memory Optimizations Toward Training Trillion Parameter Models* (2020).
# - Shoeybi et al., *Megatron-LM: Training Multi-Billion Parameter Language Models Using Model Parallelism* (2019).
# - Yang et al., *Tensor Programs V: Tuning Large Neural Networks via Zero-Shot Hyperparameter Transfer* (μP, 2022).
