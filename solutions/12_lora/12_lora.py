# %% [markdown]
# # Chapter 12 · LoRA: low-rank adaptation
#
# **Where this sits on the tee:** the Tech Band's *LoRA: Low-rank weight adapt*, which
# "freezes the original model weights and injects trainable rank decomposition matrices
# ... saving massive amounts of compute". It is the first of the two post-training
# chapters: we take chapter 07's shipped model, teach it a new dialect, and measure what
# the adapters buy against fine-tuning every weight.
#
# **You will be able to**
# - write a LoRA layer, $y = W x + \frac{\alpha}{r} B A x$, and say why $B$ starts at zero
#   and why the update is divided by $r$;
# - fold an adapter into its base weight and take it out again, exactly;
# - count the parameters an adapter trains, choose which matrices to adapt, and adapt the
#   q and v blocks of a fused Q/K/V projection;
# - ship a fine-tune as a file of adapters that names its base model;
# - measure LoRA against full fine-tuning on the same task: held-out loss, a task score,
#   trainable parameters, optimizer memory, time per step, and what each forgets.
#
# **Prerequisites:** chapter 07 (the GPT, `train`, the shipped model and its tokenizer)
# and chapter 04 (multi-head attention and its Q/K/V projection).
#
# **Time:** about 30 minutes of reading, 30 minutes of exercises (three coded, two written).
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
from minillm.model import GPT, GPTConfig

device = course.setup(seed=0)  # this chapter runs on the CPU whatever `device` says: its model is small
torch.set_num_threads(1)  # the model is small: one thread is as fast, and robust on a busy machine
QUICK = course.QUICK

# %% [markdown]
# Everything this chapter builds goes into the module `minillm/lora.py`. Its first cell
# holds the module's docstring and imports.

# %%
#| export minillm/lora.py
"""Low-rank adapters (LoRA) for ``minillm``'s models (chapter 12); the fine-tuning task is in ``minillm.tasks``.

- ``lora_update(x, lora_A, lora_B, alpha)``: the adapter's output, (alpha / r) x A^T B^T.
- ``LoRALinear(base, r, alpha, dropout=0.0)``: a frozen ``nn.Linear`` plus a trainable
  low-rank update; ``merge_weight`` folds the update into the base weight.
- ``apply_lora(model, r, alpha, targets=("q", "v"))``: wraps the linear maps of a model by
  role (``ROLES``), freezes everything else; ``merge_lora`` / ``unmerge_lora``;
  ``lora_parameter_count(config, r, targets)``, the parameters it adds.
- ``FusedLoRALinear``: adapters on row blocks of a fused Q/K/V Linear (the q and v of a
  default GPT), which ``apply_lora`` uses there.
- ``unfuse_qkv(model)``: a copy of a GPT whose fused Q/K/V projection is split into ``q``,
  ``k``, ``v`` (same function, same logits).
- ``save_lora`` / ``load_lora``: a checkpoint of the adapters alone, which names its base
  model by config and by a fingerprint of its weights (``base_fingerprint``).

Weight decay: ``minillm.optim.param_groups`` decays every trainable matrix, so the adapters'
A and B decay and the frozen base is left out. Decay pulls B A towards 0, that is, the
adapted model towards its base (full fine-tuning's decay pulls the weights towards 0).
"""
import dataclasses
import hashlib
import math

import torch
from torch import nn

from minillm.attention import MultiHeadAttention
from minillm.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from minillm.checks import number, positive_int, probability
from minillm.ffn import FeedForward, SwiGLU
from minillm.model import GPT, GPTConfig

# %% [markdown]
# ## Fine-tuning, and what it costs
#
# Chapter 07's model has read Shakespeare. To make it do something else (answer in a
# house style, speak a dialect, follow a format), the obvious move is to keep training
# it on examples of the new thing: **full fine-tuning**. Every weight moves, so every
# weight needs a gradient, and AdamW keeps two more numbers per weight (its moments). The
# result is a whole new copy of the model: one file per task, each as large as the base.
#
# Hu et al. (2021) bet that the *change* a fine-tune makes is simple even when the model
# is not: that $\Delta W$, the difference between the fine-tuned and the original weight
# matrix, has a low rank. So they freeze $W$ and learn $\Delta W$ in factored form:
#
# $$y = W x + \Delta W\, x, \qquad \Delta W = \frac{\alpha}{r}\, B A, \qquad
# A \in \mathbb{R}^{r \times d_\text{in}},\; B \in \mathbb{R}^{d_\text{out} \times r}.$$
#
# A matrix of $d_\text{out} \times d_\text{in}$ numbers is replaced, for training, by
# $r (d_\text{in} + d_\text{out})$ numbers. For one of our model's $128 \times 128$
# attention matrices and $r = 4$, that is 1,024 numbers instead of 16,384; for a
# $4096 \times 4096$ matrix of a 7B model, 32,768 instead of 16.8 million. The factor
# $\alpha / r$ is a fixed scale: $\alpha$ is chosen once, and dividing by $r$ keeps the
# size of the update about the same when $r$ changes (Exercise 1's tests show why that
# matters), so the learning rate need not be retuned for every rank.
#
# ## Low-rank adapters
#
# ### Exercise 1 · The adapter's output, with its scale
#
# Implement `lora_update(x, lora_A, lora_B, alpha)`: the update $\frac{\alpha}{r} B A x$
# for a batch of inputs `x` of shape `(..., in_features)`, with `lora_A` of shape
# `(r, in_features)` and `lora_B` of shape `(out_features, r)`, as `torch.nn.Linear`
# stores weights. The rank $r$ is `lora_A`'s first dimension. Multiply `x` by $A^\top$
# first: then the $d_\text{out} \times d_\text{in}$ product $B A$ is never formed, which is
# the point of the factorization. Raise a `ValueError` naming `lora_A`, `lora_B` or `x`
# when the shapes do not fit together. The result keeps `x`'s dtype.
#
# Difficulty ●○○ · Importance ●●● · about 8 minutes
#
# <details><summary>Hint 1</summary>For a row vector convention, <code>x @ lora_A.T</code> has shape <code>(..., r)</code>, and <code>@ lora_B.T</code> takes it to <code>(..., out_features)</code>.</details>
# <details><summary>Hint 2</summary>The scale is <code>alpha / r</code>, not <code>alpha</code>: with <code>alpha</code> alone the update grows with the rank.</details>
# <details><summary>Hint 3</summary>Check <code>lora_A.dim() == 2</code>, <code>lora_B.dim() == 2</code>, <code>lora_B.shape[1] == lora_A.shape[0]</code> and <code>x.shape[-1] == lora_A.shape[1]</code>; then <code>(alpha / r) * ((x @ lora_A.T) @ lora_B.T)</code>.</details>

# %%
#| answer lora_update
#| export minillm/lora.py
def lora_update(x: torch.Tensor, lora_A: torch.Tensor, lora_B: torch.Tensor, alpha: float) -> torch.Tensor:
    """The low-rank update of a LoRA layer: (alpha / r) (x A^T) B^T, with r = lora_A.shape[0].

    x: (..., in_features); lora_A: (r, in_features); lora_B: (out_features, r).
    Returns (..., out_features) in x's dtype. x A^T is computed first, so the
    (out_features, in_features) product B A is never formed. ``ValueError`` naming the
    argument when the shapes do not fit.
    """
    ### BEGIN SOLUTION
    if lora_A.dim() != 2 or lora_B.dim() != 2 or lora_B.shape[1] != lora_A.shape[0]:
        raise ValueError(f"lora_A must be (r, in_features) and lora_B (out_features, r), got "
                         f"{tuple(lora_A.shape)} and {tuple(lora_B.shape)}")
    if x.shape[-1] != lora_A.shape[1]:
        raise ValueError(f"x must have shape (..., in_features={lora_A.shape[1]}), got {tuple(x.shape)}")
    r = lora_A.shape[0]
    return (alpha / r) * ((x @ lora_A.T) @ lora_B.T)
    ### END SOLUTION

# %%
#| test lora_update_visible points=1
@course.visible_check("lora_update")
def check_lora_update(lora_update):
    """Rank 2, alpha 6, a batch of (2, 3) inputs of width 5 mapped to width 4."""
    x = torch.linspace(-1.0, 1.0, 30).reshape(2, 3, 5)
    lora_A = torch.linspace(-0.5, 0.7, 10).reshape(2, 5)
    lora_B = torch.linspace(0.3, -0.9, 8).reshape(4, 2)
    before = (x.clone(), lora_A.clone(), lora_B.clone())
    expected = torch.einsum("bsi,ri,or->bso", x, lora_A, lora_B) * (6.0 / 2)
    got = lora_update(x, lora_A, lora_B, 6.0)
    if not all(torch.equal(a, b) for a, b in zip(before, (x, lora_A, lora_B))):
        raise course.CheckFailed("lora_update changed one of its inputs in place: compute a new tensor instead")
    course.expect_close(got, expected, "lora_update(x, lora_A, lora_B, alpha=6) with r=2", mistakes={
        "the scale is alpha, not alpha / r: divide by the rank r = lora_A.shape[0]": expected * 2,
        "no scale at all: multiply by alpha / r": expected / 3,
        "the scale is r / alpha, upside down": expected / 9,
        "the scale is 1 / r (alpha left out)": expected / 6,
        "r read from lora_B.shape[0], which is out_features: the rank is lora_A.shape[0]": expected * 2 / 4,
        "r read from lora_A.shape[1], which is in_features: the rank is lora_A.shape[0]": expected * 2 / 5,
    }, hint="(alpha / r) * ((x @ lora_A.T) @ lora_B.T) with r = lora_A.shape[0]")
    if got.dtype != x.dtype:
        raise course.CheckFailed(f"lora_update returned {got.dtype} for {x.dtype} inputs: keep x's dtype")
    course.expect_raises(ValueError, lora_update, x, lora_A, lora_B[:, :1], 6.0, match="lora_B",
                         what="lora_update with lora_B of rank 1 and lora_A of rank 2",
                         hint="check lora_B.shape[1] == lora_A.shape[0] and name lora_B in the message")
    course.expect_raises(ValueError, lora_update, x[..., :4], lora_A, lora_B, 6.0, match="x",
                         what="lora_update with x of width 4 and lora_A of width 5",
                         hint="check x.shape[-1] == lora_A.shape[1] and name x in the message")


