# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Chapter 11 · Mixture of experts
#
# **Where this sits on the tee:** the Tech Band's *MoE*, "sparse expert routings": "only a
# subset of the network's parameters ... are activated for any given token, allowing
# models to scale to trillions of parameters while keeping inference costs low". In the
# left sleeve's encoder layer it replaces the one *Dense → GELU → Dense* box by many such
# boxes and a small network that picks among them.
#
# **You will be able to**
# - write the router: a linear map, a softmax, the top-$k$ experts of each token and
#   their renormalized weights (and Switch's top-1 without renormalizing);
# - dispatch tokens to experts and combine their outputs with no loop over tokens, with a
#   capacity per expert, and say what happens to the tokens that do not fit;
# - write the two auxiliary losses that keep a router healthy: Switch's load-balancing
#   loss and ST-MoE's router z-loss, and check the first equals 1 at perfect balance;
# - count a mixture's total and active parameters exactly, and tell what the active count
#   does and does not save;
# - train a mixture against a dense model of equal active size and read the result
#   against the noise between seeds; read a utilization table and tell a balanced router
#   from a collapsing one.
#
# **Prerequisites:** chapter 05 (`SwiGLU`, the FFN registry, `ffn_options`), chapter 07
# (`GPT`, `train`, the auxiliary-loss convention of `GPT.forward`).
#
# **Time:** about 25 minutes of reading, 50 minutes of exercises (five coded, one written).
#
# **How the exercises work.** Each exercise has an answer cell (replace
# `raise NotImplementedError()` with your code), a *visible test* that explains what is
# wrong when it fails, and a *hidden test* that runs only when the notebook is graded. Each
# exercise is graded on its own: where one builds on another, its tests use the course's
# reference for the other. A cell after the tests binds a new name to your function when it
# passes the visible test, or else to the course's reference, so you can always read on; in
# a student bundle where that reference is not released yet, the cells that need your
# answer wait for it and say so.

# %%
import json
import math
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

import course_runtime as course
from minillm import data
from minillm.ffn import SwiGLU
from minillm.model import GPT, count_parameters
from minillm.moe import MoEFeedForward, routing_metrics
from minillm.recipe import load_pretrained, recipe_config, recipe_train_config
from minillm.batches import BatchSampler
from minillm.train import held_out_loss, lm_loss, train

device = course.setup(seed=0)  # this chapter runs on the CPU whatever `device` says: its models are small
torch.set_num_threads(1)  # small matrices: one thread is as fast, and robust on a busy machine

# %% [markdown]
# ## Routing tokens to experts
#
# A dense Transformer block sends every token through the same feed-forward network. A
# **mixture of experts** (MoE) layer holds $N$ of them, the *experts* $E_1, \dots, E_N$,
# and a **router**, one linear map $W_r \in \mathbb{R}^{N \times d}$ that scores each
# expert for each token $x \in \mathbb{R}^d$:
#
# $$p(x) = \operatorname{softmax}(W_r x) \in \mathbb{R}^N, \qquad
# \mathcal{T}(x) = \text{the } k \text{ largest entries of } p(x), \qquad
# y = \sum_{i \in \mathcal{T}(x)} g_i(x)\, E_i(x).$$
#
# Only the $k$ chosen experts run for this token, so its cost is that of $k$ FFNs, however
# large $N$ is: parameters grow with $N$, compute per token with $k$. The weights $g_i$ are
# the chosen probabilities, renormalized to sum to 1 (GShard, Mixtral):
# $g_i = p_i / \sum_{j \in \mathcal{T}} p_j$. The Switch Transformer (Fedus et al., 2021)
# takes $k = 1$ and keeps $g = p_{\max}$ unnormalized: renormalizing a single weight would
# make it 1 always, and the router would then get no gradient from the language-model loss.
#
# The router's loss gradient comes through the weights $g$ only (the choice
# $\mathcal{T}$ is a discrete argmax and has none): an expert whose output helps gets a
# larger weight next time, and the softmax takes that weight from the others.
#
# Cells that begin with `#| export` become part of the `minillm` package. This one starts
# the module `minillm/moe.py`; your answers below are its next parts.

