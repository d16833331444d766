# %% [markdown]
# # Chapter 13 · DPO: direct preference optimization
#
# **Where this sits on the tee:** the Tech Band's *DPO: Direct preference tune*, which
# "bypasses the complex Reinforcement Learning loop (RLHF) by directly optimizing the
# language model on human preference data". It is the second post-training chapter and
# the last of the course. Chapter 12 taught chapter 07's shipped model a new dialect
# from examples. Here the same model learns from *comparisons*: two continuations of one
# prompt, one preferred. We measure how far its behaviour moves, and what the move costs.
#
# **You will be able to**
# - derive the DPO loss from the KL-regularized reward objective of RLHF, and say where
#   the reward went;
# - compute the log-probability of a response under a model, with the prompt and the
#   padding masked out;
# - write the DPO loss so that it stays finite for any margin, and check it against its
#   value at the start, $\ln 2$;
# - read the implicit reward $\beta \log \frac{\pi_\theta}{\pi_\text{ref}}$ and estimate the
#   KL divergence to the reference from samples;
# - train a policy against a frozen reference with the package's training loop, and
#   read a frontier of the preferred attribute against its KL cost, beside supervised
#   fine-tuning on the preferred answers.
#
# **Prerequisites:** chapter 07 (the GPT, `train` with its `loss_fn=`, `generate`, the
# shipped model and its tokenizer) and chapter 12 (fine-tuning the shipped model, and
# measuring what it forgot).
#
# **Time:** about 35 minutes of reading, 40 minutes of exercises (four coded, one written).
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
import json
import math
import time

import matplotlib.pyplot as plt
import torch
from tqdm.auto import tqdm

import course_runtime as course
from minillm import data

device = course.setup(seed=0)  # this chapter runs on the CPU whatever `device` says: its model is small
torch.set_num_threads(1)  # the model is small: one thread is as fast, and robust on a busy machine
QUICK = course.QUICK

# %% [markdown]
# Everything this chapter builds goes into the module `minillm/dpo.py`. Its first cell
# holds the module's docstring and imports.

# %%
#| export minillm/dpo.py
"""Direct preference optimization (DPO) of ``minillm``'s models, and the chapter's preference data (chapter 13).

- ``response_logprobs(logits, ids, mask)`` and ``sequence_logprobs(model, ids, mask)``: the
  log-probability of each sequence's response, summed over its tokens (prompt and padding masked).
- ``dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta)``: the DPO
  loss, -log sigmoid(beta * margin) averaged over the pairs (Rafailov et al., 2023).
- ``implicit_reward(policy_logps, ref_logps, beta)``: beta log(pi / pi_ref), the reward a policy defines.
- ``kl_estimate(policy_logps, ref_logps)``: KL(pi || pi_ref) in nats per sequence, from
  responses sampled from the policy, with its standard error.
- The preference data: ``prompt_windows``, ``sample_responses`` and ``preference_pairs``
  (``PreferencePairs``), pairs sampled from the reference model itself and ranked by a
  scorer, by default ``minillm.tasks.uses_target`` (the word "love" in any of its forms).
- Training with ``minillm.train.train(..., loss_fn=...)``: ``frozen_reference(model)``,
  ``PairBatches``, ``dpo_objective(reference, beta)`` and ``sft_objective`` (supervised
  fine-tuning on the chosen responses, the baseline).
- Measuring: ``evaluate_policy`` (attribute rate and KL from samples) and ``pair_metrics``
  (reward accuracy, margins and log-probabilities on pairs).
"""
import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from minillm.checks import eager_only, integer, positive_int, positive_number
from minillm.generate import generate
from minillm.precision import compute_dtype
from minillm.tasks import uses_target

# %% [markdown]
# ## From preferences to a loss
#
# A pretrained model continues text the way its training text continues. To make it
# *prefer* some continuations (helpful answers, a house style, no insults), people compare
# pairs: for a prompt $x$, a response $y_w$ is preferred to a response $y_l$ ("w" for
# win, "l" for lose). The classic recipe, RLHF (Christiano et al., 2017; Ouyang et al.,
# 2022), takes two stages.
#
# 1. **A reward model.** Fit a network $r(x, y)$ to the comparisons with the
#    Bradley–Terry model of preferences (1952): the chance that $y_w$ beats $y_l$ is
#    $\sigma\big(r(x, y_w) - r(x, y_l)\big)$, with $\sigma$ the logistic sigmoid.
# 2. **Reinforcement learning.** Sample responses from the policy $\pi_\theta$, score them
#    with $r$, and update the policy with PPO to maximize the reward, with a penalty that
#    keeps it near the starting model $\pi_\text{ref}$:
#
# $$\max_{\pi_\theta}\; \mathbb{E}_{x,\; y \sim \pi_\theta(\cdot \mid x)}\big[r(x, y)\big]
#   - \beta\, \mathrm{KL}\big(\pi_\theta(\cdot \mid x) \,\|\, \pi_\text{ref}(\cdot \mid x)\big).$$
#
# The penalty matters: without it, the policy finds whatever the reward model overrates
# and collapses onto it. $\beta$ sets the exchange rate between reward and drift.
#
# **The step DPO takes** (Rafailov et al., 2023). That objective has a closed-form
# optimum: for each prompt,
#
# $$\pi^*(y \mid x) = \frac{1}{Z(x)}\, \pi_\text{ref}(y \mid x)\, e^{r(x, y) / \beta},$$
#
# the reference reweighted by the exponentiated reward ($Z(x)$ normalizes). Read it
# backwards: any policy defines the reward it is optimal for,
#
# $$r(x, y) = \beta \log \frac{\pi(y \mid x)}{\pi_\text{ref}(y \mid x)} + \beta \log Z(x).$$
#
# Put that reward into Bradley–Terry. $Z(x)$ is the same for both responses of a pair, so
# it cancels, and what is left is a loss on the policy alone:
#
# $$\mathcal{L}_\text{DPO} = -\,\mathbb{E}_{(x, y_w, y_l)} \log \sigma\Big(
#   \beta \log \frac{\pi_\theta(y_w \mid x)}{\pi_\text{ref}(y_w \mid x)}
#   - \beta \log \frac{\pi_\theta(y_l \mid x)}{\pi_\text{ref}(y_l \mid x)} \Big).$$
#
# No reward network, no sampling during training, no PPO: four log-probabilities per
# pair and a logistic loss. The reward is still there, *implicit* in the policy:
# $\hat r_\theta(x, y) = \beta \log \frac{\pi_\theta(y \mid x)}{\pi_\text{ref}(y \mid x)}$.
# This chapter builds each piece and measures what it does to our model.
#
# ## The log-probability of a response
#
# Everything above needs $\log \pi(y \mid x)$, the log-probability a model gives a whole
# response $y$ after a prompt $x$. A language model scores one token at a time, so it is a
# sum over the response's tokens:
#
# $$\log \pi(y \mid x) = \sum_{t \in \text{response}} \log \pi(\text{token}_t \mid \text{token}_{<t}).$$
#
# We feed the prompt and the response as one sequence of ids. The model's logits at
# position $t - 1$ score the token at position $t$ (chapter 07). A boolean mask says which
# positions are the response's: the prompt's tokens are the condition, not part of $y$,
# and a batch of responses of different lengths is padded on the right, with the padding
# masked too. Position 0 can never be in the mask: no logits score the first token.
#
# ### Exercise 1 · Summing over the response
#
# Implement `response_logprobs(logits, ids, mask)`. `logits` has shape `(batch, seq,
# vocab)`, the model's output for `ids` `(batch, seq)`; `mask` is a bool tensor of ids'
# shape, True at the tokens to count. Return a `(batch,)` tensor in the logits' dtype:
#
# $$\text{out}_b = \sum_{t \ge 1,\ \text{mask}_{b,t}} \log \operatorname{softmax}(\text{logits}_{b,t-1})[\text{ids}_{b,t}].$$
#
# Use `torch.log_softmax`: the log of a softmax underflows to $-\infty$ for large logits.
# Raise a `ValueError` naming `logits` when its shape is not `(batch, seq, vocab)` of ids,
# naming `ids` when it is not a 2-D integer tensor, and naming `mask` when it is not a
# bool tensor of ids' shape or is True at position 0. (The package's
# `sequence_logprobs(model, ids, mask)` calls it on `model(ids)`'s logits.)
#
# Difficulty ●●○ · Importance ●●● · about 10 minutes
#
# <details><summary>Hint 1</summary>Drop the last position of the logits (it scores a token after the sequence) and the first of ids and mask: <code>logits[:, :-1]</code> scores <code>ids[:, 1:]</code>.</details>
# <details><summary>Hint 2</summary><code>torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)</code> is the log-probability of every next token, shape <code>(batch, seq - 1)</code>.</details>
# <details><summary>Hint 3</summary>Zero the positions outside the mask with <code>torch.where(mask[:, 1:], token_logps, 0.0)</code> (multiplying by the mask would turn a <code>-inf</code> into NaN), then sum over the last dimension.</details>