check_lora_update(lora_update)
print("lora_update: visible test passed")

# %%
#| test lora_update_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
for shape, d_in, d_out, r, alpha, dtype in [((7, 6), 6, 9, 3, 5.0, torch.float64), ((2, 3, 4, 8), 8, 3, 8, 16.0, torch.float32),
                                            ((1, 5), 5, 5, 1, 1.0, torch.float64), ((4, 16), 16, 12, 16, 2.0, torch.float32)]:
    x = torch.randn(*shape[:-1], d_in, dtype=dtype)
    A, B = torch.randn(r, d_in, dtype=dtype), torch.randn(d_out, r, dtype=dtype)
    got = lora_update(x, A, B, alpha)
    assert isinstance(got, torch.Tensor) and got.dtype == dtype, "lora_update must keep the dtype"
    course.expect_close(got, (alpha / r) * x @ (B @ A).T, "lora_update", atol=1e-5, rtol=1e-5)
# the defining property of the 1/r: a rank-1 update written with rank r (a's row and b's column repeated r
# times) has B A = r b a, and the scale alpha / r brings it back to the rank-1 update alpha b a
x, a, b = torch.randn(5, 10, dtype=torch.float64), torch.randn(1, 10, dtype=torch.float64), torch.randn(7, 1, dtype=torch.float64)
for r in (2, 4, 8):
    course.expect_close(lora_update(x, a.expand(r, 10).clone(), b.expand(7, r).clone(), 3.0), lora_update(x, a, b, 3.0),
                        "lora_update's scale is alpha / r (a rank-1 update written with a higher rank)", atol=1e-9)
# zero B: no update at all
course.expect_close(lora_update(torch.randn(3, 6), torch.randn(2, 6), torch.zeros(4, 2), 8.0), torch.zeros(3, 4),
                    "lora_update with lora_B = 0")
for bad, what, args in [("lora_B", "lora_update with a badly shaped lora_B", (torch.randn(2, 6), torch.randn(2, 6), torch.randn(4, 3), 1.0)),
                        ("lora_A", "lora_update with a badly shaped lora_A", (torch.randn(2, 6), torch.randn(6), torch.randn(4, 2), 1.0)),
                        ("x", "lora_update with a badly shaped x", (torch.randn(2, 5), torch.randn(2, 6), torch.randn(4, 2), 1.0))]:
    course.expect_raises(ValueError, lora_update, *args, match=bad, what=what)
# the text forbids forming the (out, in) product B A: with factors near 1e20 their product overflows
# float32, while x A^T (inputs near 1e-20) stays moderate, so only x A^T first gives a finite answer
signs = lambda *shape: torch.where(torch.rand(*shape) < 0.5, -1.0, 1.0)  # noqa: E731
x = 1e-20 * (1 + torch.rand(3, 6)) * signs(3, 6)
A, B = 1e20 * (1 + torch.rand(2, 6)) * signs(2, 6), 1e20 * (1 + torch.rand(5, 2)) * signs(5, 2)
got = lora_update(x, A, B, 2.0)
assert isinstance(got, torch.Tensor) and bool(torch.isfinite(got).all()), \
    "lora_update must multiply x by lora_A.T first: the product lora_B @ lora_A must never be formed"
course.expect_close(got.double(), (x.double() @ A.double().T) @ B.double().T, "lora_update with large factors",
                    atol=1e17, rtol=1e-3)
### END HIDDEN TESTS

# %%
from minillm import lora as reference_lora

adapter_update = course.keep_going("lora_update", lora_update, reference_lora.lora_update, check_lora_update)

# %% [markdown]
# The layer wraps a frozen `nn.Linear` and adds the update. $A$ is drawn the way
# `nn.Linear` draws its own weights; $B$ starts at zero, so at the start the layer computes
# exactly what its base does (the written question below asks why this way round). The
# base's marks (`minillm.markers`: attention's output projection is a *residual
# projection*) stay on the base, so the model's initialization still finds them.

# %%
#| export minillm/lora.py
class LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus a trainable low-rank update (Hu et al., 2021).

    y = base(x) + (alpha / r) B A dropout(x), with lora_A (r, in_features) drawn as
    ``nn.Linear`` draws its weights (uniform, bound 1 / sqrt(in_features)) and lora_B
    (out_features, r) zero: at the start the layer computes exactly what ``base`` does.
    base: the ``nn.Linear`` to adapt; its parameters are frozen (``requires_grad`` False)
    and keep its marks (``minillm.markers``), so the model's initialization still finds it.
    r: the rank; alpha: the scale of the update, which is multiplied by alpha / r so that
    a change of r needs no change of the learning rate. dropout: on the update's input,
    while training. x: (..., in_features) → (..., out_features).

    ``merge()`` adds the update into ``base.weight`` (the layer then costs what a plain
    Linear costs) and keeps the weight it replaced, so ``unmerge()`` restores the base bit
    for bit (a copy of the adapted weight is held while merged).
    blocks, adapted_rows: for a subclass that stacks the adapters of row blocks
    (``FusedLoRALinear``): lora_A is then (blocks r, in_features) and lora_B
    (adapted_rows, r); by default one adapter covers every output row.
    """

    def __init__(self, base: nn.Linear, r: int, alpha: float, dropout: float = 0.0, *, blocks: int = 1,
                 adapted_rows: int | None = None):
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise TypeError(f"base must be a torch.nn.Linear, got {type(base).__name__}")
        positive_int("r", r)
        number("alpha", alpha, low=0.0, low_open=True)
        probability("dropout", dropout)
        self.base, self.r, self.alpha = base, r, float(alpha)
        base.requires_grad_(False)
        factory = dict(device=base.weight.device, dtype=base.weight.dtype)
        rows = base.out_features if adapted_rows is None else adapted_rows
        self.lora_A = nn.Parameter(torch.empty(blocks * r, base.in_features, **factory))
        self.lora_B = nn.Parameter(torch.zeros(rows, r, **factory))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # nn.Linear's own draw (fan-in: in_features)
        self.dropout = nn.Dropout(dropout)
        # while merged, the base weight as it was: unmerge restores it bit for bit (W + BA - BA
        # is W only up to rounding, and an adapter file names its base by exact bytes)
        self.register_buffer("unmerged_weight", None, persistent=False)

    @property
    def merged(self) -> bool:
        return self.unmerged_weight is not None

    @property
    def scaling(self) -> float:
        return self.alpha / self.r

    def extra_repr(self) -> str:
        return f"r={self.r}, alpha={self.alpha:g}, merged={self.merged}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., in_features) → (..., out_features): base(x) plus the update (unless merged)."""
        if self.merged:
            return self.base(x)
        return self.base(x) + lora_update(self.dropout(x), self.lora_A, self.lora_B, self.alpha)

    @torch.no_grad()
    def merge(self) -> None:
        """Fold the update into ``base.weight`` (``merge_weight``); ``ValueError`` when merged already."""
        if self.merged:
            raise ValueError("this LoRALinear is merged already")
        self.unmerged_weight = self.base.weight.detach().clone()
        self.base.weight.copy_(self.merged_weight())

    def merged_weight(self) -> torch.Tensor:
        """The (out_features, in_features) weight of a plain Linear equal to this layer."""
        return merge_weight(self.base.weight, self.lora_A, self.lora_B, self.alpha)

    @torch.no_grad()
    def unmerge(self) -> None:
        """Restore ``base.weight`` as it was before ``merge``, bit for bit; ``ValueError`` when not merged."""
        if not self.merged:
            raise ValueError("this LoRALinear is not merged")
        self.base.weight.copy_(self.unmerged_weight)
        self.unmerged_weight = None

# %%
torch.manual_seed(0)
linear = torch.nn.Linear(128, 128)
layer = reference_lora.LoRALinear(linear, r=4, alpha=8.0)
inputs = torch.randn(3, 128)
print(f"trainable: {[name for name, p in layer.named_parameters() if p.requires_grad]}, frozen: "
      f"{[name for name, p in layer.named_parameters() if not p.requires_grad]}")
print(f"at the start, the layer equals its base exactly: {torch.equal(layer(inputs), linear(inputs))}")
print(f"{sum(p.numel() for p in layer.parameters() if p.requires_grad):,} trainable numbers instead of "
      f"{linear.weight.numel() + linear.bias.numel():,}")