# %%
#| export minillm/moe.py
"""Mixture of experts: a router, dispatch with capacity, load balancing and the z-loss (chapter 11).

A mixture-of-experts layer replaces the one feed-forward network of a block by ``n_experts``
of them (chapter 05's FFNs) and a router that sends each token to ``top_k`` of them.

- ``top_k_routing(logits, top_k, normalize=True)``: the router's choice, renormalized
  top-k weights (or Switch's unnormalized top-1 with ``normalize=False``).
- ``load_balancing_loss`` (Switch Transformer) and ``router_z_loss`` (ST-MoE).
- ``expert_capacity``, ``capacity_mask`` and ``dispatch_and_combine``: each expert takes
  at most ``capacity`` assignments; the rest are dropped (their FFN output is zero, so the
  token passes through the block's residual unchanged).
- ``MoEFeedForward``: the layer, registered as the FFN "moe" (``GPTConfig(ffn="moe",
  ffn_options={...})``). Its ``aux_loss`` reaches the model's loss, its parts
  ``aux_losses`` ("moe_balance", "moe_z") are logged apart, ``last_stats`` keeps what the
  router did, and ``active_parameter_count()`` answers ``count_parameters(config, active=True)``.
- ``routing_metrics(model)``: the last forward's routing, layer by layer, as floats for
  a training log.

Shapes: the layer takes ``(..., d_model)``; inside, tokens are flattened to
``(tokens, d_model)``, and routing tensors are ``(tokens, top_k)``.
The dispatch has data-dependent shapes (how many tokens each expert gets), so
``torch.compile`` breaks its graph there; the rest of the model compiles as before.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from minillm.checks import boolean, number, one_of, positive_int
from minillm.ffn import FFNS, build_ffn, default_d_ff
from minillm.precision import compute_dtype

# %% [markdown]
# ### Exercise 1 · The router's top-k
#
# Implement `top_k_routing(logits, top_k, normalize=True)`. From the router's logits
# `(tokens, n_experts)` compute the softmax probabilities, take each token's `top_k`
# largest (in decreasing order), and return `(weights, experts)`, both `(tokens, top_k)`:
# the probabilities, renormalized to sum to 1 per token when `normalize`, left as they are
# when not; and the experts' indices (int64). Raise a `ValueError` naming `top_k` unless
# `1 <= top_k <= n_experts`, and one naming `logits` unless it is 2-D.
#
# Difficulty ●○○ · Importance ●●● · about 5 minutes
#
# <details><summary>Hint 1</summary><code>torch.topk(x, k, dim=-1)</code> returns the values and the indices, largest first.</details>
# <details><summary>Hint 2</summary>Take the top k of the <em>probabilities</em>, not of the logits, when you want the weights; the indices are the same either way, since the softmax keeps the order. <code>torch.softmax</code> is stable for large logits; <code>exp</code> written out is not.</details>
# <details><summary>Hint 3</summary><code>weights, experts = torch.softmax(logits, -1).topk(top_k, dim=-1)</code>, then <code>weights / weights.sum(-1, keepdim=True)</code> when normalizing.</details>

# %%
#| answer top_k_routing
#| export minillm/moe.py
def top_k_routing(logits: torch.Tensor, top_k: int, normalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The router's choice: each token's ``top_k`` experts and their weights.

    logits: (tokens, n_experts), the router's scores. Returns ``(weights, experts)``, both
    (tokens, top_k): ``experts`` (int64) the indices of the top_k largest softmax
    probabilities, in decreasing order; ``weights`` (logits' dtype) those probabilities,
    divided by their sum when ``normalize`` (each row then sums to 1), as they are when
    not (Switch Transformer's top-1). ``ValueError`` unless logits is 2-D and
    1 <= top_k <= n_experts.
    """
    ### BEGIN SOLUTION
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        raise ValueError(f"logits must be a (tokens, n_experts) tensor, got {getattr(logits, 'shape', type(logits).__name__)}")
    if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= logits.shape[-1]:
        raise ValueError(f"top_k must be an int in [1, n_experts={logits.shape[-1]}], got {top_k!r}")
    weights, experts = torch.softmax(logits, dim=-1).topk(top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, experts
    ### END SOLUTION

# %%
#| test top_k_routing_visible points=1
def _routing_case():
    return torch.tensor([[2.0, 0.5, 1.0, -1.0], [0.0, 3.0, 0.0, 2.5], [-1.0, -1.0, 4.0, 1.0]], dtype=torch.float64)


@course.visible_check("top_k_routing")
def check_top_k_routing(top_k_routing):
    logits = _routing_case()
    probs = torch.softmax(logits, dim=-1)
    got = top_k_routing(logits, 2)
    if not isinstance(got, tuple) or len(got) != 2:
        raise course.CheckFailed(f"top_k_routing must return a pair (weights, experts), got {course.describe(got)}")
    weights, experts = got
    if not torch.equal(logits, _routing_case()):
        raise course.CheckFailed("top_k_routing changed logits in place: return new tensors")
    expected_experts = torch.tensor([[0, 2], [1, 3], [2, 3]])
    if isinstance(experts, torch.Tensor) and experts.dtype != torch.int64:
        raise course.CheckFailed(f"experts must be int64 indices, got {experts.dtype}: the values of topk are the "
                                 "weights, its indices are the experts")
    course.expect_equal(experts.tolist() if isinstance(experts, torch.Tensor) else experts, expected_experts.tolist(),
                        "experts of top_k_routing(logits, 2)",
                        mistakes={"the two smallest, not the largest (topk(largest=False)?)": [[3, 1], [0, 2], [0, 1]],
                                  "the softmax ran over the tokens (dim 0), not over each token's experts (dim -1)":
                                      torch.softmax(logits, dim=0).topk(2, dim=-1).indices.tolist()})
    top = probs.gather(-1, expected_experts)
    course.expect_close(weights, top / top.sum(-1, keepdim=True), "weights of top_k_routing(logits, 2)",
                        mistakes={"the probabilities are not renormalized over the chosen experts": top,
                                  "softmax over the two chosen logits equals renormalizing, but these are the raw "
                                  "logits: take the softmax first": logits.gather(-1, expected_experts)},
                        hint="weights = p_i / (sum of the chosen p_j); each row sums to 1")
    weights, experts = top_k_routing(logits, 1, normalize=False)
    course.expect_close(weights, probs.max(-1, keepdim=True).values, "weights of top_k_routing(logits, 1, normalize=False)",
                        mistakes={"normalize=False still renormalizes (every weight is 1)": torch.ones(3, 1, dtype=torch.float64)},
                        hint="Switch's top-1 keeps the probability p_max itself")
    if weights.dtype != torch.float64:
        raise course.CheckFailed(f"weights must keep the logits' dtype (float64 here), got {weights.dtype}")
    course.expect_raises(ValueError, top_k_routing, logits, 5, match="top_k",
                         what="top_k_routing(logits with 4 experts, top_k=5)")
    course.expect_raises(ValueError, top_k_routing, logits, 0, match="top_k", what="top_k_routing(logits, top_k=0)")


check_top_k_routing(top_k_routing)
print("top_k_routing: visible test passed")

# %%
#| test top_k_routing_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
for tokens, n_experts, k, dtype in [(17, 8, 2, torch.float32), (5, 4, 4, torch.float64), (33, 16, 3, torch.float32),
                                    (1, 2, 1, torch.float64)]:
    logits = 3 * torch.randn(tokens, n_experts, dtype=dtype)
    weights, experts = top_k_routing(logits, k)
    ref_weights, ref_experts = torch.softmax(logits, -1).topk(k, dim=-1)
    course.expect_equal(tuple(weights.shape), (tokens, k), "the shape of the weights")
    assert weights.dtype == dtype, "the weights must keep the logits' dtype"
    assert experts.dtype == torch.int64, "experts must be int64"
    course.expect_equal(experts.tolist(), ref_experts.tolist(), "the experts chosen")
    course.expect_close(weights, ref_weights / ref_weights.sum(-1, keepdim=True), "the renormalized weights")
    course.expect_close(weights.sum(-1), torch.ones(tokens, dtype=dtype), "renormalized weights sum to 1")
    raw, _ = top_k_routing(logits, k, normalize=False)
    course.expect_close(raw, ref_weights, "the unnormalized weights")
# large logits: no overflow
logits = torch.tensor([[1000.0, 999.0, -1000.0], [-500.0, -480.0, -490.0]])
weights, experts = top_k_routing(logits, 2)
assert torch.isfinite(weights).all(), "top_k_routing gave NaN or inf for logits near 1000: is the softmax stable?"
course.expect_close(weights, torch.softmax(logits, -1).topk(2, -1).values / torch.softmax(logits, -1).topk(2, -1).values.sum(-1, keepdim=True),
                    "weights for logits of +-1000")
course.expect_raises(ValueError, top_k_routing, torch.randn(3, 4), 7, match="top_k", what="top_k_routing(top_k > n_experts)")
course.expect_raises(ValueError, top_k_routing, torch.randn(2, 3, 4), 1, match="logits", what="top_k_routing(3-D logits)")
### END HIDDEN TESTS

# %%
from minillm import moe as reference_moe

routing = course.keep_going("top_k_routing", top_k_routing, reference_moe.top_k_routing, check_top_k_routing)

# %% [markdown]
# Eight experts, a random router and ten random tokens: each token's two experts and their
# weights, which sum to one per row.

# %%
router_logits = torch.randn(10, 8)
weights, experts = routing(router_logits, 2)
for t in range(4):
    print(f"token {t}: experts {experts[t].tolist()}, weights {[round(w, 3) for w in weights[t].tolist()]}")
print("weights sum to 1 in every row:", torch.allclose(weights.sum(-1), torch.ones(10)))

# %% [markdown]
# ## Keeping the experts busy: the load-balancing loss
#
# Nothing in the language-model loss asks the router to use all its experts. Early in
# training some expert happens to be slightly better; the router sends it more tokens; it
# trains on more data and gets better still. Left alone, a router can *collapse* onto a few
# experts, and the others hold parameters that nothing uses.
#
# The Switch Transformer adds an auxiliary loss. With $T$ tokens, $k$ choices each and $N$
# experts, let $f_i$ be the fraction of the $kT$ assignments that go to expert $i$ and
# $P_i$ the mean router probability of expert $i$:
#
# $$f_i = \frac{1}{kT} \sum_{t=1}^{T} \sum_{j=1}^{k} \mathbb{1}[e_{t,j} = i], \qquad
# P_i = \frac{1}{T} \sum_{t=1}^{T} p_i(x_t), \qquad
# \mathcal{L}_\text{balance} = \alpha \cdot N \sum_{i=1}^{N} f_i P_i .$$
#
# $f$ counts a discrete choice and has no gradient; $P$ has one, and the loss pushes the
# probabilities of the busy experts down. The product is smallest when both are uniform,
# $f_i = P_i = 1/N$, and then $N \sum_i \frac{1}{N}\frac{1}{N} = 1$: the factor $N$ makes
# the loss 1 at perfect balance whatever the number of experts, so one $\alpha$
# (0.01 in the paper) works for all. (Dividing by $k$ in $f$ keeps that true for $k > 1$;
# some libraries leave it out, and their balanced value is $k$.)
#
# ### Exercise 2 · The load-balancing loss
#
# Implement `load_balancing_loss(probs, experts, n_experts)`, the loss above *without* the
# factor $\alpha$ (the layer multiplies it in). `probs`: `(tokens, n_experts)`, the router's
# softmax; `experts`: `(tokens, k)` int64, the chosen experts. Return a 0-dim tensor in
# `probs`' dtype that the gradient reaches through `probs`. Raise a `ValueError` naming
# `experts` when an index lies outside `[0, n_experts)` or its first dimension differs from
# `probs`'.
#
# Difficulty ●●○ · Importance ●●● · about 10 minutes
#
# <details><summary>Hint 1</summary><code>torch.bincount(experts.flatten(), minlength=n_experts)</code> counts the assignments of each expert.</details>
# <details><summary>Hint 2</summary>Divide the counts by <code>experts.numel()</code> (that is $kT$), not by the number of tokens.</details>
# <details><summary>Hint 3</summary><code>f = counts.to(probs.dtype) / experts.numel()</code>; <code>P = probs.mean(0)</code>; <code>n_experts * (f * P).sum()</code>.</details>

# %%
#| answer load_balancing_loss
#| export minillm/moe.py
def load_balancing_loss(probs: torch.Tensor, experts: torch.Tensor, n_experts: int) -> torch.Tensor:
    """Switch Transformer's load-balancing loss, without its coefficient: N * sum_i f_i * P_i.

    probs: (tokens, n_experts), the router's softmax probabilities. experts: (tokens, k)
    int64, the chosen experts. f_i: the fraction of the tokens * k assignments that go to
    expert i (no gradient); P_i: the mean probability of expert i. Returns a 0-dim tensor in
    probs' dtype, 1 at perfect balance (f_i = P_i = 1/N), N / k when every token's
    probability sits on one expert (N for top-1). ``ValueError`` naming ``experts`` for an index outside
    [0, n_experts) or a first dimension other than probs'.
    """
    ### BEGIN SOLUTION
    if experts.dim() != 2 or experts.shape[0] != probs.shape[0]:
        raise ValueError(f"experts must be (tokens={probs.shape[0]}, k), got {tuple(experts.shape)}")
    if experts.numel() and (int(experts.min()) < 0 or int(experts.max()) >= n_experts):
        raise ValueError(f"experts must hold indices in [0, n_experts={n_experts}), "
                         f"got values from {int(experts.min())} to {int(experts.max())}")
    fraction = torch.bincount(experts.flatten(), minlength=n_experts).to(probs.dtype) / experts.numel()
    return n_experts * (fraction * probs.mean(dim=0)).sum()
    ### END SOLUTION

# %%
#| test load_balancing_loss_visible points=1
@course.visible_check("load_balancing_loss")
def check_load_balancing_loss(load_balancing_loss):
    probs = torch.tensor([[0.7, 0.1, 0.1, 0.1], [0.4, 0.4, 0.1, 0.1], [0.1, 0.2, 0.6, 0.1]], dtype=torch.float64)
    experts = torch.tensor([[0, 1], [0, 1], [2, 1]])
    f = torch.tensor([2, 3, 1, 0], dtype=torch.float64) / 6
    expected = 4 * (f * probs.mean(0)).sum()
    got = load_balancing_loss(probs, experts, 4)
    course.expect_close(got, expected, "load_balancing_loss(probs, experts, 4)",
                        mistakes={"f divides by the number of tokens, not tokens * k (the balanced value becomes k)":
                                      4 * (f * 2 * probs.mean(0)).sum(),
                                  "the factor N (n_experts) is missing": (f * probs.mean(0)).sum(),
                                  "only the first choice counts in f": 4 * (torch.tensor([2, 0, 1, 0.0], dtype=torch.float64) / 3 * probs.mean(0)).sum(),
                                  "P sums the probabilities instead of averaging them": 4 * (f * probs.sum(0)).sum()})
    if got.dtype != torch.float64:
        raise course.CheckFailed(f"the loss must be in probs' dtype (float64 here), got {got.dtype}")
    uniform = torch.full((8, 4), 0.25, dtype=torch.float64)
    balanced = torch.tensor([[0, 1], [2, 3]] * 4)
    course.expect_close(load_balancing_loss(uniform, balanced, 4), torch.tensor(1.0, dtype=torch.float64),
                        "the loss at perfect balance (uniform probabilities, every expert chosen equally)")
    course.expect_raises(ValueError, load_balancing_loss, probs, torch.tensor([[0, 4], [1, 2], [3, 0]]), 4,
                         match="experts", what="load_balancing_loss(experts holding the index 4, n_experts=4)")


check_load_balancing_loss(load_balancing_loss)
print("load_balancing_loss: visible test passed")

# %%
#| test load_balancing_loss_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
for tokens, n_experts, k, dtype in [(50, 8, 2, torch.float32), (7, 3, 1, torch.float64), (64, 16, 4, torch.float64)]:
    probs = torch.softmax(2 * torch.randn(tokens, n_experts, dtype=dtype), -1)
    experts = torch.stack([torch.randperm(n_experts)[:k] for _ in range(tokens)])
    one_hot = F.one_hot(experts, n_experts).to(dtype).sum(1)  # (tokens, n_experts)
    expected = n_experts * (one_hot.mean(0) / k * probs.mean(0)).sum()
    got = load_balancing_loss(probs, experts, n_experts)
    assert isinstance(got, torch.Tensor) and got.dim() == 0, "the loss must be a 0-dim tensor"
    assert got.dtype == dtype, "the loss must keep probs' dtype"
    course.expect_close(got, expected, "load_balancing_loss")
# perfect balance gives 1 for any number of experts and any k; collapse onto one expert gives N
for n_experts, k in [(2, 1), (8, 2), (6, 3)]:
    tokens = n_experts * 5
    uniform = torch.full((tokens, n_experts), 1.0 / n_experts, dtype=torch.float64)
    balanced = torch.stack([torch.arange(i, i + k) % n_experts for i in range(tokens)])
    course.expect_close(load_balancing_loss(uniform, balanced, n_experts), torch.tensor(1.0, dtype=torch.float64),
                        "load_balancing_loss of a perfectly balanced router is 1")
collapsed = torch.zeros(10, 5, dtype=torch.float64)
collapsed[:, 2] = 1.0
course.expect_close(load_balancing_loss(collapsed, torch.full((10, 1), 2), 5), torch.tensor(5.0, dtype=torch.float64),
                    "collapsed loss equals N")
# an expert nobody chose still counts in N
course.expect_close(load_balancing_loss(torch.full((4, 3), 1 / 3, dtype=torch.float64), torch.zeros(4, 1, dtype=torch.long), 3),
                    torch.tensor(1.0, dtype=torch.float64), "loss when one expert takes every token but P is uniform")
course.expect_raises(ValueError, load_balancing_loss, torch.full((3, 4), 0.25), torch.tensor([[0], [-1], [2]]), 4,
                     match="experts", what="load_balancing_loss(a negative expert index)")
course.expect_raises(ValueError, load_balancing_loss, torch.full((3, 4), 0.25), torch.zeros(2, 1, dtype=torch.long), 4,
                     match="experts", what="load_balancing_loss(experts for 2 tokens, probs for 3)")
### END HIDDEN TESTS

# %%
balance_loss = course.keep_going("load_balancing_loss", load_balancing_loss, reference_moe.load_balancing_loss,
                                 check_load_balancing_loss)

# %% [markdown]
# The loss is 1 when balanced and grows as the router concentrates, up to $N/k$ when all
# the probability sits on one expert (that expert then takes every first choice, $f = 1/k$;
# $N$ for top-1). A router at initialization is close to uniform, so it starts near 1: the
# loss does not *make* the router balanced, it keeps it from drifting away.

# %%
n = 8
for name, logits in [("random router", torch.randn(512, n) * 0.1), ("a favourite expert", torch.randn(512, n) + 3 * F.one_hot(torch.zeros(512, dtype=torch.long), n)),
                     ("collapsed", 20 * F.one_hot(torch.zeros(512, dtype=torch.long), n).float())]:
    probs = torch.softmax(logits, -1)
    _, chosen = routing(logits, 2)
    print(f"{name:>20}: balance loss {balance_loss(probs, chosen, n).item():.3f} (1 = balanced, {n // 2} = collapsed, top-2)")

# %% [markdown]
# ## Keeping the logits small: the router z-loss
#
# The router's softmax runs in float32 even in a bfloat16 model (Switch's "selective
# precision"): bfloat16 keeps 8 bits of mantissa, and its round-off can change which
# expert wins. ST-MoE (Zoph et al., 2022)
# found that router logits grow during training and that this destabilizes large runs,
# and added a penalty on their size, the **router z-loss**:
#
# $$\mathcal{L}_z = \beta \cdot \frac{1}{T} \sum_{t=1}^{T} \Big(\log \sum_{i=1}^{N} e^{z_{t,i}}\Big)^2,$$
#
# with $z_t = W_r x_t$ the logits and $\beta \approx 10^{-3}$. The log-sum-exp is the
# softmax's normalizer, about the largest logit: squaring it penalizes large logits
# without caring which expert they favour, so it barely disturbs the routing.
#
# ### Exercise 3 · The router z-loss
#
# Implement `router_z_loss(logits)`: the mean over tokens of the squared log-sum-exp of
# each token's logits, without $\beta$. `logits`: `(tokens, n_experts)`; return a 0-dim
# tensor in its dtype. It must stay finite for logits in the thousands.
#
# Difficulty ●○○ · Importance ●●○ · about 5 minutes
#
# <details><summary>Hint 1</summary><code>torch.logsumexp(logits, dim=-1)</code> subtracts the maximum first, as chapter 04's softmax does.</details>
# <details><summary>Hint 2</summary><code>torch.logsumexp(logits, dim=-1).square().mean()</code></details>

# %%
#| answer router_z_loss
#| export minillm/moe.py
def router_z_loss(logits: torch.Tensor) -> torch.Tensor:
    """ST-MoE's router z-loss, without its coefficient: mean over tokens of logsumexp(logits)².

    logits: (tokens, n_experts). Returns a 0-dim tensor in logits' dtype, computed stably
    (finite for logits in the thousands).
    """
    ### BEGIN SOLUTION
    return torch.logsumexp(logits, dim=-1).square().mean()
    ### END SOLUTION

# %%
#| test router_z_loss_visible points=1
@course.visible_check("router_z_loss")
def check_router_z_loss(router_z_loss):
    logits = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0], [-1.0, 4.0, 0.5], [2.0, -3.0, 1.0]], dtype=torch.float64)
    lse = torch.log(torch.exp(logits).sum(-1))
    course.expect_close(router_z_loss(logits), lse.square().mean(), "router_z_loss(logits)",
                        mistakes={"the log-sum-exp is not squared": lse.mean(),
                                  "the square of the mean, not the mean of the squares": lse.mean().square(),
                                  "the sum over tokens, not the mean": lse.square().sum(),
                                  "the squared maximum logit, not the log-sum-exp": logits.amax(-1).square().mean(),
                                  "the squared logits, not their log-sum-exp": logits.square().mean()})
    big = torch.tensor([[1000.0, 998.0], [-1000.0, -1001.0]])
    got = router_z_loss(big)
    if isinstance(got, torch.Tensor) and not torch.isfinite(got).all():
        raise course.CheckFailed("router_z_loss is inf or NaN for logits near +-1000: log(sum(exp(z))) overflows; "
                                 "use torch.logsumexp, which subtracts the maximum first")
    course.expect_close(got, torch.logsumexp(big.double(), -1).square().mean().float(), "router_z_loss of logits near +-1000",
                        rtol=1e-5)