# %%
#| answer response_logprobs
#| export minillm/dpo.py
def response_logprobs(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The summed log-probability of the masked tokens of each sequence.

    logits: (batch, seq, vocab), a model's output for ids, position t scoring ids[:, t + 1].
    ids: (batch, seq) integer token ids (a prompt, its response, any padding on the right).
    mask: (batch, seq) bool, True at the tokens whose log-probabilities are summed (the
    response's); False at position 0, which no logits score.
    Returns (batch,) in the logits' dtype: sum over t >= 1 with mask[b, t] of
    log softmax(logits[b, t - 1])[ids[b, t]]. ``ValueError`` naming the argument for bad input.
    """
    ### BEGIN SOLUTION
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise ValueError(f"ids must be a (batch, seq) integer tensor, got {getattr(ids, 'shape', type(ids).__name__)}")
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or logits.shape[:2] != ids.shape:
        raise ValueError(f"logits must have shape (batch, seq, vocab) with (batch, seq) = {tuple(ids.shape)}, got "
                         f"{getattr(logits, 'shape', type(logits).__name__)}")
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.shape != ids.shape:
        raise ValueError(f"mask must be a bool tensor of ids' shape {tuple(ids.shape)}, got "
                         f"{getattr(mask, 'dtype', type(mask).__name__)} {tuple(getattr(mask, 'shape', ()))}")
    if eager_only() and bool(mask[:, 0].any()):
        raise ValueError("mask must be False at position 0: no logits score the first token")
    token_logps = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None].long()).squeeze(-1)
    return torch.where(mask[:, 1:], token_logps, torch.zeros((), dtype=token_logps.dtype)).sum(dim=-1)
    ### END SOLUTION

# %%
#| test response_logprobs_visible points=1
@course.visible_check("response_logprobs")
def check_response_logprobs(response_logprobs):
    """Two sequences of 6 tokens over a vocabulary of 5: a prompt of 2 tokens, a response of 3
    (the second row's last token is padding), with logits of a small ramp."""
    ids = torch.tensor([[0, 3, 1, 4, 2, 0], [2, 2, 0, 1, 3, 4]])
    mask = torch.tensor([[False, False, True, True, True, False], [False, False, True, True, False, False]])
    logits = torch.linspace(-2.0, 2.0, 60).reshape(2, 6, 5).sin() * 3
    before = (logits.clone(), ids.clone(), mask.clone())
    log_probs = torch.log_softmax(logits, dim=-1)

    def summed(keep, shift=1):  # the sum over kept positions t of log p(ids[t]) read at position t - shift
        return torch.stack([sum((log_probs[b, t - shift, ids[b, t]] for t in range(shift, 6) if keep[b, t]),
                                torch.tensor(0.0)) for b in range(2)])

    expected = summed(mask)
    got = response_logprobs(logits, ids, mask)
    if not all(torch.equal(a, b) for a, b in zip(before, (logits, ids, mask))):
        raise course.CheckFailed("response_logprobs changed one of its inputs in place: compute a new tensor instead")
    everything = torch.ones_like(mask)
    course.expect_close(got, expected, "response_logprobs on a (2, 6) batch, prompt of 2, response of 3 and 2", mistakes={
        "the logits at position t scored the token at t: position t - 1 predicts token t (shift by one)":
            summed(mask, shift=0),
        "the prompt and the padding were summed too: keep only the positions where mask is True": summed(everything),
        "the mean over the response, not the sum": expected / mask.sum(dim=1),
        "probabilities were summed, not log-probabilities": torch.stack([
            sum(log_probs[b, t - 1, ids[b, t]].exp() for t in range(1, 6) if mask[b, t]) for b in range(2)]),
        "the mask was read one position early (mask[:, :-1] with ids[:, 1:])": torch.stack([
            sum((log_probs[b, t - 1, ids[b, t]] for t in range(1, 6) if mask[b, t - 1]), torch.tensor(0.0))
            for b in range(2)]),
    }, hint="torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]), masked by mask[:, 1:], summed over t")
    padded = ids.clone()
    padded[1, 4:] = torch.tensor([0, 0])
    course.expect_close(response_logprobs(logits, padded, mask), expected,
                        "response_logprobs with other tokens in the padding (they are masked: nothing may change)")
    course.expect_raises(ValueError, response_logprobs, logits, ids, mask.int(), match="mask",
                         what="response_logprobs with an int mask", hint="check mask.dtype == torch.bool")
    first = mask.clone()
    first[0, 0] = True
    course.expect_raises(ValueError, response_logprobs, logits, ids, first, match="mask",
                         what="response_logprobs with mask True at position 0 (no logits score the first token)")
    course.expect_raises(ValueError, response_logprobs, logits[:, :5], ids, mask, match="logits",
                         what="response_logprobs with logits of 5 positions for ids of 6")


check_response_logprobs(response_logprobs)
print("response_logprobs: visible test passed")

# %%
#| test response_logprobs_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
for batch, seq, vocab, dtype in [(3, 9, 7, torch.float64), (1, 2, 4, torch.float32), (5, 16, 50, torch.float32),
                                 (2, 12, 11, torch.float64)]:
    logits = torch.randn(batch, seq, vocab, dtype=dtype) * 2
    ids = torch.randint(0, vocab, (batch, seq))
    mask = torch.rand(batch, seq) < 0.6
    mask[:, 0] = False
    summed = response_logprobs(logits, ids, mask)
    assert isinstance(summed, torch.Tensor) and summed.dtype == dtype, \
        "response_logprobs must return the logits' dtype"
    expected = -(torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
                 * mask[:, 1:]).sum(dim=1)
    course.expect_close(summed, expected, "response_logprobs", atol=1e-5)
    # the defining property: the tokens outside the mask (the prompt, the padding) are not counted
    changed = ids.clone()
    changed[~mask] = torch.randint(0, vocab, (int((~mask).sum()),))
    course.expect_close(response_logprobs(logits, changed, mask), expected,
                        "response_logprobs with other tokens outside the mask", atol=1e-5)
course.expect_close(response_logprobs(torch.randn(2, 1, 3), torch.zeros(2, 1, dtype=torch.long),
                                      torch.zeros(2, 1, dtype=torch.bool)), torch.zeros(2),
                    "response_logprobs of one-token sequences (nothing to score)")
# large logits: the log of a softmax underflows to -inf, log_softmax does not
logits = torch.randn(2, 6, 8) * 1e4
ids, mask = torch.randint(0, 8, (2, 6)), torch.tensor([[False] + [True] * 5] * 2)
course.expect_close(response_logprobs(logits, ids, mask),
                    torch.log_softmax(logits.double()[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1).sum(1).float(),
                    "response_logprobs with logits of size 1e4 (use torch.log_softmax)", rtol=1e-4)
ids, mask = torch.randint(0, 5, (2, 4)), torch.tensor([[False, True, True, True]] * 2)
for bad, what, args in [("mask", "response_logprobs with a bad mask", (torch.randn(2, 4, 5), ids, mask[:1])),
                        ("mask", "response_logprobs with a bad mask", (torch.randn(2, 4, 5), ids, mask.float())),
                        ("mask", "response_logprobs with a bad mask", (torch.randn(2, 4, 5), ids, torch.ones(2, 4, dtype=torch.bool))),
                        ("logits", "response_logprobs with a bad logits", (torch.randn(2, 4), ids, mask)),
                        ("logits", "response_logprobs with a bad logits", (torch.randn(3, 4, 5), ids, mask)),
                        ("ids", "response_logprobs with a bad ids", (torch.randn(2, 4, 5), ids.float(), mask)),
                        ("ids", "response_logprobs with a bad ids", (torch.randn(8, 5), ids.flatten(), mask))]:
    course.expect_raises(ValueError, response_logprobs, *args, match=bad, what=what)
### END HIDDEN TESTS

# %%
from minillm import dpo as reference_dpo

logprobs_of = course.keep_going("response_logprobs", response_logprobs, reference_dpo.response_logprobs,
                                check_response_logprobs)

# %% [markdown]
# The package wraps it around a model: `sequence_logprobs(model, ids, mask)` runs the
# model on the ids and sums the response's log-probabilities, keeping the graph, since
# training differentiates it. Padding on the right needs no attention mask: with causal
# attention no token ever sees a later one, so whatever the padding holds cannot change
# the response's scores.

# %%
#| export minillm/dpo.py
def sequence_logprobs(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log pi(response | prompt) for each sequence of ``ids`` under ``model``, summed over the response.

    model: ``model(ids)`` returns (logits (batch, seq, vocab), loss), as a minillm ``GPT``
    does; it runs in its current mode, with gradients unless the caller turns them off.
    ids: (batch, seq) token ids, each row a prompt followed by its response and any padding
    on the right. mask: (batch, seq) bool, True at the response's tokens (not at position 0).
    Returns (batch,) float: ``response_logprobs`` of the model's logits (the prompt and the
    padding are masked; with causal attention, padding on the right changes nothing).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        raise ValueError(f"ids must be a (batch, seq) tensor of token ids, got {getattr(ids, 'shape', type(ids).__name__)}")
    if not isinstance(mask, torch.Tensor) or mask.shape != ids.shape:
        raise ValueError(f"mask must have the shape of ids, {tuple(ids.shape)}, got "
                         f"{tuple(getattr(mask, 'shape', ())) or type(mask).__name__}")
    logits, _ = model(ids)
    return response_logprobs(logits.to(compute_dtype(logits.dtype)), ids, mask)  # float64 stays float64

# %% [markdown]
# On the shipped model: a prompt and two continuations of it, one as Shakespeare wrote it
# and one with its words shuffled. The log-probability is in nats, summed over the
# continuation's tokens; the shuffled one is far less likely, though it has the same words.

# %%
from minillm.recipe import load_pretrained

shipped, tokenizer = load_pretrained()
prompt_text = "ROMEO:\nBut soft, what light through yonder"
responses = [" window breaks? It is the east,", " east breaks? It window is the,"]
encoded = [tokenizer.encode(prompt_text + text) for text in responses]
width = max(map(len, encoded))
prompt_length = len(tokenizer.encode(prompt_text))
ids = torch.tensor([row + [0] * (width - len(row)) for row in encoded])  # right-padded with token 0
mask = torch.zeros_like(ids, dtype=torch.bool)
for row, tokens in enumerate(encoded):
    mask[row, prompt_length: len(tokens)] = True
with torch.no_grad():
    logits, _ = shipped(ids)
scores = logprobs_of(logits, ids, mask)  # your response_logprobs, if it passed its visible test
for text, score, row in zip(responses, scores, mask):
    print(f"log pi({text!r} | prompt) = {score:7.2f} nats over {int(row.sum())} tokens")

# %% [markdown]
# ## The DPO loss
#
# With the four log-probabilities of a pair, the policy's and the reference's for the
# chosen response $y_w$ and the rejected one $y_l$, the loss is a logistic loss on one
# number, the **margin** of log-ratios:
#
# $$z = \beta\Big[\big(\log \pi_\theta(y_w) - \log \pi_\text{ref}(y_w)\big) -
#       \big(\log \pi_\theta(y_l) - \log \pi_\text{ref}(y_l)\big)\Big], \qquad
#   \mathcal{L} = -\log \sigma(z) = \log\big(1 + e^{-z}\big),$$
#
# averaged over the pairs of a batch. At the start the policy *is* the reference, so
# every log-ratio is 0, $z = 0$ and the loss is $-\log \frac12 = \ln 2 \approx 0.693$
# whatever the data: a check worth making on any DPO implementation. $-\log \sigma(z)$
# must be computed as one stable function (`torch.nn.functional.logsigmoid`): once the
# policy separates a pair well, $z$ is large, and for a badly ranked pair it can be very
# negative, where $\sigma(z)$ rounds to 0 and its log to $-\infty$.
#
# ### Exercise 2 · The loss
#
# Implement `dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta)`.
# The four arguments are tensors of one shape (one entry per pair, summed log-probabilities
# of the responses); return the 0-dim mean over the pairs of $-\log \sigma(z)$, in their
# dtype. Raise a `ValueError` naming `beta` unless it is a positive number, and one naming
# the argument whose shape differs from `policy_chosen`'s.
#
# Difficulty ●○○ · Importance ●●● · about 8 minutes
#
# <details><summary>Hint 1</summary>The margin is <code>(policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)</code>, in nats; multiply it by <code>beta</code>.</details>
# <details><summary>Hint 2</summary><code>-torch.nn.functional.logsigmoid(beta * margin).mean()</code>; <code>torch.log(torch.sigmoid(z))</code> is <code>-inf</code> for <code>z = -200</code>.</details>

# %%
#| answer dpo_loss
#| export minillm/dpo.py
def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float) -> torch.Tensor:
    """The DPO loss (Rafailov et al., 2023): mean over pairs of -log sigmoid(beta * margin).

    policy_chosen, policy_rejected, ref_chosen, ref_rejected: tensors of one shape, e.g.
    (pairs,), the summed log-probabilities of the chosen and rejected responses under the
    policy and under the frozen reference. margin = (policy_chosen - ref_chosen) -
    (policy_rejected - ref_rejected). beta > 0. Returns a 0-dim tensor in their dtype,
    finite for any margin (``logsigmoid``); ln 2 when the policy is the reference.
    """
    ### BEGIN SOLUTION
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0 < beta < math.inf:
        raise ValueError(f"beta must be a positive number, got {beta!r}")
    if not isinstance(policy_chosen, torch.Tensor):
        raise ValueError(f"policy_chosen must be a tensor, got {type(policy_chosen).__name__}")
    for name, value in (("policy_rejected", policy_rejected), ("ref_chosen", ref_chosen), ("ref_rejected", ref_rejected)):
        if not isinstance(value, torch.Tensor) or value.shape != policy_chosen.shape:
            raise ValueError(f"{name} must be a tensor of policy_chosen's shape {tuple(policy_chosen.shape)}, got "
                             f"{tuple(getattr(value, 'shape', ())) or type(value).__name__}")
    margin = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    return -F.logsigmoid(beta * margin).mean()
    ### END SOLUTION

# %%
#| test dpo_loss_visible points=1
@course.visible_check("dpo_loss")
def check_dpo_loss(dpo_loss):
    """Hand-computed cases: three pairs with beta = 0.5, a policy equal to its reference, and a
    pair ranked very badly."""
    pc, pr = torch.tensor([-10.0, -20.0, -15.0]), torch.tensor([-12.0, -18.0, -15.0])
    rc, rr = torch.tensor([-11.0, -19.0, -14.0]), torch.tensor([-11.0, -19.0, -16.0])
    # margins (pc - rc) - (pr - rr): (1 - (-1), -1 - 1, -1 - 1) = (2, -2, -2); z = 0.5 margins = (1, -1, -1)
    expected = torch.tensor((math.log1p(math.exp(-1.0)) + 2 * math.log1p(math.exp(1.0))) / 3)
    before = [t.clone() for t in (pc, pr, rc, rr)]
    got = dpo_loss(pc, pr, rc, rr, 0.5)
    if not all(torch.equal(a, b) for a, b in zip(before, (pc, pr, rc, rr))):
        raise course.CheckFailed("dpo_loss changed one of its inputs in place: compute new tensors instead")

    def loss_of(z):
        return torch.nn.functional.softplus(-z).mean()

    margin = (pc - rc) - (pr - rr)
    course.expect_close(got, expected, "dpo_loss of three hand-computed pairs, beta = 0.5", mistakes={
        "chosen and rejected swapped: the loss must fall as the chosen response gains": loss_of(-0.5 * margin),
        "beta left out: z = beta * margin": loss_of(margin),
        "beta outside the log-sigmoid: -beta * logsigmoid(margin), where the loss is -logsigmoid(beta * margin)":
            0.5 * loss_of(margin),
        "beta multiplies the policy's log-probabilities only (beta * pc - rc): it scales the whole margin, "
        "reference included": loss_of((0.5 * pc - rc) - (0.5 * pr - rr)),
        "beta multiplies the chosen log-ratio only: it scales the whole margin, both log-ratios":
            loss_of(0.5 * (pc - rc) - (pr - rr)),
        "divided by beta instead of multiplied": loss_of(margin / 0.5),
        "the reference left out: the margin is of log-ratios, policy minus reference": loss_of(0.5 * (pc - pr)),
        "the sum over the pairs, not the mean": loss_of(0.5 * margin) * 3,
        "log sigmoid without the minus sign": -loss_of(0.5 * margin),
    }, hint="-torch.nn.functional.logsigmoid(beta * ((pc - rc) - (pr - rr))).mean()")
    if got.dim() != 0:
        raise course.CheckFailed(f"dpo_loss must return a 0-dim tensor (the mean over pairs), got shape {tuple(got.shape)}")
    same = torch.tensor([-3.0, -40.0])
    course.expect_close(dpo_loss(same, same - 5, same, same - 5, 0.1), torch.tensor(math.log(2)),
                        "dpo_loss when the policy equals the reference (it must be ln 2)")
    course.expect_close(dpo_loss(torch.tensor([-500.0]), torch.tensor([-10.0]), torch.tensor([-10.0]), torch.tensor([-10.0]),
                                 1.0), torch.tensor(490.0), "dpo_loss of a pair ranked badly by 490 nats (z = -490)",
                        hint="log(sigmoid(-490)) is log(0) = -inf in float32: use torch.nn.functional.logsigmoid")
    course.expect_raises(ValueError, dpo_loss, pc, pr, rc, rr, 0.0, match="beta", what="dpo_loss with beta = 0")
    course.expect_raises(ValueError, dpo_loss, pc, pr[:2], rc, rr, 0.5, match="policy_rejected",
                         what="dpo_loss with policy_rejected of 2 pairs and policy_chosen of 3")


check_dpo_loss(dpo_loss)
print("dpo_loss: visible test passed")

# %%
#| test dpo_loss_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
for n, beta, dtype in [(7, 0.1, torch.float64), (1, 2.0, torch.float32), (64, 0.03, torch.float32), (5, 1, torch.float64)]:
    pc, pr, rc, rr = (torch.randn(n, dtype=dtype) * 20 - 50 for _ in range(4))
    got = dpo_loss(pc, pr, rc, rr, beta)
    assert isinstance(got, torch.Tensor) and got.dim() == 0 and got.dtype == dtype, \
        "dpo_loss must return a 0-dim tensor of the inputs' dtype"
    z = beta * ((pc - rc) - (pr - rr))
    course.expect_close(got, torch.log1p(torch.exp(-z.double())).mean().to(dtype), "dpo_loss",
                        atol=1e-5)
    # policy == reference: exactly ln 2, whatever the log-probabilities and beta
    course.expect_close(dpo_loss(pc, pr, pc, pr, beta), torch.tensor(math.log(2), dtype=dtype),
                        "dpo_loss at policy == reference", atol=1e-6)
# 2-D batches work as well (the mean over every entry)
course.expect_close(dpo_loss(*(torch.full((2, 3), -5.0) for _ in range(4)), 0.5), torch.tensor(math.log(2)),
                    "dpo_loss of (2, 3) tensors at policy == reference")
# very large margins both ways: finite, and the exact asymptotes
margins = torch.tensor([-3000.0, -200.0, 200.0, 3000.0])
zero = torch.zeros(4)
course.expect_close(dpo_loss(margins, zero, zero, zero, 1.0), torch.tensor((3000.0 + 200.0) / 4),
                    "dpo_loss with margins of +-200 and +-3000 nats (use logsigmoid)", rtol=1e-5)
for bad, what, args in [("beta", "dpo_loss with a bad beta", (zero, zero, zero, zero, -0.1)),
                        ("beta", "dpo_loss with a bad beta", (zero, zero, zero, zero, float("inf"))),
                        ("beta", "dpo_loss with a bad beta", (zero, zero, zero, zero, float("nan"))),
                        ("ref_chosen", "dpo_loss with a bad ref_chosen", (zero, zero, torch.zeros(3), zero, 0.1)),
                        ("ref_rejected", "dpo_loss with a bad ref_rejected", (zero, zero, zero, torch.zeros(4, 1), 0.1))]:
    course.expect_raises(ValueError, dpo_loss, *args, match=bad, what=what)
### END HIDDEN TESTS

# %%
loss_of_pairs = course.keep_going("dpo_loss", dpo_loss, reference_dpo.dpo_loss, check_dpo_loss)

# %% [markdown]
# **What the gradient does.** With $z$ the scaled margin, $\frac{\partial \mathcal L}{\partial z}
# = -\sigma(-z)$: each pair pushes up $\log \pi_\theta(y_w)$ and down
# $\log \pi_\theta(y_l)$ with a weight $\beta\,\sigma(-z)$, large while the pair is ranked
# wrongly by the implicit reward and vanishing once it is ranked right by a wide margin.
# That is the difference from fine-tuning on the chosen answers: DPO stops pushing on a
# pair it has learned, and it pushes *down* on the rejected response as well. The loss
# against the margin, with the weight:

# %%
z = torch.linspace(-8, 8, 401, requires_grad=True)
losses = loss_of_pairs(z, torch.zeros_like(z), torch.zeros_like(z), torch.zeros_like(z), 1.0) * len(z)
(weight,) = torch.autograd.grad(losses, z)
fig, ax = plt.subplots(figsize=(7, 3.6), layout="constrained")
ax.plot(z.detach(), torch.nn.functional.softplus(-z).detach(), label=r"loss $-\log\sigma(z)$")
ax.plot(z.detach(), -weight, label=r"push on the pair, $\sigma(-z)$")
ax.axhline(math.log(2), color="grey", linestyle=":", label=r"$\ln 2$, the loss at the start ($z = 0$)")
ax.set(xlabel=r"scaled margin $z = \beta\,[\log$-ratio of chosen $-$ $\log$-ratio of rejected$]$", ylabel="nats",
       title="DPO is a logistic loss on the margin of each pair", ylim=(0, 4))
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# The push on a pair (orange) is strongest for pairs the policy ranks the wrong way round
# ($z < 0$) and fades once it ranks them right: at $z = 4$ it is 2% of its largest
# value. A pair contributes to the gradient only while the policy has not yet learned it.
#
# ## The implicit reward
#
# DPO never fits a reward model, yet every policy it trains defines a reward:
# $\hat r_\theta(x, y) = \beta \log \frac{\pi_\theta(y \mid x)}{\pi_\text{ref}(y \mid x)}$,
# the reward for which it would be the optimal RLHF policy (up to a term of $x$ alone).
# It is how DPO trainers report progress: the rewards of the chosen and the rejected
# responses, their margin, and the **reward accuracy**, the share of pairs whose chosen
# response gets the higher reward. (The loss is a function of the reward margin alone:
# $\mathcal L = -\log \sigma(\hat r_\theta(y_w) - \hat r_\theta(y_l))$.)
#
# ### Exercise 3 · The reward a policy defines
#
# Implement `implicit_reward(policy_logps, ref_logps, beta)`: $\beta\,(\log \pi_\theta -
# \log \pi_\text{ref})$ for tensors of one shape, in their dtype. Raise a `ValueError`
# naming `beta` unless it is a positive number, and one naming `ref_logps` when its shape
# differs from `policy_logps`'.
#
# Difficulty ●○○ · Importance ●●○ · about 4 minutes
#
# <details><summary>Hint</summary>The log of a ratio is a difference of logs: the arguments are log-probabilities already.</details>

# %%
#| answer implicit_reward
#| export minillm/dpo.py
def implicit_reward(policy_logps: torch.Tensor, ref_logps: torch.Tensor, beta: float) -> torch.Tensor:
    """DPO's implicit reward, beta log(pi(y|x) / pi_ref(y|x)) = beta (policy_logps - ref_logps).

    policy_logps, ref_logps: tensors of one shape, summed log-probabilities of responses
    under the policy and the reference. beta > 0. Returns a tensor of that shape and dtype.
    """
    ### BEGIN SOLUTION
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0 < beta < math.inf:
        raise ValueError(f"beta must be a positive number, got {beta!r}")
    if not isinstance(policy_logps, torch.Tensor):
        raise ValueError(f"policy_logps must be a tensor, got {type(policy_logps).__name__}")
    if not isinstance(ref_logps, torch.Tensor) or ref_logps.shape != policy_logps.shape:
        raise ValueError(f"ref_logps must be a tensor of policy_logps' shape {tuple(policy_logps.shape)}, got "
                         f"{tuple(getattr(ref_logps, 'shape', ())) or type(ref_logps).__name__}")
    return beta * (policy_logps - ref_logps)
    ### END SOLUTION

# %%
#| test implicit_reward_visible points=1
@course.visible_check("implicit_reward")
def check_implicit_reward(implicit_reward):
    """Three responses, beta = 0.2: the policy likes the first more than the reference does, the
    second less, the third the same."""
    policy, ref = torch.tensor([-30.0, -45.0, -12.0]), torch.tensor([-35.0, -40.0, -12.0])
    kept = (policy.clone(), ref.clone())
    got = implicit_reward(policy, ref, 0.2)
    if not (torch.equal(policy, kept[0]) and torch.equal(ref, kept[1])):
        raise course.CheckFailed("implicit_reward changed its inputs in place: compute a new tensor instead")
    expected = torch.tensor([1.0, -1.0, 0.0])
    course.expect_close(got, expected, "implicit_reward(policy, ref, beta=0.2)", mistakes={
        "the ratio upside down: reference minus policy": -expected,
        "beta left out": expected / 0.2,
        "divided by beta instead of multiplied": expected / 0.04,
        "a ratio of log-probabilities, not a difference: they are logs already": 0.2 * policy / ref,
        "exp of the log-ratio (the probability ratio), not its log": 0.2 * (policy - ref).exp(),
    }, hint="beta * (policy_logps - ref_logps)")
    course.expect_raises(ValueError, implicit_reward, policy, ref, -1.0, match="beta", what="implicit_reward with beta = -1")
    course.expect_raises(ValueError, implicit_reward, policy, ref[:2], 0.2, match="ref_logps",
                         what="implicit_reward with ref_logps of 2 responses and policy_logps of 3")


check_implicit_reward(implicit_reward)
print("implicit_reward: visible test passed")

# %%
#| test implicit_reward_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
for shape, beta, dtype in [((9,), 0.1, torch.float64), ((4, 3), 3.0, torch.float32), ((1,), 1, torch.float32)]:
    policy, ref = torch.randn(shape, dtype=dtype) * 10 - 40, torch.randn(shape, dtype=dtype) * 10 - 40
    got = implicit_reward(policy, ref, beta)
    assert isinstance(got, torch.Tensor) and got.dtype == dtype and got.shape == shape, \
        "implicit_reward must keep the shape and dtype of its inputs"
    course.expect_close(got, beta * torch.log(torch.exp(policy.double()) / torch.exp(ref.double())).to(dtype),
                        "implicit_reward", atol=1e-4)
    course.expect_close(implicit_reward(ref, ref, beta), torch.zeros(shape, dtype=dtype),
                        "implicit_reward of the reference itself is 0")
for bad, what, args in [("beta", "implicit_reward with a bad beta", (torch.zeros(3), torch.zeros(3), 0)),
                        ("beta", "implicit_reward with a bad beta", (torch.zeros(3), torch.zeros(3), float("nan"))),
                        ("ref_logps", "implicit_reward with a bad ref_logps", (torch.zeros(3), torch.zeros(3, 1), 0.1))]:
    course.expect_raises(ValueError, implicit_reward, *args, match=bad, what=what)
### END HIDDEN TESTS

# %%
reward_of = course.keep_going("implicit_reward", implicit_reward, reference_dpo.implicit_reward, check_implicit_reward)

# %% [markdown]
# ## Preference data from the model itself
#
# Real preference data comes from people comparing answers. To measure what DPO does we
# need pairs in any amount, made by code, and an attribute a program can score. Ours:
# **the continuation speaks of love**, that is, it uses one of the words *love, loves,
# loved, lover, lovers, lovely, loving, lovest, loveth*. The shipped model has read
# Shakespeare, so it writes of love sometimes, but not often: that is its *base rate*.
#
# The pairs are sampled from the reference model itself, as on-policy preference data is:
# for each training prompt (a window of 32 tokens of the training text) the model writes
# eight continuations of 32 tokens at temperature 1; where some use the word and some do
# not, one that does is *chosen* and one that does not is *rejected* (as many pairs as the
# smaller group has). Both responses of a pair continue the same prompt, so the
# comparison is about the continuation alone. The held-out prompts come from the
# validation text, which no run trains on.

# %%
#| export minillm/dpo.py
def prompt_windows(tokenizer, text: str, n: int, length: int) -> torch.Tensor:
    """``n`` prompts of ``length`` token ids, evenly spaced over the tokens of ``text``: (n, length) long.

    tokenizer: ``encode(str) -> list[int]`` (a ``BPETokenizer``). ``ValueError`` when the
    text has fewer than n * length tokens.
    """
    positive_int("n", n)
    positive_int("length", length)
    stream = tokenizer.encode(text)
    if len(stream) < n * length:
        raise ValueError(f"text holds {len(stream)} tokens, too few for n={n} prompts of length={length}")
    gap = len(stream) // n
    return torch.tensor([stream[i * gap: i * gap + length] for i in range(n)], dtype=torch.long)


def response_mask(n: int, prompt_length: int, length: int) -> torch.Tensor:
    """(n, length) bool, True at the positions after the first ``prompt_length``: the responses."""
    positive_int("n", n)
    positive_int("prompt_length", prompt_length)
    if not prompt_length < length:
        raise ValueError(f"length must exceed prompt_length={prompt_length}, got {length!r}")
    mask = torch.zeros(n, length, dtype=torch.bool)
    mask[:, prompt_length:] = True
    return mask


@torch.no_grad()
def sample_responses(model: nn.Module, prompts: torch.Tensor, new_tokens: int, samples: int = 1,
                     generator: torch.Generator | None = None, batch_size: int = 256) -> torch.Tensor:
    """``samples`` continuations of each prompt, drawn from the model's own distribution.

    prompts: (n, prompt_length) token ids. Temperature 1 and no truncation (no top-k, no
    top-p): the samples are from pi itself, as a KL estimate from samples needs. Returns
    (n * samples, prompt_length + new_tokens) ids, the rows of prompt i at
    i * samples ... (i + 1) * samples - 1. generator: a seeded one makes the draws reproducible.
    """
    if not isinstance(prompts, torch.Tensor) or prompts.dim() != 2:
        raise ValueError(f"prompts must be a (n, prompt_length) tensor, got {getattr(prompts, 'shape', prompts)}")
    positive_int("new_tokens", new_tokens)
    positive_int("samples", samples)
    positive_int("batch_size", batch_size)
    rows = prompts.repeat_interleave(samples, dim=0)
    return torch.cat([generate(model, rows[i: i + batch_size], new_tokens, use_cache=True, generator=generator)
                      for i in range(0, len(rows), batch_size)])


@dataclass(frozen=True)
class PreferencePairs:
    """Preference pairs that share their prompts.

    chosen, rejected: (pairs, seq) token ids, a prompt followed by a response; mask:
    (pairs, seq) bool, True at the response's tokens (the same positions in both);
    prompt: (pairs,) the index of each pair's prompt. attribute_rate: the share of the
    sampled responses the pairs were drawn from that had the preferred attribute.
    """

    chosen: torch.Tensor
    rejected: torch.Tensor
    mask: torch.Tensor
    prompt: torch.Tensor
    attribute_rate: float

    def __post_init__(self):
        shape = self.chosen.shape
        if self.chosen.dim() != 2 or self.rejected.shape != shape or self.mask.shape != shape:
            raise ValueError(f"chosen, rejected and mask must have one (pairs, seq) shape, got {tuple(shape)}, "
                             f"{tuple(self.rejected.shape)} and {tuple(self.mask.shape)}")
        if self.mask.dtype != torch.bool or self.prompt.shape != shape[:1]:
            raise ValueError("mask must be bool and prompt (pairs,)")

    def __len__(self) -> int:
        return self.chosen.shape[0]


def preference_pairs(model: nn.Module, tokenizer, prompts: torch.Tensor, samples: int, new_tokens: int,
                     generator: torch.Generator | None = None, score=uses_target) -> PreferencePairs:
    """Pairs ranked by ``score``, from ``samples`` continuations of each prompt by ``model``.

    For each prompt, the sampled responses (``sample_responses``) whose decoded text
    ``score`` finds True are paired with those it finds False, in the order they were drawn:
    min(#True, #False) pairs, chosen = True. Prompts whose samples all agree give no pair.
    prompts: (n, prompt_length) ids; score(text) -> bool. ``ValueError`` when no prompt
    gives a pair.
    """
    positive_int("samples", samples)
    if not callable(score):
        raise TypeError(f"score must be a function (text) -> bool, got {type(score).__name__}")
    length = prompts.shape[1]
    out = sample_responses(model, prompts, new_tokens, samples, generator)
    flags = [bool(score(tokenizer.decode(row[length:].tolist()))) for row in out]
    chosen, rejected, prompt = [], [], []
    for i in range(len(prompts)):
        rows = range(i * samples, (i + 1) * samples)
        good, bad = [r for r in rows if flags[r]], [r for r in rows if not flags[r]]
        for win, lose in zip(good, bad):
            chosen.append(win)
            rejected.append(lose)
            prompt.append(i)
    if not chosen:
        raise ValueError(f"no prompt of {len(prompts)} gave a pair: every sample scored the same "
                         f"(attribute rate {sum(flags) / len(flags):.3f}); draw more samples or more prompts")
    return PreferencePairs(out[chosen], out[rejected], response_mask(len(chosen), length, out.shape[1]),
                           torch.tensor(prompt), sum(flags) / len(flags))

# %% [markdown]
# The base rate, on held-out prompts, and a few pairs for the live run below. (Quick mode
# draws fewer prompts, so its pairs are fewer and its rates noisier.)

# %%
train_text, val_text = data.split_corpus(data.corpus_text())
PROMPT, RESPONSE, SAMPLES = 32, 32, 8
n_train, n_held = (40, 48) if QUICK else (256, 256)
train_prompts = reference_dpo.prompt_windows(tokenizer, train_text, n_train, PROMPT)
held_prompts = reference_dpo.prompt_windows(tokenizer, val_text[:100_000], n_held, PROMPT)
start = time.perf_counter()
pairs = reference_dpo.preference_pairs(shipped, tokenizer, train_prompts, SAMPLES, RESPONSE,
                                       generator=torch.Generator().manual_seed(0))
print(f"{n_train} prompts x {SAMPLES} samples in {time.perf_counter() - start:.1f} s: attribute rate "
      f"{pairs.attribute_rate:.3f}, {len(pairs)} pairs from {len(pairs.prompt.unique())} prompts")
first = 0
print("\nprompt:  ", repr(tokenizer.decode(pairs.chosen[first, :PROMPT].tolist())))
print("chosen:  ", repr(tokenizer.decode(pairs.chosen[first, PROMPT:].tolist())))
print("rejected:", repr(tokenizer.decode(pairs.rejected[first, PROMPT:].tolist())))

# %% [markdown]
# ## Training against a frozen reference
#
# The policy starts as a copy of the shipped model and trains; the reference is another
# copy, **frozen**: in eval mode (no dropout: its log-probabilities must be the same
# numbers every time it scores a response) and without gradients (it never changes, and
# its forward pass needs no graph). A DPO step runs the policy on the chosen and the
# rejected responses of a batch of pairs, the reference on the same, and takes the loss.
# It is chapter 07's `train` with another `loss_fn`: the batches are dicts of pair tensors
# (`PairBatches`, resumable like `BatchSampler`), and the loss function also returns the
# numbers DPO trainers log (rewards, reward accuracy, log-probabilities), which `train`
# keeps in its history. The baseline, `sft_objective`, is supervised fine-tuning on the
# chosen responses alone: the mean negative log-likelihood of their tokens.

# %%
#| export minillm/dpo.py
def frozen_reference(model: nn.Module) -> nn.Module:
    """A copy of ``model`` to score responses with: eval mode (no dropout) and no gradients."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return copy.deepcopy(model).eval().requires_grad_(False)


class PairBatches:
    """Batches of preference pairs in a seeded order, resumable (``state_dict`` / ``load_state_dict``).

    Each epoch shuffles the pairs and yields ``{"chosen", "rejected", "mask"}`` dicts of
    (batch_size, seq) tensors; the last pairs of an epoch that do not fill a batch wait
    for the next one's order (every batch is full). The cursor (epoch, position) is the state.
    """

    def __init__(self, pairs: PreferencePairs, batch_size: int, seed: int = 0):
        if not isinstance(pairs, PreferencePairs):
            raise TypeError(f"pairs must be PreferencePairs, got {type(pairs).__name__}")
        positive_int("batch_size", batch_size)
        integer("seed", seed)
        if batch_size > len(pairs):
            raise ValueError(f"batch_size ({batch_size}) must be at most the number of pairs ({len(pairs)})")
        self.pairs, self.batch_size, self.seed = pairs, batch_size, seed
        self.epoch, self.position = 0, 0
        self._order = self._epoch_order(0)

    def _epoch_order(self, epoch: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(len(self.pairs), generator=generator)

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        if self.position + self.batch_size > len(self._order):
            self.epoch, self.position = self.epoch + 1, 0
            self._order = self._epoch_order(self.epoch)
        rows = self._order[self.position: self.position + self.batch_size]
        self.position += self.batch_size
        return {"chosen": self.pairs.chosen[rows], "rejected": self.pairs.rejected[rows], "mask": self.pairs.mask[rows]}

    def state_dict(self) -> dict:
        return {"seed": self.seed, "epoch": self.epoch, "position": self.position, "batch_size": self.batch_size}

    def load_state_dict(self, state: dict) -> None:
        if int(state["batch_size"]) != self.batch_size:
            raise ValueError(f"the saved state has batch_size {state['batch_size']}, this sampler {self.batch_size}")
        self.seed, self.epoch, self.position = int(state["seed"]), int(state["epoch"]), int(state["position"])
        self._order = self._epoch_order(self.epoch)


def _pair_logps(model: nn.Module, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The summed response log-probabilities of a batch's chosen and rejected rows, in one forward pass."""
    n = batch["chosen"].shape[0]
    logps = sequence_logprobs(model, torch.cat([batch["chosen"], batch["rejected"]]), batch["mask"].repeat(2, 1))
    return logps[:n], logps[n:]


def dpo_objective(reference: nn.Module, beta: float):
    """A ``loss_fn(model, batch)`` for ``minillm.train.train``: the DPO loss of the pairs of
    ``batch`` (a ``PairBatches`` dict) against ``reference``, and the numbers to log.

    reference: the frozen model (``frozen_reference``); it is put in eval mode and scored
    without gradients, and must not be the model being trained. beta > 0. The logged
    numbers are means over the batch: ``chosen_logp`` and ``rejected_logp`` (the policy's
    summed log-probabilities), ``chosen_reward`` and ``rejected_reward`` (``implicit_reward``),
    ``reward_margin`` and ``reward_accuracy`` (the share of pairs ranked right).
    """
    if not isinstance(reference, nn.Module):
        raise TypeError(f"reference must be a torch.nn.Module, got {type(reference).__name__}")
    beta = positive_number("beta", beta)
    reference.eval()

    def loss_fn(model: nn.Module, batch: dict):
        if model is reference:
            raise ValueError("the model being trained is the reference itself: train a copy (frozen_reference "
                             "makes the reference's)")
        policy_chosen, policy_rejected = _pair_logps(model, batch)
        with torch.no_grad():
            ref_chosen, ref_rejected = _pair_logps(reference, batch)
        loss = dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta)
        chosen = implicit_reward(policy_chosen.detach(), ref_chosen, beta)
        rejected = implicit_reward(policy_rejected.detach(), ref_rejected, beta)
        return loss, {"chosen_logp": policy_chosen.detach().mean(), "rejected_logp": policy_rejected.detach().mean(),
                      "chosen_reward": chosen.mean(), "rejected_reward": rejected.mean(),
                      "reward_margin": (chosen - rejected).mean(), "reward_accuracy": (chosen > rejected).float().mean()}

    return loss_fn


def sft_objective(model: nn.Module, batch: dict):
    """A ``loss_fn`` for ``train``: supervised fine-tuning on the chosen responses of ``batch``
    (the baseline): their mean negative log-likelihood per response token, and ``chosen_logp``,
    the mean summed log-probability of a chosen response, to log."""
    logps = sequence_logprobs(model, batch["chosen"], batch["mask"])
    return -logps.sum() / batch["mask"].sum(), {"chosen_logp": logps.detach().mean()}

# %% [markdown]
# A live run: DPO with $\beta = 0.1$ (a common default), AdamW through `train` at a
# constant learning rate after a short warmup, on the pairs above, batches of 16 pairs.
# The loss must start at $\ln 2$. (Quick mode takes 6 steps on its few pairs; the full
# run 40. The measured sweep below trains longer, on more pairs.)

# %%
from minillm.train import TrainConfig, train

BETA, live_steps = 0.1, 6 if QUICK else 40
frozen = reference_dpo.frozen_reference(shipped)
live_policy = reference_dpo.frozen_reference(shipped).train().requires_grad_(True)  # a trainable copy
config = TrainConfig(steps=live_steps, lr=3e-4, warmup_steps=2, min_lr_ratio=1.0, weight_decay=0.0,
                     eval_every=live_steps, checkpoint_every=live_steps)
torch.manual_seed(0)
start = time.perf_counter()
state = train(live_policy, reference_dpo.PairBatches(pairs, min(16, len(pairs)), seed=0), config,
              loss_fn=reference_dpo.dpo_objective(frozen, BETA))
history = state.history
print(f"{live_steps} steps in {time.perf_counter() - start:.1f} s; loss at the first step {history['train_loss'][0]:.4f} "
      f"(ln 2 = {math.log(2):.4f}), at the last {history['train_loss'][-1]:.4f}")
print(f"reward accuracy on the batch: {history['reward_accuracy'][0]:.2f} -> {history['reward_accuracy'][-1]:.2f}; "
      f"chosen log-prob {history['chosen_logp'][0]:.1f} -> {history['chosen_logp'][-1]:.1f}, "
      f"rejected {history['rejected_logp'][0]:.1f} -> {history['rejected_logp'][-1]:.1f} nats")
with torch.no_grad():  # the implicit rewards of the training pairs after the run (your implicit_reward, if it passed)
    logps = {name: [reference_dpo.sequence_logprobs(model, getattr(pairs, name), pairs.mask) for model in (live_policy, frozen)]
             for name in ("chosen", "rejected")}
chosen_reward, rejected_reward = reward_of(*logps["chosen"], BETA), reward_of(*logps["rejected"], BETA)
print(f"implicit rewards of the {len(pairs)} training pairs: chosen {chosen_reward.mean():.2f}, rejected "
      f"{rejected_reward.mean():.2f}, accuracy {(chosen_reward > rejected_reward).float().mean():.2f}")

# %% [markdown]
# ## How far did the policy move? KL from samples
#
# The price of the new behaviour is drift: how different the policy's distribution is
# from the reference's. RLHF's objective names the measure, the KL divergence per prompt,
#
# $$\mathrm{KL}(\pi_\theta \,\|\, \pi_\text{ref}) = \mathbb{E}_{y \sim \pi_\theta}
#   \Big[\log \pi_\theta(y \mid x) - \log \pi_\text{ref}(y \mid x)\Big],$$
#
# in nats per sequence (here per response of 32 tokens). It is an expectation over the
# policy's own responses, which are far too many to sum, so we estimate it from samples:
# draw responses $y_i$ from the policy (temperature 1, no truncation: from $\pi_\theta$
# itself), score each under both models, and average the log-ratios. One log-ratio can be
# negative (a response the reference likes more), the average converges to the KL, which
# is never negative. The spread of the log-ratios says how far to trust it: the standard
# error of the mean is $s / \sqrt{n}$, with $s$ the sample standard deviation.
#
# ### Exercise 4 · The KL estimate
#
# Implement `kl_estimate(policy_logps, ref_logps)`: given the summed log-probabilities of
# $n$ responses *sampled from the policy*, under the policy and under the reference (two
# 1-D tensors of $n \ge 2$ entries), return a tuple of two Python floats, the mean
# log-ratio and its standard error $s / \sqrt{n}$, where $s$ is the sample standard
# deviation (dividing by $n - 1$) of the log-ratios. Compute in float64, casting both
# tensors before you subtract: summed log-probabilities of long responses reach thousands
# of nats, where float32's steps are thousandths of a nat, as coarse as the spread of the
# log-ratios it would then measure. Raise a
# `ValueError` naming `policy_logps` when it is not a 1-D tensor of at least 2 entries,
# and one naming `ref_logps` when its shape differs.
#
# Difficulty ●○○ · Importance ●●● · about 6 minutes
#
# <details><summary>Hint 1</summary>The log-ratio of each sample is <code>policy_logps - ref_logps</code>; its mean is the estimate.</details>
# <details><summary>Hint 2</summary><code>tensor.std()</code> divides by n - 1 by default; <code>.item()</code> turns a 0-dim tensor into a float.</details>

# %%
#| answer kl_estimate
#| export minillm/dpo.py
def kl_estimate(policy_logps: torch.Tensor, ref_logps: torch.Tensor) -> tuple[float, float]:
    """KL(pi || pi_ref) in nats per sequence, estimated from n responses sampled from pi.

    policy_logps, ref_logps: (n,) summed log-probabilities of the sampled responses under
    the policy and the reference, n >= 2. Returns (mean log-ratio, its standard error
    s / sqrt(n)), s the sample standard deviation (n - 1) of the log-ratios; in float64.
    """
    ### BEGIN SOLUTION
    if not isinstance(policy_logps, torch.Tensor) or policy_logps.dim() != 1 or len(policy_logps) < 2:
        raise ValueError(f"policy_logps must be a 1-D tensor of at least 2 samples, got "
                         f"{tuple(getattr(policy_logps, 'shape', ())) or type(policy_logps).__name__}")
    if not isinstance(ref_logps, torch.Tensor) or ref_logps.shape != policy_logps.shape:
        raise ValueError(f"ref_logps must be a tensor of policy_logps' shape {tuple(policy_logps.shape)}, got "
                         f"{tuple(getattr(ref_logps, 'shape', ())) or type(ref_logps).__name__}")
    ratios = policy_logps.double() - ref_logps.double()
    return ratios.mean().item(), (ratios.std() / math.sqrt(len(ratios))).item()
    ### END SOLUTION

# %%
#| test kl_estimate_visible points=1
@course.visible_check("kl_estimate")
def check_kl_estimate(kl_estimate):
    """Four sampled responses of 32 tokens, their log-probabilities under the policy and the reference."""
    policy, ref = torch.tensor([-40.0, -52.0, -35.0, -61.0]), torch.tensor([-43.0, -51.0, -41.0, -63.0])
    kept = (policy.clone(), ref.clone())
    got = kl_estimate(policy, ref)
    if not (torch.equal(policy, kept[0]) and torch.equal(ref, kept[1])):
        raise course.CheckFailed("kl_estimate changed its inputs in place")
    if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(v, float) for v in got)):
        raise course.CheckFailed(f"kl_estimate must return a tuple of two floats (estimate, standard error), got "
                                 f"{course.describe(got)}")
    ratios = [3.0, -1.0, 6.0, 2.0]  # policy - ref: the mean is 2.5
    s = math.sqrt(sum((r - 2.5) ** 2 for r in ratios) / 3)
    course.expect_close(torch.tensor(got[0]), torch.tensor(2.5), "kl_estimate's estimate (the mean log-ratio)", mistakes={
        "the log-ratio upside down: log pi - log pi_ref, for samples of pi": torch.tensor(-2.5),
        "per token, not per sequence: the log-probabilities are summed over the response already": torch.tensor(2.5 / 32),
        "the mean of |log-ratio|: a single log-ratio may be negative, the mean is the estimate": torch.tensor(3.0),
    }, hint="(policy_logps - ref_logps).mean()")
    course.expect_close(torch.tensor(got[1]), torch.tensor(s / 2), "kl_estimate's standard error", mistakes={
        "the standard deviation itself: the error of the mean is s / sqrt(n)": torch.tensor(s),
        "the population standard deviation (dividing by n): use the sample one (n - 1)":
            torch.tensor(math.sqrt(sum((r - 2.5) ** 2 for r in ratios) / 4) / 2),
        "s / n instead of s / sqrt(n)": torch.tensor(s / 4),
    }, hint="(policy_logps - ref_logps).std() / math.sqrt(n)")
    near, far = torch.tensor([-1.001, -0.998, -1.003, -0.999]), torch.full((4,), -30000.0)  # float32, 30,000 nats apart
    course.expect_close(torch.tensor(kl_estimate(near, far)[1], dtype=torch.float64),
                        (near.double() - far.double()).std() / 2,
                        "kl_estimate's standard error for float32 log-probabilities 30,000 nats apart", mistakes={
        "the log-ratios were computed in float32, whose steps near 30,000 are 0.002 nats: cast both to float64 "
        "before subtracting": torch.tensor(((near - far).std() / 2).item(), dtype=torch.float64),
    }, atol=1e-9, rtol=1e-6)
    course.expect_raises(ValueError, kl_estimate, policy[:1], ref[:1], match="policy_logps",
                         what="kl_estimate of one sample (no standard error)")
    course.expect_raises(ValueError, kl_estimate, policy, ref[:3], match="ref_logps",
                         what="kl_estimate with ref_logps of 3 samples and policy_logps of 4")


