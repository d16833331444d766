# %% [markdown]
# # Chapter 10 · FlashAttention: tiling and online softmax
#
# **Where this sits on the tee:** the Tech Band's *FlashAttention*, "an IO-aware tiled GPU
# attention kernel" that tiles attention "to minimize memory reads/writes between the GPU's
# slow High Bandwidth Memory (HBM) and fast SRAM". It computes exactly the attention of
# chapter 04, the same numbers, in a different order.
#
# **You will be able to**
# - measure the memory that naive attention spends on its $N \times N$ matrices, forward
#   and backward, and say why it grows as $N^2$;
# - derive the online softmax (one pass, a running maximum and sum) and prove it equal
#   to the softmax, rows of $-\infty$ included;
# - write tiled attention: blocks of queries and keys, the running statistics
#   $(m, \ell, O)$, the causal block skip, the log-sum-exp kept for the backward pass;
# - write the backward pass that recomputes the attention blocks instead of storing them,
#   from the identity $dS = P \odot (dP - \operatorname{rowsum}(dO \odot O))$;
# - fill in the inner loop of a Triton kernel and test it on a CPU with Triton's
#   interpreter;
# - count the bytes and FLOPs of each version and place them on a GPU's roofline.
#
# **Prerequisites:** chapter 04 (the softmax, scaled dot-product attention, GQA, the
# attention-backend registry) and chapter 07 (the model and its training loop).
#
# **Time:** about 40 minutes of reading, 70 minutes of exercises: 64 for the six coded ones
# (their estimates below add up to that) and about 6 for the written question.
#
# **How the exercises work.** Each exercise has an answer cell (replace
# `raise NotImplementedError()` with your code), a *visible test* that explains what is
# wrong when it fails, and a *hidden test* that runs only when the notebook is graded. Each
# exercise is graded on its own: where one builds on another, its tests use the course's
# reference for the other. A cell after the tests binds a new name to your function when it
# passes the visible test, or else to the course's reference, so you can always read on; in
# a student bundle where that reference is not released yet, the cells that need your answer
# wait for it and say so.

# %% [markdown]
# The setup cell also prepares Triton, the GPU kernel language of the last sections. On a
# machine without a CUDA GPU, `TRITON_INTERPRET=1` makes Triton run its kernels in Python
# on CPU tensors; it must be set before the first kernel is defined, so it is set here,
# first thing. `TRITON_CACHE_DIR` points at a fresh temporary folder, so the notebook never
# writes into your home folder (nor into a grader's sandbox, which may forbid it). Triton
# exists for Linux on x86-64 only; elsewhere `HAVE_TRITON` is false, and the Triton cells
# say so and use the PyTorch version instead.

# %%
import importlib.util
import math
import os
import tempfile
import time

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any @triton.jit: run kernels on the CPU
os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="triton-cache-"))
HAVE_TRITON = importlib.util.find_spec("triton") is not None

import matplotlib.pyplot as plt
import torch.nn.functional as F
from tqdm.auto import tqdm

import course_runtime as course
from course_runtime.memory import peak_growth
from minillm import flash  # flash: the package's module, the course's reference of each exercise
from minillm.attention import get_attention_backend

device = course.setup(seed=0)
QUICK = course.QUICK
torch.set_num_threads(1)  # this chapter's tensors are small: one thread is as fast, and steady on a busy machine
print(f"Triton: {'installed' if HAVE_TRITON else 'not installed (it exists for Linux x86-64 only)'}; "
      f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '0')}")

# %% [markdown]
# Everything this chapter builds in PyTorch goes into `minillm/flash.py`; the Triton kernel
# goes into `minillm/flash_triton.py`, which only the code that uses it imports, so that
# `import minillm` works where Triton does not exist.

# %%
#| export minillm/flash.py
"""FlashAttention in PyTorch: online softmax, tiled attention, a recomputing backward (chapter 10).

Shapes: q ``(..., q_len, head_dim)``; k, v ``(..., k_len, head_dim)``, their leading
dimensions broadcast against q's (so grouped-query attention is q ``(batch, n_kv_heads,
n_rep, q_len, head_dim)`` against k ``(batch, n_kv_heads, 1, k_len, head_dim)``, the K/V
heads never copied). Causal attention aligns the triangle to the last queries: query i may
attend to key j when j <= i + k_len - q_len, as with a KV cache.

- ``online_softmax``: the softmax with its normalizer computed in one streaming pass.
- ``tile_update``, ``tile_visibility``, ``tiled_attention_forward``: the forward pass,
  block by block, keeping only the running statistics (m, l, O) and the log-sum-exp.
- ``score_grad``, ``tiled_attention_backward``: the backward pass, recomputing each block
  of attention weights from q, k and the log-sum-exp instead of storing them.
- ``flash_attention``: both, as one differentiable function; ``flash_backend`` adapts it to
  the attention-backend contract (``minillm.attention.ATTENTION_BACKENDS``, name "flash").
- ``LiveTensorBytes``, ``peak_tensor_bytes``: the peak of the bytes held by live tensors
  while a function runs, the measure this chapter's memory claims use.

The Triton kernel is ``minillm.flash_triton`` (imported only where it is used).
"""

import math

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from minillm.attention import kv_groups
from minillm.checks import boolean, positive_int
from minillm.precision import compute_dtype

# %% [markdown]
# ## The memory problem, measured
#
# Chapter 04's attention computes, for each head, the scores $S = QK^\top/\sqrt{d}$ and
# the weights $P = \operatorname{softmax}(S)$: two $N \times N$ matrices for a sequence
# of $N$ tokens, while $Q$, $K$, $V$ and the output are $N \times d$. At $N = 4{,}096$ and
# $d = 64$ one head's $Q$ holds 262,144 numbers and its $S$ 16.8 million: 64 times more.
# Training keeps $P$ for the backward pass, so the $N^2$ term is paid in every layer and
# every head at once.
#
# To see it, we count the bytes held by live tensors while a function runs. A
# `TorchDispatchMode` sees every operation PyTorch dispatches; after each one we note the
# storage of its outputs and forget the storages that have been freed. The peak of their
# sum is the memory the function needed beyond its inputs: a count of tensors, not of the
# process's resident memory, which the allocator and the rest of Python blur.

# %%
#| export minillm/flash.py
class LiveTensorBytes(TorchDispatchMode):
    """Within ``with LiveTensorBytes() as counter:``, ``counter.peak`` is the largest number of
    bytes held at once by the storages of tensors that the block's operations created (the
    inputs that existed before, and views of them, are not counted); ``counter.live`` is the
    count at the end. Storages are tracked by weak reference, so a freed one stops counting
    as soon as it is freed. It sees what PyTorch's dispatcher sees: an operation's scratch
    space inside a fused kernel is invisible, its outputs are not."""

    def __init__(self):
        super().__init__()
        self._storages: dict[int, tuple[StorageWeakRef, int]] = {}
        self._outside: set[int] = set()
        self.peak = 0
        self.live = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for tensor in tree_flatten((args, kwargs))[0]:
            if isinstance(tensor, torch.Tensor):
                key = StorageWeakRef(tensor.untyped_storage()).cdata
                if key not in self._storages:
                    self._outside.add(key)  # an input from before: not this block's allocation
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor):
                ref = StorageWeakRef(tensor.untyped_storage())
                if ref.cdata not in self._storages and ref.cdata not in self._outside:
                    self._storages[ref.cdata] = (ref, tensor.untyped_storage().nbytes())
        self._storages = {key: entry for key, entry in self._storages.items() if not entry[0].expired()}
        self.live = sum(size for _, size in self._storages.values())
        self.peak = max(self.peak, self.live)
        return out


def peak_tensor_bytes(fn, *args, **kwargs) -> int:
    """The peak of live tensor bytes (``LiveTensorBytes``) while ``fn(*args, **kwargs)`` runs,
    the result's own storage included while it is alive."""
    with LiveTensorBytes() as counter:
        fn(*args, **kwargs)
    return counter.peak

# %% [markdown]
# The naive attention (chapter 04's "math" backend) on one head of width 64, forward
# alone and forward plus backward, for growing $N$:

# %%
math_attention = get_attention_backend("math")


def naive_forward(q, k, v):
    return math_attention(q, k, v, causal=True)


def naive_training_step(q, k, v):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    math_attention(q, k, v, causal=True).sum().backward()


lengths = [256, 512, 1024] if QUICK else [256, 512, 1024, 2048]
naive_memory = {"forward": [], "forward + backward": []}
for n in tqdm(lengths, desc="naive attention"):
    q, k, v = torch.randn(3, 1, 1, n, 64).unbind(0)
    naive_memory["forward"].append(flash.peak_tensor_bytes(naive_forward, q, k, v))
    naive_memory["forward + backward"].append(flash.peak_tensor_bytes(naive_training_step, q, k, v))
for i, n in enumerate(lengths):
    print(f"N = {n:5d}: forward {naive_memory['forward'][i] / 2**20:7.1f} MiB, forward + backward "
          f"{naive_memory['forward + backward'][i] / 2**20:7.1f} MiB; one N×N float32 matrix is {4 * n * n / 2**20:5.1f} MiB")

# %%
fig, ax = plt.subplots(figsize=(7, 4))
for label, values in naive_memory.items():
    ax.loglog(lengths, [b / 2**20 for b in values], "o-", label=f"naive attention, {label}")
ax.loglog(lengths, [4 * n * n / 2**20 for n in lengths], "k--", label="one N×N float32 matrix")
ax.loglog(lengths, [4 * n * 64 / 2**20 for n in lengths], "k:", label="one N×d float32 matrix (Q, K, V or O)")
ax.set_xlabel("sequence length N (tokens)")
ax.set_ylabel("peak of live tensor bytes (MiB)")
ax.set_title("Naive attention, one head, d = 64: memory grows as N²")
ax.set_xticks(lengths, [f"{n:,}" for n in lengths])
ax.minorticks_off()
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# The measured peaks run parallel to the $N \times N$ line: doubling $N$ multiplies them
# by 4. At $N = 2{,}048$ the forward pass holds three $N \times N$ matrices at its peak
# (48 MiB, where one is 16 MiB: the scores, the masked scores, their exponentials), and
# forward plus backward about seven (117 MiB: the weights kept for the backward pass, and
# the gradients of the weights and of the scores). The $N \times d$ tensors we actually want are a rounding
# error beside them. FlashAttention never holds an $N \times N$ matrix: it computes the
# same output block by block, and the rest of the chapter shows how.
#
# ## Online softmax
#
# The obstacle is the softmax: each weight $P_{ij} = e^{S_{ij} - m_i} / \ell_i$ needs the
# row's maximum $m_i = \max_j S_{ij}$ (chapter 04's stable softmax) and its sum
# $\ell_i = \sum_j e^{S_{ij} - m_i}$, which depend on *every* key. Read the keys in blocks
# and you know the maximum and the sum only of the blocks seen so far.
#
# The fix (Milakov & Gimelshein, 2018) keeps both as running values and corrects the sum
# whenever the maximum grows. After the blocks $1, \dots, t$ let
#
# $$m^{(t)} = \max_{j \in \text{blocks } 1..t} x_j, \qquad \ell^{(t)} = \sum_{j \in \text{blocks } 1..t} e^{x_j - m^{(t)}}.$$
#
# A new block $B$ gives $m^{(t+1)} = \max(m^{(t)}, \max_{j \in B} x_j)$, and every old term
# $e^{x_j - m^{(t)}}$ must become $e^{x_j - m^{(t+1)}} = e^{x_j - m^{(t)}} \cdot e^{m^{(t)} - m^{(t+1)}}$:
# one factor for the whole old sum,
#
# $$\ell^{(t+1)} = e^{m^{(t)} - m^{(t+1)}}\, \ell^{(t)} + \sum_{j \in B} e^{x_j - m^{(t+1)}}.$$
#
# By induction $\ell^{(T)} = \sum_j e^{x_j - m}$ with $m = \max_j x_j$ after the last
# block: exactly the stable softmax's maximum and normalizer, in one pass, whatever the
# blocks. The factor $e^{m^{(t)} - m^{(t+1)}} \le 1$, so nothing overflows either.
#
# **Rows of $-\infty$.** A masked score is $-\infty$. A block that is $-\infty$ everywhere
# leaves $m = -\infty$, and then $m^{(t)} - m^{(t+1)} = -\infty - (-\infty)$ is NaN. When
# the running maximum is still $-\infty$ there is nothing to correct ($\ell = 0$), so shift
# by 0 instead: $e^{-\infty - 0} = 0$. A row that is $-\infty$ everywhere ends with
# $\ell = 0$; as in chapter 04's attention, its weights are zeros, never NaN.
#
# ### Exercise 1 · Online softmax
#
# Implement `online_softmax(x, block_size)`: the softmax over the last dimension of `x`,
# with $m$ and $\ell$ computed in **one pass** over blocks of `block_size` columns as above,
# then the weights $e^{x - m} / \ell$. A row of $-\infty$ gives zeros. `block_size` that is
# not a positive int is a `ValueError` (the given `positive_int("block_size", block_size)`
# raises it).
#
# Difficulty ●●○ · Importance ●●● · about 12 minutes
#
# <details><summary>Hint 1</summary>Start with <code>m = torch.full((*x.shape[:-1], 1), float("-inf"), dtype=x.dtype)</code> and <code>l = torch.zeros_like(m)</code>; <code>x[..., start:start + block_size]</code> is one block.</details>
# <details><summary>Hint 2</summary>The shift: <code>safe = m_new.masked_fill(torch.isneginf(m_new), 0.0)</code>; then <code>l = l * (m - safe).exp() + (block - safe).exp().sum(-1, keepdim=True)</code>.</details>
# <details><summary>Hint 3</summary>At the end, the same shift for <code>m</code>, and divide by <code>l.masked_fill(l == 0, 1.0)</code>: a row of -inf has exponentials 0, so 0 / 1 = 0.</details>