# %% [markdown]
# #| written zero_init points=2
# **Question.** `LoRALinear` draws $A$ at random and sets $B = 0$. What goes wrong if
# both start at zero? If both start random? Would $A = 0$ with $B$ random work as well?
# Answer in three to five sentences, using the gradients of the loss with respect to $A$
# and $B$.
#
# ### BEGIN SOLUTION
# *Model answer.* With $B = 0$ the update $BA$ is zero, so the fine-tune starts exactly at
# the base model (its loss, its behaviour), and yet it can learn: the gradient with
# respect to $B$ is $\frac{\alpha}{r}\, g\, (A x)^\top$, non-zero because $A$ is random
# ($g$ is the gradient at the layer's output). If both were zero, both gradients would be
# zero ($\nabla_A \propto B^\top g x^\top$, $\nabla_B \propto g (Ax)^\top$): a saddle point
# the optimizer never leaves. If both were random, the model would start with a random
# perturbation of every adapted weight: the pretrained behaviour is damaged before the
# first step, and the early steps are spent undoing noise. $A = 0$ with $B$ random is the
# mirror image and also starts at the base model with a non-zero gradient (now for $A$);
# it works, and which factor is zero is a convention (the paper zeroes $B$, so the first
# steps move $B$ along the random directions of the input that $A$ projects onto).
#
# *Grading:* 1 point for "both zero: zero gradients, stuck", 1 point for "both random:
# the start is not the base model" (or for the symmetric $A = 0$ argument with its reason).
# ### END SOLUTION

# %% [markdown]
# ## Merging the adapter into the weight
#
# After training, the update can be folded into the base weight once and for all:
#
# $$W' = W + \frac{\alpha}{r} B A.$$
#
# The merged layer is a plain `nn.Linear` again, so the fine-tuned model costs exactly
# what the base costs at inference: no extra matrix products, no latency. Keeping $W$ aside
# lets us *unmerge* too, back to $W$ exactly, to switch the adapter off or
# swap in another one (one base model in memory, many small adapters).
#
# ### Exercise 2 · Merge
#
# Implement `merge_weight(weight, lora_A, lora_B, alpha)`: the weight of the plain Linear
# that computes what the LoRA layer computes, $W + \frac{\alpha}{r} B A$, as a new tensor
# (`weight` itself must not change: the layer copies the result into its base). Raise a
# `ValueError` naming `weight` when its shape is not `(out_features, in_features)` of the
# adapter, and one naming `lora_A` or `lora_B` when those two do not fit together. The result
# is in `weight`'s dtype even when the factors are kept in a wider one (a bfloat16 base with
# float32 adapters): it is copied into the base.
#
# Difficulty ●○○ · Importance ●●○ · about 6 minutes
#
# <details><summary>Hint 1</summary><code>lora_B @ lora_A</code> has shape <code>(out_features, in_features)</code>, the weight's shape.</details>
# <details><summary>Hint 2</summary><code>weight += ...</code> changes the caller's tensor; <code>weight + ...</code> makes a new one.</details>
# <details><summary>Hint 3</summary>A bfloat16 weight plus a float32 product is float32: <code>.to(weight.dtype)</code> at the end.</details>

# %%
#| answer merge_weight
#| export minillm/lora.py
def merge_weight(weight: torch.Tensor, lora_A: torch.Tensor, lora_B: torch.Tensor, alpha: float) -> torch.Tensor:
    """The weight of one plain Linear equal to a LoRA layer: W + (alpha / r) B A, r = lora_A.shape[0].

    weight: (out_features, in_features); lora_A: (r, in_features); lora_B: (out_features, r).
    Returns a new (out_features, in_features) tensor in weight's dtype (weight is not changed).
    """
    ### BEGIN SOLUTION
    if lora_A.dim() != 2 or lora_B.dim() != 2 or lora_B.shape[1] != lora_A.shape[0]:
        raise ValueError(f"lora_A must be (r, in_features) and lora_B (out_features, r), got "
                         f"{tuple(lora_A.shape)} and {tuple(lora_B.shape)}")
    if weight.shape != (lora_B.shape[0], lora_A.shape[1]):
        raise ValueError(f"weight must have shape (out_features, in_features) = "
                         f"{(lora_B.shape[0], lora_A.shape[1])}, got {tuple(weight.shape)}")
    r = lora_A.shape[0]
    return (weight + (alpha / r) * (lora_B @ lora_A)).to(weight.dtype)  # factors may be wider than the weight
    ### END SOLUTION

# %%
#| test merge_weight_visible points=1
@course.visible_check("merge_weight")
def check_merge_weight(merge_weight):
    """A (4, 5) weight with an adapter of rank 2 and alpha 6: the merged Linear must compute
    what the base plus the adapter computes."""
    weight = torch.linspace(-1.0, 1.0, 20).reshape(4, 5)
    lora_A = torch.linspace(-0.5, 0.7, 10).reshape(2, 5)
    lora_B = torch.linspace(0.3, -0.9, 8).reshape(4, 2)
    x = torch.linspace(-2.0, 2.0, 15).reshape(3, 5)
    kept = weight.clone()
    merged = merge_weight(weight, lora_A, lora_B, 6.0)
    if not torch.equal(weight, kept):
        raise course.CheckFailed("merge_weight changed weight in place (weight += ...): return a new tensor, "
                                 "weight + (alpha / r) * (lora_B @ lora_A)")
    expected = weight + 3.0 * lora_B @ lora_A
    course.expect_close(merged, expected, "merge_weight(weight, lora_A, lora_B, alpha=6) with r=2", mistakes={
        "the scale is alpha, not alpha / r": weight + 6.0 * lora_B @ lora_A,
        "the scale is missing": weight + lora_B @ lora_A,
        "the weight is left out: that is the update alone, B A times the scale": 3.0 * lora_B @ lora_A,
        "subtracted instead of added (that is unmerging)": weight - 3.0 * lora_B @ lora_A,
        "r read from lora_B.shape[0], which is out_features: the rank is lora_A.shape[0]": weight + 1.5 * lora_B @ lora_A,
    })
    course.expect_close(x @ merged.T, x @ weight.T + 3.0 * (x @ lora_A.T) @ lora_B.T,
                        "a Linear with the merged weight against the base plus the adapter")
    course.expect_raises(ValueError, merge_weight, weight[:, :4], lora_A, lora_B, 6.0, match="weight",
                         what="merge_weight with a (4, 4) weight for an adapter of (4, 5)")
    course.expect_raises(ValueError, merge_weight, weight, lora_A, lora_B[:, :1], 6.0, match="lora_",
                         what="merge_weight with lora_B of rank 1 and lora_A of rank 2")


check_merge_weight(merge_weight)
print("merge_weight: visible test passed")

# %%
#| test merge_weight_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
for d_out, d_in, r, alpha, dtype in [(9, 6, 3, 5.0, torch.float64), (3, 8, 8, 16.0, torch.float32), (5, 5, 1, 1.0, torch.float64),
                                     (12, 16, 16, 2.0, torch.float32)]:
    W, A, B = torch.randn(d_out, d_in, dtype=dtype), torch.randn(r, d_in, dtype=dtype), torch.randn(d_out, r, dtype=dtype)
    kept = W.clone()
    got = merge_weight(W, A, B, alpha)
    assert torch.equal(W, kept), "merge_weight must not change weight in place"
    assert isinstance(got, torch.Tensor) and got.dtype == dtype, "merge_weight must keep the dtype"
    course.expect_close(got, W + (alpha / r) * torch.einsum("or,ri->oi", B, A), "merge_weight",
                        atol=1e-5, rtol=1e-5)
    x = torch.randn(4, d_in, dtype=dtype)
    course.expect_close(x @ got.T, x @ W.T + (alpha / r) * (x @ A.T) @ B.T, "merged Linear equals base + adapter",
                        atol=1e-4, rtol=1e-4)
    # merging -B undoes the merge (unmerging)
    course.expect_close(merge_weight(got, A, -B, alpha), W, "merging B and then -B gives the weight back",
                        atol=1e-4, rtol=1e-4)
for bad, what, args in [("weight", "merge_weight with a badly shaped weight", (torch.randn(4, 6), torch.randn(2, 5), torch.randn(4, 2), 1.0)),
                        ("weight", "merge_weight with a badly shaped weight", (torch.randn(3, 5), torch.randn(2, 5), torch.randn(4, 2), 1.0)),
                        ("lora_", "merge_weight with lora_A and lora_B of different ranks", (torch.randn(4, 5), torch.randn(2, 5), torch.randn(4, 3), 1.0))]:
    course.expect_raises(ValueError, merge_weight, *args, match=bad, what=what)
# the result is in the weight's dtype when the factors are wider (a half-precision base, float32 adapters)
for w_dtype, f_dtype in [(torch.bfloat16, torch.float32), (torch.float16, torch.float32), (torch.float32, torch.float64)]:
    W, A, B = torch.randn(6, 5, dtype=w_dtype), torch.randn(2, 5, dtype=f_dtype), torch.randn(6, 2, dtype=f_dtype)
    got = merge_weight(W, A, B, 4.0)
    assert isinstance(got, torch.Tensor) and got.dtype == w_dtype, "merge_weight must return a tensor in the weight's dtype"
    course.expect_close(got.double(), W.double() + 2.0 * (B.double() @ A.double()), "merge_weight with wider factors",
                        atol=0.1, rtol=0.02)
### END HIDDEN TESTS

# %%
weight_merge = course.keep_going("merge_weight", merge_weight, reference_lora.merge_weight, check_merge_weight)