check_kl_estimate(kl_estimate)
print("kl_estimate: visible test passed")

# %%
#| test kl_estimate_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
for n, dtype in [(2, torch.float64), (50, torch.float32), (1000, torch.float32)]:
    policy = torch.randn(n, dtype=dtype) * 5 - 60
    ref = policy - torch.randn(n, dtype=dtype) * 2 - 1
    estimate = kl_estimate(policy, ref)
    assert isinstance(estimate, tuple) and len(estimate) == 2 and all(isinstance(v, float) for v in estimate), \
        "kl_estimate must return a tuple of two floats"
    ratios = (policy.double() - ref.double()).tolist()
    mean = sum(ratios) / n
    stderr = math.sqrt(sum((r - mean) ** 2 for r in ratios) / (n - 1) / n)
    course.expect_close(torch.tensor(estimate, dtype=torch.float64), torch.tensor([mean, stderr], dtype=torch.float64),
                        "kl_estimate", atol=1e-6, rtol=1e-6)
# float64 log-probabilities of long responses: the estimate keeps their precision (no cast to float32)
policy = torch.full((4,), -20000.0, dtype=torch.float64) + torch.tensor([0.001, -0.001, 0.002, 0.0], dtype=torch.float64)
ref = torch.full((4,), -20000.0, dtype=torch.float64)
course.expect_close(torch.tensor(kl_estimate(policy, ref)[0]), torch.tensor(0.0005, dtype=torch.float64),
                    "kl_estimate of float64 inputs keeps their precision", atol=1e-9)