# %%
#| answer online_softmax
#| export minillm/flash.py
def online_softmax(x: torch.Tensor, block_size: int = 128) -> torch.Tensor:
    """Softmax over the last dimension of x (any shape, float), its maximum m and normalizer
    l computed in one pass over blocks of ``block_size`` columns:
    m' = max(m, max(block)), l' = l e^(m - m') + sum(e^(block - m')); then e^(x - m) / l.
    A row that is -inf everywhere gets zeros, never NaN. ``ValueError`` for a block_size
    that is not a positive int."""
    positive_int("block_size", block_size)
    ### BEGIN SOLUTION
    m = torch.full((*x.shape[:-1], 1), float("-inf"), dtype=x.dtype, device=x.device)
    l = torch.zeros_like(m)
    for start in range(0, x.shape[-1], block_size):
        block = x[..., start:start + block_size]
        m_new = torch.maximum(m, block.amax(dim=-1, keepdim=True))
        safe = m_new.masked_fill(torch.isneginf(m_new), 0.0)  # nothing seen yet: shift by 0, not by -inf
        l = l * (m - safe).exp() + (block - safe).exp().sum(dim=-1, keepdim=True)
        m = m_new
    safe = m.masked_fill(torch.isneginf(m), 0.0)
    return (x - safe).exp() / l.masked_fill(l == 0, 1.0)
    ### END SOLUTION

# %%
#| test online_softmax_visible points=1
def _without_rescaling(x, block):
    """What the one-pass softmax gives when the old sum is never multiplied by e^(m - m')."""
    m, l = torch.full((x.shape[0], 1), float("-inf")), torch.zeros(x.shape[0], 1)
    for start in range(0, x.shape[-1], block):
        m = torch.maximum(m, x[:, start:start + block].amax(-1, keepdim=True))
        l = l + (x[:, start:start + block] - m).exp().sum(-1, keepdim=True)
    return (x - m).exp() / l


@course.visible_check("online_softmax")
def check_online_softmax(online_softmax):
    x = torch.tensor([[1.0, 3.0, 0.5, 8.0, 2.0, -1.0, 9.5], [0.0, -2.0, 1.0, 4.0, 4.0, 3.0, -5.0]])
    expected = torch.softmax(x, dim=-1)
    first_block_only = torch.cat([torch.softmax(x[:, :3], -1), torch.zeros(2, 4)], dim=-1)
    course.expect_close(
        online_softmax(x, block_size=3), expected, "online_softmax(x, block_size=3) on two rows of 7",
        mistakes={"only the first block is normalized: the loop stops after one block?": first_block_only,
                  "the old sum is not rescaled when the maximum grows (l' = l + sum, without e^(m - m'))":
                  _without_rescaling(x, 3)},
        hint="m' = max(m, max(block)); l' = l * exp(m - m') + sum(exp(block - m'))")
    course.expect_close(online_softmax(x, block_size=1), expected, "online_softmax with block_size=1")
    course.expect_close(online_softmax(x, block_size=100), expected, "online_softmax with one block larger than the row")
    big = torch.tensor([[1000.0, 999.0, 0.0, 998.0]])
    got = online_softmax(big, block_size=2)
    if isinstance(got, torch.Tensor) and not torch.isfinite(got).all():
        raise course.CheckFailed("online_softmax: NaN or inf for logits near 1000: subtract the running maximum "
                                 "before exp, as chapter 04's stable softmax does")
    course.expect_close(got, torch.softmax(big, -1), "online_softmax of logits near 1000")
    inf = float("-inf")
    masked = torch.tensor([[inf, inf, 1.0, 2.0, inf], [inf, inf, inf, inf, inf]])
    got = online_softmax(masked, block_size=2)
    if isinstance(got, torch.Tensor) and not torch.isfinite(got).all():
        raise course.CheckFailed("online_softmax gave NaN where the first block is all -inf (row 0) or the whole row is "
                                 "(row 1): while the running maximum is -inf, exp(m - m') is exp(-inf - -inf) = NaN. "
                                 "Shift by 0 while the maximum is still -inf, and divide a zero sum by 1")
    expected = torch.zeros(2, 5)
    expected[0, 2:4] = torch.softmax(torch.tensor([1.0, 2.0]), -1)
    course.expect_close(got, expected, "online_softmax with -inf entries and a row of -inf (zeros)")
    course.expect_raises(ValueError, online_softmax, x, 0, what="online_softmax(x, block_size=0)")


check_online_softmax(online_softmax)
print("online_softmax: visible test passed")

# %%
#| test online_softmax_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
for shape, block, dtype in [((3, 17), 4, torch.float64), ((2, 3, 33), 8, torch.float32), ((5, 1), 3, torch.float64),
                            ((4, 64), 64, torch.float32), ((2, 29), 5, torch.float64)]:
    x = 6 * torch.randn(*shape, dtype=dtype)
    got = online_softmax(x, block_size=block)
    assert isinstance(got, torch.Tensor) and got.dtype == dtype, "online_softmax must keep the dtype"
    course.expect_close(got, torch.softmax(x, -1), "online_softmax",
                        atol=1e-12 if dtype == torch.float64 else 1e-6)
# increasing rows: the maximum grows in every block, so every block rescales the old sum
x = torch.linspace(-50, 400, 45, dtype=torch.float64).repeat(2, 1) + torch.randn(2, 45, dtype=torch.float64)
course.expect_close(online_softmax(x, block_size=4), torch.softmax(x, -1), "online_softmax of rising logits", atol=1e-12)
# -inf: scattered, a leading run longer than a block, whole rows
x = torch.randn(4, 23, dtype=torch.float64)
x[0, :11] = float("-inf")
x[1, torch.randperm(23)[:12]] = float("-inf")
x[2] = float("-inf")
got = online_softmax(x, block_size=5)
assert torch.isfinite(got).all(), "online_softmax gave NaN or inf with -inf entries"
expected = torch.softmax(x, -1).nan_to_num(0.0)
course.expect_close(got, expected, "online_softmax with -inf entries and a row of -inf", atol=1e-12)
assert (got[2] == 0).all() and (got[0, :11] == 0).all(), "-inf entries must get weight exactly 0"
# float32 logits near 500: e^500 overflows float32, so only a shifted exponent stays finite
x = 500 + 10 * torch.randn(3, 40)
got = online_softmax(x, block_size=7)
assert torch.isfinite(got).all(), "online_softmax gave NaN or inf for float32 logits near 500"
course.expect_close(got, torch.softmax(x, -1), "online_softmax of float32 logits near 500", atol=1e-6)
for bad in (0, -3, 2.0):
    course.expect_raises(ValueError, online_softmax, x, bad, what="online_softmax with a block_size that is not valid", match="block_size")
### END HIDDEN TESTS

# %%
soft = course.keep_going("online_softmax", online_softmax, flash.online_softmax, check_online_softmax)

# %% [markdown]
# The streaming pass gives the same weights as chapter 04's two-pass softmax, block size
# 1 or a block as wide as the row:

# %%
x = 4 * torch.randn(3, 1000, dtype=torch.float64)
for block in (1, 7, 128, 1000):
    print(f"block {block:4d}: largest difference from torch.softmax {(soft(x, block) - torch.softmax(x, -1)).abs().max():.1e}")

# %% [markdown]
# ## Tiles
#
# Attention needs more than the weights: each query's output $O_i = \sum_j P_{ij} V_j$.
# The same trick carries over. For a block of queries keep, per query, the running maximum
# $m$, the running sum $\ell$, and an *unnormalized* output $\tilde O = \sum_j e^{S_{ij} - m} V_j$
# over the keys seen so far. A tile of scores $S$ (those queries against one block of keys)
# and its values $V_B$ update them as
#
# $$m' = \max(m, \operatorname{rowmax} S), \qquad
# \ell' = e^{m - m'} \ell + \operatorname{rowsum} e^{S - m'}, \qquad
# \tilde O' = e^{m - m'}\, \tilde O + e^{S - m'} V_B,$$
#
# and after the last tile $O = \tilde O / \ell$. The only $N$-sized things left are the
# inputs and the output; a tile holds $B_q \times B_k$ scores, whatever $N$ is. Besides the
# output we keep one number per query, the **log-sum-exp** $L = m + \log \ell$: the
# backward pass rebuilds every weight from it, $P_{ij} = e^{S_{ij} - L_i}$.
#
# ### Exercise 2 · One tile's update of (m, l, O)
#
# Implement `tile_update(m, l, acc, scores, v)`, returning the new `(m, l, acc)` as the
# formulas say. `m`, `l`: `(..., bq, 1)`; `acc` (that is $\tilde O$): `(..., bq, d)`;
# `scores`: `(..., bq, bk)`, possibly holding $-\infty$ (masked keys); `v`: `(..., bk, d)`,
# whose leading dimensions broadcast against the scores'. A query that has seen no finite
# score yet keeps $m = -\infty$, $\ell = 0$, $\tilde O = 0$: no NaN (the same shift by 0
# as in Exercise 1). Return new tensors; do not change the arguments in place.
#
# Difficulty ●●○ · Importance ●●● · about 10 minutes
#
# <details><summary>Hint 1</summary>Both the old sum and the old output are rescaled by the same factor <code>alpha = exp(m - m')</code>, of shape <code>(..., bq, 1)</code>: it broadcasts over the columns of <code>acc</code>.</details>
# <details><summary>Hint 2</summary><code>p = (scores - safe).exp()</code> with <code>safe</code> the new maximum, -inf replaced by 0; then <code>alpha * acc + p @ v</code>.</details>

