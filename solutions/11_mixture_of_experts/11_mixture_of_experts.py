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
# **Time:** about 35 minutes of reading, 40 minutes of exercises (four coded, one written).
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

from minillm import course, data
from minillm.ffn import SwiGLU

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
# Difficulty ●○○ · Importance ●●● · about 10 minutes
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
                        mistakes={"the two smallest, not the largest (topk(largest=False)?)": [[3, 1], [0, 2], [0, 1]]})
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
    course.expect_equal(tuple(weights.shape), (tokens, k), f"weights shape ({tokens}, {n_experts}), k={k}")
    assert weights.dtype == dtype, f"the weights must keep the logits' dtype {dtype}"
    assert experts.dtype == torch.int64, "experts must be int64"
    course.expect_equal(experts.tolist(), ref_experts.tolist(), f"experts ({tokens}, {n_experts}), k={k}")
    course.expect_close(weights, ref_weights / ref_weights.sum(-1, keepdim=True), f"weights ({tokens}, {n_experts}), k={k}")
    course.expect_close(weights.sum(-1), torch.ones(tokens, dtype=dtype), f"renormalized weights sum to 1, k={k}")
    raw, _ = top_k_routing(logits, k, normalize=False)
    course.expect_close(raw, ref_weights, f"unnormalized weights ({tokens}, {n_experts}), k={k}")
# large logits: no overflow
logits = torch.tensor([[1000.0, 999.0, -1000.0], [-500.0, -480.0, -490.0]])
weights, experts = top_k_routing(logits, 2)
assert torch.isfinite(weights).all(), "top_k_routing gave NaN or inf for logits near 1000: is the softmax stable?"
course.expect_close(weights, torch.softmax(logits, -1).topk(2, -1).values / torch.softmax(logits, -1).topk(2, -1).values.sum(-1, keepdim=True),
                    "weights for logits of +-1000")
# the gradient reaches the logits through the renormalized weights
logits = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
weights, _ = top_k_routing(logits, 2)
(weights[:, 0] * torch.arange(6.0, dtype=torch.float64)).sum().backward()
assert logits.grad is not None and logits.grad.abs().sum() > 0, "no gradient reaches the logits through the weights"
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
    probs' dtype, 1 at perfect balance (f_i = P_i = 1/N), up to N when every token goes to
    one expert with certainty. ``ValueError`` naming ``experts`` for an index outside
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
    leaf = probs.clone().requires_grad_(True)
    load_balancing_loss(leaf, experts, 4).backward()
    if leaf.grad is None or leaf.grad.abs().sum() == 0:
        raise course.CheckFailed("no gradient reaches probs: P must be computed from probs with tensor operations "
                                 "(no .item(), .tolist() or torch.tensor(...) around it)")
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
    assert got.dtype == dtype, f"the loss must keep probs' dtype {dtype}"
    course.expect_close(got, expected, f"load_balancing_loss ({tokens}, {n_experts}), k={k}")
    leaf = probs.clone().requires_grad_(True)
    load_balancing_loss(leaf, experts, n_experts).backward()
    course.expect_close(leaf.grad, (n_experts * one_hot.mean(0) / k / tokens).expand(tokens, n_experts),
                        f"gradient of the loss with respect to probs ({tokens}, {n_experts})")
# perfect balance gives 1 for any number of experts and any k; collapse onto one expert gives N
for n_experts, k in [(2, 1), (8, 2), (6, 3)]:
    tokens = n_experts * 5
    uniform = torch.full((tokens, n_experts), 1.0 / n_experts, dtype=torch.float64)
    balanced = torch.stack([torch.arange(i, i + k) % n_experts for i in range(tokens)])
    course.expect_close(load_balancing_loss(uniform, balanced, n_experts), torch.tensor(1.0, dtype=torch.float64),
                        f"balanced loss, N={n_experts}, k={k}")
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
# The loss runs from 1 (balanced) to $N$ (every token to one expert with certainty). A
# router at initialization is close to uniform, so it starts near 1: the loss does not
# *make* the router balanced, it keeps it from drifting away.