# float32 log-probabilities far apart: computed in float64, their log-ratios are exact; in float32, rounded
near, far = -1 + 1e-3 * torch.randn(64), torch.full((64,), -30000.0) - 1e-3 * torch.rand(64)
ratios = near.double() - far.double()
course.expect_close(torch.tensor(kl_estimate(near, far), dtype=torch.float64),
                    torch.stack([ratios.mean(), ratios.std() / 8]), "kl_estimate computes in float64",
                    atol=1e-9, rtol=1e-6)
course.expect_close(torch.tensor(kl_estimate(ref, ref)), torch.zeros(2, dtype=torch.float64),
                    "kl_estimate of the reference against itself: 0 with no error")
for bad, what, args in [("policy_logps", "kl_estimate with a bad policy_logps", (torch.zeros(1), torch.zeros(1))),
                        ("policy_logps", "kl_estimate with a bad policy_logps", (torch.zeros(3, 2), torch.zeros(3, 2))),
                        ("ref_logps", "kl_estimate with a bad ref_logps", (torch.zeros(3), torch.zeros(4)))]:
    course.expect_raises(ValueError, kl_estimate, *args, match=bad, what=what)
### END HIDDEN TESTS

# %%
kl_of = course.keep_going("kl_estimate", kl_estimate, reference_dpo.kl_estimate, check_kl_estimate)