# %%
#| answer tile_update
#| export minillm/flash.py
def tile_update(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor, scores: torch.Tensor,
                v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One tile's update of a block of queries' running statistics.

    m, l: (..., bq, 1), the running maximum of the scores and the running sum of
    exp(score - m) over the keys seen so far; acc: (..., bq, d), the running sum of
    exp(score - m) v (the output before normalization); scores: (..., bq, bk), this tile's
    scaled scores (-inf where masked); v: (..., bk, d), its values. Returns (m', l', acc'):
    m' = max(m, rowmax(scores)), l' = e^(m - m') l + rowsum(e^(scores - m')),
    acc' = e^(m - m') acc + e^(scores - m') v. A query without any finite score so far keeps
    m' = -inf, l' = 0, acc' = 0.
    """
    ### BEGIN SOLUTION
    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))
    safe = m_new.masked_fill(torch.isneginf(m_new), 0.0)
    alpha = (m - safe).exp()
    p = (scores - safe).exp()
    return m_new, alpha * l + p.sum(dim=-1, keepdim=True), alpha * acc + p @ v
    ### END SOLUTION

# %%
#| test tile_update_visible points=1
@course.visible_check("tile_update")
def check_tile_update(tile_update):
    g = torch.Generator().manual_seed(10)
    scores, v = 3 * torch.randn(2, 4, 6, generator=g, dtype=torch.float64), torch.randn(2, 6, 5, generator=g, dtype=torch.float64)
    # the state after a first tile of 6 keys (computed here directly), then the tile to add
    first, v_first = 3 * torch.randn(2, 4, 6, generator=g, dtype=torch.float64), torch.randn(2, 6, 5, generator=g, dtype=torch.float64)
    m = first.amax(-1, keepdim=True)
    l = (first - m).exp().sum(-1, keepdim=True)
    acc = (first - m).exp() @ v_first
    both = torch.cat([first, scores], -1)
    m_all = both.amax(-1, keepdim=True)
    e_all = (both - m_all).exp()
    expected = (m_all, e_all.sum(-1, keepdim=True), e_all @ torch.cat([v_first, v], -2))
    inputs = [t.clone() for t in (m, l, acc, scores, v)]
    got = tile_update(m, l, acc, scores, v)
    if not all(torch.equal(a, b) for a, b in zip((m, l, acc, scores, v), inputs)):
        raise course.CheckFailed("tile_update changed its arguments in place (acc *= ..., l.mul_(...)): return new tensors")
    if not (isinstance(got, tuple) and len(got) == 3):
        raise course.CheckFailed(f"tile_update must return (m, l, acc), got {course.describe(got)}")
    course.expect_close(got[0], expected[0], "tile_update: the new maximum m'")
    m_tile = scores.amax(-1, keepdim=True)
    course.expect_close(got[1], expected[1], "tile_update: the new sum l'", mistakes={
        "the old sum is not rescaled by exp(m - m')": l + (scores - m_all).exp().sum(-1, keepdim=True),
        "the tile's exponentials use the tile's own maximum, not the new running maximum m'":
            l * (m - m_all).exp() + (scores - m_tile).exp().sum(-1, keepdim=True)})
    course.expect_close(got[2], expected[2], "tile_update: the new unnormalized output acc'", mistakes={
        "acc is not rescaled by exp(m - m') (only l is)": acc + (scores - m_all).exp() @ v,
        "acc is normalized (divided by l'): keep it unnormalized until the last tile": expected[2] / expected[1]})
    inf = float("-inf")
    masked = torch.full((1, 2, 3), inf, dtype=torch.float64)
    masked[0, 0, 1] = 0.5
    start = (torch.full((1, 2, 1), inf, dtype=torch.float64), torch.zeros(1, 2, 1, dtype=torch.float64),
             torch.zeros(1, 2, 5, dtype=torch.float64))
    got = tile_update(*start, masked, v[:1, :3])
    if not all(isinstance(t, torch.Tensor) and not torch.isnan(t).any() for t in got):
        raise course.CheckFailed("tile_update gave NaN for a query whose scores are all -inf so far (row 1): "
                                 "exp(m - m') is exp(-inf - -inf). Shift by 0 while the maximum is -inf")
    course.expect_close(got[1], torch.tensor([[[1.0], [0.0]]], dtype=torch.float64), "tile_update: l' of a first tile with -inf")
    course.expect_close(got[2], torch.stack([v[0, 1], torch.zeros(5, dtype=torch.float64)])[None],
                        "tile_update: acc' of a first tile with -inf (row 1 stays 0)")


check_tile_update(tile_update)
print("tile_update: visible test passed")

# %%
#| test tile_update_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
def _stream(update, scores, v, block):
    """Run ``update`` over the tiles of ``scores`` (..., bq, n) and ``v`` (..., n, d); return O and l."""
    m = torch.full((*scores.shape[:-1], 1), float("-inf"), dtype=scores.dtype)
    l = torch.zeros_like(m)
    acc = torch.zeros(*scores.shape[:-1], v.shape[-1], dtype=scores.dtype)
    for s in range(0, scores.shape[-1], block):
        m, l, acc = update(m, l, acc, scores[..., s:s + block], v[..., s:s + block, :])
    return acc / l.masked_fill(l == 0, 1.0), m, l


for lead, bq, n, d, block, dtype in [((3,), 5, 19, 4, 4, torch.float64), ((2, 2), 3, 32, 8, 8, torch.float32),
                                     ((1,), 1, 7, 3, 1, torch.float64)]:
    scores = 5 * torch.randn(*lead, bq, n, dtype=dtype)
    v = torch.randn(*lead, n, d, dtype=dtype)
    out, m, l = _stream(tile_update, scores, v, block)
    assert out.dtype == dtype and l.dtype == dtype, "tile_update must keep the dtype"
    course.expect_close(out, torch.softmax(scores, -1) @ v, "streamed tiles give attention",
                        atol=1e-10 if dtype == torch.float64 else 1e-5)
    course.expect_close(m, scores.amax(-1, keepdim=True), "m after the last tile is the row maximum", atol=1e-12)
    course.expect_close(m + l.log(), torch.logsumexp(scores, -1, keepdim=True), "m + log l is the log-sum-exp",
                        atol=1e-10 if dtype == torch.float64 else 1e-5)
# v broadcasts over the scores' leading dimensions (grouped heads share one value head)
scores, v = torch.randn(2, 3, 4, 10, dtype=torch.float64), torch.randn(2, 1, 10, 6, dtype=torch.float64)
out, _, _ = _stream(tile_update, scores, v, 3)
course.expect_close(out, torch.softmax(scores, -1) @ v, "tile_update with v broadcast over heads", atol=1e-10)
# large scores and masked keys: leading tiles fully masked, one query masked everywhere
scores = 300 * torch.randn(1, 4, 12, dtype=torch.float64)
scores[0, :, :6] = float("-inf")
scores[0, 3] = float("-inf")
v = torch.randn(1, 12, 2, dtype=torch.float64)
out, _, l = _stream(tile_update, scores, v, 3)
assert torch.isfinite(out).all() and torch.isfinite(l).all(), "tile_update gave NaN or inf with masked tiles"
course.expect_close(out, (torch.softmax(scores, -1) @ v).nan_to_num(0.0), "tile_update with masked tiles", atol=1e-10)
### END HIDDEN TESTS

# %%
update = course.keep_going("tile_update", tile_update, flash.tile_update, check_tile_update)

# %% [markdown]
# ### The causal block skip
#
# With a causal mask, query $i$ may attend to key $j$ only when $j \le i + \text{offset}$,
# with $\text{offset} = N_k - N_q$ (0 in training; the number of cached keys with a KV
# cache, chapter 04's convention). A tile of queries $q_0 \le i < q_1$ against keys
# $k_0 \le j < k_1$ is then one of three kinds:
#
# - **skip**: every key is in the future of every query, $k_0 > q_1 - 1 + \text{offset}$.
#   The tile is never computed, and neither is any tile to its right: about half the work
#   of causal attention disappears.
# - **full**: every key is visible to every query, $k_1 - 1 \le q_0 + \text{offset}$: no
#   mask needed.
# - **partial**: the diagonal crosses the tile; only these tiles need the mask.
#
# ### Exercise 3 · The causal block skip
#
# Implement `tile_visibility(q_start, q_stop, k_start, k_stop, offset)`, returning the
# string `"skip"`, `"full"` or `"partial"` for the queries `range(q_start, q_stop)` and the
# keys `range(k_start, k_stop)`. An empty range is a `ValueError` whose message names
# the bound at fault alone: `q_stop` (not `k_stop`) when `q_stop <= q_start`, `k_stop`
# (not `q_stop`) when `k_stop <= k_start`.
#
# Difficulty ●○○ · Importance ●●○ · about 6 minutes
#
# <details><summary>Hint 1</summary>The last query of the tile sees furthest: up to key <code>q_stop - 1 + offset</code>. The first query sees least: up to key <code>q_start + offset</code>.</details>

# %%
#| answer tile_visibility
#| export minillm/flash.py
def tile_visibility(q_start: int, q_stop: int, k_start: int, k_stop: int, offset: int) -> str:
    """Which causal tile this is, for the queries range(q_start, q_stop) and the keys
    range(k_start, k_stop), query i seeing key j when j <= i + offset: "skip" (no query
    sees any key), "full" (every query sees every key) or "partial". ``ValueError`` naming
    q_stop or k_stop for an empty range."""
    ### BEGIN SOLUTION
    if q_stop <= q_start:
        raise ValueError(f"q_stop ({q_stop}) must be greater than q_start ({q_start})")
    if k_stop <= k_start:
        raise ValueError(f"k_stop ({k_stop}) must be greater than k_start ({k_start})")
    if k_start > q_stop - 1 + offset:
        return "skip"
    if k_stop - 1 <= q_start + offset:
        return "full"
    return "partial"
    ### END SOLUTION

# %%
#| test tile_visibility_visible points=1
def _visibility_by_brute_force(q_start, q_stop, k_start, k_stop, offset):
    seen = [[j <= i + offset for j in range(k_start, k_stop)] for i in range(q_start, q_stop)]
    return "full" if all(map(all, seen)) else "skip" if not any(map(any, seen)) else "partial"


def _expect_bound_named_alone(tile_visibility, args, bound, other, what):
    """Fail unless tile_visibility(*args) raises a ValueError naming ``bound`` and not ``other``."""
    course.expect_raises(ValueError, tile_visibility, *args, what=what, match=bound)
    try:
        tile_visibility(*args)
    except ValueError as error:
        if other in str(error):
            raise course.CheckFailed(f"{what}: the message names {other} too, though that range is not empty: name "
                                     f"the bound at fault alone ({bound}), with a check of its own for each range") from None


@course.visible_check("tile_visibility")
def check_tile_visibility(tile_visibility):
    cases = {(0, 4, 4, 8, 0): "the tile right of the diagonal block (keys 4-7 for queries 0-3)",
             (4, 8, 0, 4, 0): "the tile left of the diagonal block", (4, 8, 4, 8, 0): "a diagonal tile",
             (0, 4, 3, 7, 0): "a tile the diagonal just touches (query 3 sees key 3)",
             (0, 4, 4, 8, 4): "keys 4-7 with 4 cached keys (offset 4)", (0, 2, 6, 8, 5): "offset 5, key 6 visible to query 1"}
    for args, what in cases.items():
        expected = _visibility_by_brute_force(*args)
        mistakes = {}
        if args[-1] and _visibility_by_brute_force(*args[:-1], 0) != expected:  # listed first: it can look like an off-by-one
            mistakes["the offset is ignored: with cached keys query i sees key j when j <= i + offset, "
                     "offset = n_keys - n_queries, not j <= i"] = _visibility_by_brute_force(*args[:-1], 0)
        mistakes["an off-by-one: query i sees key j when j <= i + offset (its own position included); "
                 "q_stop and k_stop are exclusive"] = {"skip": "partial", "partial": "skip", "full": "partial"}[expected]
        course.expect_equal(tile_visibility(*args), expected, f"tile_visibility{args}: {what}", mistakes=mistakes)
    _expect_bound_named_alone(tile_visibility, (4, 4, 0, 4, 0), "q_stop", "k_stop",
                              "tile_visibility with no queries (q_stop == q_start)")
    _expect_bound_named_alone(tile_visibility, (0, 4, 8, 6, 0), "k_stop", "q_stop",
                              "tile_visibility with no keys (k_stop < k_start)")


check_tile_visibility(tile_visibility)
print("tile_visibility: visible test passed")

# %%
#| test tile_visibility_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
for _ in range(300):
    q_start, k_start = torch.randint(0, 40, (2,)).tolist()
    q_stop, k_stop = q_start + torch.randint(1, 17, ()).item(), k_start + torch.randint(1, 17, ()).item()
    offset = torch.randint(0, 20, ()).item()
    course.expect_equal(tile_visibility(q_start, q_stop, k_start, k_stop, offset),
                        _visibility_by_brute_force(q_start, q_stop, k_start, k_stop, offset),
                        "tile_visibility on random tiles")
# every tile of a causal pass, as the tiled forward asks: the skipped and masked ones agree with the mask
n_q, n_k, b = 13, 21, 4
for q0 in range(0, n_q, b):
    for k0 in range(0, n_k, b):
        args = (q0, min(q0 + b, n_q), k0, min(k0 + b, n_k), n_k - n_q)
        course.expect_equal(tile_visibility(*args), _visibility_by_brute_force(*args), "tile_visibility on ragged edge tiles")
# each empty range's error names its own bound alone
_expect_bound_named_alone(tile_visibility, (3, 2, 0, 4, 0), "q_stop", "k_stop", "tile_visibility with q_stop < q_start")
_expect_bound_named_alone(tile_visibility, (0, 4, 5, 5, 0), "k_stop", "q_stop", "tile_visibility with k_stop == k_start")
### END HIDDEN TESTS

# %%
visibility = course.keep_going("tile_visibility", tile_visibility, flash.tile_visibility, check_tile_visibility)

# %% [markdown]
# The tiles of a causal pass over 16 queries and 16 keys in blocks of 4, and of a pass of
# 4 new queries over 16 keys (12 of them cached):

# %%
#| stable
symbols = {"skip": ".", "full": "#", "partial": "/"}
for n_q, n_k in ((16, 16), (4, 16)):
    print(f"{n_q} queries, {n_k} keys (offset {n_k - n_q}); rows: query blocks, columns: key blocks")
    for q0 in range(0, n_q, 4):
        print("   " + " ".join(symbols[visibility(q0, q0 + 4, k0, k0 + 4, n_k - n_q)] for k0 in range(0, n_k, 4)))

# %% [markdown]
# Ten of the sixteen tiles of the square are computed, four of them masked; the six to the
# right of the diagonal are skipped. As the number of blocks grows, the computed share
# tends to one half.
#
# ### Exercise 4 · The tiled forward
#
# Put the pieces together: `tiled_attention_forward(q, k, v, causal=False, block_q=64,
# block_k=64)` returns the attention output and the log-sum-exp of every query's scaled
# scores. For each block of `block_q` queries: start from $m = -\infty$, $\ell = 0$,
# $\tilde O = 0$; for each block of `block_k` keys, compute the tile's scaled scores,
# skip or mask it when `causal` (offset $N_k - N_q$), update the statistics; then write
# $O = \tilde O / \ell$ and $L = m + \log \ell$. The last blocks may be shorter (`N` need
# not be a multiple of the block).
#
# Call your `tile_update` and `tile_visibility`. The checks of this exercise run it with
# the course's versions of those two instead (`flash.tile_update` and
# `flash.tile_visibility`), so that it is graded on its own, whatever your answers to
# Exercises 2 and 3 do. q: `(..., q_len, d)`; k, v: `(..., k_len, d)`,
# leading dimensions broadcasting against q's. Return `out` `(..., q_len, d)` in q's dtype
# and `lse` `(..., q_len)`. Nothing of size $N_q \times N_k$ may be built (no scores, no
# weights, no mask): the tests measure the memory, as the operating system sees it (the
# process's peak resident memory, on Linux), at a length where one such matrix is many
# times the tiles.
#
# Difficulty ●●● · Importance ●●● · about 15 minutes
#
# <details><summary>Hint 1</summary>Allocate <code>out</code> and <code>lse</code> once, of the broadcast leading shape <code>torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])</code>, and fill them block by block: <code>out[..., q0:q1, :] = ...</code>.</details>
# <details><summary>Hint 2</summary>A partial tile's mask: <code>torch.arange(k0, k1)[None, :] &lt;= torch.arange(q0, q1)[:, None] + offset</code>, applied with <code>scores.masked_fill(~allowed, float("-inf"))</code>. Once a tile is "skip", every tile to its right is too: <code>break</code>.</details>
# <details><summary>Hint 3</summary>Scale once per query block: <code>q_block = q[..., q0:q1, :] * scale</code> with <code>scale = 1 / math.sqrt(d)</code>; the scores of a tile are <code>q_block @ k[..., k0:k1, :].transpose(-2, -1)</code>.</details>

# %%
#| answer tiled_attention_forward
#| export minillm/flash.py
def tiled_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                            block_q: int = 64, block_k: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention softmax(q k^T / sqrt(d)) v computed tile by tile, and its log-sum-exp.

    q: (..., q_len, d); k, v: (..., k_len, d), leading dimensions broadcasting against q's.
    causal: query i may attend to key j when j <= i + k_len - q_len. Blocks of ``block_q``
    queries and ``block_k`` keys (the last ones may be shorter). Returns out (..., q_len, d)
    in q's dtype and lse (..., q_len): log sum_j exp(q_i . k_j / sqrt(d)) over the keys
    query i may see. No (q_len, k_len) tensor is built: the memory beyond the inputs is
    O(q_len d + block_q block_k) per leading index.
    """
    ### BEGIN SOLUTION
    q_len, k_len, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale, offset = 1.0 / math.sqrt(d), k_len - q_len
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    out = q.new_empty(*lead, q_len, v.shape[-1])
    lse = q.new_empty(*lead, q_len)
    for q0 in range(0, q_len, block_q):
        q1 = min(q0 + block_q, q_len)
        q_block = q[..., q0:q1, :] * scale
        m = q.new_full((*lead, q1 - q0, 1), float("-inf"))
        l = q.new_zeros((*lead, q1 - q0, 1))
        acc = q.new_zeros((*lead, q1 - q0, v.shape[-1]))
        for k0 in range(0, k_len, block_k):
            k1 = min(k0 + block_k, k_len)
            kind = tile_visibility(q0, q1, k0, k1, offset) if causal else "full"
            if kind == "skip":
                break  # every later tile of this row of tiles is in the future too
            scores = q_block @ k[..., k0:k1, :].transpose(-2, -1)
            if kind == "partial":
                allowed = torch.arange(k0, k1, device=q.device)[None, :] <= torch.arange(q0, q1, device=q.device)[:, None] + offset
                scores = scores.masked_fill(~allowed, float("-inf"))
            m, l, acc = tile_update(m, l, acc, scores, v[..., k0:k1, :])
        out[..., q0:q1, :] = acc / l.masked_fill(l == 0, 1.0)
        lse[..., q0:q1] = (m + l.log()).squeeze(-1)
    return out, lse
    ### END SOLUTION

# %%
#| test tiled_attention_forward_visible points=1
def _naive_attention(q, k, v, causal=False):
    """Chapter 04's attention written out, with the causal triangle aligned to the last queries."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        q_len, k_len = scores.shape[-2:]
        scores = scores.masked_fill(torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len).logical_not(), float("-inf"))
    return torch.softmax(scores, -1) @ v, torch.logsumexp(scores, -1)


def _expect_no_score_matrix(tiled_attention_forward, q, k, v, what):
    """Fail when the peak memory of the causal forward on q, k, v (float32, long) rises by a
    quarter of one (q_len, k_len) float32 matrix or more: the 128 x 128 tiles need under 1 MiB.
    Read by the operating system (``course_runtime.memory``); where it cannot be read, there
    is nothing to judge. A (q_len, k_len) float32 matrix here is over 32 MiB, so the C
    allocator maps fresh pages for it on every call (it never reuses freed ones that large)."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    tiled_attention_forward(q, k, v, causal=True, block_q=128, block_k=128)  # warm-up: code and tables paged in
    _, grown = peak_growth(tiled_attention_forward, q, k, v, causal=True, block_q=128, block_k=128)
    if grown is not None and grown >= n_q * n_k:
        raise course.CheckFailed(
            f"{what}: the memory grew by {grown / 2**20:.0f} MiB while one {n_q} x {n_k} float32 matrix is "
            f"{4 * n_q * n_k / 2**20:.0f} MiB and the tiles need under 1: a (q_len, k_len) tensor (scores, weights, "
            "a mask) is built. Compute one block_q x block_k tile of scores at a time, and mask only partial tiles",
            f"{what}: the memory grew as if a (q_len, k_len) tensor (scores, weights, a mask) were built")


@course.visible_check("tiled_attention_forward", tile_update=flash.tile_update,
                      tile_visibility=flash.tile_visibility)
def check_tiled_attention_forward(tiled_attention_forward):
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 3, 10, 8, generator=g, dtype=torch.float64) for _ in range(3))
    for causal in (False, True):
        got = tiled_attention_forward(q, k, v, causal=causal, block_q=4, block_k=3)
        if not (isinstance(got, tuple) and len(got) == 2):
            raise course.CheckFailed(f"tiled_attention_forward must return (out, lse), got {course.describe(got)}")
        out, lse = _naive_attention(q, k, v, causal)
        unscaled = _naive_attention(q * math.sqrt(8), k, v, causal)
        course.expect_close(got[0], out, f"the output, causal={causal}, 10 queries and keys in blocks of 4 and 3", atol=1e-10,
                            mistakes={"the scale 1/sqrt(d) is missing": unscaled[0],
                                      "causal is ignored: future keys get weight": _naive_attention(q, k, v)[0]},
                            hint="the last blocks are shorter (10 = 4 + 4 + 2 = 3 + 3 + 3 + 1): are they all visited?")
        future = torch.ones(10, 10, dtype=torch.bool).tril().logical_not() & causal
        row_max = (q @ k.transpose(-2, -1) / math.sqrt(8)).masked_fill(future, float("-inf")).amax(-1)
        course.expect_close(got[1], lse, f"the log-sum-exp, causal={causal}", atol=1e-10, mistakes={
            "lse is log l alone: L = m + log l": lse - row_max, "lse is the maximum m alone: L = m + log l": row_max})
    q2 = torch.randn(1, 2, 3, 8, generator=g, dtype=torch.float64)  # 3 new queries after 7 cached keys
    course.expect_close(tiled_attention_forward(q2, k[:1, :2], v[:1, :2], causal=True, block_q=2, block_k=4)[0],
                        _naive_attention(q2, k[:1, :2], v[:1, :2], causal=True)[0],
                        "causal with 3 queries over 10 keys: the queries are the last 3 positions", atol=1e-10,
                        mistakes={"the causal triangle is aligned to the first queries (offset 0), not the last":
                                  F.scaled_dot_product_attention(q2, k[:1, :2], v[:1, :2], is_causal=True)})
    kv = k[:, :1]  # one K/V head for three query heads: the leading dimensions broadcast
    course.expect_close(tiled_attention_forward(q, kv, v[:, :1], causal=True, block_q=3, block_k=3)[0],
                        _naive_attention(q, kv, v[:, :1], causal=True)[0], "k and v broadcast over the heads", atol=1e-10)
    got = tiled_attention_forward(q.float(), k.float(), v.float(), block_q=5, block_k=5)[0]
    if isinstance(got, torch.Tensor) and got.dtype != torch.float32:
        raise course.CheckFailed(f"tiled_attention_forward of float32 inputs returned {got.dtype}: keep q's dtype")
    long = [torch.randn(1, 4096, 8, generator=g) for _ in range(3)]
    _expect_no_score_matrix(tiled_attention_forward, *long, "tiled_attention_forward on 4,096 queries and keys")