check_router_z_loss(router_z_loss)
print("router_z_loss: visible test passed")

# %%
#| test router_z_loss_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
for tokens, n_experts, dtype in [(40, 8, torch.float32), (3, 64, torch.float64), (1, 2, torch.float64)]:
    logits = 4 * torch.randn(tokens, n_experts, dtype=dtype)
    got = router_z_loss(logits)
    assert isinstance(got, torch.Tensor) and got.dim() == 0, "the z-loss must be a 0-dim tensor"
    assert got.dtype == dtype, "the z-loss must keep the logits' dtype"
    course.expect_close(got, torch.logsumexp(logits, -1).square().mean(), "router_z_loss")
big = torch.tensor([[3000.0, 2999.0, -5.0], [-4000.0, -4000.0, -4001.0]], dtype=torch.float32)
got = router_z_loss(big)
assert torch.isfinite(got), "the z-loss must stay finite for logits in the thousands"
course.expect_close(got, torch.logsumexp(big.double(), -1).square().mean().float(), "z-loss for logits in the thousands", rtol=1e-5)
### END HIDDEN TESTS

# %%
z_loss = course.keep_going("router_z_loss", router_z_loss, reference_moe.router_z_loss, check_router_z_loss)
for scale in (0.1, 1.0, 10.0):
    print(f"router logits of scale {scale:>4}: z-loss {z_loss(scale * torch.randn(512, 8)).item():8.2f}")


# %% [markdown]
# ## Dispatch, capacity and token dropping
#
# The router has chosen; now each expert must run on its tokens. A loop over tokens would
# call an FFN once per token, the slowest way to use a matrix unit. The fast way
# *dispatches*: sort the assignments by expert, so that each expert's tokens lie together,
# gather them into one batch per expert and run each expert once; then *combine*: scatter
# the outputs back to their tokens, each times its weight, adding up a token's $k$
# contributions.
#
# On an accelerator the batches must have a fixed size, so each expert gets a **capacity**
# of slots,
#
# $$C = \left\lceil c \cdot \frac{kT}{N} \right\rceil ,$$
#
# the even share of the $kT$ assignments times a *capacity factor* $c$ (1.0 to 2.0 in
# practice). Assignments past an expert's capacity are **dropped**: that token gets nothing
# from that expert. In a pre-norm block $h = x + \mathrm{FFN}(\mathrm{norm}(x))$, so a token
# that all its experts drop passes through the block unchanged, along the residual. Which
# assignments fit is decided in a fixed order, each expert's *queue*: all first choices
# before any second choice, and within a choice in token order (GShard's and Switch's
# rule: a token's favourite expert matters more than its second).
#
# Dropping is a training-time compromise. At evaluation a layer can run *dropless*, every
# expert taking all its tokens: `MoEFeedForward`'s `eval_capacity_factor=None`, its
# default, does that.

# %%
#| export minillm/moe.py
def expert_capacity(n_tokens: int, n_experts: int, top_k: int, capacity_factor: float) -> int:
    """Slots per expert: ceil(capacity_factor * n_tokens * top_k / n_experts), at least 1."""
    positive_int("n_tokens", n_tokens)
    positive_int("n_experts", n_experts)
    positive_int("top_k", top_k)
    number("capacity_factor", capacity_factor, low=0.0, low_open=True)
    return max(1, math.ceil(capacity_factor * n_tokens * top_k / n_experts))

# %% [markdown]
# ### Exercise 4 · The dispatch plan
#
# Implement `dispatch_plan(experts, n_experts, capacity=None)`. `experts` is the router's
# choice, `(tokens, k)` int64. Lay the assignments out in queue order, choice-major:
# assignment $a = j \cdot T + t$ is token $t$'s choice $j$ (that is `experts.T.reshape(-1)`).
# Sort them by expert with a *stable* sort, so that each expert's assignments stay in
# queue order, keep each expert's first `capacity` (all of them when `capacity` is None),
# and return three int64 tensors:
#
# - `rows`: the token of each kept assignment, expert 0's first, then expert 1's, ...;
# - `slots`: which of its $k$ choices that assignment was (so `experts[rows, slots]` is
#   sorted);
# - `counts`: `(n_experts,)`, how many assignments each expert keeps.
#
# The plan must be vectorised: no Python loop over the tokens or the assignments (a loop
# over the experts is allowed, but not needed). The tests count the lines of Python your
# function runs for a few tokens and for many, and that count must not grow with the
# number of tokens.
#
# Difficulty ●●● · Importance ●●● · about 15 minutes
#
# <details><summary>Hint 1</summary><code>flat = experts.T.reshape(-1)</code>; <code>order = torch.argsort(flat, stable=True)</code> lists the assignments by expert, in queue order within each. Assignment <code>a</code> is token <code>a % T</code>, choice <code>a // T</code>.</details>
# <details><summary>Hint 2</summary>An assignment's place in its expert's queue is its position in the sorted list minus where its expert's run starts: <code>counts = torch.bincount(flat, minlength=n_experts)</code>, <code>starts = counts.cumsum(0) - counts</code>, <code>place = torch.arange(len(flat)) - starts[flat[order]]</code>.</details>
# <details><summary>Hint 3</summary><code>keep = order[place &lt; capacity]</code>; <code>rows, slots = keep % T, keep // T</code>; <code>counts.clamp(max=capacity)</code>.</details>