# %%
n = 8
for name, logits in [("random router", torch.randn(512, n) * 0.1), ("a favourite expert", torch.randn(512, n) + 3 * F.one_hot(torch.zeros(512, dtype=torch.long), n)),
                     ("collapsed", 20 * F.one_hot(torch.zeros(512, dtype=torch.long), n).float())]:
    probs = torch.softmax(logits, -1)
    _, chosen = routing(logits, 2)
    print(f"{name:>20}: balance loss {balance_loss(probs, chosen, n).item():.3f} (1 = balanced, {n} = collapsed)")

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
    assert got.dtype == dtype, f"the z-loss must keep the logits' dtype {dtype}"
    course.expect_close(got, torch.logsumexp(logits, -1).square().mean(), f"router_z_loss ({tokens}, {n_experts}) {dtype}")
    leaf = logits.clone().requires_grad_(True)
    router_z_loss(leaf).backward()
    lse = torch.logsumexp(logits, -1, keepdim=True)
    course.expect_close(leaf.grad, 2 * lse * torch.softmax(logits, -1) / tokens, f"gradient of the z-loss ({tokens}, {n_experts})")
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
# No loop over tokens (a loop over the experts is allowed, but not needed).
#
# Difficulty ●●● · Importance ●●● · about 20 minutes
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
        course.expect_equal(counts.tolist(), exp_counts, f"counts, capacity={capacity}",
                            mistakes={"capacity is ignored": [4, 3, 1]})
        token_major = [t for e in range(3) for t in range(4) for j in range(2) if int(experts[t, j]) == e]
        course.expect_equal(rows.tolist(), exp_rows, f"rows, capacity={capacity}",
                            mistakes={"the queue is token-major (experts.reshape(-1)), not choice-major "
                                      "(experts.T.reshape(-1)): a token's second choice came before other tokens' "
                                      "first choices": token_major,
                                      "rows are assignment indices, not tokens (take a % T)": [
                                          j * 4 + t for e in range(3) for j in range(2) for t in range(4)
                                          if int(experts[t, j]) == e][: len(exp_rows)]},
                            hint="with capacity 2, expert 0 keeps tokens 0 and 1 (first choices), not token 3's "
                                 "second choice" if capacity else None)
        course.expect_equal(slots.tolist(), exp_slots, f"slots, capacity={capacity}")


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
    for name, value in (("rows", rows), ("slots", slots), ("counts", counts)):
        assert isinstance(value, torch.Tensor) and value.dtype == torch.int64, f"{name} must be an int64 tensor"
    course.expect_equal(counts.tolist(), exp_counts, f"counts, {tokens} tokens, {n} experts, k={k}, capacity={capacity}")
    course.expect_equal(rows.tolist(), exp_rows, f"rows, {tokens} tokens, {n} experts, k={k}, capacity={capacity}")
    course.expect_equal(slots.tolist(), exp_slots, f"slots, {tokens} tokens, {n} experts, k={k}, capacity={capacity}")
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
# `weights` is the router's `(tokens, k)`. No loop over tokens.
#
# Difficulty ●●○ · Importance ●●● · about 10 minutes
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
    assert isinstance(got, torch.Tensor) and got.dtype == dtype, f"combine must return outputs' dtype {dtype}"
    course.expect_close(got, expected, f"combine, {tokens} tokens, k={k}, {kept} kept", atol=1e-5 if dtype == torch.float32 else 1e-12)
# the gradient reaches the outputs and the weights (the router)
outputs = torch.randn(6, 3, dtype=torch.float64, requires_grad=True)
weights = torch.rand(4, 2, dtype=torch.float64, requires_grad=True)
combine(outputs, torch.tensor([0, 1, 2, 3, 0, 1]), torch.tensor([0, 0, 0, 0, 1, 1]), weights, 4).square().sum().backward()
assert outputs.grad is not None and weights.grad is not None and weights.grad.abs().sum() > 0, "no gradient reaches the weights"
assert torch.equal(weights.grad[2:, 1], torch.zeros(2, dtype=torch.float64)), "weights of choices that were not kept get no gradient"
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
        router_input = tokens.to(torch.promote_types(tokens.dtype, torch.float32))  # round-off must not pick the expert
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
    """The last forward's routing in every ``MoEFeedForward`` of ``model``, as floats for a log.

    Keys ``moe{i}/`` (i counts the MoE layers in order) + "dropped", "entropy", "logit_rms",
    "balance", "z", and "share{e}" (the fraction of assignments that went to expert e,
    before dropping). Empty when the model has no MoE layer.
    """
    metrics: dict[str, float] = {}
    layers = [m for m in model.modules() if isinstance(m, MoEFeedForward) and m.last_stats]
    for i, layer in enumerate(layers):
        stats = layer.last_stats
        for name in ("dropped", "entropy", "logit_rms", "balance", "z"):
            metrics[f"moe{i}/{name}"] = float(stats[name])
        share = stats["assigned"].float() / stats["assigned"].sum()
        metrics.update({f"moe{i}/share{e}": value for e, value in enumerate(share.tolist())})
    return metrics