check_tiled_attention_forward(tiled_attention_forward)
print("tiled_attention_forward: visible test passed")

# %%
#| test tiled_attention_forward_hidden points=3
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
for shape_q, shape_k, causal, bq, bk, dtype in [
    ((2, 2, 37, 16), (2, 2, 37, 16), True, 8, 16, torch.float64),
    ((1, 4, 29, 8), (1, 1, 45, 8), True, 7, 5, torch.float64),
    ((3, 19, 12), (3, 19, 12), False, 64, 64, torch.float32),
    ((1, 2, 1, 8), (1, 2, 33, 8), True, 4, 8, torch.float64),
    ((2, 5, 4), (2, 23, 4), False, 2, 6, torch.float64),
]:
    q, k, v = torch.randn(*shape_q, dtype=dtype), torch.randn(*shape_k, dtype=dtype), torch.randn(*shape_k, dtype=dtype)
    got = tiled_attention_forward(q, k, v, causal=causal, block_q=bq, block_k=bk)
    expected_out, expected_lse = _naive_attention(q, k, v, causal)
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    assert isinstance(got[0], torch.Tensor) and got[0].dtype == dtype, "the output must keep q's dtype"
    course.expect_close(got[0], expected_out, "the tiled forward's output", atol=tol)
    course.expect_close(got[1], expected_lse, "the tiled forward's lse", atol=tol)
# large scores stay finite
q, k, v = 30 * torch.randn(1, 1, 20, 8), 30 * torch.randn(1, 1, 20, 8), torch.randn(1, 1, 20, 8)
got = tiled_attention_forward(q, k, v, causal=True, block_q=6, block_k=6)
assert torch.isfinite(got[0]).all() and torch.isfinite(got[1]).all(), "NaN or inf for large scores"
course.expect_close(got[0], _naive_attention(q, k, v, True)[0], "tiled forward with large scores", atol=1e-4)
# the memory: nothing of size q_len x k_len, here 3,500 new queries after 500 cached keys
q, k, v = torch.randn(1, 3500, 8), torch.randn(1, 4000, 8), torch.randn(1, 4000, 8)
_expect_no_score_matrix(tiled_attention_forward, q, k, v, "the tiled forward on long sequences")
### END HIDDEN TESTS

# %%
forward = course.keep_going("tiled_attention_forward", tiled_attention_forward, flash.tiled_attention_forward,
                            check_tiled_attention_forward)

# %% [markdown]
# Its memory, measured as before, against the naive attention's:

# %%
tiled_memory = []
for n in tqdm(lengths, desc="tiled forward"):
    q, k, v = torch.randn(3, 1, 1, n, 64).unbind(0)
    tiled_memory.append(flash.peak_tensor_bytes(forward, q, k, v, causal=True, block_q=128, block_k=128))
previous = None
for n, naive, tiled in zip(lengths, naive_memory["forward"], tiled_memory):
    growth = "" if previous is None else f", {naive / tiled / previous:.1f} times the previous factor"
    print(f"N = {n:5d}: naive forward {naive / 2**20:6.1f} MiB, tiled forward {tiled / 2**20:5.2f} MiB "
          f"({naive / tiled:5.1f}x less{growth})")
    previous = naive / tiled