# %%
#| answer dispatch_plan
#| export minillm/moe.py
def dispatch_plan(experts: torch.Tensor, n_experts: int,
                  capacity: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Which assignments each expert runs, sorted by expert: ``(rows, slots, counts)``.

    experts: (tokens, top_k) int64, the router's choice. An expert's queue is choice-major:
    every token's first choice in token order, then every second choice, ...; each expert
    keeps the first ``capacity`` assignments of its queue (all when capacity is None).
    rows, slots: (kept,) int64, the token and the choice of each kept assignment, expert 0's
    first, each expert's in queue order. counts: (n_experts,) int64, the assignments each
    expert keeps.
    """
    ### BEGIN SOLUTION
    tokens = experts.shape[0]
    flat = experts.T.reshape(-1)  # assignment a = choice * tokens + token
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=n_experts)
    if capacity is not None:
        starts = counts.cumsum(0) - counts
        place = torch.arange(len(flat), device=flat.device) - starts[flat[order]]
        order = order[place < capacity]
        counts = counts.clamp(max=capacity)
    return order % tokens, order // tokens, counts
    ### END SOLUTION

# %%
#| test dispatch_plan_visible points=1
from course_runtime.opcount import grows_with_size


def _naive_plan(experts, n_experts, capacity):
    """Each expert's queue, walked in order: choices outer, tokens inner."""
    queues = [[] for _ in range(n_experts)]
    for j in range(experts.shape[1]):
        for t in range(experts.shape[0]):
            e = int(experts[t, j])
            if capacity is None or len(queues[e]) < capacity:
                queues[e].append((t, j))
    rows = [t for q in queues for t, _ in q]
    slots = [j for q in queues for _, j in q]
    return rows, slots, [len(q) for q in queues]


def _cycling_experts(tokens):
    """(tokens, 2): token t's top-2 of 4 experts, t % 4 and (3t + 1) % 4 (never the same)."""
    t = torch.arange(tokens)
    return torch.stack([t % 4, (3 * t + 1) % 4], dim=1)


@course.visible_check("dispatch_plan")
def check_dispatch_plan(dispatch_plan):
    experts = torch.tensor([[0, 1], [0, 2], [0, 1], [1, 0]])  # 4 tokens, top-2 of 3 experts
    for capacity in (None, 2):
        got = dispatch_plan(experts.clone(), 3, capacity)
        if not isinstance(got, tuple) or len(got) != 3:
            raise course.CheckFailed(f"dispatch_plan must return (rows, slots, counts), got {course.describe(got)}")
        rows, slots, counts = got
        exp_rows, exp_slots, exp_counts = _naive_plan(experts, 3, capacity)
        for name, value in (("rows", rows), ("slots", slots), ("counts", counts)):
            if not isinstance(value, torch.Tensor) or value.dtype != torch.int64:
                raise course.CheckFailed(f"{name} must be an int64 tensor, got {course.describe(value)}")
        one_more = {}  # what keeping capacity + 1 gives: place <= capacity, where places count from 0
        if capacity is not None:
            one_more = dict(zip(("rows", "counts"), _naive_plan(experts, 3, capacity + 1)[::2]))
        too_many = ("each expert kept capacity + 1 assignments: keep those whose place in the queue is < capacity, "
                    "not <= (places count from 0)")
        course.expect_equal(counts.tolist(), exp_counts, f"counts, capacity={capacity}",
                            mistakes={"capacity is ignored": [4, 3, 1],
                                      **({too_many: one_more["counts"]} if one_more else {})})
        token_major = [t for e in range(3) for t in range(4) for j in range(2) if int(experts[t, j]) == e]
        course.expect_equal(rows.tolist(), exp_rows, f"rows, capacity={capacity}",
                            mistakes={"the queue is token-major (experts.reshape(-1)), not choice-major "
                                      "(experts.T.reshape(-1)): a token's second choice came before other tokens' "
                                      "first choices": token_major,
                                      "rows are assignment indices, not tokens (take a % T)": [
                                          j * 4 + t for e in range(3) for j in range(2) for t in range(4)
                                          if int(experts[t, j]) == e][: len(exp_rows)],
                                      **({too_many: one_more["rows"]} if one_more else {})},
                            hint="with capacity 2, expert 0 keeps tokens 0 and 1 (first choices), not token 3's "
                                 "second choice" if capacity else None)
        course.expect_equal(slots.tolist(), exp_slots, f"slots, capacity={capacity}")
    steps = grows_with_size(dispatch_plan, (_cycling_experts(32), 4, 8), (_cycling_experts(512), 4, 128), slack=32)
    if steps:
        raise course.CheckFailed(f"dispatch_plan ran {steps[0]} lines of Python for 32 tokens and {steps[1]} for 512: "
                                 "it loops over the tokens in Python, and the plan must be vectorised "
                                 "(torch.argsort, torch.bincount and cumsum loop in C)")


check_dispatch_plan(dispatch_plan)
print("dispatch_plan: visible test passed")

# %%
#| test dispatch_plan_hidden points=3
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
for tokens, n, k, capacity in [(40, 4, 2, None), (40, 4, 2, 12), (23, 8, 1, 2), (30, 6, 3, 1), (9, 3, 3, None),
                               (64, 8, 2, 16), (1, 2, 1, 1), (50, 5, 2, 1000)]:
    logits = torch.randn(tokens, n)
    logits[: tokens // 2, 0] += 3  # a busy expert, so that capacity bites
    experts = logits.topk(k, dim=-1).indices
    rows, slots, counts = dispatch_plan(experts.clone(), n, capacity)
    exp_rows, exp_slots, exp_counts = _naive_plan(experts, n, capacity)
    for value, message in ((rows, "rows must be an int64 tensor"), (slots, "slots must be an int64 tensor"),
                           (counts, "counts must be an int64 tensor")):
        assert isinstance(value, torch.Tensor) and value.dtype == torch.int64, message
    course.expect_equal(counts.tolist(), exp_counts, "dispatch_plan's counts")
    course.expect_equal(rows.tolist(), exp_rows, "dispatch_plan's rows")
    course.expect_equal(slots.tolist(), exp_slots, "dispatch_plan's slots")
# vectorised: the lines of Python it runs do not grow with the number of tokens
for few_slots, many_slots in ((None, None), (16, 256)):
    small, large = (torch.randn(tokens, 6).topk(2, dim=-1).indices for tokens in (48, 768))
    assert grows_with_size(dispatch_plan, (small, 6, few_slots), (large, 6, many_slots), slack=48) is None, \
        "dispatch_plan runs more Python for more tokens: the plan must be vectorised, with no loop over tokens"
# an expert that nobody chose keeps nothing, and the counts still have n_experts entries
rows, slots, counts = dispatch_plan(torch.tensor([[2], [2], [0]]), 5, None)
course.expect_equal(counts.tolist(), [1, 0, 2, 0, 0], "counts with unused experts")
course.expect_equal(rows.tolist(), [2, 0, 1], "rows with unused experts")
### END HIDDEN TESTS

# %%
plan = course.keep_going("dispatch_plan", dispatch_plan, reference_moe.dispatch_plan, check_dispatch_plan)
assignments = torch.tensor([[0, 1], [0, 2], [0, 1], [1, 0]])
rows, slots, counts = plan(assignments, 3, capacity=2)
print("rows", rows.tolist(), "slots", slots.tolist(), "counts", counts.tolist())

# %% [markdown]
# Four tokens, top-2 of three experts, two slots each. Expert 0 is every token's first
# choice: tokens 0 and 1 keep it, token 2 loses its first choice, and token 3's *second*
# choice of expert 0 comes after all first choices, so it is dropped too. Expert 1 takes
# token 3's first choice before the second choices of tokens 0 and 2, so it keeps tokens
# 3 and 0 and drops token 2, which is left with nothing at all: it will pass through the
# block unchanged. Expert 2 keeps token 1's second choice.
#
# ### Exercise 5 · Combine
#
# The experts have run: `outputs` `(kept, d)` holds, in the plan's order, expert
# `experts[rows[i], slots[i]]`'s output for token `rows[i]`. Implement
# `combine(outputs, rows, slots, weights, n_tokens)`:
#
# $$y_t = \sum_{i \,:\, \text{rows}_i = t} w_{t,\, \text{slots}_i}\; \text{outputs}_i ,$$
#
# a `(n_tokens, d)` tensor in `outputs`' dtype, zero for a token that kept no assignment.
# `weights` is the router's `(tokens, k)`, which may have another dtype (a float32 router
# beside bfloat16 experts): the result keeps the experts' dtype, not the weights'. No loop
# over tokens.
#
# Difficulty ●●○ · Importance ●●● · about 5 minutes
#
# <details><summary>Hint 1</summary><code>weights[rows, slots]</code> picks each kept assignment's weight.</details>
# <details><summary>Hint 2</summary><code>y[rows] += ...</code> does <em>not</em> add up repeated rows (a token with two kept choices keeps only one); <code>y.index_add_(0, rows, values)</code> does.</details>

# %%
#| answer combine
#| export minillm/moe.py
def combine(outputs: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor, weights: torch.Tensor,
            n_tokens: int) -> torch.Tensor:
    """Scatter the experts' outputs back to their tokens, weighted, summing a token's choices.

    outputs: (kept, d), in ``dispatch_plan``'s order; rows, slots: (kept,) int64 from the
    plan; weights: (tokens, top_k), the router's. Returns (n_tokens, d) in outputs' dtype:
    y[t] = sum over i with rows[i] == t of weights[t, slots[i]] * outputs[i]; zero for a
    token with no kept assignment.
    """
    ### BEGIN SOLUTION
    y = outputs.new_zeros(n_tokens, outputs.shape[-1])
    return y.index_add_(0, rows, outputs * weights[rows, slots, None].to(outputs.dtype))
    ### END SOLUTION

# %%
#| test combine_visible points=1
@course.visible_check("combine")
def check_combine(combine):
    outputs = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0], [9.0, 10.0]], dtype=torch.float64)
    rows = torch.tensor([0, 1, 3, 0, 1])
    slots = torch.tensor([0, 0, 0, 1, 1])
    weights = torch.tensor([[0.75, 0.25], [0.6, 0.4], [0.5, 0.5], [0.9, 0.1]], dtype=torch.float64)
    w = weights[rows, slots, None]
    expected = torch.zeros(4, 2, dtype=torch.float64).index_add_(0, rows, outputs * w)
    last_only = torch.zeros(4, 2, dtype=torch.float64)
    last_only[rows] = outputs * w
    got = combine(outputs.clone(), rows, slots, weights, 4)
    course.expect_close(got, expected, "combine(outputs, rows, slots, weights, 4)",
                        mistakes={"y[rows] += ...: a token's second kept choice overwrites its first "
                                  "(use index_add_)": last_only,
                                  "the outputs are not multiplied by the weights":
                                      torch.zeros(4, 2, dtype=torch.float64).index_add_(0, rows, outputs),
                                  "the weight of the first choice is used for every choice":
                                      torch.zeros(4, 2, dtype=torch.float64).index_add_(0, rows, outputs * weights[rows, 0, None])},
                        hint="token 2 kept nothing: its row is zero")
    if got.dtype != torch.float64:
        raise course.CheckFailed(f"combine must return outputs' dtype (float64 here), got {got.dtype}")
    mixed = combine(outputs.float(), rows, slots, weights, 4)
    if isinstance(mixed, torch.Tensor) and mixed.dtype != torch.float32:
        raise course.CheckFailed(f"combine of float32 outputs with float64 weights returned {mixed.dtype}: the result "
                                 "is in outputs' dtype, not the weights' (cast the weights to outputs.dtype)")
    course.expect_close(mixed, expected.float(), "combine of float32 outputs with float64 weights")


check_combine(combine)
print("combine: visible test passed")

# %%
#| test combine_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
for tokens, d, k, kept, dtype in [(30, 7, 2, 45, torch.float32), (5, 3, 3, 15, torch.float64), (8, 4, 1, 0, torch.float64),
                                  (12, 2, 2, 5, torch.float64)]:
    pairs = torch.randperm(tokens * k)[:kept]
    rows, slots = pairs % tokens, pairs // tokens
    order = torch.argsort(torch.randint(0, 4, (kept,)), stable=True)  # any order the plan may produce
    rows, slots = rows[order], slots[order]
    outputs = torch.randn(kept, d, dtype=dtype)
    weights = torch.rand(tokens, k, dtype=dtype)
    expected = torch.zeros(tokens, d, dtype=dtype)
    for i in range(kept):
        expected[rows[i]] += weights[rows[i], slots[i]] * outputs[i]
    got = combine(outputs, rows, slots, weights, tokens)
    assert isinstance(got, torch.Tensor) and got.dtype == dtype, "combine must return the outputs' dtype"
    course.expect_close(got, expected, "combine", atol=1e-5 if dtype == torch.float32 else 1e-12)
# a token whose every choice was kept gets both; repeated rows add up whatever their order
outputs = torch.randn(4, 3, dtype=torch.float64)
weights = torch.rand(3, 2, dtype=torch.float64)
got = combine(outputs, torch.tensor([1, 0, 1, 0]), torch.tensor([1, 1, 0, 0]), weights, 3)
expected = torch.stack([weights[0, 1] * outputs[1] + weights[0, 0] * outputs[3],
                        weights[1, 1] * outputs[0] + weights[1, 0] * outputs[2], torch.zeros(3, dtype=torch.float64)])
course.expect_close(got, expected, "combine: tokens 0 and 1 keep both choices, token 2 none", atol=1e-12)
# the result is in outputs' dtype whatever the weights' (a float32 router beside bfloat16 experts)
for out_dtype, weight_dtype in [(torch.float32, torch.float64), (torch.bfloat16, torch.float32),
                                (torch.float64, torch.float32)]:
    pairs = torch.randperm(20)[:14]
    rows, slots = pairs % 10, pairs // 10
    outputs, weights = torch.randn(14, 5).to(out_dtype), torch.rand(10, 2, dtype=weight_dtype)
    got = combine(outputs, rows, slots, weights, 10)
    assert isinstance(got, torch.Tensor) and got.dtype == out_dtype, "combine must return the outputs' dtype, not the weights'"
    expected = torch.zeros(10, 5, dtype=torch.float64).index_add_(0, rows, outputs.double() * weights[rows, slots, None].double())
    course.expect_close(got.double(), expected, "combine with weights of another dtype",
                        atol=5e-2 if out_dtype == torch.bfloat16 else 1e-5)