# %% [markdown]
# The package measures a policy with it. `evaluate_policy` samples one response per
# held-out prompt from the policy, scores the attribute on each, and estimates the KL to
# the reference on the same samples (the cell after it does the same by hand, with your
# estimate); `pair_metrics` reads a set of pairs (held-out pairs, sampled from the
# reference on held-out prompts) with the implicit reward.

# %%
#| export minillm/dpo.py
@torch.no_grad()
def evaluate_policy(policy: nn.Module, reference: nn.Module, tokenizer, prompts: torch.Tensor, new_tokens: int,
                    samples: int = 1, generator: torch.Generator | None = None, score=uses_target) -> dict[str, float]:
    """The policy on held-out prompts, from its own samples.

    Draws ``samples`` responses per prompt from the policy (``sample_responses``), and returns
    ``attribute_rate`` (the share that ``score`` finds True) with ``attribute_stderr``
    (sqrt(p (1 - p) / n)), and ``kl`` with ``kl_stderr``: ``kl_estimate`` of the responses'
    log-probabilities under the policy and the reference, in nats per response.
    """
    was_training = policy.training
    policy.eval()
    try:
        out = sample_responses(policy, prompts, new_tokens, samples, generator)
        mask = response_mask(len(out), prompts.shape[1], out.shape[1])
        kl, kl_error = kl_estimate(sequence_logprobs(policy, out, mask), sequence_logprobs(reference, out, mask))
    finally:
        policy.train(was_training)
    hits = [bool(score(tokenizer.decode(row[prompts.shape[1]:].tolist()))) for row in out]
    rate = sum(hits) / len(hits)
    return {"attribute_rate": rate, "attribute_stderr": math.sqrt(rate * (1 - rate) / len(hits)), "kl": kl,
            "kl_stderr": kl_error}