# %% [markdown]
# The tiled forward's peak grows linearly: a fixed part (one $128 \times 128$ tile of
# scores and its exponentials, one block's statistics), which dominates at small $N$, plus
# the output and the log-sum-exp, which grow as $N$. The naive one quadruples with every
# doubling, the tiled one less than doubles while its fixed part dominates, so the factor
# printed on the right grows by more than 2 with each doubling here (the last column); it
# tends to 2 once the $N$-sized part of the tiled peak takes over.
#
# ## The backward
#
# Training needs the gradients with respect to $q$, $k$ and $v$. Autograd through the
# naive attention stores $P$ ($N \times N$) for them. FlashAttention stores only $q$, $k$,
# $v$, the output $O$ and the log-sum-exp $L$, and *recomputes* each tile of $P$ during
# the backward pass: $P_{ij} = e^{S_{ij} - L_i}$, exact, from one matrix product per tile.
# That costs one more $QK^\top$ than the naive backward (a quarter more FLOPs in the backward
# pass, a sixth more for forward and backward together);
# on a GPU it is cheaper than reading an $N \times N$ matrix back from HBM.
#
# With $dO$ the gradient arriving at the output, the chain rule through $O = PV$ gives
# $dV = P^\top dO$ and $dP = dO\, V^\top$. Through the softmax of each row,
# $dS_{ij} = P_{ij} (dP_{ij} - \sum_k P_{ik} dP_{ik})$. The row sum looks like it needs a
# whole row of $P$, but
#
# $$\sum_k P_{ik}\, dP_{ik} = \sum_k P_{ik} \sum_c dO_{ic} V_{kc} = \sum_c dO_{ic} \sum_k P_{ik} V_{kc} = \sum_c dO_{ic}\, O_{ic},$$
#
# so $dS = P \odot (dP - D)$ with $D = \operatorname{rowsum}(dO \odot O)$: the correction
# is a dot product of two $N \times d$ rows, one number per query, known before any tile
# is computed. FlashAttention-2 computes $D$ once, for every query, before the loops (as
# the Triton tutorial's backward does), instead of once per tile: each tile then only
# subtracts it. Then $dQ = dS\, K / \sqrt{d}$ and $dK = dS^\top Q / \sqrt{d}$,
# accumulated tile by tile.
#
# ### Exercise 5 · The backward's dS identity
#
# Implement `score_grad(p, dp, row_term)`: the gradient at the scores of one tile,
# $dS = P \odot (dP - D)$. `p`, `dp`: `(..., bq, bk)`, the tile's weights and
# $dP = dO\,V^\top$ on the tile; `row_term`: `(..., bq)`, the query block's
# $D = \operatorname{rowsum}(dO \odot O)$, computed once before the loops (as the
# log-sum-exp, one number per query), its leading dimensions broadcasting against `p`'s.
# Return dS `(..., bq, bk)` in `p`'s dtype.
#
# Difficulty ●○○ · Importance ●●● · about 6 minutes
#
# <details><summary>Hint 1</summary><code>row_term</code> has one number per query, so it belongs to the tile's rows: as <code>(..., bq, 1)</code> (<code>row_term[..., None]</code>) it broadcasts across the tile's columns. As it is, <code>(..., bq)</code>, it would line up with the columns, the keys.</details>

# %%
#| answer score_grad
#| export minillm/flash.py
def score_grad(p: torch.Tensor, dp: torch.Tensor, row_term: torch.Tensor) -> torch.Tensor:
    """The gradient at one tile's scores, dS = P * (dP - D).

    p: (..., bq, bk), the tile's attention weights; dp: (..., bq, bk), dO V^T on the tile;
    row_term: (..., bq), D = rowsum(dO * O) of the tile's queries (their output and the
    gradient at it), computed once per query before the loops. Returns dS (..., bq, bk).
    Exact for each tile because rowsum(P * dP) over all keys equals rowsum(dO * O)."""
    ### BEGIN SOLUTION
    return p * (dp - row_term[..., None])
    ### END SOLUTION

# %%
#| test score_grad_visible points=1
def _score_grad_case(g, lead=(2,), n_q=5, n_k=5, d=3, dtype=torch.float64):
    """Scores S (n_q x n_k) with autograd's gradient at them, and P, dP and D = rowsum(dO * O),
    for attention softmax(S) V."""
    scores = (2 * torch.randn(*lead, n_q, n_k, generator=g, dtype=dtype)).requires_grad_()
    v, do = torch.randn(*lead, n_k, d, generator=g, dtype=dtype), torch.randn(*lead, n_q, d, generator=g, dtype=dtype)
    p = torch.softmax(scores, -1)
    o = p @ v
    (o * do).sum().backward()
    return p.detach(), do @ v.transpose(-2, -1), (do * o.detach()).sum(-1), scores.grad


@course.visible_check("score_grad")
def check_score_grad(score_grad):
    g = torch.Generator().manual_seed(5)
    p, dp, row_term, expected = _score_grad_case(g)
    course.expect_close(score_grad(p, dp, row_term), expected, "score_grad against autograd through softmax(S) V",
                        atol=1e-10, mistakes={
                            "P * dP: the Jacobian's diagonal only, the correction - D is missing": p * dp,
                            "the correction is not weighted by P: dP - D": dp - row_term[..., None],
                            "D is subtracted along the keys (columns): row_term is (..., bq), one number per query; "
                            "as row_term[..., None] it belongs to the rows": p * (dp - row_term[..., None, :]),
                            "the sign of the correction: P * (dP + D)": p * (dp + row_term[..., None])})
    # one tile of the keys (columns 1..3): the queries' D, computed once from the whole row's O and dO, makes it exact
    course.expect_close(score_grad(p[..., 1:4], dp[..., 1:4], row_term), expected[..., 1:4],
                        "score_grad on a tile of three keys (the row's D makes it exact)", atol=1e-10,
                        mistakes={"the correction is the tile's own rowsum(P * dP), which needs the whole row: "
                                  "subtract the row_term given":
                                  p[..., 1:4] * (dp[..., 1:4] - (p[..., 1:4] * dp[..., 1:4]).sum(-1, keepdim=True))},
                        hint="row_term is (..., bq): row_term[..., None] broadcasts across the tile's columns")


check_score_grad(score_grad)
print("score_grad: visible test passed")

# %%
#| test score_grad_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
for lead, n_q, n_k, d, dtype in [((3, 2), 7, 9, 4, torch.float64), ((1,), 16, 16, 8, torch.float32),
                                 ((), 3, 5, 1, torch.float64), ((2,), 6, 4, 3, torch.float64)]:
    p, dp, row_term, expected = _score_grad_case(None, lead, n_q, n_k, d, dtype)
    got = score_grad(p, dp, row_term)
    assert isinstance(got, torch.Tensor) and got.dtype == dtype, "score_grad must keep the dtype"
    course.expect_close(got, expected, "score_grad", atol=1e-10 if dtype == torch.float64 else 1e-5)
    course.expect_close(score_grad(p[..., 2:], dp[..., 2:], row_term), expected[..., 2:], "score_grad on a tile",
                        atol=1e-10 if dtype == torch.float64 else 1e-5)
# two leading dimensions, (batch, heads)
p, dp, row_term, expected = _score_grad_case(None, (2, 3), 6, 6, 4)
course.expect_close(score_grad(p, dp, row_term), expected, "score_grad with two leading dimensions", atol=1e-10)
# every row of dS sums to zero (the softmax's gradient is orthogonal to shifts)
course.expect_close(score_grad(p, dp, row_term).sum(-1), torch.zeros(2, 3, 6, dtype=torch.float64), "rows of dS sum to 0",
                    atol=1e-10)
### END HIDDEN TESTS

# %%
grad_of_scores = course.keep_going("score_grad", score_grad, flash.score_grad, check_score_grad)

# %% [markdown]
# The backward pass, tile by tile, is given. It walks the tiles in FlashAttention-2's
# order, one block of keys at a time against every block of queries that sees it (the
# skipped tiles skipped), so that the block's $dK$ and $dV$ accumulate locally; it
# recomputes each tile of $P$ from the log-sum-exp and adds the tile's part of $dQ$. The
# row term $D = \operatorname{rowsum}(dO \odot O)$ is computed once, for every query,
# before the loops, and each tile takes its rows of it. When K/V heads are shared by several query heads (their leading
# dimension broadcasts), `sum_to_size` adds up the gradients of the queries that share
# them. `FlashAttentionFunction` ties both passes into autograd: its forward saves only q,
# k, v, the output and the log-sum-exp.

# %%
#| export minillm/flash.py
def tiled_attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                             lse: torch.Tensor, d_out: torch.Tensor, causal: bool = False, block_q: int = 64,
                             block_k: int = 64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients (dq, dk, dv), shaped as q, k, v, of ``tiled_attention_forward``'s output.

    out, lse: what the forward returned for q, k, v and ``causal``; d_out: the gradient at
    out. Each tile of the weights is recomputed as P = exp(q k^T / sqrt(d) - lse) (zeros for
    a query that sees no key); dS comes from ``score_grad``, with D = rowsum(d_out * out)
    computed once for every query before the loops, as FlashAttention-2 does. Memory beyond
    the inputs and the gradients: D, one number per query, and one block_q x block_k tile at
    a time.
    """
    n_queries, n_keys = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1])
    offset = n_keys - n_queries
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    lse = lse.masked_fill(torch.isneginf(lse), float("inf"))[..., None]  # a query that sees no key: P = exp(-inf) = 0
    # D: once per query, not once per tile, and a block of queries at a time, so that the
    # product d_out * out (as large as the output) never exists whole
    row_term = torch.cat([(d_out[..., i0:i0 + block_q, :] * out[..., i0:i0 + block_q, :]).sum(dim=-1)
                          for i0 in range(0, n_queries, block_q)], dim=-1)
    query_positions, key_positions = torch.arange(n_queries, device=q.device), torch.arange(n_keys, device=q.device)
    for j0 in range(0, n_keys, block_k):  # FlashAttention-2's order: one block of keys and values at a time...
        j1 = min(j0 + block_k, n_keys)
        k_j, v_j = k[..., j0:j1, :], v[..., j0:j1, :]
        dk_j, dv_j = torch.zeros_like(k_j), torch.zeros_like(v_j)
        for i0 in range(0, n_queries, block_q):  # ...against every block of queries that sees it
            i1 = min(i0 + block_q, n_queries)
            kind = tile_visibility(i0, i1, j0, j1, offset) if causal else "full"
            if kind == "skip":
                continue  # queries before these keys; a later block of queries may see them
            q_i, do_i = q[..., i0:i1, :], d_out[..., i0:i1, :]
            scores = (q_i @ k_j.transpose(-2, -1)) * scale
            if kind == "partial":
                future = key_positions[None, j0:j1] > query_positions[i0:i1, None] + offset
                scores = scores.masked_fill(future, float("-inf"))
            p = (scores - lse[..., i0:i1, :]).exp()  # the tile's weights, recomputed
            dv_j += (p.transpose(-2, -1) @ do_i).sum_to_size(dv_j.shape)
            ds = score_grad(p, do_i @ v_j.transpose(-2, -1), row_term[..., i0:i1])
            dk_j += (ds.transpose(-2, -1) @ q_i * scale).sum_to_size(dk_j.shape)
            dq[..., i0:i1, :] += (ds @ k_j * scale).sum_to_size(dq[..., i0:i1, :].shape)
        dk[..., j0:j1, :], dv[..., j0:j1, :] = dk_j, dv_j
    return dq, dk, dv


class FlashAttentionFunction(torch.autograd.Function):
    """``tiled_attention_forward`` with ``tiled_attention_backward`` as its gradient: the
    forward saves q, k, v, the output and the log-sum-exp, never the attention weights."""

    @staticmethod
    def forward(ctx, q, k, v, causal, block_q, block_k):
        out, lse = tiled_attention_forward(q, k, v, causal=causal, block_q=block_q, block_k=block_k)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = (causal, block_q, block_k)
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = tiled_attention_backward(q, k, v, out, lse, d_out, *ctx.options)
        return dq, dk, dv, None, None, None


def check_attention_inputs(q, k, v) -> None:
    """``ValueError`` unless q (..., q_len, d), k (..., k_len, d), v (..., k_len, d_v) are floating
    tensors of one dtype and device; ``TypeError`` for a non-tensor. (Whether the leading
    dimensions fit is the caller's check: they broadcast here, they hold grouped heads in
    the Triton kernel.)"""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() < 2 or not t.is_floating_point():
            raise ValueError(f"{name} must be a floating tensor (..., seq, head_dim), got {t.dtype} of shape {tuple(t.shape)}")
    if k.shape[-1] != q.shape[-1] or v.shape[-2] != k.shape[-2]:
        raise ValueError(f"k must be (..., k_len, {q.shape[-1]}) and v (..., k_len, d_v) with k's k_len; "
                         f"got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if len({q.dtype, k.dtype, v.dtype}) > 1 or len({q.device, k.device, v.device}) > 1:
        raise ValueError(f"q, k and v must share one dtype and device, got {q.dtype}/{k.dtype}/{v.dtype} "
                         f"on {q.device}/{k.device}/{v.device}")


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, block_q: int = 64,
                    block_k: int = 64) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v, tiled (FlashAttention), differentiable with a backward
    pass that recomputes the weights: memory O(N d) instead of O(N^2), forward and backward.

    q: (..., q_len, d); k, v: (..., k_len, d), leading dimensions broadcasting against q's.
    causal: query i may attend to key j when j <= i + k_len - q_len (the queries are the
    last q_len positions, as with a KV cache). block_q, block_k: the tile's size. Returns
    (..., q_len, d) in q's dtype; float16 and bfloat16 are computed in float32.
    ``ValueError``/``TypeError`` for inputs that do not fit, non-positive blocks, a non-bool causal.
    """
    check_attention_inputs(q, k, v)
    try:
        torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        raise ValueError(f"the leading dimensions of q {tuple(q.shape)}, k {tuple(k.shape)} and v {tuple(v.shape)} "
                         "do not broadcast") from None
    boolean("causal", causal)
    positive_int("block_q", block_q)
    positive_int("block_k", block_k)
    compute = compute_dtype(q.dtype)
    out = FlashAttentionFunction.apply(q.to(compute), k.to(compute), v.to(compute), causal, block_q, block_k)
    return out.to(q.dtype)