### END HIDDEN TESTS

# %%
combine_outputs = course.keep_going("combine", combine, reference_moe.combine, check_combine)

# %% [markdown]
# Plan, run, combine: that is the layer's whole dispatch. `dispatch_and_combine` below puts
# the pieces together, one gather of the kept tokens, one call of each expert on its
# contiguous slice, one scatter. The experts are the only loop, $N$ iterations whatever
# the number of tokens. `dispatch_and_combine_masked` is the same computation written the
# way most tutorials write it: for each expert, find its tokens with a boolean mask
# (`capacity_mask` decides what fits, by a cumulative count over a one-hot table instead of
# a sort). The two are independent implementations of one formula; the package's tests
# check both against a per-token loop, and `bench/moe.py` times them.

# %%
#| export minillm/moe.py
def dispatch_and_combine(x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor,
                         expert_fns: Sequence[Callable[[torch.Tensor], torch.Tensor]],
                         capacity: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's dispatch by sorting: plan, gather, run each expert once on its slice, combine.

    x: (tokens, d). experts, weights: (tokens, top_k), the router's choice. expert_fns: N
    callables, (n, d) → (n, d). capacity: slots per expert, or None for no limit. Returns
    ``(y, kept)``: y (tokens, d) in x's dtype, y[t] = sum over kept choices j of
    weights[t, j] * expert_fns[experts[t, j]](x[t]); kept, the (tokens, top_k) bool mask of
    the assignments that fit. An expert with no tokens is not called.
    """
    rows, slots, counts = dispatch_plan(experts, len(expert_fns), capacity)
    gathered = x[rows]
    outputs = [fn(chunk) for fn, chunk, n in zip(expert_fns, gathered.split(counts.tolist()), counts.tolist()) if n]
    y = combine(torch.cat(outputs) if outputs else gathered, rows, slots, weights, x.shape[0])
    kept = torch.zeros(experts.shape, dtype=torch.bool, device=x.device)
    kept[rows, slots] = True
    return y.to(x.dtype), kept


def capacity_mask(experts: torch.Tensor, n_experts: int, capacity: int | None) -> torch.Tensor:
    """Which assignments fit, by counting instead of sorting: a bool (tokens, top_k) tensor.

    experts: (tokens, top_k) int64. The queue order of ``dispatch_plan``: an assignment is
    kept when fewer than ``capacity`` assignments of its expert come before it (all are
    kept when capacity is None).
    """
    if capacity is None:
        return torch.ones(experts.shape, dtype=torch.bool, device=experts.device)
    one_hot = F.one_hot(experts.T.reshape(-1), n_experts)  # (top_k * tokens, n_experts), choice-major
    place = (one_hot.cumsum(dim=0) * one_hot).sum(dim=-1) - 1  # earlier assignments of the same expert
    return (place < capacity).reshape(experts.shape[1], experts.shape[0]).T


def dispatch_and_combine_masked(x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor,
                                expert_fns: Sequence[Callable[[torch.Tensor], torch.Tensor]],
                                capacity: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``dispatch_and_combine`` written as a loop over experts with a boolean mask each: same
    arguments, same result (up to float rounding); the baseline ``bench/moe.py`` times."""
    kept = capacity_mask(experts, len(expert_fns), capacity)
    y = torch.zeros_like(x)
    for e, fn in enumerate(expert_fns):
        rows, slots = (kept & (experts == e)).nonzero(as_tuple=True)
        if len(rows):
            y.index_add_(0, rows, (fn(x[rows]) * weights[rows, slots, None]).to(y.dtype))
    return y, kept


DISPATCHERS = {"sorted": dispatch_and_combine, "masked": dispatch_and_combine_masked}

# %% [markdown]
# ## The layer: `MoEFeedForward`
#
# The layer puts it all together and plugs into chapter 05's FFN registry as "moe", so a
# model config names it like any FFN:
#
# ```python
# GPTConfig(..., ffn="moe", d_ff=176,
#           ffn_options={"n_experts": 8, "top_k": 2, "expert": "swiglu", "capacity_factor": 1.25})
# ```
#
# - The **router** is a bias-free `Linear(d_model, n_experts)`, computed in float32 at
#   least, even in a bfloat16 model. With `jitter` $> 0$ its input is multiplied by uniform
#   noise in $[1 - \text{jitter}, 1 + \text{jitter}]$ while training (Switch's
#   exploration).
# - The **experts** are chapter 05's FFNs, built by the registry from the name in
#   `expert` ("swiglu", "gelu", ...), each of hidden width `d_ff`. The default width is the
#   expert's own rule, so each expert is as large as the dense FFN it replaces (Switch,
#   Mixtral); pass a smaller `d_ff` for equal active size.
# - **Capacity:** `capacity_factor` while training (None: dropless), `eval_capacity_factor`
#   in eval mode (None, the default: dropless).
# - **Losses:** `self.aux_loss` $= \alpha\,\mathcal{L}_\text{balance} + \beta\,\mathcal{L}_z$
#   (`balance_coef` $\alpha = 0.01$, `z_coef` $\beta = 10^{-3}$), which `GPT.forward` adds to
#   the loss; `self.aux_losses` holds the two parts, "moe_balance" and "moe_z", which
#   `GPT.last_aux_losses` sums over the layers and `train` logs apart.
# - **Diagnostics:** `last_stats` keeps what the router did in the last forward: the
#   assignments and the kept assignments per expert, the drop rate, the router's entropy,
#   the root-mean-square of its logits, and both losses unweighted.
# - **Counting:** `active_parameter_count()` is the router plus `top_k` experts, what one
#   token uses; `count_parameters(config, active=True)` asks it.
#
# One thing the layer gives up: chapter 07 checks that the dense GPT compiles into one
# graph (`torch._dynamo.explain` finds no graph break). Here how many tokens each expert
# gets depends on the data (`bincount`, `nonzero`, the split sizes), so `torch.compile`
# breaks the graph at every MoE layer: `explain` counts 21 breaks in a two-layer MoE GPT.
# Compiled MoE kernels avoid this with fixed-size capacity buffers (GShard) or
# block-sparse products (MegaBlocks).

# %%
#| export minillm/moe.py
class MoEFeedForward(nn.Module):
    """A mixture-of-experts feed-forward layer: a router and ``n_experts`` FFNs, ``top_k`` per token.

    d_model: input and output width. d_ff: each expert's hidden width. n_experts, top_k:
    experts in all and per token. capacity_factor: slots per expert while training, as a
    multiple of the even share (``expert_capacity``); None drops nothing.
    eval_capacity_factor: the same in eval mode; None (default) is dropless evaluation.
    expert: the FFN registry's name of the experts ("swiglu", "gelu", "relu", "gelu_tanh");
    expert_options: their own options (a dict). normalize_weights: renormalize the top-k
    weights to sum to 1 (False: Switch's raw probabilities). jitter: multiplicative
    uniform noise on the router's input while training (0: none). balance_coef, z_coef: the
    coefficients of the load-balancing loss and the router z-loss. dispatch: "sorted"
    (``dispatch_and_combine``) or "masked" (``dispatch_and_combine_masked``). bias, dropout:
    passed to every expert (the router has no bias).

    Submodules: ``router`` (Linear, weight (n_experts, d_model)), ``experts`` (ModuleList).
    Input (..., d_model) → output (..., d_model). After each forward: ``aux_loss`` (0-dim),
    ``aux_losses`` {"moe_balance", "moe_z"} (weighted), ``last_stats`` (detached tensors:
    "assigned" and "kept" per expert (n_experts,), "dropped" (the fraction of assignments
    dropped), "entropy" (mean router entropy, nats), "logit_rms", "balance" and "z"
    (unweighted)).
    """

    def __init__(self, d_model: int, d_ff: int, n_experts: int = 8, top_k: int = 2,
                 capacity_factor: float | None = 1.25, eval_capacity_factor: float | None = None,
                 expert: str = "swiglu", expert_options: dict | None = None, normalize_weights: bool = True,
                 jitter: float = 0.0, balance_coef: float = 0.01, z_coef: float = 1e-3, dispatch: str = "sorted",
                 bias: bool = False, dropout: float = 0.0):
        super().__init__()
        positive_int("d_model", d_model)
        positive_int("d_ff", d_ff)
        positive_int("n_experts", n_experts)
        if not 1 <= positive_int("top_k", top_k) <= n_experts:
            raise ValueError(f"top_k must be in [1, n_experts={n_experts}], got {top_k}")
        for name, value in (("capacity_factor", capacity_factor), ("eval_capacity_factor", eval_capacity_factor)):
            if value is not None:
                number(name, value, low=0.0, low_open=True)
        if expert == "moe" or not isinstance(expert, str):
            raise ValueError(f"expert must be the registry name of a dense FFN, got {expert!r}")
        one_of("expert", expert, FFNS.names())
        if expert_options is not None and not isinstance(expert_options, dict):
            raise TypeError(f"expert_options must be None or a dict, got {type(expert_options).__name__}")
        boolean("normalize_weights", normalize_weights)
        number("jitter", jitter, low=0.0, high=1.0, high_open=True)
        number("balance_coef", balance_coef, low=0.0)
        number("z_coef", z_coef, low=0.0)
        one_of("dispatch", dispatch, tuple(DISPATCHERS))
        self.d_model, self.d_ff, self.n_experts, self.top_k = d_model, d_ff, n_experts, top_k
        self.capacity_factor, self.eval_capacity_factor = capacity_factor, eval_capacity_factor
        self.expert_name, self.normalize_weights, self.jitter = expert, normalize_weights, jitter
        self.balance_coef, self.z_coef, self.dispatch = balance_coef, z_coef, dispatch
        self.router = nn.Linear(d_model, n_experts, bias=False)
        self.experts = nn.ModuleList(
            build_ffn(expert, d_model, d_ff, bias=bias, dropout=dropout, **(expert_options or {}))
            for _ in range(n_experts))
        self.aux_loss: torch.Tensor | None = None
        self.aux_losses: dict[str, torch.Tensor] = {}
        self.last_stats: dict[str, torch.Tensor] = {}

    @classmethod
    def default_d_ff(cls, d_model: int, expert: str = "swiglu", expert_options: dict | None = None, **options) -> int:
        """Each expert's hidden width when a configuration names none: the expert's own rule
        (``minillm.ffn.default_d_ff``), so that each expert is as large as the dense FFN."""
        return default_d_ff(expert, d_model, **(expert_options or {}))

    def capacity(self, n_tokens: int) -> int | None:
        """Slots per expert for ``n_tokens`` tokens in the current mode (None: no limit)."""
        factor = self.capacity_factor if self.training else self.eval_capacity_factor
        return None if factor is None else expert_capacity(n_tokens, self.n_experts, self.top_k, factor)

    def active_parameter_count(self) -> int:
        """Parameters one token uses: the router and ``top_k`` experts (all experts have one size)."""
        per_expert = sum(p.numel() for p in self.experts[0].parameters())
        return self.router.weight.numel() + self.top_k * per_expert

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., d_model) → (..., d_model); sets ``aux_loss``, ``aux_losses`` and ``last_stats``."""
        if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (..., d_model={self.d_model}), got {tuple(getattr(x, 'shape', ()))}")
        tokens = x.reshape(-1, self.d_model)
        router_input = tokens.to(compute_dtype(tokens.dtype))  # round-off must not pick the expert
        if self.training and self.jitter > 0:
            router_input = router_input * torch.empty_like(router_input).uniform_(1 - self.jitter, 1 + self.jitter)
        logits = F.linear(router_input, self.router.weight.to(router_input.dtype))
        probs = torch.softmax(logits, dim=-1)
        weights, experts = top_k_routing(logits, self.top_k, self.normalize_weights)
        y, kept = DISPATCHERS[self.dispatch](tokens, experts, weights, self.experts, self.capacity(tokens.shape[0]))
        balance = load_balancing_loss(probs, experts, self.n_experts)
        z = router_z_loss(logits)
        self.aux_losses = {"moe_balance": self.balance_coef * balance, "moe_z": self.z_coef * z}
        self.aux_loss = self.aux_losses["moe_balance"] + self.aux_losses["moe_z"]
        with torch.no_grad():
            self.last_stats = {
                "assigned": torch.bincount(experts.flatten(), minlength=self.n_experts),
                "kept": torch.bincount(experts[kept], minlength=self.n_experts),
                "dropped": 1 - kept.float().mean(),
                "entropy": -(probs * probs.clamp_min(1e-12).log()).sum(-1).mean(),
                "logit_rms": logits.square().mean().sqrt(),
                "balance": balance.detach(), "z": z.detach()}
        return y.reshape(x.shape)

    def extra_repr(self) -> str:
        return (f"n_experts={self.n_experts}, top_k={self.top_k}, capacity_factor={self.capacity_factor}, "
                f"expert={self.expert_name!r}, dispatch={self.dispatch!r}")


def routing_metrics(model: nn.Module) -> dict[str, float]:
    """The last forward's routing in every MoE layer of ``model``, as floats for a log.

    A layer is any module with a non-empty ``last_stats`` (a ``MoEFeedForward`` after a
    forward). Keys ``moe{i}/`` (i counts the MoE layers in order) + "dropped", "entropy",
    "logit_rms", "balance", "z", and "share{e}" (the fraction of assignments that went to
    expert e, before dropping). Empty when the model has no MoE layer.
    """
    metrics: dict[str, float] = {}
    layers = [m for m in model.modules() if vars(m).get("last_stats")]  # vars: nn.Module's getattr is slow
    for i, layer in enumerate(layers):
        stats = layer.last_stats
        for name in ("dropped", "entropy", "logit_rms", "balance", "z"):
            metrics[f"moe{i}/{name}"] = float(stats[name])
        share = stats["assigned"].float() / stats["assigned"].sum()
        metrics.update({f"moe{i}/share{e}": value for e, value in enumerate(share.tolist())})
    return metrics

# %% [markdown]
# `MoEFeedForward` calls your `top_k_routing`, `dispatch_plan`, `combine` and both losses
# by their names. Keep going: the next cell compares the layer with the formula written out
# token by token (and its `aux_loss` with the two losses written out), and binds `Layer` to
# it when it agrees, else to the course's reference.

# %%
def _layer_check(cls):
    with torch.random.fork_rng():  # the cells below draw the same numbers whatever this check draws
        torch.manual_seed(3)
        layer = cls(16, 24, n_experts=4, top_k=2, capacity_factor=1.0)  # training mode: 10 slots per expert
        tokens = torch.randn(20, 16)
    with torch.no_grad():
        y = layer(tokens)
        logits = tokens @ layer.router.weight.T
        probs = torch.softmax(logits, dim=-1)
        top, experts = probs.topk(2, dim=-1)
        rows, slots, _ = _naive_plan(experts, 4, math.ceil(1.0 * 20 * 2 / 4))
        expected = torch.zeros_like(tokens)
        for t, j in zip(rows, slots):
            expected[t] += top[t, j] / top[t].sum() * layer.experts[int(experts[t, j])](tokens[t])
    course.expect_close(y, expected, "MoEFeedForward's output against the formula, token by token")
    share = torch.bincount(experts.flatten(), minlength=4) / experts.numel()
    balance, z = 4 * (share * probs.mean(0)).sum(), torch.logsumexp(logits, -1).square().mean()
    course.expect_close(layer.aux_loss, 0.01 * balance + 1e-3 * z, "MoEFeedForward's aux_loss")


Layer = course.keep_going("MoEFeedForward", MoEFeedForward, reference_moe.MoEFeedForward, check=_layer_check)

# %% [markdown]
# Two checks before any training. With one expert, top-1 and no capacity limit, the layer
# *is* its expert: the router's one weight is renormalized to exactly 1, nothing is
# dropped, and the output equals the dense SwiGLU's bit for bit. And with eight experts the
# layer matches the formula computed one token at a time.

# %%
one = Layer(128, 352, n_experts=1, top_k=1, capacity_factor=None)
dense_ffn = SwiGLU(128, 352)
dense_ffn.load_state_dict(one.experts[0].state_dict())
x = torch.randn(4, 16, 128)
print("1 expert, top-1, no capacity limit == the dense SwiGLU, bit for bit:", torch.equal(one(x), dense_ffn(x)))

layer = Layer(128, 176, n_experts=8, top_k=2, capacity_factor=1.0)
tokens = x.reshape(-1, 128)
w, e = routing(tokens @ layer.router.weight.T, 2)
kept = reference_moe.capacity_mask(e, 8, reference_moe.expert_capacity(64, 8, 2, 1.0))
naive = torch.zeros_like(tokens)
for t in range(64):  # the formula, one token at a time
    for j in range(2):
        if kept[t, j]:
            naive[t] += w[t, j] * layer.experts[int(e[t, j])](tokens[t])
print(f"8 experts, top-2, capacity factor 1.0: largest difference from the per-token loop "
      f"{(layer(x).reshape(-1, 128) - naive).abs().max().item():.1e}, dropped {layer.last_stats['dropped'].item():.1%}")

# %% [markdown]
# ## Counting: total and active parameters
#
# The experiments below compare two models of the course's shape (chapter 07's recipe: 4
# layers, $d = 128$, 4 heads, RoPE, RMSNorm, the shipped 2,048-token tokenizer):
#
# - **dense**: the recipe's SwiGLU, $d_{ff} = 352$;
# - **MoE**: 8 SwiGLU experts of $d_{ff} = 176$, top-2. A token runs two half-width
#   experts, $2 \times 176 = 352$: the same active FFN as the dense model, plus a router of
#   $8 \times 128 = 1{,}024$ weights per layer. This is the *fine-grained* layout of
#   DeepSeekMoE (more, smaller experts); Switch and Mixtral use full-width experts instead.
#
# `count_parameters(config, active=True)` asks each layer for its `active_parameter_count()`.

# %%
_, tokenizer = load_pretrained()
dense_config = recipe_config(len(tokenizer.vocab))
moe_config = recipe_config(len(tokenizer.vocab), ffn="moe", d_ff=176,
                           ffn_options={"n_experts": 8, "top_k": 2, "expert": "swiglu", "capacity_factor": 1.25})
for name, config in (("dense", dense_config), ("MoE", moe_config)):
    built = sum(p.numel() for p in GPT(config).parameters())
    total, active = count_parameters(config), count_parameters(config, active=True)
    print(f"{name:>5}: {total:>9,d} parameters ({built:,d} in the built model), {active:>9,d} active per token, "
          f"{4 * total / 2**20:5.1f} MiB in float32")

# %% [markdown]
# The MoE model holds 2.5 times the dense model's parameters and uses the same number for
# each token, up to the routers' 4,096. Its memory follows the first number, its compute
# per token the second.
#
# ## A short training run
#
# The MoE model trains through chapter 07's `train` unchanged: `GPT.forward` adds each
# layer's `aux_loss` to the loss, and `lm_loss` returns the parts from
# `GPT.last_aux_losses` to be logged. The loss function below also logs the routing of
# every layer (`routing_metrics`). A short run here, live; the full runs, with seeds and
# ablations, come from a cache in the next section.

# %%
train_text, val_text = data.split_corpus(data.corpus_text())
train_ids = torch.tensor(tokenizer.encode(train_text[:200_000]))
val_ids = torch.tensor(tokenizer.encode(val_text[:40_000]))


def loss_with_routing(model, batch):
    """chapter 07's lm_loss, and the routing of every MoE layer in the log."""
    loss, parts = lm_loss(model, batch)
    return loss, {**parts, **routing_metrics(model)}