@torch.no_grad()
def pair_metrics(policy: nn.Module, reference: nn.Module, pairs: PreferencePairs, beta: float,
                 batch_size: int = 64) -> dict[str, float]:
    """The policy on preference pairs (held-out ones, to measure): means over the pairs of the
    policy's ``chosen_logp`` and ``rejected_logp``, ``logratio_margin`` (the margin in nats,
    before beta), ``reward_margin`` (beta times it), ``reward_accuracy`` (share ranked right)
    and ``loss`` (``dpo_loss``)."""
    beta = positive_number("beta", beta)
    positive_int("batch_size", batch_size)
    was_training = policy.training
    policy.eval()
    parts = {"policy": ([], []), "reference": ([], [])}
    try:
        for i in range(0, len(pairs), batch_size):
            batch = {key: getattr(pairs, key)[i: i + batch_size] for key in ("chosen", "rejected", "mask")}
            for name, model in (("policy", policy), ("reference", reference)):
                chosen, rejected = _pair_logps(model, batch)
                parts[name][0].append(chosen)
                parts[name][1].append(rejected)
    finally:
        policy.train(was_training)
    (pc, pr), (rc, rr) = ((torch.cat(a), torch.cat(b)) for a, b in parts.values())
    margin = (pc - rc) - (pr - rr)
    return {"chosen_logp": pc.mean().item(), "rejected_logp": pr.mean().item(), "logratio_margin": margin.mean().item(),
            "reward_margin": beta * margin.mean().item(), "reward_accuracy": (margin > 0).float().mean().item(),
            "loss": dpo_loss(pc, pr, rc, rr, beta).item()}