# %% [markdown]
# `gradcheck` compares the backward pass with finite differences of the forward in
# float64, entry by entry: causal, ragged blocks, three query heads sharing one K/V head.

# %%
#| stable
q = torch.randn(1, 3, 7, 4, dtype=torch.float64, requires_grad=True)
k, v = (torch.randn(1, 1, 9, 4, dtype=torch.float64, requires_grad=True) for _ in range(2))
print("gradcheck:", torch.autograd.gradcheck(lambda q, k, v: flash.flash_attention(q, k, v, causal=True, block_q=3, block_k=4),
                                             (q, k, v)))

# %% [markdown]
# And the memory of a training step, forward and backward, against the naive attention's:

# %%
def flash_training_step(q, k, v):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    flash.flash_attention(q, k, v, causal=True, block_q=128, block_k=128).sum().backward()


flash_memory = []
for n in tqdm(lengths, desc="flash attention, forward + backward"):
    q, k, v = torch.randn(3, 1, 1, n, 64).unbind(0)
    flash_memory.append(flash.peak_tensor_bytes(flash_training_step, q, k, v))

fig, ax = plt.subplots(figsize=(7, 4))
ax.loglog(lengths, [b / 2**20 for b in naive_memory["forward + backward"]], "o-", label="naive attention")
ax.loglog(lengths, [b / 2**20 for b in flash_memory], "s-", label="flash_attention (tiles of 128 × 128)")
ax.set_xlabel("sequence length N (tokens)")
ax.set_ylabel("peak of live tensor bytes (MiB)")
ax.set_title("Forward + backward, one head, d = 64, causal")
ax.set_xticks(lengths, [f"{n:,}" for n in lengths])
ax.minorticks_off()
ax.legend()
plt.show()
for i, (n, naive, tiled) in enumerate(zip(lengths, naive_memory["forward + backward"], flash_memory)):
    slopes = "" if i == 0 else (
        f"; slopes from N = {lengths[i - 1]}: naive {math.log2(naive / naive_memory['forward + backward'][i - 1]):.2f}, "
        f"flash {math.log2(tiled / flash_memory[i - 1]):.2f}")
    print(f"N = {n:5d}: naive {naive / 2**20:6.1f} MiB, flash {tiled / 2**20:5.2f} MiB: {naive / tiled:5.1f}x less{slopes}")

# %% [markdown]
# On the log-log plot the naive line has slope 2 (the local slopes printed under the
# figure): its memory is the $N \times N$ matrices. The flash line's slopes are well below 1
# at these lengths: its peak is mostly a fixed part (the tiles), plus the $N \times d$
# tensors, which grow as $N$; its slope tends to 1 as they take over, never more. So the
# memory saved by recomputing, the factor printed, grows faster than $N$ here, and as $N$
# from there on.
#
# ## The backend
#
# `flash_backend` adapts `flash_attention` to chapter 04's backend contract: K/V arrive
# un-repeated, `(batch, n_kv_heads, k_len, d)`, and the query heads are grouped as
# `(batch, n_kv_heads, n_rep, q_len, d)` so that each K/V head is read once and broadcast
# over its group, never copied. Causal attention already aligns to the last queries. What
# it does not do it refuses with a `ValueError`, as the contract asks: masks (padding,
# ALiBi's biases: "sdpa" and "math" take them) and dropout on the weights. The registry
# declared the name "flash" in chapter 04; from now on it resolves.

# %%
#| export minillm/flash.py
def refuse_mask_and_dropout(backend: str, mask, dropout_p) -> None:
    """``ValueError`` naming the argument for a mask or a dropout_p other than 0, which a tiled
    kernel of full or causal attention (the backend called ``backend``) cannot take."""
    if mask is not None:
        raise ValueError(f"the {backend} backend takes no mask (it computes full or causal attention); "
                         "use the 'sdpa' or 'math' backend for padding masks and ALiBi biases")
    if dropout_p != 0.0:
        raise ValueError(f"the {backend} backend has no attention dropout (dropout_p must be 0.0, got {dropout_p!r}); "
                         "use the 'sdpa' or 'math' backend to train with dropout")


def flash_backend(q, k, v, mask=None, causal=False, dropout_p=0.0):
    """The "flash" attention backend (contract: ``minillm.attention.ATTENTION_BACKENDS``):
    ``flash_attention`` with the K/V heads shared by broadcasting.

    q: (batch, n_heads, q_len, d); k, v: (batch, n_kv_heads, k_len, d), n_kv_heads dividing
    n_heads. ``ValueError`` for a mask (this kernel computes full or causal attention only:
    use "sdpa" or "math" for padding masks and biases), for dropout_p > 0, and for head
    counts that do not divide.
    """
    refuse_mask_and_dropout("flash", mask, dropout_p)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be (batch, heads, seq, head_dim), got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    grouped = q.unflatten(1, (k.shape[1], kv_groups(q, k)))
    out = flash_attention(grouped, k[:, :, None], v[:, :, None], causal=causal)
    return out.flatten(1, 2)

# %% [markdown]
# Two models with the same weights, one on "math" and one on "flash", give the same
# logits, and with a KV cache (chapter 07's `generate(..., use_cache=True)`, where each
# new query attends to every cached key) the same tokens. Then both train for a few
# steps from the same start on the same batches:

# %%
import dataclasses

from minillm import data
from minillm.generate import generate
from minillm.model import GPT, GPTConfig
from minillm.batches import BatchSampler
from minillm.train import TrainConfig, train

config = GPTConfig(vocab_size=256, context_length=128, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                   attention_backend="math")
torch.manual_seed(0)
math_model = GPT(config)
flash_model = GPT(dataclasses.replace(config, attention_backend="flash"))
flash_model.load_state_dict(math_model.state_dict())
ids = torch.tensor([list(data.corpus_text()[:96].encode())])
with torch.no_grad():
    difference = (math_model(ids)[0] - flash_model(ids)[0]).abs().max().item()
print(f"largest difference of the logits, math vs flash: {difference:.1e}")
torch.manual_seed(1)
sampled_math = generate(math_model, ids[:, :20], max_new_tokens=12, use_cache=True)
torch.manual_seed(1)
sampled_flash = generate(flash_model, ids[:, :20], max_new_tokens=12, use_cache=True)
print(f"12 sampled tokens with a KV cache: {'identical' if torch.equal(sampled_math, sampled_flash) else 'different'}")

# %%
corpus = torch.tensor(list(data.corpus_text()[:200_000].encode()))
steps = 6 if QUICK else 30
curves = {}
for name, model in (("math", math_model), ("flash", flash_model)):
    torch.manual_seed(2)
    start = time.perf_counter()
    state = train(model, BatchSampler(corpus, batch_size=8, context=128, seed=3), TrainConfig(steps=steps, lr=2e-3, warmup_steps=2),
                  progress=False)
    curves[name] = state.history["train_loss"]
    print(f"{name:5s}: {steps} steps in {time.perf_counter() - start:4.1f} s, loss {curves[name][0]:.3f} → {curves[name][-1]:.3f}")
print(f"largest difference between the two loss curves: {max(abs(a - b) for a, b in zip(*curves.values())):.1e}")
fig, ax = plt.subplots(figsize=(6, 3.5))
for name, losses in curves.items():
    ax.plot(range(1, steps + 1), losses, "o-" if name == "math" else "x--", label=f'attention_backend="{name}"')
ax.set_xlabel("optimizer step")
ax.set_ylabel("training loss (nats per byte)")
ax.set_title("The same training run on two attention backends")
ax.legend()
plt.show()

# %% [markdown]
# The two curves lie on top of each other: the same numbers to float32 rounding, step
# after step (the largest difference is printed above). The times printed are one short
# run on a shared machine, not a benchmark: `bench/flash_attention.py` measures time and
# memory side by side, and on a CPU it is the memory that differs (the README's table).
#
# ## A Triton kernel
#
# On a GPU the tile loop is written as one kernel, in which each program (a block of
# threads) owns one block of queries: it loads the block into on-chip memory (SRAM), walks
# the key blocks, and writes only the output and the log-sum-exp back to HBM. Triton
# (Tillet et al., 2019) writes such kernels in Python: `tl.load` and `tl.store` move
# blocks between memory and the program, `tl.dot` multiplies blocks, and block shapes are
# compile-time constants (`tl.constexpr`, powers of two). Loads and stores take a `mask`
# so that the last, partial block of a ragged length reads zeros instead of running off
# the end of the tensor.
#
# Without a GPU, `TRITON_INTERPRET=1` (set in the setup cell) runs the same kernel in
# Python, one program after another, on CPU tensors: slow, but the same code, tested the
# same way. Where Triton is not installed at all (it exists for Linux x86-64 only), the
# next cells fail with the reason printed, and the cells after them use the PyTorch
# `flash_attention`. The kernel's module begins:

# %%
#| export minillm/flash_triton.py
#| tags raises-exception
"""FlashAttention's forward pass as a Triton kernel (chapter 10), imported only where it is used.

``triton_flash_attention(q, k, v, causal=False)``: q (batch, n_heads, q_len, d), k, v
(batch, n_kv_heads, k_len, d); float32 (its products in IEEE float32), float16 or
bfloat16; d a power of two from 16 to 256; any lengths (the last blocks are masked). The
backward pass is PyTorch's recomputing one, ``minillm.flash.tiled_attention_backward``,
fed with the kernel's log-sum-exp: this module has no Triton backward.

On a CUDA GPU the kernel is compiled; elsewhere set ``TRITON_INTERPRET=1`` before this
module is imported, and it runs in Triton's interpreter on CPU tensors (small shapes only;
the interpreter's ``tl.dot`` has no bfloat16). Triton exists for Linux x86-64 only.
"""

import torch

try:
    import triton
    import triton.language as tl
except ImportError as error:
    raise ImportError("minillm.flash_triton needs Triton, which exists for Linux x86-64 only "
                      "(pip install triton); minillm.flash.flash_attention is the PyTorch version") from error

from minillm.checks import boolean
from minillm.attention import kv_groups
from minillm.flash import check_attention_inputs, refuse_mask_and_dropout, tiled_attention_backward