# %% [markdown]
# `LoRALinear.merge` copies `merge_weight`'s result into its base and from then on skips
# the adapter. `unmerge` could merge $-B$, but $(W + \Delta) - \Delta$ is $W$ only up to
# rounding, and an adapter file names its base by the exact bytes of its weights (below).
# So `merge` keeps the weight it replaces and `unmerge` copies it back. Merged and
# unmerged layers agree to float rounding; the weight after a round trip is the original:

# %%
with torch.no_grad():
    layer.lora_B.normal_()  # as if trained
    unmerged, original = layer(inputs), linear.weight.clone()
    layer.merge()
    merged = layer(inputs)
    layer.unmerge()
print(f"merged against unmerged output: largest difference {(merged - unmerged).abs().max():.1e}")
print(f"weight after merge and unmerge: largest difference {(linear.weight - original).abs().max():.1e}, "
      f"bit for bit the original: {torch.equal(linear.weight, original)}")

# %% [markdown]
# ## Choosing targets
#
# A Transformer block has seven matrices LoRA could adapt. `apply_lora` names them by
# their *role*, whatever the module is called:
#
# | role | matrix | shape (out, in) in our model |
# | --- | --- | --- |
# | `q`, `k`, `v` | attention's query, key and value projections | (128, 128) each |
# | `o` | attention's output projection (`MultiHeadAttention.out`) | (128, 128) |
# | `w1`, `w3` | SwiGLU's gate and value matrices | (352, 128) each |
# | `w2` | the FFN's down-projection | (128, 352) |
#
# The groups `"attention"`, `"ffn"` and `"all"` name several at once. The paper adapted
# $W_q$ and $W_v$ only, and that is `apply_lora`'s default; later work (QLoRA, 2023) found
# that adapting every linear layer matters more than the rank. The embedding table is not
# a target here: an adapter on attention and the FFN cannot change which vector a token
# starts from, so a task that only renames tokens would be a poor test of it.
#
# **A fused projection.** Chapter 04's `MultiHeadAttention` computes Q, K
# and V with one `qkv` Linear, three blocks of rows $[W_Q; W_K; W_V]$, because one large
# matrix product is faster than three small ones. An adapter on that Linear would adapt
# all three together, with one shared rank. So in a fused model `apply_lora` wraps `qkv` in
# a `FusedLoRALinear` (loralib's `MergedLinear` does the same): one adapter of rank $r$ per
# targeted block of rows, $q$ and $v$ by default, and the $k$ rows untouched. With
# grouped-query attention the $k$ and $v$ blocks have `n_kv_heads * head_dim` rows, fewer
# than $q$'s. The other way is `unfuse_qkv`, which copies the three blocks into separate
# `q`, `k`, `v` Linears; the function is the same, so the logits agree (the cell below
# measures the largest difference), and the rest of this chapter uses it.

# %%
#| export minillm/lora.py
ROLES = {
    "q": "attention's query projection (MultiHeadAttention.q)",
    "k": "attention's key projection (MultiHeadAttention.k)",
    "v": "attention's value projection (MultiHeadAttention.v)",
    "o": "attention's output projection (MultiHeadAttention.out)",
    "w1": "the FFN's first matrix (the gate of SwiGLU)",
    "w2": "the FFN's last matrix, its down-projection",
    "w3": "SwiGLU's value matrix",
}
"""The roles a LoRA target names, and what each is. ``GROUPS`` names sets of them."""
GROUPS = {"attention": ("q", "k", "v", "o"), "ffn": ("w1", "w2", "w3"), "all": tuple(ROLES)}
_ATTENTION_NAMES = {"q": ("q",), "k": ("k",), "v": ("v",), "out": ("o",), "qkv": ("q", "k", "v")}


def _roles(parent: nn.Module, name: str) -> tuple[str, ...]:
    """The roles that the child ``name`` of ``parent`` computes (a fused ``qkv``: three)."""
    if isinstance(parent, MultiHeadAttention):
        return _ATTENTION_NAMES.get(name, ())
    if isinstance(parent, (FeedForward, SwiGLU)) and name in GROUPS["ffn"]:
        return (name,)
    return ()


def qkv_rows(attention: MultiHeadAttention, roles) -> dict[str, tuple[int, int]]:
    """The output rows (start, stop) of each of ``roles`` in a fused ``qkv`` weight, [W_Q; W_K; W_V]:
    q has d_model rows, k and v n_kv_heads * head_dim each (fewer with grouped-query attention)."""
    d, kv = attention.d_model, attention.n_kv_heads * attention.head_dim
    rows = {"q": (0, d), "k": (d, d + kv), "v": (d + kv, d + 2 * kv)}
    return {role: rows[role] for role in roles}


def _target_names(targets) -> tuple[str, ...]:
    """``targets`` as a tuple of role and group names, each checked."""
    if isinstance(targets, str):
        targets = (targets,)
    try:
        targets = tuple(targets)
    except TypeError:
        raise TypeError(f"targets must be a role name or a sequence of them, got {type(targets).__name__}") from None
    for target in targets:
        if target not in ROLES and target not in GROUPS:
            raise ValueError(f"targets holds {target!r}, which is neither a role {tuple(ROLES)} nor a group "
                             f"{tuple(GROUPS)}")
    if not targets:
        raise ValueError("targets is empty: name at least one role")
    return targets