# %% [markdown]
# The live policy against the reference, on the held-out prompts: the attribute rate of
# its samples, the KL estimate, and the loss on Shakespeare's validation text (the
# capability cost), in nats per character as in chapter 12.

# %%
from minillm.loss import nats_per_char

shakespeare = val_text[100_000: 104_000 if QUICK else 108_000]
shakespeare_ids = torch.tensor(tokenizer.encode(shakespeare))
for name, model in (("reference", frozen), ("live DPO policy", live_policy)):
    samples = reference_dpo.sample_responses(model, held_prompts, RESPONSE, generator=torch.Generator().manual_seed(1))
    response = reference_dpo.response_mask(len(samples), PROMPT, samples.shape[1])
    with torch.no_grad():
        kl, kl_error = kl_of(reference_dpo.sequence_logprobs(model, samples, response),  # your kl_estimate, if it passed
                             reference_dpo.sequence_logprobs(frozen, samples, response))
    rate = sum(uses_target(tokenizer.decode(row[PROMPT:].tolist())) for row in samples) / len(samples)
    print(f"{name:16s} attribute rate {rate:.3f} ± {math.sqrt(rate * (1 - rate) / len(samples)):.3f} · "
          f"KL {kl:5.2f} ± {kl_error:.2f} nats/response · "
          f"Shakespeare {nats_per_char(model, shakespeare_ids, len(shakespeare)):.3f} nats/char")

# %% [markdown]
# In full mode the live run (92 pairs, 40 steps) took the attribute rate from 3.5% to 30%,
# but at a KL of 11.1 nats per response, and the Shakespeare loss from 1.823 to 2.007
# nats per character: β = 0.1 on a few pairs, which it learns by heart (the loss at the
# last step is 0.002), lets the policy drift far. (Quick mode's 6 steps on fewer pairs
# move less, and its 48 held-out samples leave rates with errors of several points.) The
# measured sweep below asks how the drift depends on β, and what SFT does instead.
#
# ## The frontier, measured
#
# `bench/dpo_frontier.py` repeats the live run at scale and caches the results in
# `data/dpo_frontier.json`, with the command that made them and how long they took. Its
# pairs: 1,024 training prompts with 8 samples each. Its runs: DPO at
# $\beta \in \{0.1, 0.3, 1, 3\}$ and, as the baseline, supervised fine-tuning (SFT) on the
# chosen responses alone, all with the same pairs, batches of 16, 150 steps and the
# learning rate $3 \times 10^{-4}$ (full fine-tuning, AdamW, no weight decay). Every 25
# steps each run is measured on 512 held-out prompts (one sample each: the attribute
# rate, and the KL estimate of Exercise 4), on held-out pairs (reward accuracy and
# margins), and on Shakespeare's validation text.

# %%
frontier = json.loads(data.path("dpo_frontier.json").read_text())
base = frontier["runs"][0]["points"][0]
print(f"{frontier['command']!r}: {len(frontier['runs'])} runs of {frontier['steps']} steps at lr {frontier['lr']:g}, "
      f"{frontier['seconds'] / 60:.0f} min on {frontier['threads']} torch thread")
print(f"pairs: {frontier['pairs']['train']} for training (attribute rate {frontier['pairs']['train_attribute_rate']:.3f} "
      f"in their samples), {frontier['pairs']['held_out']} held out\n")
print(f"{'run':14s} {'attribute':>9s} {'KL (nats)':>12s} {'per nat':>7s} {'reward acc':>10s} {'margin':>7s} "
      f"{'chosen':>7s} {'rejected':>8s} {'Shakespeare':>11s}")
print(f"{'shipped model':14s} {base['attribute_rate']:9.3f} {'0':>12s} {'':7s} {'':10s} {'':7s} "
      f"{base['held_chosen_logp']:7.1f} {base['held_rejected_logp']:8.1f} {base['shakespeare']:11.3f}")
for run in frontier["runs"]:
    last = run["points"][-1]
    name = "SFT (chosen)" if run["method"] == "sft" else f"DPO beta={run['beta']:g}"
    gain = f"{(last['attribute_rate'] - base['attribute_rate']) / last['kl']:7.3f}" if last["kl"] > 0.1 else f"{'-':>7s}"
    print(f"{name:14s} {last['attribute_rate']:9.3f} {last['kl']:6.2f} ± {last['kl_stderr']:.2f} {gain} "
          f"{last['held_reward_accuracy']:10.2f} {last['held_logratio_margin']:7.1f} {last['held_chosen_logp']:7.1f} "
          f"{last['held_rejected_logp']:8.1f} {last['shakespeare']:11.3f}")

# %% [markdown]
# The columns: the attribute rate of the held-out samples and the KL estimate (with its
# standard error) after the last step; *per nat*, the gain in attribute rate over the
# shipped model per nat of KL; on the held-out pairs, the reward accuracy, the mean
# log-ratio margin in nats (before $\beta$), and the policy's mean log-probabilities of
# their chosen and rejected responses; the loss on Shakespeare in nats per character.

# %% [markdown]
# The figure of the sweep is drawn by a function of the package (`minillm.curves`), so that
# the bench script draws the same one into `data/dpo-frontier.png`.

# %%
from minillm.curves import plot_frontier

# %%
plot_frontier(frontier)
plt.show()