# %% [markdown]
# ### Exercise 6 · The Triton kernel's inner loop
#
# The kernel below is given except for its inner loop: the body of `for start_n in
# range(0, hi, BLOCK_N)`, which handles one block of `BLOCK_N` keys for the program's
# `BLOCK_M` queries. Write it, as in Exercise 2 but in Triton:
#
# 1. load the key block `k` (`BLOCK_N × HEAD_DIM`) and the value block `v` at rows
#    `cols = start_n + offs_n`, with `mask=cols[:, None] < k_len, other=0.0`;
# 2. the tile's scores `s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale`;
# 3. set `s` to `-inf` where the key is past the end (`cols >= k_len`) and, when `CAUSAL`,
#    where `cols[None, :] > offs_m[:, None] + offset` (`tl.where`);
# 4. update `m_i`, `l_i`, `acc` (here `m_i`, `l_i` have shape `(BLOCK_M,)`: use
#    `tl.max(s, 1)`, `tl.sum(p, 1)` and `[:, None]`); cast `p` to `v`'s dtype before the
#    second `tl.dot`.
#
# Every query row here sees at least key 0 (the launcher requires `k_len >= q_len` when
# causal), so the running maximum is finite after the first block: no $-\infty - (-\infty)$
# to guard against. `triton_attention_forward`, also given, launches one program per
# block of queries and per head and returns `(out, lse)`. This exercise is graded where
# Triton runs (Linux x86-64, in the grader too, under the interpreter); elsewhere its cells
# cannot run and it scores 0.
#
# Difficulty ●●● · Importance ●●○ · about 15 minutes
#
# <details><summary>Hint 1</summary>Pointers are base + offsets: the keys of block <code>start_n</code> are at <code>K + kv_head * stride_kh + cols[:, None] * stride_kn + offs_d[None, :]</code>; values likewise with V's strides.</details>
# <details><summary>Hint 2</summary><code>valid = cols[None, :] &lt; k_len</code>, then <code>if CAUSAL: valid = valid &amp; (cols[None, :] &lt;= offs_m[:, None] + offset)</code>, then <code>s = tl.where(valid, s, float("-inf"))</code>.</details>
# <details><summary>Hint 3</summary><code>m_new = tl.maximum(m_i, tl.max(s, 1))</code>; <code>alpha = tl.exp(m_i - m_new)</code>; <code>p = tl.exp(s - m_new[:, None])</code>; <code>l_i = l_i * alpha + tl.sum(p, 1)</code>; <code>acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)</code>; <code>m_i = m_new</code>.</details>

# %%
#| answer triton_attention_forward
#| export minillm/flash_triton.py
#| tags raises-exception
@triton.jit
def _flash_forward_kernel(Q, K, V, O, LSE, q_len, k_len, offset, scale, n_rep,
                          stride_qh, stride_qm, stride_kh, stride_kn, stride_vh, stride_vn, stride_oh, stride_om,
                          HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          CAUSAL: tl.constexpr, PRECISION: tl.constexpr):
    """One program: queries start_m * BLOCK_M ... of head program_id(1) (batch and heads
    flattened), against every key block it may see; writes O and LSE (log-sum-exp)."""
    start_m = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // n_rep  # grouped-query attention: n_rep query heads share one K/V head
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + head * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :], mask=offs_m[:, None] < q_len, other=0.0)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    hi = k_len
    if CAUSAL:  # the causal block skip: no key past the last query's position + offset
        hi = tl.minimum(k_len, (start_m + 1) * BLOCK_M + offset)
    for start_n in range(0, hi, BLOCK_N):
        ### BEGIN SOLUTION
        cols = start_n + offs_n
        k = tl.load(K + kv_head * stride_kh + cols[:, None] * stride_kn + offs_d[None, :], mask=cols[:, None] < k_len, other=0.0)
        v = tl.load(V + kv_head * stride_vh + cols[:, None] * stride_vn + offs_d[None, :], mask=cols[:, None] < k_len, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        valid = cols[None, :] < k_len
        if CAUSAL:
            valid = valid & (cols[None, :] <= offs_m[:, None] + offset)
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
        ### END SOLUTION
    acc = acc / l_i[:, None]
    rows = offs_m < q_len
    tl.store(O + head * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :], acc.to(O.dtype.element_ty), mask=rows[:, None])
    tl.store(LSE + head * q_len + offs_m, m_i + tl.log(l_i), mask=rows)


def triton_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                             block_m: int = 16, block_n: int = 16, num_warps: int = 4,
                             num_stages: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's (out, lse): q (batch, n_heads, q_len, d), k, v (batch, n_kv_heads, k_len,
    d) → out (batch, n_heads, q_len, d) in q's dtype, lse (batch, n_heads, q_len) float32.
    block_m, block_n: the tile (powers of two, at least 16 for tl.dot on a GPU; the small
    default suits the interpreter); num_warps, num_stages: how a GPU runs each program.
    ``ValueError`` for shapes the kernel cannot take (d not a power of two in 16..256,
    heads that do not divide, causal with more queries than keys)."""
    if q.dim() != 4 or k.shape != v.shape or k.dim() != 4 or k.shape[0] != q.shape[0] or k.shape[-1] != q.shape[-1]:
        raise ValueError(f"q must be (batch, n_heads, q_len, d) and k, v (batch, n_kv_heads, k_len, d), "
                         f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    batch, n_heads, q_len, d = q.shape
    k_len = k.shape[2]
    if d not in (16, 32, 64, 128, 256):
        raise ValueError(f"the Triton kernel needs head_dim a power of two from 16 to 256, got {d}")
    n_rep = kv_groups(q, k)
    if causal and k_len < q_len:
        raise ValueError(f"causal attention needs at least as many keys as queries, got {q_len} queries and {k_len} keys")
    q, k, v = (t.reshape(-1, t.shape[2], d).contiguous() for t in (q, k, v))  # heads flattened: (batch * heads, seq, d)
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(q_len, block_m), batch * n_heads)
    _flash_forward_kernel[grid](q, k, v, out, lse, q_len, k_len, k_len - q_len, 1.0 / d ** 0.5, n_rep,
                                q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                                out.stride(0), out.stride(1), HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n,
                                CAUSAL=bool(causal), PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
                                num_warps=num_warps, num_stages=num_stages)
    return out.view(batch, n_heads, q_len, d), lse.view(batch, n_heads, q_len)

# %%
#| test triton_attention_forward_visible points=1
@course.visible_check("triton_attention_forward")
def check_triton_attention_forward(triton_attention_forward):
    if not HAVE_TRITON:
        raise course.CheckFailed("Triton is not installed here (it exists for Linux x86-64 only): this exercise is "
                                 "graded where Triton runs")
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 2, 40, 16, generator=g).to(device) for _ in range(3))  # 40 = 2.5 blocks of 16
    for causal in (False, True):
        got = triton_attention_forward(q, k, v, causal=causal)
        if not (isinstance(got, tuple) and len(got) == 2):
            raise course.CheckFailed(f"triton_attention_forward must return (out, lse), got {course.describe(got)}")
        out, lse = _naive_attention(q.double().cpu(), k.double().cpu(), v.double().cpu(), causal)
        course.expect_close(got[0].cpu().double(), out, f"the kernel's output, causal={causal}, 40 queries and keys", atol=1e-4,
                            mistakes={"causal is ignored: future keys get weight": _naive_attention(
                                q.double().cpu(), k.double().cpu(), v.double().cpu())[0]},
                            hint="the last key block holds 8 real keys and 8 past the end: are those masked to -inf?")
        course.expect_close(got[1].cpu().double(), lse, f"the kernel's log-sum-exp, causal={causal}", atol=1e-4,
                            hint="l_i must be rescaled by alpha before the new block's sum is added")
    q2 = torch.randn(1, 4, 24, 16, generator=g).to(device)  # 24 new queries after 16 cached keys; 2 K/V heads
    k2, v2 = torch.randn(1, 2, 40, 16, generator=g).to(device), torch.randn(1, 2, 40, 16, generator=g).to(device)
    expected = _naive_attention(q2.double().cpu(), k2.double().cpu().repeat_interleave(2, 1),
                                v2.double().cpu().repeat_interleave(2, 1), causal=True)[0]
    course.expect_close(triton_attention_forward(q2, k2, v2, causal=True)[0].cpu().double(), expected,
                        "causal, 24 queries over 40 keys, 2 K/V heads for 4 query heads", atol=1e-4,
                        hint="the causal condition is key <= query + offset, with offset = k_len - q_len")


check_triton_attention_forward(triton_attention_forward)
print("triton_attention_forward: visible test passed")

# %%
#| test triton_attention_forward_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
assert HAVE_TRITON, "Triton is not installed here: this exercise is graded where Triton runs"
for (b, h, h_kv, n_q, n_k, d), causal, dtype, tol in [((1, 2, 1, 33, 33, 32), True, torch.float32, 1e-4),
                                                      ((2, 1, 1, 17, 50, 16), False, torch.float32, 1e-4),
                                                      ((1, 2, 2, 48, 64, 16), True, torch.float16, 2e-2)]:
    q = torch.randn(b, h, n_q, d, dtype=dtype).to(device)
    k, v = torch.randn(b, h_kv, n_k, d, dtype=dtype).to(device), torch.randn(b, h_kv, n_k, d, dtype=dtype).to(device)
    result = triton_attention_forward(q, k, v, causal=causal)
    assert result[0].dtype == dtype, "the kernel's output must keep q's dtype"
    rep = h // h_kv
    out, lse = _naive_attention(q.double().cpu(), k.double().cpu().repeat_interleave(rep, 1),
                                v.double().cpu().repeat_interleave(rep, 1), causal)
    course.expect_close(result[0].cpu().double(), out, "the kernel's output", atol=tol)
    course.expect_close(result[1].cpu().double(), lse, "the kernel's lse", atol=tol)
### END HIDDEN TESTS

# %%
if HAVE_TRITON:
    from minillm import flash_triton

    kernel_forward = course.keep_going("triton_attention_forward", triton_attention_forward,
                                       flash_triton.triton_attention_forward, check_triton_attention_forward)
else:
    print("triton_attention_forward: Triton is not installed here (Linux x86-64 only); the cells below use the "
          "PyTorch flash_attention instead")
    kernel_forward = None

# %% [markdown]
# The kernel's forward with the PyTorch recomputing backward, as one differentiable
# function and as the backend "triton". Triton could run the backward too (FlashAttention-2
# writes it as two more kernels); this module keeps PyTorch's, fed with the kernel's
# log-sum-exp, and says so in its docstring.

# %%
#| export minillm/flash_triton.py
#| tags raises-exception
def gpu_launch_options(head_dim: int) -> dict:
    """Tiles and warps for ``triton_attention_forward`` on a GPU: 128 queries by 64 keys (32
    keys for head_dim above 64, to fit the shared memory)."""
    wide = head_dim > 64
    return {"block_m": 128, "block_n": 32 if wide else 64, "num_warps": 8 if wide else 4, "num_stages": 3}


def launch_options(q: torch.Tensor) -> dict:
    """``gpu_launch_options`` for q on a CUDA GPU; in the interpreter, the launcher's 16 by 16."""
    return gpu_launch_options(q.shape[-1]) if q.device.type == "cuda" else {}


class TritonFlashAttention(torch.autograd.Function):
    """``triton_attention_forward`` with ``minillm.flash.tiled_attention_backward`` (PyTorch,
    recomputing the weights from the kernel's log-sum-exp) as its gradient."""

    @staticmethod
    def forward(ctx, q, k, v, causal):
        out, lse = triton_attention_forward(q, k, v, causal=causal, **launch_options(q))
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal = causal
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, lse = ctx.saved_tensors
        n_kv_heads = k.shape[1]

        def grouped(t):  # (batch, n_heads, ...) → (batch, n_kv_heads, n_rep, ...), in float32
            return t.unflatten(1, (n_kv_heads, -1)).float()

        dq, dk, dv = tiled_attention_backward(grouped(q), k[:, :, None].float(), v[:, :, None].float(), grouped(out),
                                              grouped(lse), grouped(d_out), causal=ctx.causal)
        return dq.flatten(1, 2).to(q.dtype), dk[:, :, 0].to(k.dtype), dv[:, :, 0].to(v.dtype), None


def triton_flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """FlashAttention with the Triton forward kernel: q (batch, n_heads, q_len, d), k, v
    (batch, n_kv_heads, k_len, d) → (batch, n_heads, q_len, d) in q's dtype. causal: query i
    may attend to key j when j <= i + k_len - q_len. Differentiable (PyTorch's recomputing
    backward). ``ValueError`` for shapes the kernel cannot take."""
    check_attention_inputs(q, k, v)
    boolean("causal", causal)
    return TritonFlashAttention.apply(q, k, v, causal)


def triton_backend(q, k, v, mask=None, causal=False, dropout_p=0.0):
    """The "triton" attention backend (contract: ``minillm.attention.ATTENTION_BACKENDS``):
    ``triton_flash_attention``. ``ValueError`` for a mask and for dropout_p > 0, as "flash"."""
    refuse_mask_and_dropout("triton", mask, dropout_p)
    return triton_flash_attention(q, k, v, causal=causal)

# %% [markdown]
# The backend "triton" in the model of the last section (under the interpreter this takes
# a few seconds: every program runs in Python):