live_steps = 10 if course.QUICK else 60
torch.manual_seed(0)
live_model = GPT(moe_config)
start = time.perf_counter()
live = train(live_model, BatchSampler(train_ids, 8, moe_config.context_length, seed=0),
             recipe_train_config(steps=live_steps, eval_every=live_steps), loss_fn=loss_with_routing,
             evaluate=held_out_loss(val_ids, max_windows=16))
h = live.history
print(f"{live_steps} steps in {time.perf_counter() - start:.0f} s; held-out loss {h['val_loss'][-1]:.3f}; "
      f"last step: loss {h['train_loss'][-1]:.3f} = cross-entropy + balance {h['moe_balance'][-1]:.4f} "
      f"+ z {h['moe_z'][-1]:.5f}")
print("layer 0's expert shares at the last step:", [round(h[f"moe0/share{e}"][-1], 3) for e in range(8)])
print("drop rate at capacity factor 1.25, per layer:", [round(h[f"moe{i}/dropped"][-1], 3) for i in range(4)])

# %% [markdown]
# The balance loss, summed over the four layers, sits near $4 \times 0.01 = 0.04$: each
# layer's unweighted loss is close to its balanced value of 1. The z-loss starts at
# $4 \times 10^{-3} \times (\ln 8)^2 \approx 0.017$, its value for logits near zero
# ($\log \sum_i e^{0} = \ln 8$), and after the full mode's 60 steps it is already down to
# about a quarter of that: the routers learn to push their log-sum-exp towards 0 (more on
# this below).
#
# ## MoE against dense, at equal active parameters
#
# The full runs: `python bench/moe_runs.py` trained the dense model and the MoE model
# with three seeds each (the seed sets the initialization and the data order; both models
# see the same batches for a given seed), 800 steps of 8 sequences of 128 tokens, the
# recipe's optimizer and schedule, and two more MoE runs without the balancing loss and
# without the z-loss. Its results are in `data/moe_runs.json`, with the command and the
# time it took; the held-out loss is measured on 32 windows of the validation text,
# dropless. FLOPs per training token are chapter 08's `training_flops(config, 1)`: $6N$,
# with $N$ the active non-embedding parameters (the router and two experts per layer) plus
# the tied output head, and attention's $12\, L\, T\, d_{\text{attn}}$.

# %%
cache = json.loads(data.path("moe_runs.json").read_text())
runs = cache["runs"]
print(f"cache: `{cache['command']}`, {cache['seconds'] / 60:.0f} minutes with {cache['workers']} processes of one thread, "
      f"torch {cache['torch']}; {cache['steps']} steps of batch {cache['batch_size']}")
seeds = sorted(int(name.split("-s")[1]) for name in runs if name.startswith("dense-s"))
fig, axes = plt.subplots(1, 2, figsize=(12, 4), sharey=True)
for kind, color in (("dense", "tab:blue"), ("moe", "tab:orange")):
    for seed in seeds:
        run = runs[f"{kind}-s{seed}"]
        tokens_seen = torch.tensor(run["val_step"]) * cache["batch_size"] * run["config"]["context_length"]
        label = f"{'dense' if kind == 'dense' else 'MoE'} (seed {seed})"
        axes[0].plot(run["val_step"], run["val_loss"], color=color, alpha=0.4 + 0.2 * seed, label=label)
        axes[1].plot(tokens_seen * run["flops_per_token"] / 1e12, run["val_loss"], color=color, alpha=0.4 + 0.2 * seed)
axes[0].set_xlabel("optimizer step")
axes[1].set_xlabel("training compute (TFLOPs: chapter 08's training_flops, active parameters)")
axes[0].set_ylabel("held-out loss (nats per token)")
axes[0].set_ylim(top=min(7.6, max(max(r["val_loss"]) for r in runs.values())))
axes[0].legend(fontsize=8)
fig.suptitle("MoE (8 experts of width 176, top-2) against dense (width 352): equal active parameters")
plt.show()