def lora_targets(model: nn.Module, targets=("q", "v")) -> list[tuple[str, str]]:
    """The (module name, role) of every ``nn.Linear`` of ``model`` that ``apply_lora`` wraps.

    targets: a role of ``ROLES``, a group of ``GROUPS`` ("attention", "ffn", "all": the
    roles of the group that the model has), or a sequence of them. In a model whose attention
    is fused, q, k and v name the one ``qkv`` Linear, once per role (``apply_lora`` adapts
    their row blocks). ``ValueError`` for an unknown name, and for a role named on its own
    that the model lacks (w3 in a GELU network).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    names = _target_names(targets)
    required = {name for name in names if name in ROLES}
    wanted = required.union(*(GROUPS[name] for name in names if name in GROUPS))
    found, seen = [], set()
    for parent_name, parent in model.named_modules():
        for name, child in parent.named_children():
            if not isinstance(child, (nn.Linear, LoRALinear)):
                continue
            for role in _roles(parent, name):
                if role in wanted:
                    found.append((f"{parent_name}.{name}" if parent_name else name, role))
                    seen.add(role)
    missing = sorted(required - seen)
    if missing or not found:
        raise ValueError(f"targets {missing or list(names)} match no layer of this model "
                         f"(it has {sorted(seen) or 'none of them'})")
    return found


class FusedLoRALinear(LoRALinear):
    """LoRA on row blocks of one fused Linear, as loralib's ``MergedLinear``: each block gets
    its own rank-r adapter, the other rows none (the q and v of a fused Q/K/V projection).

    rows: {role: (start, stop)}, output rows of ``base``, not overlapping. lora_A stacks the
    blocks' A, (n_blocks r, in_features); lora_B stacks their B, (rows adapted, r); so the
    parameters are those of one adapter per block. x: (..., in_features) → (..., out_features).
    """

    def __init__(self, base: nn.Linear, r: int, alpha: float, dropout: float = 0.0, *, rows: dict):
        spans = sorted(rows.values()) if isinstance(rows, dict) else []
        if isinstance(base, nn.Linear) and (  # checked before the base is frozen; a wrong base is the parent's error
                not spans or any(not 0 <= start < stop <= base.out_features for start, stop in spans)
                or any(stop > start for (_, stop), (start, _) in zip(spans, spans[1:]))):
            raise ValueError(f"rows must map roles to (start, stop) output rows of base within "
                             f"[0, {base.out_features}], not overlapping, got {rows!r}")
        super().__init__(base, r, alpha, dropout, blocks=len(spans),
                         adapted_rows=sum(stop - start for start, stop in spans))
        self.rows = dict(sorted(rows.items(), key=lambda item: item[1]))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rows={self.rows}"

    def blocks(self):
        """(start, stop, A (r, in_features), B (stop - start, r)) of each adapted block, in row order."""
        at = 0
        for i, (start, stop) in enumerate(self.rows.values()):
            yield start, stop, self.lora_A[i * self.r:(i + 1) * self.r], self.lora_B[at:at + stop - start]
            at += stop - start

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        if self.merged:
            return y
        x, pieces, at = self.dropout(x), [], 0
        for start, stop, lora_A, lora_B in self.blocks():
            pieces += [y[..., at:start], y[..., start:stop] + lora_update(x, lora_A, lora_B, self.alpha)]
            at = stop
        return torch.cat(pieces + [y[..., at:]], dim=-1)

    def merged_weight(self) -> torch.Tensor:
        weight = self.base.weight.clone()
        for start, stop, lora_A, lora_B in self.blocks():
            weight[start:stop] = merge_weight(weight[start:stop], lora_A, lora_B, self.alpha)
        return weight


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    """Every ``LoRALinear`` of ``model``, by module name."""
    return {name: module for name, module in model.named_modules() if isinstance(module, LoRALinear)}


def apply_lora(model: nn.Module, r: int, alpha: float, targets=("q", "v"), dropout: float = 0.0) -> nn.Module:
    """Freeze ``model`` and wrap the linear maps of ``targets`` in ``LoRALinear`` (in place); returns it.

    targets: as ``lora_targets`` takes them. After the call, only the adapters' lora_A and
    lora_B train; the model's output is unchanged until they do (B starts at zero). A fused
    ``qkv`` Linear becomes a ``FusedLoRALinear`` with one adapter per targeted block (q and v
    by default; k's rows stay untouched), so the defaults work on a default GPT.
    ``ValueError`` when the model has adapters already (``lora_layers``).
    """
    positive_int("r", r)
    number("alpha", alpha, low=0.0, low_open=True)
    probability("dropout", dropout)
    if lora_layers(model):
        raise ValueError("model has LoRA adapters already: apply_lora wraps a model once")
    roles = {}
    for name, role in lora_targets(model, targets):
        roles.setdefault(name, []).append(role)
    model.requires_grad_(False)
    for name, these in roles.items():
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        base = getattr(parent, child)
        if child == "qkv" and isinstance(parent, MultiHeadAttention):
            layer = FusedLoRALinear(base, r, alpha, dropout, rows=qkv_rows(parent, these))
        else:
            layer = LoRALinear(base, r, alpha, dropout)
        setattr(parent, child, layer)
    return model


def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every adapter of ``model`` into its base weight (``LoRALinear.merge``); returns the model.

    The merged model computes what the adapted one did, at the cost of the plain model.
    ``ValueError`` when it has no adapters, or they are merged already.
    """
    layers = _unmerged_state(model, merged=False)
    for layer in layers.values():
        layer.merge()
    return model


def unmerge_lora(model: nn.Module) -> nn.Module:
    """Take every adapter out of its base weight again (``LoRALinear.unmerge``); returns the model.

    The base weights come back bit for bit (each layer kept them). ``ValueError`` when the model has no
    adapters, or they are not merged.
    """
    layers = _unmerged_state(model, merged=True)
    for layer in layers.values():
        layer.unmerge()
    return model


def _unmerged_state(model: nn.Module, merged: bool) -> dict[str, LoRALinear]:
    layers = lora_layers(model)
    if not layers:
        raise ValueError("model has no LoRA adapters (apply_lora adds them)")
    wrong = [name for name, layer in layers.items() if layer.merged != merged]
    if wrong:
        raise ValueError(f"the adapters of {wrong[:3]} are {'not ' if merged else ''}merged")
    return layers

# %%
from minillm.recipe import load_pretrained

import copy

shipped, tokenizer = load_pretrained()
fused_adapted = reference_lora.apply_lora(copy.deepcopy(shipped), r=4, alpha=8.0)  # the defaults: q and v
print(fused_adapted.blocks[0].attn.qkv)
base_model = reference_lora.unfuse_qkv(shipped)
ids = torch.tensor([tokenizer.encode("ROMEO:\nBut soft, what light through yonder window breaks?")])
with torch.no_grad():
    difference = (base_model(ids)[0] - shipped(ids)[0]).abs().max()
print(f"unfused against fused logits: largest difference {difference:.1e}")
print(base_model.blocks[0].attn)

# %% [markdown]
# ### Exercise 3 · Counting what trains
#
# Implement `lora_parameter_count(config, r, targets)`: how many parameters
# `apply_lora(GPT(config), r, alpha, targets)` adds (they are the only ones that train).
# An adapter on a Linear with `in_features` inputs and `out_features` outputs adds
# $r\,(d_\text{in} + d_\text{out})$; every one of the `config.n_layers` blocks has one
# Linear of each role. The shapes come from the config: `q` and `o` map `d_model` to
# `d_model`; `k` and `v` map `d_model` to `n_kv_heads * head_dim` (smaller with
# grouped-query attention); `w1` and `w3` map `d_model` to `d_ff`, and `w2` maps `d_ff`
# back. `targets` is a tuple of role names (the package's version also takes the groups). Raise a
# `ValueError` naming `targets` for a name that is not a role, and for `w3` when the
# config's FFN is not `"swiglu"` (only SwiGLU has a third matrix).
#
# Difficulty ●●○ · Importance ●●○ · about 10 minutes
#
# <details><summary>Hint 1</summary>Make a dict from each role to its <code>(d_in, d_out)</code>, then sum <code>r * (d_in + d_out)</code> over the targets and multiply by <code>config.n_layers</code>.</details>
# <details><summary>Hint 2</summary><code>config.n_kv_heads</code> and <code>config.head_dim</code> are fields of the config; <code>config.d_ff</code> is the FFN's real hidden width.</details>

# %%
#| answer lora_parameter_count
#| export minillm/lora.py
def lora_parameter_count(config: GPTConfig, r: int, targets=("q", "v")) -> int:
    """The parameters ``apply_lora(GPT(config), r, alpha, targets)`` adds (and trains).

    A LoRA layer on a Linear of in_features inputs and out_features outputs adds
    r (in_features + out_features): lora_A (r, in) and lora_B (out, r). Per block: q and o
    map d_model → d_model; k and v d_model → n_kv_heads head_dim; w1 (and w3, SwiGLU's
    only) d_model → d_ff; w2 d_ff → d_model. ``ValueError`` as ``lora_targets`` raises it
    (a fused Q/K/V projection gets the same count: one adapter per block).
    """
    ### BEGIN SOLUTION
    if not isinstance(config, GPTConfig):
        raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
    positive_int("r", r)
    kv = config.n_kv_heads * config.head_dim
    shapes = {"q": (config.d_model, config.d_model), "k": (config.d_model, kv), "v": (config.d_model, kv),
              "o": (config.d_model, config.d_model), "w1": (config.d_model, config.d_ff),
              "w2": (config.d_ff, config.d_model), "w3": (config.d_model, config.d_ff)}
    with torch.device("meta"):  # the roles this config's model has, and lora_targets' errors
        roles = {role for _, role in lora_targets(GPT(dataclasses.replace(config, fused_qkv=False)), targets)}
    return config.n_layers * sum(r * sum(shapes[role]) for role in roles)
    ### END SOLUTION

# %%
#| test lora_parameter_count_visible points=1
@course.visible_check("lora_parameter_count", lora_update=reference_lora.lora_update,
                      merge_weight=reference_lora.merge_weight)  # LoRALinear calls them
def check_lora_parameter_count(lora_parameter_count):
    """Against the adapters a real model gets, on the shipped model's shape and a small GQA config."""
    shipped_shape = GPTConfig(vocab_size=2048, context_length=128, d_model=128, n_layers=4, n_heads=4, positions="rope",
                              norm="rmsnorm", ffn="swiglu", bias=False, fused_qkv=False)
    gqa = GPTConfig(vocab_size=50, context_length=16, d_model=48, n_layers=3, n_heads=6, n_kv_heads=2, ffn="gelu",
                    d_ff=80, fused_qkv=False)
    for config, r, targets in [(shipped_shape, 4, ("q", "v")), (shipped_shape, 2, ("q", "k", "v", "o", "w1", "w2", "w3")),
                               (gqa, 3, ("k", "v")), (gqa, 1, ("q", "o", "w1", "w2"))]:
        with torch.random.fork_rng():
            model = reference_lora.apply_lora(GPT(config), r, 1.0, targets)
        expected = sum(p.numel() for p in model.parameters() if p.requires_grad)
        a_only = sum(layer.lora_A.numel() for layer in reference_lora.lora_layers(model).values())
        kv_rows = sum(config.d_model - config.n_kv_heads * config.head_dim for role in targets if role in ("k", "v"))
        no_gqa = expected + config.n_layers * r * kv_rows  # k and v sized as d_model → d_model
        course.expect_equal(lora_parameter_count(config, r, targets), expected,
                            f"lora_parameter_count(d_model={config.d_model}, n_kv_heads={config.n_kv_heads}, "
                            f"d_ff={config.d_ff}, n_layers={config.n_layers}, r={r}, targets={targets})",
                            mistakes={"the count of one block: multiply by config.n_layers": expected // config.n_layers,
                                      "r * d_in only: lora_B's (d_out, r) numbers are missing": a_only,
                                      "k and v sized d_model → d_model: with grouped-query attention they map to "
                                      "n_kv_heads * head_dim": no_gqa})
    course.expect_raises(ValueError, lora_parameter_count, gqa, 2, ("q", "w3"), match="targets",
                         what="lora_parameter_count with w3 on a GELU network (it has no third matrix)")
    course.expect_raises(ValueError, lora_parameter_count, gqa, 2, ("query",), match="targets",
                         what="lora_parameter_count with the unknown role 'query'")


check_lora_parameter_count(lora_parameter_count)
print("lora_parameter_count: visible test passed")

# %%
#| test lora_parameter_count_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
roles = ("q", "k", "v", "o", "w1", "w2", "w3")
for trial in range(6):
    n_kv = int(torch.randint(1, 4, ()))
    n_heads = n_kv * int(torch.randint(1, 4, ()))
    ffn = ("swiglu", "gelu", "relu")[trial % 3]
    config = GPTConfig(vocab_size=40, context_length=8, d_model=8 * n_heads, n_layers=int(torch.randint(1, 5, ())),
                       n_heads=n_heads, n_kv_heads=n_kv, ffn=ffn, d_ff=int(torch.randint(8, 40, ())), fused_qkv=False)
    usable = roles if ffn == "swiglu" else roles[:-1]
    chosen = tuple(role for role in usable if torch.rand(()) < 0.5) or ("v",)
    r = int(torch.randint(1, 9, ()))
    adapted = reference_lora.apply_lora(GPT(config), r, 1.0, chosen)
    course.expect_equal(lora_parameter_count(config, r, chosen), reference_lora.trainable_parameters(adapted),
                        "lora_parameter_count of a random model and targets")
config = GPTConfig(vocab_size=40, context_length=8, d_model=16, n_layers=2, n_heads=2, ffn="relu", d_ff=24, fused_qkv=False)
for bad in [("w3",), ("q", "up"), ("v", "w3")]:
    course.expect_raises(ValueError, lora_parameter_count, config, 2, bad, match="targets",
                         what="lora_parameter_count with targets that are not valid")
### END HIDDEN TESTS

# %%
parameter_count = course.keep_going("lora_parameter_count", lora_parameter_count, reference_lora.lora_parameter_count,
                                    check_lora_parameter_count)
config = base_model.config
total = sum(p.numel() for p in base_model.parameters())
print(f"the shipped model: {total:,} parameters")
for r in (1, 2, 4, 8, 16):
    qv, every = parameter_count(config, r, ("q", "v")), parameter_count(config, r, reference_lora.GROUPS["all"])
    print(f"r = {r:2d}: q,v {qv:7,} ({100 * qv / (total + qv):5.2f}%)   "
          f"all linears {every:7,} ({100 * every / (total + every):5.2f}%)")

# %% [markdown]
# Two small measurements help below: the parameters that train, and the bytes AdamW keeps
# for them (two moments of the parameter's size, and a step count).

# %%
#| export minillm/lora.py
def trainable_parameters(model: nn.Module) -> int:
    """The number of parameters of ``model`` that train (``requires_grad``); a shared one counts once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the tensors an optimizer keeps per parameter (AdamW: two moments, and a step count)."""
    return sum(value.numel() * value.element_size() for state in optimizer.state.values()
               for value in state.values() if isinstance(value, torch.Tensor))


def unfuse_qkv(model: GPT) -> GPT:
    """A copy of ``model`` with separate ``q``, ``k``, ``v`` Linears in every attention layer.

    The fused ``qkv`` weight's rows are [W_Q; W_K; W_V] (``MultiHeadAttention``); the copy
    gets those blocks as its three weights (and biases), so it computes the same logits.
    Its config is the model's with ``fused_qkv=False``; the global random generator is
    left as it was. ``ValueError`` when the model has LoRA adapters (unfuse first).
    """
    if not isinstance(model, GPT):
        raise TypeError(f"model must be a minillm GPT, got {type(model).__name__}")
    if lora_layers(model):
        raise ValueError("model has LoRA adapters: unfuse the base model first, then apply_lora")
    config = dataclasses.replace(model.config, fused_qkv=False)
    parameter = next(model.parameters())
    with torch.random.fork_rng(devices=[]):  # GPT() draws its initial weights, which are overwritten
        unfused = GPT(config).to(device=parameter.device, dtype=parameter.dtype)
    width = [config.d_model, config.n_kv_heads * config.head_dim, config.n_kv_heads * config.head_dim]
    state = {}
    for key, value in model.state_dict().items():
        prefix, _, kind = key.rpartition(".")
        if prefix.endswith(".qkv"):
            for name, block in zip("qkv", value.split(width, dim=0)):
                state[f"{prefix[:-3]}{name}.{kind}"] = block
        else:
            state[key] = value
    unfused.load_state_dict(state)
    return unfused.train(model.training)

# %% [markdown]
# ## An adapter checkpoint names its base
#
# A fine-tune shipped as adapters is a small file, but it means nothing without the exact
# base weights it was trained on: loaded onto another checkpoint (a base retrained with
# another seed, a later release), it silently computes something else. So the file holds
# the adapters, the LoRA settings, the base model's config and a **fingerprint** of the
# base weights (a SHA-256 over their names, shapes and bytes); `load_lora` checks both
# before it loads anything.

# %%
#| export minillm/lora.py
LORA_FORMAT = "minillm LoRA adapters"


def base_fingerprint(model: nn.Module) -> str:
    """A SHA-256 hex digest of the base weights of ``model``: every parameter but the adapters',
    by name (a wrapped layer's ``base.`` left out of it, so the plain model and the adapted
    one agree), dtype, shape and bytes. ``ValueError`` when adapters are merged into them."""
    if any(layer.merged for layer in lora_layers(model).values()):
        raise ValueError("the adapters are merged into the base weights: unmerge_lora(model) first")
    digest = hashlib.sha256()
    for name, parameter in sorted(model.named_parameters()):
        if name.endswith((".lora_A", ".lora_B")):
            continue
        data = parameter.detach().cpu().contiguous()
        digest.update(f"{name.replace('.base.', '.')}|{data.dtype}|{tuple(data.shape)}|".encode())
        digest.update(data.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def lora_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapters' tensors alone: ``{"<module>.lora_A": ..., "<module>.lora_B": ...}``."""
    return {f"{name}.{part}": getattr(layer, part).detach().clone()
            for name, layer in lora_layers(model).items() for part in ("lora_A", "lora_B")}


def save_lora(path, model: nn.Module, targets) -> None:
    """Write the adapters of ``model`` (a GPT after ``apply_lora``) to ``path``, and nothing else
    of the weights: the base model is named by its config and ``base_fingerprint``.

    targets: what ``apply_lora`` was given, stored so that ``load_lora`` can wrap a fresh
    base model the same way. ``ValueError`` without adapters, or with merged ones.
    """
    layers = _unmerged_state(model, merged=False)
    names = {name for name, _ in lora_targets(model, targets)}
    if sorted(names) != sorted(layers):
        raise ValueError(f"targets {targets!r} do not name the adapted layers of this model")
    first = next(iter(layers.values()))
    save_checkpoint(path, {"format": LORA_FORMAT, "base_config": model.config.to_dict(),
                           "base_fingerprint": base_fingerprint(model),
                           "lora": {"r": first.r, "alpha": first.alpha, "dropout": first.dropout.p,
                                    "targets": list(_target_names(targets)), "modules": sorted(layers)},
                           "adapters": lora_state_dict(model)})


def load_lora(path, model: GPT) -> GPT:
    """Load the adapters ``save_lora`` wrote into ``model`` and return it.

    model: the base model they were trained on, plain (then ``apply_lora`` wraps it as the
    file says) or wrapped the same way already. A ``CheckpointError`` naming the file when
    it holds no adapters, or when ``model`` is another base model than the file names
    (another config, or other weights: a fine-tune of another checkpoint); the model is
    then left as it was.
    """
    saved = load_checkpoint(path, required=("format", "base_config", "base_fingerprint", "lora", "adapters"))
    if saved["format"] != LORA_FORMAT:
        raise CheckpointError(f"checkpoint {str(path)!r} is a {saved['format']!r}, not {LORA_FORMAT!r}")
    if saved["base_config"] != model.config.to_dict():
        differ = sorted(key for key in saved["base_config"] if saved["base_config"][key] != model.config.to_dict().get(key))
        raise CheckpointError(f"checkpoint {str(path)!r} holds adapters for another base model: its config "
                              f"differs in {differ}")
    if saved["base_fingerprint"] != base_fingerprint(model):
        raise CheckpointError(f"checkpoint {str(path)!r} holds adapters for another base model: the config "
                              f"matches but the weights do not (fingerprint {saved['base_fingerprint'][:12]}..., "
                              f"this model's {base_fingerprint(model)[:12]}...)")
    spec = saved["lora"]
    if not lora_layers(model):
        apply_lora(model, spec["r"], spec["alpha"], spec["targets"], spec["dropout"])
    layers = lora_layers(model)
    if sorted(layers) != spec["modules"] or any(
            (layer.r, layer.alpha) != (spec["r"], spec["alpha"]) or layer.lora_A.shape != saved["adapters"][f"{name}.lora_A"].shape
            or layer.lora_B.shape != saved["adapters"][f"{name}.lora_B"].shape for name, layer in layers.items()):
        raise CheckpointError(f"checkpoint {str(path)!r} holds adapters of r={spec['r']}, alpha={spec['alpha']} on "
                              f"{spec['modules']}, which the model's adapters are not")
    with torch.no_grad():
        for name, layer in layers.items():
            layer.lora_A.copy_(saved["adapters"][f"{name}.lora_A"])
            layer.lora_B.copy_(saved["adapters"][f"{name}.lora_B"])
    return model

# %% [markdown]
# ## The task: a dialect made by rules
#
# To measure a fine-tune we need a task the shipped model does badly, whose data we can
# make in any amount, and whose success a program can check. **Pig latin** fits: every
# word moves its leading consonants to its end and adds "ay" ("thou" → "outhay"), and a
# word that starts with a vowel adds "way" ("art" → "artway"). It is Shakespeare's text in
# a dialect, so the model's knowledge still helps (which word comes next), but every word
# must be rebuilt: the ending of a word depends on how the word started, several tokens
# earlier. That is a job for attention, not a renaming of tokens, so adapters on attention
# and the FFN are a fair test. The task score is the share of the words of a sampled text
# that are the pig latin of a real word (one of the words of the training text).

# %%
# The rules above, as code, live in `minillm/tasks.py` with chapter 13's task: they are
# the chapter's data, not its subject.
from minillm.tasks import pig_latin, pig_latin_score, words

# %% [markdown]
# The shipped model on the task, before any fine-tuning: its loss in nats per character on
# held-out pig latin (the pig latin of the validation text, which no run trains on), on the
# validation text as written, and a sampled continuation of a held-out prompt with its score.

# %%
from minillm.generate import generate
from minillm.loss import token_nll

train_text, val_text = data.split_corpus(data.corpus_text())
vocabulary = set(words(train_text))
held_chars = 2_000 if QUICK else 8_000
held_out = pig_latin(val_text[:held_chars])
shakespeare = val_text[held_chars: 2 * held_chars]
held_ids, shakespeare_ids = torch.tensor(tokenizer.encode(held_out)), torch.tensor(tokenizer.encode(shakespeare))
prompt = torch.tensor([tokenizer.encode(held_out)[:24]])
print("the start of the validation text in pig latin:" + pig_latin(val_text[1:120]))


def measure(model) -> dict:
    """Held-out pig latin and Shakespeare in nats per character, and the task score of a sample."""
    sample = generate(model, prompt, 48, temperature=0.8, use_cache=True, generator=torch.Generator().manual_seed(0))
    text = tokenizer.decode(sample[0, prompt.shape[1]:].tolist())
    return {"held_out": token_nll(model, held_ids)[0] / len(held_out),
            "shakespeare": token_nll(model, shakespeare_ids)[0] / len(shakespeare),
            "score": pig_latin_score(text, vocabulary), "sample": text}


before = measure(base_model)
print(f"\nheld-out pig latin: {before['held_out']:.3f} nats/char · Shakespeare: {before['shakespeare']:.3f} nats/char · "
      f"task score of the sample: {before['score']:.2f}")
print("sample:", repr(before["sample"]))

# %% [markdown]
# The shipped model has never seen the dialect: 4.02 nats per character on held-out pig
# latin, three times its 1.37 on the same kind of text as written (quick mode measures
# shorter texts, so its numbers differ a little), and its sample of a pig latin prompt
# is plain Shakespeare, with a task score of 0.

# %% [markdown]
# ## A live fine-tune
#
# One LoRA run, the way the sweep below runs each of its configurations: the shipped model,
# unfused, adapters of rank 2 on every linear map (1.8% of the parameters), AdamW through
# chapter 07's `train`, on the pig latin of the first 120,000 characters of the training
# text. (Quick mode trains for 8 steps on less text; the full run takes the sweep's 60.)

# %%
from minillm.batches import BatchSampler
from minillm.train import TrainConfig, TrainState, train

live_steps = 8 if QUICK else 60
torch.manual_seed(0)
model = reference_lora.apply_lora(reference_lora.unfuse_qkv(shipped), r=2, alpha=8.0, targets=("all",))
fine_tune_ids = torch.tensor(tokenizer.encode(pig_latin(train_text[: 30_000 if QUICK else 120_000])))
config = TrainConfig(steps=live_steps, lr=2e-2, warmup_steps=max(1, live_steps // 10), eval_every=live_steps,
                     checkpoint_every=live_steps)
state = TrainState.new(model, config)
start = time.perf_counter()
train(model, BatchSampler(fine_tune_ids, 8, 128, seed=0), config, state=state)
seconds = time.perf_counter() - start
after = measure(model)
print(f"{live_steps} steps in {seconds:.1f} s; trainable {reference_lora.trainable_parameters(model):,} parameters, "
      f"AdamW state {reference_lora.optimizer_state_bytes(state.optimizer) / 1e3:.0f} kB")
print(f"held-out pig latin: {before['held_out']:.3f} → {after['held_out']:.3f} nats/char · Shakespeare: "
      f"{before['shakespeare']:.3f} → {after['shakespeare']:.3f} · task score {before['score']:.2f} → {after['score']:.2f}")
print("sample:", repr(after["sample"]))

# %% [markdown]
# In the full run (60 steps), 19,712 trained numbers take the held-out loss from 4.02 to
# 1.70 nats per character, and the sample turns into pig latin: 45% of its words are the
# pig latin of a real word, against none before. AdamW's state for them is 158 kB. The
# price is on the right: the loss on Shakespeare as written rose from 1.37 to 2.76. The
# adapters did not touch a single base weight, yet the adapted model forgot how to write
# plain English, because the adapters change what every layer computes. (Quick mode's
# 8 steps show the start of the same movement.)

# %% [markdown]
# The fine-tune ships as its adapters. The file names its base; loaded onto the shipped
# model it reproduces the fine-tune, and loaded onto any other weights (here the same
# model with one weight nudged, as a retrained base would differ everywhere) it refuses.
# Merged, the fine-tuned model is a plain GPT again, with the same logits.

# %%
import tempfile
from pathlib import Path

from minillm.checkpoint import CheckpointError
from minillm.train import save_model

with tempfile.TemporaryDirectory() as folder:
    adapter_file, model_file = Path(folder) / "pig-latin-lora.pt", Path(folder) / "pig-latin-full.pt"
    reference_lora.save_lora(adapter_file, model, ("all",))
    save_model(model_file, base_model)  # what full fine-tuning ships: every weight
    print(f"adapter file {adapter_file.stat().st_size / 1e3:.0f} kB; a whole model's file {model_file.stat().st_size / 1e3:.0f} kB")
    restored = reference_lora.load_lora(adapter_file, reference_lora.unfuse_qkv(shipped))
    with torch.no_grad():
        print(f"restored from the file against the fine-tuned model: largest logit difference "
              f"{(restored(ids)[0] - model(ids)[0]).abs().max():.1e}")
        other = reference_lora.unfuse_qkv(shipped)
        other.blocks[0].attn.q.weight[0, 0] += 1e-3
    try:
        reference_lora.load_lora(adapter_file, other)
    except CheckpointError as error:
        print("CheckpointError:", str(error).replace(folder, "..."))
with torch.no_grad():
    adapted = model(ids)[0]
    reference_lora.merge_lora(model)
    print(f"merged against adapted logits: largest difference {(model(ids)[0] - adapted).abs().max():.1e}")
    reference_lora.unmerge_lora(model)

# %% [markdown]
# ## LoRA against full fine-tuning, measured
#
# The sweep repeats that run for full fine-tuning and for LoRA of rank 1, 2, 4, 8 and 16,
# on `q, v` and on every linear map, with the same batches, steps and schedule
# (`bench/lora_sweep.py`; its results are cached in `data/lora_sweep.json`, with the
# command that made them and how long it took). Full fine-tuning gets the learning rate
# 2e-3, LoRA 2e-2 (with $\alpha = 8$ for every rank): adapters that start at zero need
# larger steps. These rates come from a few trial runs on this task, not a full search. The measure of success is the share of full
# fine-tuning's loss reduction that LoRA achieves:
#
# $$\text{share} = \frac{L_\text{base} - L_\text{LoRA}}{L_\text{base} - L_\text{full}}$$
#
# on held-out pig latin, in nats per character.

# %%
sweep = json.loads(data.path("lora_sweep.json").read_text())
full = next(run for run in sweep["runs"] if run["method"] == "full")
reduction = sweep["base"]["held_out"] - full["held_out"]
print(f"{sweep['command']!r}: {len(sweep['runs'])} runs of {sweep['steps']} steps in {sweep['seconds']:.0f} s "
      f"on {sweep['threads']} torch thread\n")
print(f"{'run':16s} {'trainable':>9s} {'AdamW state':>11s} {'s/step':>7s} {'file':>8s} {'held-out':>8s} {'share':>6s} "
      f"{'score':>5s} {'Shakespeare':>11s}")
print(f"{'shipped model':16s} {'':9s} {'':11s} {'':7s} {'':8s} {sweep['base']['held_out']:8.3f} {'':6s} "
      f"{sweep['base']['score']:5.2f} {sweep['base']['shakespeare']:11.3f}")
for run in sweep["runs"]:
    name = "full fine-tune" if run["method"] == "full" else f"LoRA r={run['r']} {run['targets']}"
    share = (sweep["base"]["held_out"] - run["held_out"]) / reduction
    print(f"{name:16s} {100 * run['trainable_share']:8.2f}% {run['optimizer_bytes'] / 1e6:8.2f} MB "
          f"{run['seconds_per_step'] / full['seconds_per_step']:6.2f}x {run['file_bytes'] / 1e6:5.2f} MB "
          f"{run['held_out']:8.3f} {100 * share:5.0f}% {run['score']:5.2f} {run['shakespeare']:11.3f}")

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.4), layout="constrained")
for targets, marker in (("q,v", "o"), ("all", "s")):
    runs = [run for run in sweep["runs"] if run["targets"] == targets]
    shares = [100 * (sweep["base"]["held_out"] - run["held_out"]) / reduction for run in runs]
    left.plot([100 * run["trainable_share"] for run in runs], shares, marker=marker, label=f"LoRA on {targets}")
    for run, share in zip(runs, shares):
        left.annotate(f"r={run['r']}", (100 * run["trainable_share"], share), textcoords="offset points", xytext=(4, -10),
                      fontsize=8)
    right.plot([run["held_out"] for run in runs], [run["shakespeare"] for run in runs], marker=marker, linestyle="none",
               label=f"LoRA on {targets}")
left.scatter([100.0], [100.0], color="black", zorder=3, label="full fine-tune")
left.axhline(90, color="grey", linestyle=":", label="90% of full fine-tuning")
left.axvline(2, color="grey", linestyle="--", label="2% of the parameters")
left.set(xscale="log", xlabel="trainable parameters (% of the model, log scale)",
         ylabel="held-out loss reduction (% of full fine-tuning's)",
         title=f"Pig latin after {sweep['steps']} steps: what LoRA reaches")
left.legend(fontsize=8, loc="lower right")
right.scatter([full["held_out"]], [full["shakespeare"]], color="black", zorder=3, label="full fine-tune")
right.scatter([sweep["base"]["held_out"]], [sweep["base"]["shakespeare"]], color="grey", marker="*", s=120, zorder=3,
              label="shipped model")
right.set(xlabel="held-out pig latin (nats per character)", ylabel="Shakespeare as written (nats per character)",
          title="What each fine-tune forgot")
right.legend(fontsize=8)
plt.show()

# %% [markdown]
# What the sweep says (numbers from the table above):
#
# - **The target is met, with every linear map adapted.** LoRA on all linears at rank 1
#   (0.92% of the parameters) reaches 90% of full fine-tuning's held-out loss reduction,
#   rank 2 (1.82%) 92%. Past rank 4 (94%) more rank buys almost nothing.
# - **On `q, v` alone the rank is not the limit.** Ranks 2 to 16 all stop at 75–77%: the
#   adapters cannot do what the frozen FFNs would have to do. Rebuilding every word is
#   per-position computation as well as looking back at earlier tokens. Three times the
#   parameters at rank 16 on `q, v` (2.98%) do worse than rank 1 on everything (0.92%).
# - **The task score follows the loss.** Full fine-tuning's samples have 62% pig latin
#   words, LoRA on all linears 38–50%, on `q, v` 10–22% (each from 8 sampled prompts, so
#   a few points are noise).
# - **LoRA forgets less, because it learns less.** Every fine-tune lost much of its
#   Shakespeare (1.37 nats per character before): full fine-tuning ends at 2.94, LoRA on
#   all linears at 2.64–2.77, on `q, v` at 2.25–2.45. In the right panel the runs lie
#   roughly along one trade-off: the further a run moved on pig latin, the more it forgot. Sixty
#   steps of a single task, and no plain text mixed in, make a harsh test of forgetting;
#   the order (full forgets most) is what Biderman et al. (2024) report at scale.
# - **Memory and files shrink by the parameter ratio.** AdamW's state is 8.5 MB for full
#   fine-tuning and 0.16 MB for rank 2 on all linears; the file to share is 4.3 MB
#   against 97 kB.
# - **Time per step does not.** The `s/step` column wanders between 0.89 and 1.93 times
#   full fine-tuning's, because these runs were timed one after another while the load of
#   a shared machine changed. The Tee check below quotes them timed side by side.

# %% [markdown]
# #| written choosing_targets points=2
# **Question.** You may train at most 2% of this model's parameters. From the table and
# the figure above, which targets and which rank would you choose, and why? Would your
# answer change for a 7B model with $d_\text{model} = 4096$, where one adapter of rank 8
# on a $4096 \times 4096$ matrix is 0.4% of that matrix? Answer in three to five sentences.
#
# ### BEGIN SOLUTION
# *Model answer.* At a fixed budget, spreading a small rank over every linear map beat
# concentrating a larger rank on $W_q$ and $W_v$ in this sweep (compare the runs at equal
# trainable share in the table): the task needs the FFN as well as attention, since
# rebuilding every word is a per-position computation as much as a lookup of earlier
# tokens. So: every linear map at the largest rank within 2% (r = 2 here). For a 7B model
# the same budget buys a far larger rank, because an adapter's size grows with
# $d_\text{in} + d_\text{out}$ while the matrix grows with their product: 2% of a 7B model
# is about 140 million parameters, rank 64 on every linear map of every layer is far
# below it, so the choice there is between ranks that are all large enough, and covering
# all matrices matters more than the rank (as QLoRA reports).
#
# *Grading:* 1 point for a choice justified by the measured table (all linears at low
# rank against q, v at a higher rank, at equal share), 1 point for the scaling argument
# ($r(d_\text{in} + d_\text{out})$ against $d_\text{in} d_\text{out}$).
# ### END SOLUTION

# %% [markdown]
# ## Tee check
#
# > **The shirt:** LoRA "freezes the original model weights and injects trainable rank
# > decomposition matrices ... saving massive amounts of compute".
#
# **What is right:** the base weights are frozen and the adapters are rank-decomposed
# matrices, exactly as built above; and on our task they reach most of what full
# fine-tuning reaches with a small fraction of the trainable parameters.
#
# **What is loose:** *compute*. Every training step still runs the whole frozen model
# forward, and backward through it, because the adapters of the first layer need the
# gradient that flows through all the layers after it. What LoRA skips is the gradient of
# each frozen *weight* (one of the three matrix products per layer per step) and the
# optimizer's update of it. What shrinks a lot is *memory and files*: the gradients and
# AdamW's two moments exist only for the adapters, and the fine-tune ships as a file of
# adapters. The numbers for this model, per training token:

# %%
c = base_model.config
matmul = c.n_layers * (4 * c.d_model ** 2 + 3 * c.d_model * c.d_ff) + c.d_model * c.vocab_size  # weights used per token
budget = next(run for run in sweep["runs"] if run["method"] == "lora" and run["targets"] == "all" and run["r"] == 2)
adapters = budget["trainable"]
full_flops, lora_flops = 6 * matmul, 4 * matmul + 6 * adapters  # forward 2N, input gradients 2N, weight gradients 2N
print(f"matrix-product FLOPs per training token: full {full_flops / 1e6:.2f} M, LoRA r=2 on all linears "
      f"{lora_flops / 1e6:.2f} M ({lora_flops / full_flops:.2f}x)")
print(f"AdamW state: full {full['optimizer_bytes'] / 1e6:.2f} MB, LoRA {budget['optimizer_bytes'] / 1e6:.3f} MB "
      f"({full['optimizer_bytes'] / budget['optimizer_bytes']:.0f}x less)")
print(f"file to share: full {full['file_bytes'] / 1e6:.2f} MB, adapters {budget['file_bytes'] / 1e6:.3f} MB "
      f"({full['file_bytes'] / budget['file_bytes']:.0f}x less)")

# %% [markdown]
# Compute per step barely changes. Counted, a LoRA step on this model does at most a
# third less matrix arithmetic (the frozen weights' gradients are skipped; the forward
# pass and the gradients flowing through every layer remain), and measured it is not
# much faster. `.venv/bin/python bench/lora_step.py --rounds 15` times the steps side by
# side in interleaved rounds. On this 1M-parameter model, rank 2 on all linears (the
# configuration that met the target) took 1.00 times as long as full fine-tuning per step
# and rank 16 on all linears 1.02 (medians), while a second copy of the full fine-tune
# measured 1.01, with single rounds from 0.77 to 1.16: the same, within the noise. Only
# the smallest adapters, rank 1 on q and v, were faster, at 0.79 (and they learned least).
# The extra small matrix products and the optimizer's many tiny tensors cost about what
# the skipped weight gradients save. What shrinks is state: 54
# times less AdamW memory at rank 2 on all linears, 44 times smaller files, and no
# gradient buffers for the frozen weights. At 7B parameters that is the difference
# between about 112 GB of weights, gradients and AdamW moments in float32 and 28 GB of
# frozen weights plus a few hundred MB for the adapters: "massive amounts" of *memory*,
# which is what lets a large model be fine-tuned on one GPU at all.

# %% [markdown]
# ## What `minillm` gained
#
# `minillm.lora`, the first post-training module:
#
# - `lora_update` (Exercise 1) and `merge_weight` (Exercise 2), the two formulas;
# - `LoRALinear(base, r, alpha, dropout=0.0)` with `merge()` and `unmerge()`;
# - `apply_lora(model, r, alpha, targets=("q", "v"), dropout=0.0)`, targets by role
#   (`ROLES`: q, k, v, o, w1, w2, w3; `GROUPS`: attention, ffn, all) through
#   `lora_targets`; `merge_lora`, `unmerge_lora`, `lora_layers`;
# - `FusedLoRALinear`, adapters on the q and v row blocks of a fused projection, which
#   `apply_lora` uses on a default GPT;
# - `unfuse_qkv(model)`, the same model with separate Q, K, V projections;
# - `lora_parameter_count` (Exercise 3), `trainable_parameters`, `optimizer_state_bytes`;
# - `save_lora` / `load_lora`, adapter files that name their base by config and
#   `base_fingerprint`.
#
# The task, `pig_latin`, `pig_latin_word`, `words` and `pig_latin_score`, went into
# `minillm.tasks`, beside chapter 13's.
#
# The weight-decay policy: `minillm.optim.param_groups` decays every trainable matrix, so
# A and B decay (towards $BA = 0$, the base model) and the frozen base is left out.
# Chapter 13 starts from the same shipped model and changes it with preference pairs
# instead of examples.
#
# ## Further reading
#
# - Houlsby et al., *Parameter-Efficient Transfer Learning for NLP* (2019): adapters, small trained modules in a frozen model.
# - Aghajanyan, Zettlemoyer & Gupta, *Intrinsic Dimensionality Explains the Effectiveness of Language Model Fine-Tuning* (2020): why a low-rank update can be enough.
# - Hu et al., *LoRA: Low-Rank Adaptation of Large Language Models* (2021): this chapter's method, its $\alpha / r$ and its zero-initialized $B$.
# - Dettmers et al., *QLoRA: Efficient Finetuning of Quantized LLMs* (2023): adapters on every linear layer of a 4-bit base.
# - Biderman et al., *LoRA Learns Less and Forgets Less* (2024): LoRA against full fine-tuning, measured on code and math.
# - Raschka, *Build a Large Language Model (From Scratch)*, appendix E (2024): LoRA on GPT-2 for classification.