# %%
if HAVE_TRITON:
    kernel_model = GPT(dataclasses.replace(config, attention_backend="triton", n_layers=1)).to(device)
    reference_model = GPT(dataclasses.replace(config, n_layers=1)).to(device)
    reference_model.load_state_dict(kernel_model.state_dict())
    short = ids[:, :48].to(device)  # on a GPU the kernel is compiled for CUDA tensors; here the interpreter takes CPU ones
    start = time.perf_counter()
    with torch.no_grad():
        difference = (kernel_model(short)[0] - reference_model(short)[0]).abs().max().item()
    print(f"a 1-layer model on 48 tokens, triton vs math: largest difference of the logits {difference:.1e} "
          f"({time.perf_counter() - start:.1f} s)")
else:
    print("skipped: Triton is not installed here (Linux x86-64 only); the model uses attention_backend='flash'")

# %% [markdown]
# ## The roofline
#
# Why is the tiled kernel fast on a GPU, when it does *more* arithmetic than the naive
# one (the backward recomputes $P$)? Because a GPU's arithmetic is far faster than its
# memory. An H100 SXM does about 989 TFLOP/s of dense bfloat16 matrix arithmetic and
# reads its HBM3 at 3.35 TB/s; an H200 has the same arithmetic and 4.8 TB/s of HBM3e
# (NVIDIA's data sheets). A kernel that does fewer than $989/3.35 \approx 295$ FLOPs per
# byte it moves (the *ridge point*; 206 on an H200) waits for memory: it is
# *memory-bound*, and its speed is set by its bytes, not its FLOPs.
#
# Count for one head, $N$ tokens, head width $d$, bfloat16 (2 bytes a number). Both
# versions do the two matrix products, $4N^2 d$ FLOPs. The naive version writes $S$ to
# HBM, reads it back for the softmax, writes $P$, reads it back for $PV$: $4N^2$ numbers,
# besides reading $Q, K, V$ and writing $O$ ($4Nd$). The tiled kernel reads each block of
# queries once and writes its output once, and reads $K$ and $V$ once per block of
# $B_q$ queries: $2Nd + 2Nd \cdot N/B_q$ numbers at worst, only $4Nd$ when $K$ and $V$
# stay in the GPU's 50 MB L2 cache between programs.

# %%
#| stable
H100 = {"name": "H100 SXM", "bf16 FLOP/s": 989e12, "HBM bytes/s": 3.35e12}
H200 = {"name": "H200 SXM", "bf16 FLOP/s": 989e12, "HBM bytes/s": 4.8e12}


def attention_costs(n: int, d: int, block_q: int = 128, bytes_per_number: int = 2) -> dict[str, tuple[float, float]]:
    """(FLOPs, HBM bytes) of one head's forward attention, naive and tiled (worst case and K/V cached)."""
    flops = 4 * n * n * d
    return {"naive": (flops, bytes_per_number * (4 * n * n + 4 * n * d)),
            f"tiled, K/V re-read per block of {block_q} queries": (flops, bytes_per_number * (2 * n * d + 2 * n * d * n / block_q)),
            "tiled, K/V read once (they fit in L2)": (flops, bytes_per_number * 4 * n * d)}


print(f"ridge points: {H100['name']} {H100['bf16 FLOP/s'] / H100['HBM bytes/s']:.0f} FLOP/byte, "
      f"{H200['name']} {H200['bf16 FLOP/s'] / H200['HBM bytes/s']:.0f} FLOP/byte")
for name, (flops, moved) in attention_costs(4096, 64).items():
    intensity = flops / moved
    bound = min(H100["bf16 FLOP/s"], intensity * H100["HBM bytes/s"])
    print(f"N = 4096, d = 64, {name:48s}: {flops / 1e9:5.2f} GFLOP, {moved / 2**20:6.1f} MiB moved, "
          f"{intensity:6.1f} FLOP/byte → at most {bound / 1e12:5.0f} TFLOP/s on an H100")

# %%
ns = [2 ** i for i in range(8, 16)]
fig, ax = plt.subplots(figsize=(7, 4))
for label, style in (("naive", "o-"), ("tiled, K/V re-read per block of 128 queries", "s-"),
                     ("tiled, K/V read once (they fit in L2)", "^-")):
    ax.loglog(ns, [attention_costs(n, 64)[label][0] / attention_costs(n, 64)[label][1] for n in ns], style, label=label)
for gpu, color in ((H100, "C3"), (H200, "C4")):
    ax.axhline(gpu["bf16 FLOP/s"] / gpu["HBM bytes/s"], color=color, linestyle="--", label=f"{gpu['name']} ridge point")
ax.set_xlabel("sequence length N (tokens)")
ax.set_ylabel("arithmetic intensity (FLOP per HBM byte)")
ax.set_title("One head of attention, d = 64, bfloat16")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# The naive version's intensity levels off at $d/2 = 32$ FLOPs per byte, whatever $N$:
# far below either ridge point, so HBM caps it at about 106 TFLOP/s on an H100, a ninth
# of the arithmetic the GPU has. The tiled version moves a quarter of the bytes even when
# every block of 128 queries re-reads $K$ and $V$ from HBM (124 FLOP/byte, up to about
# 416 TFLOP/s), and when they stay in L2 its intensity grows with $N$ (2,048 FLOP/byte at
# $N = 4{,}096$): past the ridge, compute-bound. That is the sense of "IO-aware": the same
# FLOPs for several times fewer bytes. On a CPU the caches play SRAM's part, but its
# arithmetic is not nearly so much faster than its memory, and our tiles run one by one
# from Python: the CPU shows the memory saving, not the speed-up.
#
# ### Written question
#
# The backward pass recomputes every tile of $P$ instead of reading it back. In three to
# five sentences: how many extra FLOPs does that cost, relative to the naive backward, and
# why is the recomputing backward still the faster one on a GPU at $N = 4{,}096$? Use the
# numbers above.

# %% [markdown]
# #| written why_recompute points=2
# ### BEGIN SOLUTION
# *Model answer.* The naive backward does four $N^2 d$ matrix products ($dV = P^\top dO$,
# $dP = dO V^\top$, $dQ = dS K$, $dK = dS^\top Q$), $8N^2 d$ FLOPs; recomputing $S = QK^\top$
# adds one more, $2N^2 d$: a quarter more in the backward, about a sixth more for forward
# and backward together. But the naive backward must read $P$ (and the forward must have
# written it): $N^2$ numbers per head, 32 MiB at $N = 4{,}096$ in bfloat16, against the
# few MiB of $Q, K, V, O$; its intensity stays near $d/2 = 32$ FLOP/byte, a tenth of an
# H100's ridge point of about 295, so it is memory-bound and the extra FLOPs of the
# recomputing version cost less than the bytes they save. Recomputation also frees the
# memory of $P$ (the factor measured above on the CPU), which allows longer sequences or
# larger batches.
#
# *Grading:* 1 point for the extra cost (one more $QK^\top$ per tile, about 25% more
# backward FLOPs, or an equivalent count); 1 point for the memory-bound argument (reading
# an $N^2$ matrix from HBM costs more time than recomputing it, with the intensity or the
# ridge point) or for the memory saved.
# ### END SOLUTION

# %% [markdown]
# ## Tee check
#
# > **The shirt:** "FlashAttention: IO-aware tiled GPU attention kernel", tiling "to
# > minimize memory reads/writes between the GPU's slow High Bandwidth Memory (HBM) and
# > fast SRAM", "dramatically accelerating training".
#
# **What is right:** FlashAttention computes exactly the attention of chapter 04 (to
# float rounding, measured above), never holds an $N \times N$ matrix, and moves an order
# of magnitude fewer bytes between HBM and the chip (the roofline section); its memory
# grows as $N$, not $N^2$ (measured: the figures above).
#
# **What is loose:** "dramatically accelerating training" is a GPU statement. The CPU
# measurement is `bench/flash_attention.py` (the README's CPU table): naive, tiled and
# PyTorch's fused `F.scaled_dot_product_attention`, time and memory of a training step's
# attention, one head, d = 64, causal. Its cached run, plotted here in both modes:

# %%
import json

bench = json.loads(data.path("flash_attention_cpu.json").read_text())
methods = [name for name in bench["rows"][0] if name != "N"]
bench_lengths = [row["N"] for row in bench["rows"]]
fig, axes = plt.subplots(1, 2, figsize=(11, 4))
for name, style in zip(methods, ("o-", "s-", "^-")):
    axes[0].loglog(bench_lengths, [row[name]["peak_bytes"] / 2**20 for row in bench["rows"]], style, label=name)
    axes[1].loglog(bench_lengths, [row[name]["seconds"] * 1e3 for row in bench["rows"]], style, label=name)
axes[0].set_ylabel("peak of live tensor bytes (MiB)")
axes[1].set_ylabel("time of forward + backward (ms, one thread)")
for ax, title in zip(axes, ("Memory: the tiled versions grow as N", "Time: noisy, and not the point on a CPU")):
    ax.set_xlabel("sequence length N (tokens)")
    ax.set_xticks(bench_lengths, [f"{n:,}" for n in bench_lengths])
    ax.minorticks_off()
    ax.set_title(title)
    ax.legend(fontsize=7)
plt.tight_layout()
plt.show()
last = bench["rows"][-1]
naive_name, tiled_name, sdpa_name = methods
print(f"cached: `{bench['command']}` ({bench['seconds']:.0f} s; {bench['versions']['device']}, torch {bench['versions']['torch']})")
for row in bench["rows"]:
    print(f"N = {row['N']:5d}: memory naive / tiled {row[naive_name]['peak_bytes'] / row[tiled_name]['peak_bytes']:5.1f}x; "
          f"time tiled / naive {row[tiled_name]['seconds'] / row[naive_name]['seconds']:.2f}, "
          f"fused SDPA / naive {row[sdpa_name]['seconds'] / row[naive_name]['seconds']:.2f}")

# %% [markdown]
# On the CPU the large and steady win is memory: about 100 times less than the naive
# version at $N = 4{,}096$, the factor a little more than doubling with each doubling of
# $N$ (2.7, 7.8, 19.9, 46.7, 102.1). Time is a noisy story (one run on a two-core machine,
# one thread): in this run our tiled version, its tiles run one by one from Python, takes
# 1.73 times the naive time at $N = 256$, where there are only $2 \times 2$ tiles and the
# Python around them costs more than it saves, 0.72 and 0.73 at $N = 512$ and $1{,}024$,
# and ever less beyond, 0.21 at $N = 4{,}096$, where the naive version's $N \times N$
# matrices no longer fit in the caches. PyTorch's fused kernel, the same algorithm in C++,
# is faster than both at every $N$. "Dramatically accelerating" is the GPU's story: the roofline predicts both memory and time to improve there, and the
# README's GPU table, from the same script, is where the course measures it (it says
# whether it has run yet). And attention is only part of a training step: the
# feed-forward networks and projections do not get faster, so a whole step gains less
# than the attention kernel does.
#
# ## What `minillm` gained
#
# - `minillm.flash`: `online_softmax` (Exercise 1), `tile_update` (Exercise 2),
#   `tile_visibility` (Exercise 3), `tiled_attention_forward` (Exercise 4), `score_grad`
#   (Exercise 5) and the given `tiled_attention_backward`; `flash_attention(q, k, v,
#   causal=False, block_q=64, block_k=64)`, differentiable with the recomputing backward;
#   `flash_backend`, the attention backend "flash" (`GPTConfig(attention_backend="flash")`);
#   `LiveTensorBytes` and `peak_tensor_bytes`, the memory measure.
# - `minillm.flash_triton` (imported only where used; Triton exists for Linux x86-64):
#   the forward kernel with your inner loop (Exercise 6), `triton_attention_forward`,
#   `triton_flash_attention(q, k, v, causal=False)` and the backend "triton".
#
# ## Further reading
#
# - Milakov & Gimelshein, *Online normalizer calculation for softmax* (2018): the online softmax.
# - Rabe & Staats, *Self-attention Does Not Need O(n²) Memory* (2021): attention in chunks with a running log-sum-exp.
# - Dao, Fu, Ermon, Rudra & Ré, *FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness* (2022).
# - Dao, *FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning* (2023): the loop order and the backward used by most kernels today.
# - Shah et al., *FlashAttention-3: Fast and Accurate Attention with Asynchrony and Low-precision* (2024): Hopper GPUs.
# - Tillet, Kung & Cox, *Triton: An Intermediate Language and Compiler for Tiled Neural Network Computations* (2019).
# - Williams, Waterman & Patterson, *Roofline: An Insightful Visual Performance Model for Multicore Architectures* (2009).