# %% [markdown]
# What the sweep says (the numbers are in the table and the figure above; each rate is from
# 512 samples, so it carries a standard error of about 2 points):
#
# - **The target is met at β = 1.** From 3.3% of held-out responses that speak of love,
#   DPO with β = 1 reaches 33% at a KL of 3.9 nats per response, and β = 3 34% at 3.7
#   nats. β = 0.3 goes further, to 51%, but at 7.0 nats; its point after 50 steps, 40% at
#   4.7 nats, was within the budget of 5.
# - **β is a brake, because the loss saturates.** Every DPO run ranks all its training
#   pairs right within about 50 steps (the loss is near 0 from then on), and its KL then
#   levels off: a pair's push fades as its margin grows (the orange curve of the loss
#   figure). A small β needs a wide margin of log-ratios before the pushes fade, so the
#   policy drifts further. At β = 0.1 the drift did not stop: 40 nats after 150 steps, with
#   the attribute past its peak (64% at 15.8 nats, then 60%) and the Shakespeare loss
#   from 1.823 to 2.338 nats per character. Above β = 1 the brake changes little (3.9
#   against 3.7 nats).
# - **Per nat of KL, DPO and SFT agree at first, then DPO gets more.** Up to about 4 nats
#   the curves lie on one another (SFT: 32% at 3.4 nats after 50 steps; DPO β = 1: 33% at
#   3.9). Past that, DPO buys more of the attribute for the same drift: at 5.8 nats DPO
#   with β = 0.3 had 50% and SFT 40%; at 8.6 nats DPO with β = 0.1 had 56% and SFT 48%. One
#   seed and one set of pairs, so the edge (10 and 8 points, about 3.2 and 2.6 standard
#   errors of a difference of two rates from 512 samples each) is a measurement, not a law.
# - **SFT does not stop by itself.** Its KL grows with every step (13.8 nats after 150)
#   while its rate stays near 45%: it learns the chosen responses by heart (right panel:
#   their log-probability climbs from −109 to about −70 nats). Its stopping point is a
#   choice of steps; DPO's is mostly set by β.
# - **Held-out reward accuracy is 0.70–0.75 for every run, SFT included,** against 1.00 on
#   the training pairs: three held-out pairs in four are ranked right by the implicit
#   reward, with a mean log-ratio margin of 1.7 to 6.4 nats. The gap is overfitting to 348 pairs, which every
#   run sees 7 times.
# - **The capability cost** follows the KL: at β = 1 and 3 the Shakespeare loss rose from
#   1.823 to 1.86–1.87 nats per character, at β = 0.3 to 1.92, after SFT to 2.04.
#
# ## Why the chosen log-probability falls too
#
# The question users of DPO trainers ask most often: *the loss goes down, the reward
# accuracy goes up, so why does the log-probability of the chosen responses fall?* The
# loss sees only the margin. Raising the chosen response by one nat or lowering the
# rejected one by one nat lowers it by exactly as much, so nothing in it says that the
# chosen response must become more likely, only that it must gain *relative to the
# rejected one*. Three things then pull the chosen log-probability down in practice:
#
# - **Shared tokens.** A chosen and a rejected response of one prompt share most of their
#   tokens' kind: the same names, the same function words, the same line breaks. Pushing
#   the rejected response's tokens down pushes down what the chosen one shares with it.
#   In our pairs what sets the chosen response apart is one word; most of the 32 tokens
#   of each are ordinary Shakespeare.
# - **Probability mass must go somewhere.** Lowering many rejected responses frees
#   probability that need not land on the few chosen ones: the policy can put it on
#   responses that are neither, which costs the chosen ones nothing in the loss.
# - **Sums over long responses.** A response's log-probability is a sum of 32 token terms,
#   so a small loss of sharpness on every token (the model becoming a little less sure of
#   everything) adds up to nats, while the margin is won on a few tokens (the target word).
#
# So a falling chosen log-probability is not a bug, but it is a warning: the policy is
# moving mass off the reference's responses altogether, which is what the KL measures.
# The right panel above shows what our runs did, on the training pairs. On the training pairs, DPO raised the chosen responses a little (β = 0.3: from about −109 to −100 nats,
# smoothed) and pushed the rejected ones far down (to about −130; at β = 0.1 below −170). On
# the **held-out** pairs, which no run trained on, the table shows the other picture:
# *both* fell, the rejected more (β = 0.3: chosen −108.4 → −111.8 nats, rejected −108.5 →
# −115.1; β = 0.1: −136.7 and −143.3). Only the training pairs' chosen responses are
# learned by heart; on new responses of the reference, DPO mostly lowers the
# probability of everything that does not speak of love, and an ordinary chosen response
# (mostly ordinary tokens, and one word) shares in the loss.
# Fixes proposed for it add a term that keeps the chosen likelihood up: a supervised loss on
# the chosen responses (Pang et al., 2024) or a penalty when it falls (DPOP; Pal et
# al., 2024).

# %% [markdown]
# #| written reading_the_frontier points=2
# **Question.** From the table and the figure of the frontier: which $\beta$ would you
# choose to reach at least 30% of responses that speak of love with at most 5 nats of
# KL per response, and why? Does DPO buy more of the attribute per nat of KL than
# fine-tuning on the chosen responses, and what would you change to find out for sure?
# Answer in three to five sentences, with the numbers you read.
#
# Difficulty ●●○ · Importance ●●○ · about 10 minutes
#
# ### BEGIN SOLUTION
# *Model answer.* β = 1 (33% at 3.9 nats, Shakespeare 1.823 → 1.872) or β = 3 (34% at 3.7
# nats) meet both limits after 150 steps; β = 0.3 reaches 51% but at 7.0 nats, within the
# budget only if stopped near step 50 (40% at 4.7), and β = 0.1 drifts without stopping
# (40 nats). Up to about 4 nats SFT and DPO lie on one curve (SFT 32% at 3.4 nats), so for
# this target DPO buys no more per nat; past it DPO did better (at 5.8 nats 50% against
# SFT's 40%; at 8.6 nats 56% against 48%), and DPO's drift levels off by itself while
# SFT's keeps growing. To be sure: several seeds and sets of pairs, more held-out samples
# (the rates carry about ±2 points, the KL ±0.2 nats), evaluations at matched KL (more
# often, or by choosing the step), and other learning rates, since one rate serves all runs.
#
# *Grading:* 1 point for a β chosen with its measured rate and KL against the limits,
# 1 point for the SFT comparison read at comparable KL (not only the last points) with a
# way to settle it.
# ### END SOLUTION

# %% [markdown]
# ## Tee check
#
# > **The shirt:** DPO "bypasses the complex Reinforcement Learning loop (RLHF) by
# > directly optimizing the language model on human preference data".
#
# **What is right:** there is no reward model to train and no RL loop. Look at what one
# step of our training did: score a batch of fixed pairs under the policy and the
# reference, take `dpo_loss`, step AdamW. That is a **classification loss on pairs**: a
# logistic regression whose input is the pair's margin of log-ratios and whose label is
# "the first one was preferred". The reward is implicit in the policy
# ($\beta \log \pi_\theta / \pi_\text{ref}$, Exercise 3), and nothing is sampled during
# training. PPO would sample from the policy at every step, score the samples with a
# reward model, estimate advantages with a value network, and keep the update in a trust
# region: four models in memory (policy, reference, reward, value) against DPO's two.
#
# **What is loose:** "directly optimizing ... on preference data" hides what DPO still
# needs, each of which this chapter had to supply:
#
# - **a reference model**, frozen, run on every pair (our `frozen_reference`): DPO's loss
#   is defined relative to it, and drift is measured against it;
# - **preference data**: pairs on shared prompts, here sampled from the reference and
#   ranked by a program; with people, that is the expensive part of RLHF, and DPO needs it
#   just as much;
# - **a β that trades the attribute against drift**: the frontier above is that trade,
#   measured. Nothing in the loss measures the KL; we had to sample from the policy to see
#   it (Exercise 4).
#
# And "bypasses" is in one sense too generous: DPO optimizes the same KL-regularized
# objective as RLHF, derived in closed form, only on a fixed set of pairs rather than on
# fresh samples from the policy. Nor is it free next to supervised fine-tuning. Counted,
# one DPO step runs the policy forward and backward on two responses and the reference
# forward on two: about $2 \times 3 + 2 \times 1 = 8$ forward passes' worth of arithmetic
# against SFT's $1 \times 3 = 3$ (a backward pass costs about two forwards). The sweep's
# parts ran at different loads, so their seconds per step are not compared here.

# %% [markdown]
# ## What `minillm` gained
#
# `minillm.dpo`, the alignment module:
#
# - `response_logprobs` (Exercise 1) and `sequence_logprobs(model, ids, mask)`, the
#   log-probability of a response with the prompt and the padding masked;
# - `dpo_loss` (Exercise 2), `implicit_reward` (Exercise 3), `kl_estimate` (Exercise 4);
# - the preference data: `prompt_windows`, `sample_responses`, `response_mask`,
#   `preference_pairs` and `PreferencePairs` (the attribute they rank by, `uses_target`,
#   is in `minillm.tasks`);
# - training with chapter 07's `train(..., loss_fn=...)`: `frozen_reference`,
#   `PairBatches` (resumable), `dpo_objective(reference, beta)` and `sft_objective`;
# - measuring: `evaluate_policy` and `pair_metrics`; the sweep in `bench/dpo_frontier.py`.
#
# That completes the course's package: `minillm` tokenizes, embeds, attends, trains,
# samples, scales, caches, tiles, routes to experts, adapts with LoRA and now aligns with
# preferences, every piece written in a chapter and tested.
#
# ## Further reading
#
# - Bradley & Terry, *Rank Analysis of Incomplete Block Designs* (1952): the model of pairwise preferences.
# - Christiano et al., *Deep Reinforcement Learning from Human Preferences* (2017): a reward model from comparisons, then RL.
# - Schulman et al., *Proximal Policy Optimization Algorithms* (2017): the RL algorithm of RLHF.
# - Ziegler et al., *Fine-Tuning Language Models from Human Preferences* (2019), and Ouyang et al., *Training language models to follow instructions with human feedback* (2022): RLHF for language models, with the KL penalty.
# - Rafailov et al., *Direct Preference Optimization: Your Language Model is Secretly a Reward Model* (2023): this chapter's loss, and its reward-against-KL frontier on IMDb.
# - Azar et al., *A General Theoretical Paradigm to Understand Learning from Human Preferences* (2023): IPO, and why DPO overfits deterministic preferences.
# - Pal et al., *Smaug: Fixing Failure Modes of Preference Optimisation with DPO-Positive* (2024), and Pang et al., *Iterative Reasoning Preference Optimization* (2024): the falling chosen likelihood, and a fix.
# - Raschka, *Build a Large Language Model (From Scratch)*, DPO notebook (2024): DPO on GPT-2, with its loss starting at ln 2.