final = {kind: torch.tensor([runs[f"{kind}-s{s}"]["val_loss"][-1] for s in seeds]) for kind in ("dense", "moe")}
for kind, values in final.items():
    print(f"{kind:>5}: final held-out loss {values.mean():.4f} ± {values.std():.4f} (seeds: "
          f"{', '.join(f'{v:.4f}' for v in values.tolist())})")
paired = final["moe"] - final["dense"]
print(f"MoE - dense, seed by seed: {', '.join(f'{v:+.4f}' for v in paired.tolist())}; mean {paired.mean():+.4f}, "
      f"spread between seeds of one model up to {max(v.max() - v.min() for v in final.values()):.4f}")
flops = {kind: runs[f"{kind}-s0"]["flops_per_token"] for kind in ("dense", "moe")}
print(f"training FLOPs per token: dense {flops['dense']:,}, MoE {flops['moe']:,} "
      f"(+{flops['moe'] / flops['dense'] - 1:.1%})")

# %% [markdown]
# At equal active parameters the mixture did not beat the dense model in this budget.
# The final held-out losses are 4.097 ± 0.042 for dense and 4.137 ± 0.062 for the MoE
# (mean ± standard deviation over three seeds). Seed by seed, MoE − dense is +0.012,
# +0.138 and −0.030: a mean of +0.040, no larger than the spread between two seeds of the
# same model (up to 0.117). Against FLOPs the picture is the same, because both models do
# the same arithmetic per token (the routers add 0.3%). The mixture held 2.5 times the
# parameters and did not turn them into a measurable gain in 800 steps. One reason is
# plain arithmetic: with 8 experts and 2 per token, each expert trains on a quarter of
# the tokens the dense FFN trains on, so in a short run each one sees little data. The
# gains in the literature come from larger models and longer runs (Switch's grow with the
# number of experts and the steps). Other small-scale attempts found the same; we did not
# tune the mixture until it won.
#
# ## Expert utilization over training
#
# The routing log of each run keeps, every 20 steps, the share of the assignments that each
# expert of each layer received. With the balancing loss (top row) and without it (bottom
# row), as a fraction of the uniform share $1/8$:

# %%
def shares(run, layer):
    """(experts, log points): the share of each expert in MoE layer `layer`, over training."""
    return torch.tensor([run["log"][f"moe{layer}/share{e}"] for e in range(8)])


pair = (("moe-s0", "with the balancing loss"), ("moe-nobalance", "without it"))
fig, axes = plt.subplots(2, 4, figsize=(14, 5.5), sharex=True, sharey=True, layout="constrained")
for row, (name, title) in enumerate(pair):
    run = runs[name]
    for layer in range(4):
        ax = axes[row, layer]
        image = ax.imshow(8 * shares(run, layer), aspect="auto", cmap="magma", vmin=0, vmax=3,
                          extent=(0, run["log_step"][-1], 7.5, -0.5))
        ax.set_title(f"layer {layer + 1}, {title}", fontsize=9)
        if layer == 0:
            ax.set_ylabel("expert")
        if row == 1:
            ax.set_xlabel("step")
fig.colorbar(image, ax=axes, shrink=0.8, label="share of assignments ÷ uniform share (1 = balanced)")
fig.suptitle("Which experts the router uses, over training")
plt.show()
for name, title in pair:
    run = runs[name]
    busiest = [8 * shares(run, layer)[:, len(run["log_step"]) // 2:].max().item() for layer in range(4)]
    entropy = [run["log"][f"moe{layer}/entropy"][-1] for layer in range(4)]
    print(f"{title:>24}: busiest expert over the second half of training, ÷ uniform, per layer "
          f"{[round(b, 2) for b in busiest]}; router entropy at the end {[round(v, 2) for v in entropy]} nats "
          f"(uniform: ln 8 = {math.log(8):.2f})")

# %% [markdown]
# With the balancing loss every layer stays near balance. Over the second half of
# training the busiest expert's share is 1.21 to 1.37 times the uniform share, so the
# layers sit at about 1.3× (layer 1 slightly above). At the end each layer's unweighted
# balance loss is 1.00, its balanced value. The routers still grow more certain: their
# entropy falls from ln 8 = 2.08 to 1.68–1.88 nats. Each token's choice sharpens while the
# load stays shared: balanced use and confident routing are different things, and the loss
# asks only for the first.
#
# Without the balancing loss, layers 2 to 4 **collapse within this budget**. In each, one
# expert is in nearly every token's top two: it gets 3.8–4.0 times the uniform share,
# that is half of all assignments, the most top-2 routing allows. The second choices go
# to two or three others, and four experts of each of these layers end with no tokens at
# all (the bright and black bands of the bottom row). The entropy falls to 0.67–0.95
# nats. Layer 1 is lopsided (1.67×), with two experts unused, but not collapsed onto one.
# The collapsed run ends at a held-out loss of 4.305, worse than every balanced seed
# (4.089–4.206) and every dense seed. Half its experts are dead weight, and its busy
# experts overflow their capacity: at a capacity factor of 1.25 they drop 38–51% of the
# assignments (next section), and those tokens skip the FFN.
#
# ### Exercise 6 · Reading a utilization table (written)
#
# A colleague trains a 16-expert, top-1 model and sends you this table, measured every
# 1,000 steps on the same held-out batch: for one layer, the share of tokens of its three
# busiest experts, the router's mean entropy (nats) and the fraction of tokens dropped at
# capacity factor 1.25. The language-model loss is still going down.
#
# | step | top-1 expert | top-2 | top-3 | entropy | dropped |
# | ---: | ---: | ---: | ---: | ---: | ---: |
# | 1,000 | 0.08 | 0.07 | 0.07 | 2.70 | 0.03 |
# | 2,000 | 0.19 | 0.12 | 0.08 | 2.10 | 0.17 |
# | 3,000 | 0.41 | 0.22 | 0.07 | 1.20 | 0.49 |
# | 4,000 | 0.58 | 0.25 | 0.05 | 0.60 | 0.69 |
#
# Is this layer collapsing? Say what in the table shows it (compare with a balanced
# layer's values), why the loss can still be going down, and name two changes you would
# make, with the reason for each.
#
# Difficulty ●●○ · Importance ●●● · about 10 minutes

# %% [markdown]
# #| written reading_a_utilization_table points=3
# ### BEGIN SOLUTION
# *Model answer.* Yes. With 16 experts a balanced layer gives each expert 1/16 = 0.0625
# of the tokens and a router entropy near ln 16 = 2.77 nats; at step 1,000 the layer is
# close to that. By step 4,000 two experts take 83% of the tokens (the busiest 0.58, over 9
# times its share), the third is below its share, so the other 13 share 12%; the entropy
# has fallen to 0.6 nats, the router is nearly certain. The drop rate follows: at
# capacity factor 1.25 an expert has slots for 1.25/16 = 7.8% of the tokens, so the two
# busiest alone drop at least (0.58 − 0.078) + (0.25 − 0.078) = 0.67 of the tokens; the
# table's 0.69 is that and a little overflow elsewhere. With top-1, 69% of the tokens skip
# the FFN entirely (they pass along the residual). This is the rich-get-richer loop: the favoured expert trains on more
# tokens, gets better, and is chosen more. The loss still falls because the model still
# learns (attention, the used experts, the residual path), but it is wasting most of its
# expert parameters and most of its FFN compute, so it learns slower than it should.
# Changes: (1) turn on, or raise, the load-balancing loss (α = 0.01 in Switch; check it is
# really added to the loss, and logged per layer), which pushes the router's probabilities
# of busy experts down; (2) add router jitter or a z-loss / lower the router's learning rate,
# which slow the logits' growth that makes the router certain early; (3) raise the capacity
# factor while fixing the router, or run dropless, so that a busy expert does not also
# starve most tokens (this treats the symptom, the drops, not the imbalance); (4) restart
# from an earlier checkpoint (step 1,000) with the fix, since a collapsed router recovers
# slowly.
#
# *Grading:* 1 point for the diagnosis with evidence from the table (shares far above
# 1/16, entropy far below ln 16, drops rising with the imbalance); 1 point for why the loss
# can still fall (the model learns with fewer experts; the waste is relative); 1 point for
# two sensible changes with reasons (balancing loss, jitter or z-loss, capacity or
# dropless, restart). No point for "add more experts": that makes the imbalance worse.
# ### END SOLUTION

# %% [markdown]
# ## Token dropping and capacity
#
# During training the layers ran at capacity factor 1.25. After training, the same
# held-out windows (batches of 8 sequences, as in training) were routed by each trained
# router at three capacity factors:

# %%
print(f"{'run':>15} {'capacity factor':>16}  drop rate per layer (fraction of assignments dropped)")
for name in ("moe-s0", "moe-nobalance"):
    for factor, rates in runs[name]["drop_rate_eval"].items():
        print(f"{name:>15} {float(factor):16.2f}  {[f'{r:.1%}' for r in rates]}")
trained = runs["moe-s0"]["log"]
print("drop rate while training (capacity factor 1.25), mean over the last 100 steps, per layer:",
      [f"{sum(trained[f'moe{i}/dropped'][-5:]) / 5:.1%}" for i in range(4)])

# %% [markdown]
# With balanced routers, a capacity factor of 1.0 drops 6–7% of the assignments, 1.25 (the
# training setting) 0.3–2.2%, and 2.0 none. During training, the drop rate at 1.25 over
# the last 100 steps was under 1% in every layer. The collapsed run drops 25–60% at 1.0,
# and still 20–27% in its collapsed layers at 2.0. Capacity cannot fix an imbalance; it
# only decides how much of it costs tokens. The evaluations of this chapter are dropless
# (`eval_capacity_factor=None`).
#
# ## Router logits with and without the z-loss

# %%
fig, axes = plt.subplots(1, 2, figsize=(12, 3.8), layout="constrained")
for name, style in (("moe-s0", "-"), ("moe-noz", "--")):
    run = runs[name]
    for layer in range(4):
        label = f"layer {layer + 1}, {'with' if name == 'moe-s0' else 'without'} z-loss"
        axes[0].plot(run["log_step"], [math.sqrt(z) for z in run["log"][f"moe{layer}/z"]], style, color=f"C{layer}",
                     label=label)
        axes[1].plot(run["log_step"], run["log"][f"moe{layer}/logit_rms"], style, color=f"C{layer}")
axes[0].set_ylabel("RMS of logsumexp(router logits)\n(the square root of the z-loss)")
axes[1].set_ylabel("RMS of the router logits")
for ax in axes:
    ax.set_xlabel("step")
axes[0].legend(fontsize=7, ncol=2)
fig.suptitle("What the z-loss controls: the log-sum-exp, not the spread of the logits")
plt.show()
for name in ("moe-s0", "moe-noz"):
    log = runs[name]["log"]
    print(f"{name:>8}: at the end, RMS logsumexp per layer {[round(math.sqrt(log[f'moe{i}/z'][-1]), 2) for i in range(4)]}, "
          f"RMS logit {[round(log[f'moe{i}/logit_rms'][-1], 2) for i in range(4)]}, "
          f"router entropy {[round(log[f'moe{i}/entropy'][-1], 2) for i in range(4)]}; "
          f"final held-out loss {runs[name]['val_loss'][-1]:.4f}")

# %% [markdown]
# The measurement is not what "logit size" suggests. The z-loss penalizes the
# log-sum-exp, and that is what it holds down: without it the root-mean-square log-sum-exp
# ends near 3 (2.74–3.18 across layers), with it at 0.43–0.97. But the logits themselves are
# *more* spread with the z-loss (RMS 2.0–2.3, against 1.05–1.43 without). A router
# without a bias can lower the log-sum-exp only by pushing every logit down, along a
# direction that all its normalized inputs share. Its logits then look like
# log-probabilities: the winner near 0, the others negative. At this size nothing is
# unstable either way: float32 throughout, logits of a few units. ST-MoE's motive was
# bfloat16 at scale, where large logits lose precision. The held-out loss without the
# z-loss, 4.136, lies inside the spread of the seeds with it (4.089–4.206).
#
# ## What the experts learned
#
# The cache also holds, for the trained seed-0 MoE model, which tokens each expert takes as
# its *first* choice on 128 held-out windows (16,384 tokens): for every token seen at least
# 20 times, the fraction of its occurrences routed to each expert. Each row lists the
# tokens an expert takes most reliably (`␣` is a space, `↵` a newline), with that fraction.

# %%
def shown(token):
    return token.replace(" ", "␣").replace("\n", "↵")


table = runs["moe-s0"]["experts"]
for layer in (0, len(table["layers"]) - 1):
    print(f"layer {layer + 1}:")
    for e, expert in enumerate(table["layers"][layer]):
        best = ", ".join(f"{shown(t)} {f:.0%}" for t, f, _ in expert["tokens"][:6])
        print(f"  expert {e} ({expert['share']:.0%} of tokens): {best}")

# %% [markdown]
# The experts specialize by *kind of token*. In the first layer the routing is almost a
# function of the token itself: of the 48 tokens listed, 46 send 100% of their occurrences
# to the expert they are listed under (`␣so` sends 86%, and `␣her`, last in the list of
# expert 1, only 2%). One expert takes the punctuation (`, : . ; ? !`); one the newline and
# the capitals that begin lines and speakers' names; one word endings (`s`, `ed`,
# `ing`); one short function words (`to`, `of`, `is`, `in`, `for`); one pronouns and objects
# (`me`, `it`, `thee`, `him`); one the uppercase pieces of the speakers' names (`IO`,
# `AN`, `UCH`). The last layer keeps punctuation together and groups determiners
# (`the`, `a`, `my`, `thy`), prepositions and auxiliaries (`of`, `in`, `be`, `have`), and
# subjects with modal verbs (`I`, `will`, `shall`). The first layer's router sees mostly
# the token's own embedding, so routing by identity is what it can do. An "expert" here
# is a specialist in a slice of the vocabulary, not in a topic. ST-MoE reports the same
# of its encoder's experts: punctuation, proper nouns, verbs.

# %% [markdown]
# ## Memory and scale, on paper
#
# At this size a mixture is a curiosity. At scale it is how the largest open models are
# built. Their published counts, total against active per token (bfloat16 weights take 2
# bytes a parameter):
#
# | model | experts | per token | parameters | active | weights in bf16 |
# | --- | --- | --- | ---: | ---: | ---: |
# | Switch-Base, 128 experts (Fedus et al., 2021) | 128 per MoE layer | 1 | 7 B | about 0.2 B (T5-Base's compute) | 14 GB |
# | Mixtral 8×7B (Jiang et al., 2024) | 8 per layer | 2 | 47 B | 13 B | 94 GB |
# | DeepSeek-V2 (DeepSeek-AI, 2024) | 160 routed + 2 shared | 6 routed + 2 shared | 236 B | 21 B | 472 GB |
# | DeepSeek-V3 (DeepSeek-AI, 2024) | 256 routed + 1 shared | 8 routed + 1 shared | 671 B | 37 B | 1.34 TB |
#
# The name "8×7B" is loose: the experts replace only the FFNs, and attention and the
# embeddings are shared, so the model holds 47 B parameters, not 56 B, and a token uses
# 13 B, not 14 B. DeepSeek's *shared* experts see every token, and many small routed
# experts (fine-grained, as in our experiments) take the rest.
#
# No single accelerator holds 1.34 TB. **Expert parallelism** spreads the experts over
# devices: each device holds the attention layers (or a shard of them) and some of the
# experts. In each MoE layer the devices route their tokens, then an **all-to-all**
# exchange sends every token to the device of its expert, the experts run, and a second
# all-to-all brings the outputs back: two all-to-alls per MoE layer, forward and backward,
# whose cost grows with the number of tokens and devices, and which is the reason capacity
# factors exist (a device must know how many tokens it will receive). The engines that do
# it: **DeepSpeed-MoE** (Rajbhandari et al., 2022), **Megatron-LM**'s MoE layers
# (Megatron-Core), and **MegaBlocks** (Gale et al., 2023), which computes the experts as
# block-sparse matrix products, so that no token is dropped and no slot is padding.
#
# ## Tee check
#
# > **The shirt:** "MoE: Sparse expert routings": "only a subset of the network's
# > parameters ... are activated for any given token, allowing models to scale to
# > trillions of parameters while keeping inference costs low".
#
# **What is right:** the arithmetic per token follows the *active* parameters. Counted by
# PyTorch's FLOP counter on one batch, the MoE model's forward pass costs what the dense
# model's costs, with 2.5 times the parameters:

# %%
from torch.utils.flop_counter import FlopCounterMode

batch = torch.randint(0, dense_config.vocab_size, (8, dense_config.context_length))
measured = {}
for name, config in (("dense", dense_config), ("MoE", moe_config)):
    model = GPT(config).eval()
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(batch)
    measured[name] = (counter.get_total_flops(), count_parameters(config))
    print(f"{name:>5}: {counter.get_total_flops() / batch.numel() / 1e6:.2f} MFLOPs per token (forward), "
          f"{measured[name][1]:,d} parameters, {4 * measured[name][1] / 2**20:.1f} MiB of float32 weights")
print(f"MoE / dense: FLOPs {measured['MoE'][0] / measured['dense'][0]:.3f}, parameters "
      f"{measured['MoE'][1] / measured['dense'][1]:.2f}")

# %% [markdown]
# **What is loose: memory and bandwidth.** Every expert must be in memory, so the model's
# memory follows the *total*: 94 GB of weights for Mixtral, a model that computes like a
# 13 B one. And generating text is limited by bandwidth, not arithmetic: each decoding
# step reads every weight it uses from memory. With one sequence, a step reads only the
# chosen experts. But a server decodes a batch of sequences at once, and each picks its own
# experts: with $B$ tokens choosing $k$ of $N$ experts, about
# $N\left(1 - (1 - k/N)^B\right)$ distinct experts are touched per layer (if the choices
# were independent and uniform), so the bytes read per step approach the total quickly:

# %%
for n_experts, top_k, label in ((8, 2, "our MoE / Mixtral: 8 experts, top-2"), (256, 8, "DeepSeek-V3: 256 routed, top-8")):
    touched = {b: n_experts * (1 - (1 - top_k / n_experts) ** b) for b in (1, 4, 16, 64, 256)}
    print(f"{label:>38}: experts read per layer per step, at a batch of "
          + ", ".join(f"{b}: {t:.1f}" for b, t in touched.items()) + f" (of {n_experts})")

# %% [markdown]
# At a batch of 16 a layer of 8 experts with top-2 (ours, Mixtral's) reads 7.9 of its 8
# experts each step: for our model, 2.5 times the weight bytes of the dense model of equal
# active size, for the same arithmetic. DeepSeek-V3's 256
# experts need a batch of a few hundred tokens per layer before every expert is read, which
# is part of why it is served with expert parallelism over many devices.
#
# And the wall clock on a CPU, at our size. `python bench/moe.py` times training steps
# (one thread, batch 8 × 128, 7 interleaved rounds of 3 steps) of the three models side by
# side. Two runs of it on 2026-12-03, on a 2-core machine busy with other work, gave the
# MoE with sorted dispatch 0.71 and 0.90 of the dense model's tokens per second (the
# median over the rounds), the masked per-expert loop 0.65 and 1.00, and the dense model
# timed against a copy of itself, the noise floor, 0.94 and 1.07, with single rounds from
# 0.46 to 2.11. On that machine the noise was larger than the difference. The training
# runs of the cache, 800 steps each, average over far longer:

# %%
speed = {kind: [runs[f"{kind}-s{s}"]["tokens_per_second"] for s in seeds] for kind in ("dense", "moe")}
for kind, values in speed.items():
    print(f"{kind:>5}: {', '.join(f'{v:,d}' for v in values)} tokens/s over its 800 training steps (seeds {seeds})")
print(f"MoE / dense, mean tokens per second: {sum(speed['moe']) / sum(speed['dense']):.2f}")

# %% [markdown]
# Over 800 steps each, the mixture trained at about two thirds of the dense model's speed
# per token (the runs shared the machine with one another, so the absolute rates are
# low). A mixture of equal active size does the same arithmetic and more of everything
# else: routing, sorting, a gather and a scatter of every token, eight small matrix
# products where the dense model has one large one (small products use a CPU's arithmetic
# less well), and 2.5 times the weights and optimizer state to stream through memory at
# every step. Whether the sorted dispatch beats the masked loop at 8 experts the two
# bench runs above cannot tell.
#
# **Verdict:** "keeping inference costs low" holds for FLOPs per token. It does not hold
# for memory (the total), nor for the bandwidth of batched decoding, and at small sizes
# not for wall-clock time either. A mixture trades memory for arithmetic: worth it when
# memory is plentiful and compute is the limit, as in large-scale training.
#
# ## What `minillm` gained
#
# `minillm.moe`, registered as the FFN "moe":
#
# - `top_k_routing` (Exercise 1), `load_balancing_loss` (Exercise 2), `router_z_loss`
#   (Exercise 3);
# - `expert_capacity`, `dispatch_plan` (Exercise 4), `combine` (Exercise 5),
#   `dispatch_and_combine` and the per-expert-loop `dispatch_and_combine_masked` with
#   `capacity_mask`;
# - `MoEFeedForward(d_model, d_ff, n_experts=8, top_k=2, capacity_factor=1.25,
#   eval_capacity_factor=None, expert="swiglu", expert_options=None,
#   normalize_weights=True, jitter=0.0, balance_coef=0.01, z_coef=1e-3,
#   dispatch="sorted", bias=False, dropout=0.0)`, built by
#   `GPTConfig(ffn="moe", ffn_options={...})`: its `aux_loss` reaches the model's loss, its
#   parts are logged apart, `last_stats` keeps the routing, and
#   `count_parameters(config, active=True)` counts what a token uses;
# - `routing_metrics(model)`, the routing of every layer for a training log.
#
# Chapter 12 adapts a trained model with low-rank updates instead of growing it.
#
# ## Further reading
#
# - Jacobs, Jordan, Nowlan & Hinton, *Adaptive Mixtures of Local Experts* (1991): the idea.
# - Shazeer et al., *Outrageously Large Neural Networks: The Sparsely-Gated Mixture-of-Experts Layer* (2017): top-k gating in an LSTM, noise, a balancing loss.
# - Lepikhin et al., *GShard* (2020): top-2 routing, capacity, expert parallelism with all-to-all.
# - Fedus, Zoph & Shazeer, *Switch Transformers* (2021): top-1, the load-balancing loss used here, selective precision.
# - Zoph et al., *ST-MoE: Designing Stable and Transferable Sparse Expert Models* (2022): the router z-loss.
# - Rajbhandari et al., *DeepSpeed-MoE* (2022); Gale et al., *MegaBlocks: Efficient Sparse Training with Mixture-of-Experts* (2023).
# - Dai et al., *DeepSeekMoE* (2024): fine-grained and shared experts; Jiang et al., *Mixtral of Experts* (2024).
# - DeepSeek-AI, *DeepSeek-V2* (2024) and *DeepSeek-V3 Technical Report* (2024): the counts above; V3 balances mostly without an auxiliary loss, by a bias on the router's choice.
