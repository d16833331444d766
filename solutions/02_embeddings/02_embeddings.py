# %% [markdown]
# # Chapter 02 · Token embeddings
#
# **Where this sits on the tee:** the right sleeve, second arrow: token ids become
# *embeddings*, one vector per id, before the sinusoidal encodings are added. On the back
# graphic it is the first box after the tokenizer, and (as this chapter shows) the last
# box too.
#
# **You will be able to**
# - explain why an embedding lookup is a matrix product with a one-hot vector, and why
#   nobody computes it that way;
# - derive the gradient of an embedding matrix and say which rows a training step changes
#   (and which optimizers change the others anyway);
# - explain why the 2017 Transformer multiplies its embeddings by $\sqrt{d_{model}}$;
# - tie the embedding to the output layer and count the parameters that saves;
# - find nearest neighbours by cosine similarity and draw a 2-D map of learned embeddings
#   with PCA.
#
# **Prerequisites:** chapter 00 (tensors, `ModelConfig`, `count_parameters`). Chapter 01's
# exercises are not needed: the chapter works with characters, and uses the package's
# `BPETokenizer` only to print the tokens of the course's trained model.
#
# **Time:** about 30 minutes of reading, 35 minutes of exercises.
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
from dataclasses import replace

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

import course_runtime as course
from minillm.config import PRESETS, count_parameters
from minillm.data import corpus_text, split_corpus
from minillm.data import path as data_path
from minillm.tokenizer import BPETokenizer

device = course.setup(seed=0)

# %% [markdown]
# ## A lookup table
#
# A tokenizer turns text into integers: ids in $\{0, 1, \dots, V-1\}$ for a vocabulary of
# $V$ tokens. The integers are names, not quantities: token 500 is not "bigger" than
# token 499, and feeding the raw id to a network would invent an order that is not there.
# So the first layer of every language model gives each id its own vector of $d$ learned
# numbers (`d_model`), stored as row $t$ of an **embedding matrix**
# $W \in \mathbb{R}^{V \times d}$. Embedding token $t$ means reading row $t$.
#
# That lookup is a linear layer in disguise. Write token $t$ as a **one-hot** vector
# $\mathbf{1}_t \in \{0, 1\}^V$: all zeros except a 1 at position $t$. Then
#
# $$\mathbf{1}_t^\top W = W_{t,:},$$
#
# because the product sums the rows of $W$ weighted by the entries of $\mathbf{1}_t$, and
# only row $t$ has weight 1. A sequence of $n$ ids becomes a one-hot matrix
# $X \in \{0,1\}^{n \times V}$ and its embeddings are $XW \in \mathbb{R}^{n \times d}$.
# Everything we know about linear layers (gradients, initialization, weight sharing)
# applies to the embedding.
#
# ### Exercise 1 · The lookup as a matrix product
#
# Implement `one_hot_embed(ids, weight)` the slow way: build the one-hot matrix of the ids
# and multiply it by `weight`. `ids` may have any shape (a sequence, a batch of
# sequences); the result has that shape plus a last axis of size $d$. Call the given
# `check_ids` first, so an id outside $[0, V)$ or a tensor of floats is refused with a
# clear error. Do not index `weight` directly: the point is to see the product.
#
# Difficulty ●○○ · Importance ●●○ · about 10 minutes
#
# <details><summary>Hint 1</summary><code>torch.nn.functional.one_hot(ids, num_classes=V)</code> returns integers; convert them to <code>weight.dtype</code> before the product.</details>
# <details><summary>Hint 2</summary>The one-hot tensor has shape <code>ids.shape + (V,)</code>; <code>@ weight</code> (shape <code>(V, d)</code>) turns the last axis into <code>d</code>.</details>
# <details><summary>Hint 3</summary><code>check_ids(ids, weight.shape[0]); return F.one_hot(ids, weight.shape[0]).to(weight.dtype) @ weight</code></details>

# %% [markdown]
# This cell starts the module `minillm/embedding.py`; your answer below is the next part
# of it.

# %%
#| export minillm/embedding.py
"""Token embeddings: the table that turns ids into vectors, tied to the output head (chapter 02).

An embedding matrix ``weight`` has shape ``(vocab_size, d_model)``: row ``t`` is the vector
of token ``t``. ``TokenEmbedding`` is the model's layer; the functions show what it does
(a one-hot product, its gradient) and how to inspect what it learned (cosine
neighbours, a PCA map).
"""
import math

import torch
import torch.nn.functional as F

from minillm.checks import boolean, eager_only, positive_int, positive_number


def check_ids(ids: torch.Tensor, vocab_size: int) -> None:
    """Refuse token ids that are not an integer tensor with values in [0, vocab_size).

    The values are read in eager mode only: under ``torch.compile`` reading them would
    split the compiled graph, so there only the dtype is checked.
    """
    if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        raise TypeError(f"ids must be an integer tensor, got {getattr(ids, 'dtype', type(ids).__name__)}")
    if eager_only() and ids.numel():
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= vocab_size:
            raise ValueError(f"ids must lie in [0, vocab_size={vocab_size}), got the id {low if low < 0 else high}")

# %%
#| answer one_hot_embed
#| export minillm/embedding.py
def one_hot_embed(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The embedding lookup written as a product: one_hot(ids) @ weight.

    ids: integer tensor of any shape; weight: (vocab_size, d_model).
    Returns ids.shape + (d_model,), equal to weight[ids] (but V times the work).
    """
    ### BEGIN SOLUTION
    if weight.dim() != 2:
        raise ValueError(f"weight must have shape (vocab_size, d_model), got {tuple(weight.shape)}")
    check_ids(ids, weight.shape[0])
    return F.one_hot(ids.long(), num_classes=weight.shape[0]).to(weight.dtype) @ weight
    ### END SOLUTION

# %%
#| test one_hot_embed_visible points=1
def _one_hot_case():
    weight = torch.arange(16.0).reshape(4, 4) / 4  # square on purpose: rows vs columns
    ids = torch.tensor([[2, 0, 3], [1, 1, 2]])
    return ids, weight


@course.visible_check("one_hot_embed")
def check_one_hot_embed(one_hot_embed):
    ids, weight = _one_hot_case()
    course.expect_close(
        one_hot_embed(ids, weight),
        weight[ids],
        "one_hot_embed",
        mistakes={
            "columns of weight instead of rows (one_hot @ weight.T)": weight.T[ids],
            "the ids are shifted by one (one-hot of ids + 1)": weight[(ids + 1) % 4],
            "the ids are shifted by one (one-hot of ids - 1)": weight[(ids - 1) % 4],
            "every position got the same vector": weight[ids[:, :1]].expand(2, 3, 4),
        },
        hint="the result should have shape ids.shape + (d_model,)",
    )
    try:
        got = one_hot_embed(ids, weight.double())
    except RuntimeError as error:
        raise course.CheckFailed(f"one_hot_embed(ids, a float64 weight) failed ({str(error)[:80]}): convert the one-hot "
                                 "to weight.dtype, not to float()") from error
    if not (isinstance(got, torch.Tensor) and got.dtype == torch.float64):
        raise course.CheckFailed(f"one_hot_embed(ids, a float64 weight) should return float64, got {course.describe(got)}")
    course.expect_raises(ValueError, one_hot_embed, torch.tensor([0, 4]), weight, what="one_hot_embed([0, 4], weight of 4 rows)",
                         mistakes={"check_ids was not called: one_hot refused the id itself": RuntimeError},
                         hint="the id 4 is outside [0, 4): call check_ids")


check_one_hot_embed(one_hot_embed)
print("one_hot_embed: visible test passed")

# %%
#| test one_hot_embed_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
for shape, vocab, d, dtype in [((7,), 11, 5, torch.float32), ((3, 9), 50, 8, torch.float64), ((2, 2, 5), 6, 3, torch.float32), ((1,), 1, 2, torch.float64)]:
    weight = torch.randn(vocab, d, dtype=dtype)
    ids = torch.randint(vocab, shape)
    got = one_hot_embed(ids, weight)
    assert isinstance(got, torch.Tensor) and got.dtype == dtype, "one_hot_embed should keep the weight's dtype"
    course.expect_close(got, F.embedding(ids, weight), "one_hot_embed", atol=1e-6)
for bad_ids, error in [(torch.tensor([3, -1]), ValueError), (torch.tensor([[0, 11]]), ValueError), (torch.tensor([0.0, 1.0]), TypeError)]:
    course.expect_raises(error, one_hot_embed, bad_ids, torch.randn(11, 4), what="one_hot_embed with ids that are not valid")
### END HIDDEN TESTS

# %% [markdown]
# Keep going: the next cell binds `embed_one_hot` to your `one_hot_embed` when it passes
# the visible test (the same checks, run again), else to the course's reference.

# %%
from minillm import embedding as reference_embedding

embed_one_hot = course.keep_going("one_hot_embed", one_hot_embed, reference_embedding.one_hot_embed, check_one_hot_embed)

# %% [markdown]
# The product and the lookup give the same numbers, but not at the same price. For each
# token the product multiplies a $V$-long one-hot row by a $V \times d$ matrix: $V d$
# multiply-adds, all but $d$ of them by zero. With GPT-2's $V = 50{,}257$ that is 50,257
# times the work of copying one row. Every framework therefore stores the matrix and
# *indexes* it (`weight[ids]`, `torch.nn.Embedding`, `F.embedding`), and keeps the product
# only as the way to reason about it.
#
# We time on one CPU thread (here and for the training below): operations this small gain
# nothing from a second thread, and on a busy machine the threads' waiting for each other
# can cost more than the work.

# %%
V_gpt2, d_demo = 50257, 256
big_weight = torch.randn(V_gpt2, d_demo) / d_demo**0.5
ids = torch.randint(V_gpt2, (64,))
with course.one_thread():
    for name, fn in [("one-hot product", lambda: embed_one_hot(ids, big_weight)), ("indexing", lambda: big_weight[ids])]:
        print(f"{name:16s}: {course.best_seconds(fn, 5) * 1e3:8.3f} ms for 64 tokens, V = {V_gpt2:,d}, d = {d_demo} (best of 5)")
assert torch.allclose(embed_one_hot(ids, big_weight), big_weight[ids], atol=1e-6)
del big_weight

# %% [markdown]
# ## The `TokenEmbedding` layer
#
# The layer the model uses is below: a learned matrix, a lookup, and two switches this
# chapter explains next: `scale=True` multiplies the vectors by $\sqrt{d_{model}}$ (as
# the 2017 paper does), and `logits(x)` reuses the same matrix as the output layer
# (weight tying). Its rows start as independent normal vectors with standard deviation
# $1/\sqrt{d_{model}}$, so each row starts with a length close to 1.

# %%
#| export minillm/embedding.py
class TokenEmbedding(torch.nn.Module):
    """A learned vector per token id, optionally scaled by sqrt(d_model), tied to the output head.

    ``forward(ids)``: integer ids of any shape → ``ids.shape + (d_model,)``.
    ``logits(x)``: hidden states ``(..., d_model)`` → ``(..., vocab_size)`` scores, computed
    with the same matrix (weight tying): ``x @ weight.T``.

    ``scale=True`` multiplies the looked-up vectors by sqrt(d_model), as "Attention Is All
    You Need" (2017) does; off by default (GPT-2 does not). Rows are initialized from
    N(0, init_std**2), by default init_std = 1/sqrt(d_model), so a row starts with length
    near 1.
    """

    def __init__(self, vocab_size: int, d_model: int, scale: bool = False, init_std: float | None = None):
        super().__init__()
        self.vocab_size, self.d_model = positive_int("vocab_size", vocab_size), positive_int("d_model", d_model)
        self.scale = boolean("scale", scale)
        self.init_std = d_model**-0.5 if init_std is None else positive_number("init_std", init_std)
        self.weight = torch.nn.Parameter(torch.empty(vocab_size, d_model))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        torch.nn.init.normal_(self.weight, mean=0.0, std=self.init_std)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        check_ids(ids, self.vocab_size)
        vectors = F.embedding(ids.long(), self.weight)
        return vectors * math.sqrt(self.d_model) if self.scale else vectors

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The tied output head: (..., d_model) → (..., vocab_size) scores, x @ weight.T."""
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x must end with d_model={self.d_model}, got shape {tuple(x.shape)}")
        return F.linear(x, self.weight)  # x @ weight.T, as one fused call (what nn.Linear does)

    def extra_repr(self) -> str:
        return f"{self.vocab_size}, {self.d_model}, scale={self.scale}"

# %%
#| stable
from minillm.embedding import TokenEmbedding

course.seed_everything(0)
table = TokenEmbedding(vocab_size=10, d_model=4)
print(table)
print("ids", [[3, 1, 4], [1, 5, 9]], "->", tuple(table(torch.tensor([[3, 1, 4], [1, 5, 9]])).shape))
print("row lengths at initialization:", [round(v, 2) for v in table.weight.norm(dim=1).tolist()])

# %% [markdown]
# ## Gradients touch only the rows used
#
# Because the lookup is $Y = XW$ with a one-hot $X$, the gradient of a loss $L$ with
# respect to the matrix is the usual one for a linear layer:
#
# $$\frac{\partial L}{\partial W} = X^\top \frac{\partial L}{\partial Y},
# \qquad \text{so row } t \text{ of the gradient is } \sum_{p\,:\,\mathrm{id}_p = t} \frac{\partial L}{\partial Y_{p,:}}.$$
#
# Row $t$ collects the output gradients of every position that holds token $t$, summed,
# and a token that does not occur in the batch gets exactly zero. A batch of a few
# thousand tokens touches only a few thousand of GPT-2's 50,257 rows.
#
# ### Exercise 2 · The gradient of an embedding, by hand
#
# Implement `embedding_weight_grad(ids, grad_output, vocab_size)`: given the ids of a
# forward pass and the gradient of the loss with respect to its output
# (`grad_output`, shape `ids.shape + (d,)`), return $\partial L / \partial W$, shape
# `(vocab_size, d)`. A token that occurs twice must get both contributions. Refuse a
# `grad_output` whose shape is not `ids.shape + (d,)` with a `ValueError`.
#
# Difficulty ●●○ · Importance ●●● · about 10 minutes
#
# <details><summary>Hint 1</summary>Flatten first: <code>ids.reshape(-1)</code> and <code>grad_output.reshape(-1, d)</code>, one row per position.</details>
# <details><summary>Hint 2</summary><code>grad[ids] = rows</code> keeps only one of the rows of a repeated id. You need an operation that <em>adds</em> into the rows: <code>Tensor.index_add_</code>.</details>
# <details><summary>Hint 3</summary><code>torch.zeros(vocab_size, d, dtype=grad_output.dtype).index_add_(0, ids.reshape(-1), grad_output.reshape(-1, d))</code></details>

# %%
#| answer embedding_weight_grad
#| export minillm/embedding.py
def embedding_weight_grad(ids: torch.Tensor, grad_output: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """dL/dweight of an embedding lookup, from the ids and dL/doutput.

    ids: integer tensor of any shape; grad_output: ids.shape + (d,).
    Returns (vocab_size, d): row t sums grad_output over the positions holding token t;
    rows of tokens absent from ids are zero.
    """
    ### BEGIN SOLUTION
    check_ids(ids, vocab_size)
    if grad_output.shape[:-1] != ids.shape:
        raise ValueError(f"grad_output must have shape ids.shape + (d,) = {tuple(ids.shape)} + (d,), "
                         f"got {tuple(grad_output.shape)}")
    d = grad_output.shape[-1]
    grad = torch.zeros(vocab_size, d, dtype=grad_output.dtype, device=grad_output.device)
    return grad.index_add_(0, ids.reshape(-1).long(), grad_output.reshape(-1, d))
    ### END SOLUTION

# %%
#| test embedding_weight_grad_visible points=1
def _grad_case():
    ids = torch.tensor([1, 3, 1, 0])  # token 1 occurs twice
    grad_output = torch.tensor([[1.0, 2.0], [0.5, -1.0], [3.0, 0.0], [-2.0, 1.0]])
    return ids, grad_output, 5

def _grad_reference(ids, grad_output, vocab_size, overwrite=False, mean=False):
    grad = torch.zeros(vocab_size, grad_output.shape[-1])
    for position, token in enumerate(ids.tolist()):
        grad[token] = grad_output[position] if overwrite else grad[token] + grad_output[position]
    if mean:
        grad = grad / torch.bincount(ids, minlength=vocab_size).clamp(min=1)[:, None]
    return grad


@course.visible_check("embedding_weight_grad")
def check_embedding_weight_grad(embedding_weight_grad):
    ids, grad_output, vocab_size = _grad_case()
    course.expect_close(
        embedding_weight_grad(ids, grad_output, vocab_size),
        _grad_reference(ids, grad_output, vocab_size),
        "embedding_weight_grad",
        mistakes={
            "a repeated token keeps only one contribution (grad[ids] = rows overwrites; use index_add_)": _grad_reference(ids, grad_output, vocab_size, overwrite=True),
            "a repeated token gets the mean of its contributions, not the sum": _grad_reference(ids, grad_output, vocab_size, mean=True),
        },
        hint="the result has one row per vocabulary entry: shape (vocab_size, d)",
    )
    try:
        got = embedding_weight_grad(ids, grad_output.double(), vocab_size)
    except RuntimeError as error:
        raise course.CheckFailed(f"embedding_weight_grad with a float64 grad_output failed ({str(error)[:80]}): "
                                 "create the zeros with dtype=grad_output.dtype") from error
    if not (isinstance(got, torch.Tensor) and got.dtype == torch.float64):
        raise course.CheckFailed(f"embedding_weight_grad with a float64 grad_output should return float64, got {course.describe(got)}")
    course.expect_raises(ValueError, embedding_weight_grad, ids, grad_output[:3], vocab_size,
                         what="embedding_weight_grad(4 ids, grad_output of shape (3, 2), 5)",
                         mistakes={"grad_output's shape is not checked, so index_add_ refused it instead": RuntimeError},
                         hint="compare grad_output.shape[:-1] with ids.shape")


check_embedding_weight_grad(embedding_weight_grad)
print("embedding_weight_grad: visible test passed")

# %%
#| test embedding_weight_grad_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
for shape, vocab, d, dtype in [((4, 6), 7, 3, torch.float64), ((30,), 100, 8, torch.float32), ((1, 1), 1, 5, torch.float64), ((2, 3, 4), 3, 2, torch.float32)]:
    ids = torch.randint(vocab, shape)
    weight = torch.randn(vocab, d, dtype=dtype, requires_grad=True)
    grad_output = torch.randn(*shape, d, dtype=dtype)
    (F.embedding(ids, weight) * grad_output).sum().backward()
    got = embedding_weight_grad(ids, grad_output, vocab)
    assert isinstance(got, torch.Tensor) and got.dtype == dtype, "embedding_weight_grad should keep the dtype"
    course.expect_close(got, weight.grad, "embedding_weight_grad against autograd", atol=1e-5)
    unused = torch.ones(vocab, dtype=torch.bool)
    unused[ids.reshape(-1)] = False
    assert torch.all(got[unused] == 0), "rows of tokens that do not occur must be exactly zero"
course.expect_raises(ValueError, embedding_weight_grad, torch.tensor([0, 1]), torch.randn(3, 4), 5,
                     what="embedding_weight_grad with grad_output of shape (3, 4) for 2 ids")
### END HIDDEN TESTS

# %%
embedding_grad = course.keep_going("embedding_weight_grad", embedding_weight_grad, reference_embedding.embedding_weight_grad, check_embedding_weight_grad)

# %% [markdown]
# Now watch it happen in a real backward pass: one batch of characters from the course's
# corpus, embedded by a `TokenEmbedding` with one row per distinct character. Autograd's
# gradient equals your formula, and the rows of characters that are not in the batch are
# zero.

# %%
text, _ = split_corpus(corpus_text())  # the course's training part: the first 90%
chars = sorted(set(text))
stoi = {c: i for i, c in enumerate(chars)}
data = torch.tensor([stoi[c] for c in text])
print(f"{len(text):,d} characters of training text, vocabulary of {len(chars)} distinct characters")

course.seed_everything(0)
layer = TokenEmbedding(len(chars), 16)
batch = data[1000:1000 + 4 * 32].reshape(4, 32)
out = layer(batch)
grad_output = torch.randn_like(out)
out.backward(grad_output)
touched = (layer.weight.grad.abs().sum(dim=1) > 0)
print(f"autograd equals embedding_weight_grad: {torch.allclose(layer.weight.grad, embedding_grad(batch, grad_output, len(chars)), atol=1e-6)}")
print(f"a batch of {batch.numel()} characters touched {int(touched.sum())} of {len(chars)} rows; "
      f"untouched rows: {''.join(chars[i] for i in (~touched).nonzero().flatten().tolist())!r}")

# %% [markdown]
# A zero gradient does not mean that the row stays put. Plain SGD moves each row by
# $-\eta\, \partial L/\partial W_{t,:}$, so untouched rows are untouched. AdamW does not:
# its momentum remembers gradients from earlier steps, and its weight decay shrinks every
# row at every step. Below, one step on a batch *without* the letter `z` after a step on
# a batch *with* it.

# %%
#| stable
def step_changes_z(optimizer_class, **options):
    course.seed_everything(0)
    layer = TokenEmbedding(len(chars), 16)
    optimizer = optimizer_class(layer.parameters(), lr=0.1, **options)
    for sentence in ("lazy zebras", "a quiet cat"):  # the second batch has no z
        before = layer.weight.detach().clone()
        optimizer.zero_grad()
        layer(torch.tensor([stoi[c] for c in sentence])).pow(2).sum().backward()
        optimizer.step()
    return (layer.weight.detach() - before)[stoi["z"]].norm().item()

print(f"SGD:   row of 'z' moved by {step_changes_z(torch.optim.SGD):.4f} in the step without a z")
print(f"AdamW: row of 'z' moved by {step_changes_z(torch.optim.AdamW, weight_decay=0.1):.4f} in the step without a z")

# %% [markdown]
# This is why large-vocabulary models sometimes use `torch.nn.Embedding(sparse=True)`
# with a sparse optimizer: the gradient is sparse, and only a sparse optimizer keeps the
# *update* sparse too. With AdamW, every row pays for every step.
#
# ## Scaling by √d_model
#
# Section 3.4 of "Attention Is All You Need" (2017) says, in one line: "In the embedding
# layers, we multiply those weights by $\sqrt{d_{model}}$." It gives no reason; here is
# the usual explanation.
#
# The paper shares one matrix between the input embedding and the output layer (next
# section). An output layer is initialized like any linear layer, with entries of
# standard deviation about $1/\sqrt{d}$, so that the scores $x W^\top$ start near 1 in
# size. Rows of that matrix have length about $\sqrt{d \cdot 1/d} = 1$. The sinusoidal
# encodings added next (chapter 03) are not learned and have a fixed size: each pair of
# dimensions holds $(\sin\omega p, \cos\omega p)$, so
#
# $$\lVert \mathrm{PE}(p) \rVert^2 = \sum_{i=0}^{d/2-1} \left(\sin^2 \omega_i p + \cos^2 \omega_i p\right) = \frac{d}{2}.$$
#
# Without scaling, the sum "token + position" is a vector of length about
# $\sqrt{d/2}$ in which the token contributes a part of length 1: the position drowns the
# token, more so the wider the model. Multiplying the embedding by $\sqrt{d}$ makes the
# two comparable at every width. The figure measures it.

# %%
widths = [16, 32, 64, 128, 256, 512, 1024]
course.seed_everything(0)
token_norm = {False: [], True: []}
for d in widths:
    for scale in (False, True):
        layer = TokenEmbedding(1000, d, scale=scale)
        with torch.no_grad():
            token_norm[scale].append(layer(torch.arange(1000)).norm(dim=-1).mean().item())
position_norm = [math.sqrt(d / 2) for d in widths]

fig, ax = plt.subplots(figsize=(6.5, 4))
ax.loglog(widths, position_norm, "k--", label="sinusoidal encoding, $\\sqrt{d/2}$")
ax.loglog(widths, token_norm[False], "o-", label="token embedding, unscaled")
ax.loglog(widths, token_norm[True], "s-", label="token embedding × $\\sqrt{d}$")
ax.set_xlabel("d_model")
ax.set_ylabel("mean vector length (L2 norm)")
ax.set_title("Unscaled, the position outgrows the token as the model widens")
ax.legend()
plt.show()

# %% [markdown]
# Unscaled, the token's part stays at length 1 while the position's grows as
# $\sqrt{d/2}$: at $d = 512$ (the paper's width) the position is 16 times longer than the
# token it is added to. Scaled, the token is $\sqrt 2$ times longer than the position at
# every width. How much of the token survives the sum? Compare the cosine between the
# embedding $e$ and $e + \mathrm{PE}$:

# %%
#| stable
course.seed_everything(0)
d = 512
position = torch.arange(1000, dtype=torch.float32)[:, None] / 10000 ** (torch.arange(0, d, 2) / d)
sinusoid = torch.stack([position.sin(), position.cos()], dim=-1).reshape(1000, d)
for scale in (False, True):
    with torch.no_grad():
        e = TokenEmbedding(1000, d, scale=scale)(torch.arange(1000))
    cosine = F.cosine_similarity(e, e + sinusoid, dim=-1).mean().item()
    print(f"d = {d}, scale={scale!s:5}: mean cos(e, e + PE) = {cosine:.3f}")

# %% [markdown]
# GPT-2 and most models since do not scale: their positions are learned (or rotary,
# chapter 03) and start at the same small size as the tokens, so there is nothing to
# balance. That is why `scale` is a switch, off by default.
#
# ### Written question 1
#
# A colleague removes the $\sqrt{d_{model}}$ factor from a Transformer that adds
# sinusoidal encodings and ties its embedding to the output layer, and sees that the model
# trains more slowly. In three to five sentences, explain why, using the measurements
# above, and say why they could not simply initialize the embedding with larger entries
# instead.

# %% [markdown]
# #| written why_scale_embeddings points=2
# ### BEGIN SOLUTION
# *Model answer.* With tied weights the matrix is initialized for its role as the output
# layer, with entries of size about $1/\sqrt{d}$, so each token vector has length about 1.
# The sinusoidal encoding has length $\sqrt{d/2}$ (16 at $d = 512$), so after the sum the
# input is mostly position: the cosine between $e$ and $e + \mathrm{PE}$ falls to about
# 0.06, and the first layers must learn to dig the token out of a vector dominated by a
# signal that carries no information about which token it is. Multiplying by $\sqrt d$
# restores a comparable share (cosine about 0.8). Initializing the embedding larger does
# not work because the same matrix is the output layer: entries of size 1 would make the
# initial logits $x W^\top$ of size $\sqrt d$, a very peaked softmax and large, unstable
# gradients at the start. The factor lets one matrix have the right size in both roles.
#
# *Grading:* 1 point for the scale mismatch (position length grows as $\sqrt{d/2}$, token
# length stays near 1, so the position dominates), 1 point for why the fix is a factor
# rather than a larger initialization (the tied output layer needs small entries).
# ### END SOLUTION

# %% [markdown]
# ## Weight tying
#
# The last layer of a language model turns a hidden state $h \in \mathbb{R}^d$ into $V$
# scores, one per token: $z = h U^\top$ with $U \in \mathbb{R}^{V \times d}$. That is the
# same shape as the embedding matrix, and row $t$ of $U$ plays a similar role: it is the
# direction in which $h$ must point for token $t$ to be likely. **Weight tying** (Press &
# Wolf, 2017; Inan et al., 2017) uses one matrix for both, $U = W$. The 2017 Transformer
# and GPT-2 tie; Llama does not. `TokenEmbedding.logits` is the tied head.
#
# How much does it save? Exactly $V \cdot d$ parameters. Chapter 00's `count_parameters`
# counts a model both ways:

# %%
#| stable
for name in ("gpt2", "gpt2-xl", "llama-7b"):
    cfg = PRESETS[name]
    tied, untied = count_parameters(replace(cfg, tie_embeddings=True)), count_parameters(replace(cfg, tie_embeddings=False))
    print(f"{name:9s}: tied {tied / 1e6:8.1f}M, untied {untied / 1e6:8.1f}M; tying saves "
          f"{untied - tied:>12,d} = V·d parameters, {1 - tied / untied:5.1%} of the untied model")

# %% [markdown]
# For GPT-2 small, tying saves 38.6 million parameters, almost a quarter of the untied
# model; for a 7-billion-parameter model the same trick saves under 2%, which is one
# reason large models stopped bothering.
#
# Tying also changes the gradient. The output layer scores *every* token at every
# position (the softmax's gradient reaches all $V$ rows), so a tied matrix gets a
# gradient on every row at every step, not only on the rows of the tokens in the batch:

# %%
#| stable
course.seed_everything(0)
layer = TokenEmbedding(len(chars), 16)
hidden = layer(batch[:, :-1])  # stand-in for the network between input and output
loss = F.cross_entropy(layer.logits(hidden).reshape(-1, len(chars)), batch[:, 1:].reshape(-1))
loss.backward()
print(f"tied embedding: {int((layer.weight.grad.abs().sum(dim=1) > 0).sum())} of {len(chars)} rows have a gradient")

# %% [markdown]
# ## Similarity and nearest neighbours
#
# What does an embedding learn? Tokens used in similar contexts get similar vectors,
# because the rest of the network must respond to them in similar ways. "Similar" is
# measured by the angle between vectors, not their distance: the length of a row mostly
# tracks how often the token was seen (we measure it on a trained model below), the
# direction how the token is used. The **cosine
# similarity** of rows $a$ and $b$ is
#
# $$\cos(a, b) = \frac{a \cdot b}{\lVert a \rVert \, \lVert b \rVert} \in [-1, 1].$$
#
# ### Exercise 3 · Nearest neighbours
#
# Implement `nearest_neighbours(weight, index, k)`: the indices of the `k` rows of
# `weight` with the highest cosine similarity to row `index`, most similar first, leaving
# out row `index` itself. Raise a `ValueError` when `index` is not a row of `weight` or
# when `k` is not between 1 and `V - 1`.
#
# Difficulty ●●○ · Importance ●●○ · about 10 minutes
#
# <details><summary>Hint 1</summary>Normalize every row to length 1 (<code>F.normalize(weight, dim=1)</code>); then a matrix-vector product gives all the cosines at once.</details>
# <details><summary>Hint 2</summary>To leave out the row itself, set its similarity to <code>-inf</code> before ranking.</details>
# <details><summary>Hint 3</summary><code>torch.topk(similarities, k).indices</code> returns the largest first.</details>

# %%
#| answer nearest_neighbours
#| export minillm/embedding.py
def nearest_neighbours(weight: torch.Tensor, index: int, k: int = 5) -> torch.Tensor:
    """Indices of the k rows most cosine-similar to row ``index``, most similar first.

    weight: (vocab_size, d). Returns a LongTensor of shape (k,), never containing ``index``.
    """
    ### BEGIN SOLUTION
    if weight.dim() != 2:
        raise ValueError(f"weight must have shape (vocab_size, d), got {tuple(weight.shape)}")
    vocab_size = weight.shape[0]
    if not 0 <= index < vocab_size:
        raise ValueError(f"index must be a row of weight, in [0, {vocab_size}), got {index}")
    if not 1 <= k <= vocab_size - 1:
        raise ValueError(f"k must be between 1 and vocab_size - 1 = {vocab_size - 1}, got {k}")
    unit = F.normalize(weight, dim=1)
    similarities = unit @ unit[index]
    similarities[index] = float("-inf")
    return torch.topk(similarities, k).indices
    ### END SOLUTION

# %%
#| test nearest_neighbours_visible points=1
def _neighbours_case():
    weight = torch.tensor([
        [1.0, 0.0],    # 0: the query
        [0.9, 0.1],    # 1: almost the same direction
        [5.0, 4.0],    # 2: long, so a large dot product, but 39 degrees away
        [0.0, 1.0],    # 3: orthogonal
        [-1.0, 0.2],   # 4: opposite
        [0.7, -0.3],   # 5: 23 degrees away
    ])
    return weight, 0, 3


@course.visible_check("nearest_neighbours")
def check_nearest_neighbours(nearest_neighbours):
    weight, index, k = _neighbours_case()
    got = nearest_neighbours(weight, index, k)
    if not isinstance(got, torch.Tensor):
        raise course.CheckFailed(f"nearest_neighbours should return a tensor of row indices, got {course.describe(got)}")
    if not torch.equal(weight, _neighbours_case()[0]):
        raise course.CheckFailed("nearest_neighbours changed weight in place (normalized its rows?): "
                                 "use F.normalize or weight / norms, which return new tensors")
    course.expect_equal(
        got.tolist(),
        [1, 5, 2],
        "nearest_neighbours(weight, 0, 3)",
        mistakes={
            "ranked by dot product, not cosine: the long row 2 wins without normalizing each row (dim=1)": [2, 1, 5],
            "ranked by Euclidean distance, not by angle": [1, 5, 3],
            "the query row itself is included": [0, 1, 5],
            "least similar first (ascending order)": [4, 3, 2],
        },
        hint="return a tensor of row indices, most similar first",
    )
    got = nearest_neighbours(weight, 4, 5)  # row 4 is at more than 90 degrees from most rows: negative cosines
    course.expect_equal(
        got.tolist() if isinstance(got, torch.Tensor) else got,
        [3, 2, 1, 5, 0],
        "nearest_neighbours(weight, 4, 5)",
        mistakes={"the query's own similarity was set to 0, but cosines can be negative: set it to -inf": [3, 4, 2, 1, 5]},
    )
    course.expect_raises(ValueError, nearest_neighbours, weight, 7, 2, what="nearest_neighbours(weight of 6 rows, index=7, k=2)",
                         mistakes={"index is not checked, so indexing weight failed instead": IndexError})


check_nearest_neighbours(nearest_neighbours)
print("nearest_neighbours: visible test passed")

# %%
#| test nearest_neighbours_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
for vocab, d, k, dtype in [(40, 8, 5, torch.float32), (12, 3, 11, torch.float64), (2, 4, 1, torch.float32)]:
    weight = torch.randn(vocab, d, dtype=dtype) * torch.rand(vocab, 1, dtype=dtype) * 5
    for index in (0, vocab - 1):
        sims = F.cosine_similarity(weight[index][None], weight, dim=1)
        sims[index] = -2
        expected = sims.argsort(descending=True)[:k].tolist()
        found = nearest_neighbours(weight, index, k)
        assert isinstance(found, torch.Tensor) and found.shape == (k,), "nearest_neighbours should return a tensor of shape (k,)"
        course.expect_equal(found.tolist(), expected, "nearest_neighbours")
weight = torch.randn(6, 3)
before = weight.clone()
nearest_neighbours(weight, 2, 2)
assert torch.equal(weight, before), "nearest_neighbours must not modify weight"
for index, k in [(6, 2), (-1, 2), (0, 0), (0, 6)]:
    course.expect_raises(ValueError, nearest_neighbours, weight, index=index, k=k,
                         what="nearest_neighbours with an index or k that is not valid")
### END HIDDEN TESTS

# %%
neighbours = course.keep_going("nearest_neighbours", nearest_neighbours, reference_embedding.nearest_neighbours, check_nearest_neighbours)

# %% [markdown]
# ## Learning embeddings
#
# A freshly initialized table has random neighbours. To see structure we need embeddings
# that a model learned: first a small one that we train here, in seconds, then the table
# of the course's trained mini-GPT. The small model is the oldest neural language model
# there is, Bengio et al.'s (2003): embed the previous 4 characters, concatenate their
# vectors, pass them through a hidden layer, and score the next character with the tied
# head `logits`:
#
# $$p(c_{t} \mid c_{t-4}, \dots, c_{t-1}) = \mathrm{softmax}\big(W\, \mathrm{MLP}([W_{c_{t-4}}; \dots; W_{c_{t-1}}])\big),$$
#
# where $[\,;\,]$ concatenates four rows of the embedding $W$ and the same $W$ scores the
# 65 possible next characters. The embedding is trained as the input table and the output
# layer at once.

# %%
class CharModel(torch.nn.Module):
    """Bengio et al. (2003)'s neural language model over characters, with a tied head."""

    def __init__(self, vocab_size: int, d_model: int = 24, context: int = 4, hidden: int = 128):
        super().__init__()
        self.embed = TokenEmbedding(vocab_size, d_model)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(context * d_model, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, d_model))

    def forward(self, context_ids: torch.Tensor) -> torch.Tensor:
        """(batch, context) ids → (batch, vocab_size) scores of the next character."""
        return self.embed.logits(self.mlp(self.embed(context_ids).flatten(1)))


context = 4
steps = 400 if course.QUICK else 2500
course.seed_everything(0)
char_model = CharModel(len(chars), context=context).to(device)
optimizer = torch.optim.AdamW(char_model.parameters(), lr=1e-2, weight_decay=0.0)
offsets = torch.arange(context + 1)
losses = []
with course.one_thread():
    for step in tqdm(range(steps), desc="training"):
        windows = data[torch.randint(len(data) - context, (256,))[:, None] + offsets].to(device)
        loss = F.cross_entropy(char_model(windows[:, :context]), windows[:, context])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
print(f"loss: {sum(losses[:20]) / 20:.2f} over the first 20 steps, {sum(losses[-100:]) / 100:.2f} over the last 100 "
      f"(ln {len(chars)} = {math.log(len(chars)):.2f} is guessing)")
learned = char_model.embed.weight.detach().cpu()

# %% [markdown]
# The loss falls from $\ln 65 \approx 4.17$ (a uniform guess) to about 2 nats per
# character (full mode; quick mode trains less). Now the neighbours, by cosine similarity
# in the learned table:

# %%
for c in ["a", "e", "A", "T", ".", ",", " ", "k"]:
    found = neighbours(learned, stoi[c], 5)
    print(f"{c!r:5s} → {'  '.join(repr(chars[i]) for i in found.tolist())}")

# %% [markdown]
# Nobody told the model what a vowel is, yet the neighbours of `a` are its capital and
# the other vowels, capitals sit with capitals, and punctuation that ends clauses
# (`. , ; : ! ?`) forms its own family: characters that can be followed by the same
# things get similar vectors. With the tied head, "followed by" counts too: rows that
# should be *predicted* in the same contexts are pulled together. A rare letter such as
# `k` lands among the rarest characters (`K $ & X 3`): seen too seldom, it has not found
# its family.
#
# ## The table of a trained language model
#
# Characters can only show so much. The course ships a bigger model trained on the same
# text: the mini-GPT of chapter 07 (four Transformer layers, about a million parameters,
# its embedding tied to its output layer), trained on the first 90% of tiny Shakespeare
# with a 2,048-token BPE tokenizer of the kind chapter 01 builds. Its weights are a file in
# the course's `data/` folder, written by `make train`; here we read one tensor out of it,
# the embedding table, as plain data (nothing from chapter 07 is needed), and chapter 01's
# `BPETokenizer` turns row numbers back into text. A BPE token usually carries its leading
# space: `' king'` is the word *king* after a space.

# %%
#| stable
checkpoint = torch.load(data_path("minillm-shakespeare.pt"), map_location="cpu", weights_only=True)
trained = checkpoint["model"]["token_embedding.weight"]
bpe = BPETokenizer.load(data_path(checkpoint["tokenizer"]))
print(f"trained embedding table: {tuple(trained.shape)} (vocab_size, d_model); "
      f"tied to the output layer: {checkpoint['config']['tie_embeddings']}")


def token_id(word: str) -> int:
    """The id of a word that the shipped tokenizer keeps as one token."""
    ids = bpe.encode(word)
    if len(ids) != 1:
        raise ValueError(f"{word!r} is {len(ids)} tokens, not one")
    return ids[0]


for word in [" king", " father", " my", " he", " hath", " speak", " good", " night", "."]:
    found = neighbours(trained, token_id(word), 5)
    print(f"{word!r:9s} → {'  '.join(repr(bpe.decode([i])) for i in found.tolist())}")

# %% [markdown]
# Here the neighbours are about meaning and grammar, learned from a third of a million
# tokens of plays and nothing else: kinship terms sit together (*father* → *mother,
# brother, son*), ranks and titles with *king*, possessives with *my*, the pronoun *he*
# with *she, they*, the old verb form *hath* with *has* and *doth*, adjectives of praise
# with *good*. Not
# every list is clean (*die* and *send* beside *speak*), and a 2,048-token vocabulary has few whole words
# beyond the common ones, but the table has clearly sorted the words it sees often.
#
# Row lengths, on the other hand, tell mostly how often a token occurred, which is why
# the neighbours use the angle. Count every token in the training text:

# %%
#| stable
counts = torch.bincount(torch.tensor(bpe.encode(text)), minlength=len(trained))
print(f"the training text is {int(counts.sum()):,d} tokens")
lengths = trained.norm(dim=1)
never = counts == 0
for label, rows in [("more than 1,000 times", counts > 1000), ("1 to 20 times", (counts >= 1) & (counts <= 20)),
                    ("never", never)]:
    print(f"tokens seen {label:21s}: {int(rows.sum()):4d}, mean row length {lengths[rows].mean().item():.2f}")
unit = F.normalize(trained[never], dim=1)
pairs = unit @ unit.T
off_diagonal = pairs[~torch.eye(len(unit), dtype=torch.bool)]
print(f"{int((never & (torch.arange(len(trained)) < 256)).sum())} of the never-seen tokens are raw bytes, e.g. "
      f"{bpe.vocab[1]!r}; the others are pieces such as {bpe.decode([int(never.nonzero()[-1])])!r}")
print(f"mean cosine between two never-seen rows: {off_diagonal.mean().item():.4f}")

# %% [markdown]
# The rarer the token, the longer its row, and the 297 tokens that never occur as tokens
# (raw bytes such as control characters, and pieces of speakers' names that occur only
# inside a longer token) all have long rows pointing in *the same direction*. The model
# started every row at a random length of about $0.02\sqrt{128} \approx 0.23$, and no
# gradient from the input side ever reached these rows, yet they moved far. Written
# question 2 below asks why.
#
# ## A map of the embeddings: PCA
#
# The vectors live in $d = 128$ dimensions. To draw them we need the two directions along
# which they spread the most: **principal component analysis**. Centre the rows (subtract
# their mean $\bar x$), take the singular value decomposition of the centred matrix,
# $X - \bar x = U S V^\top$, and project onto the first $k$ right singular vectors:
#
# $$P = (X - \bar x)\, V_{:, :k} = U_{:, :k}\, S_{:k}.$$
#
# The columns of $V$ are the principal directions, sorted by how much variance
# ($S_i^2 / n$) lies along each. A direction and its opposite are equally good, so each
# column of $P$ is defined only up to its sign.
#
# ### Exercise 4 · PCA projection
#
# Implement `pca_project(x, k=2)`: centre the rows of `x` (shape `(n, d)`) and return
# their coordinates along the first `k` principal directions, shape `(n, k)`. The tests
# accept either sign for each column. Raise a `ValueError` when `k` is not between 1 and
# `min(n, d)`.
#
# Difficulty ●●○ · Importance ●○○ · about 10 minutes
#
# <details><summary>Hint 1</summary><code>torch.linalg.svd(centred, full_matrices=False)</code> returns <code>U, S, Vh</code>, with <code>Vh</code> holding the directions as <em>rows</em>, largest first.</details>
# <details><summary>Hint 2</summary>Forgetting to centre makes the first direction point at the mean of the data instead of along its spread.</details>
# <details><summary>Hint 3</summary><code>centred @ Vh[:k].T</code></details>

# %%
#| answer pca_project
#| export minillm/embedding.py
def pca_project(x: torch.Tensor, k: int = 2) -> torch.Tensor:
    """Coordinates of the centred rows of x along their first k principal directions.

    x: (n, d). Returns (n, k), columns in decreasing order of variance. Each column's sign
    is fixed so that its largest-magnitude entry is positive.
    """
    ### BEGIN SOLUTION
    if x.dim() != 2:
        raise ValueError(f"x must have shape (n, d), got {tuple(x.shape)}")
    if not 1 <= k <= min(x.shape):
        raise ValueError(f"k must be between 1 and min(n, d) = {min(x.shape)}, got {k}")
    centred = x - x.mean(dim=0, keepdim=True)
    _, _, vh = torch.linalg.svd(centred, full_matrices=False)
    projected = centred @ vh[:k].T
    rows = projected.abs().argmax(dim=0)
    return projected * projected[rows, torch.arange(k)].sign()
    ### END SOLUTION

# %%
#| test pca_project_visible points=1
def _pca_case():
    return torch.tensor([
        [2.0, 0.0, 1.0], [4.0, 1.0, 1.5], [6.0, 0.5, 0.5],
        [8.0, 2.5, 1.0], [10.0, 1.0, 2.0], [12.0, 2.0, 0.0],
    ])

def _canonical_signs(p):
    """Each column flipped so that its largest-magnitude entry is positive (any input passes through)."""
    if not isinstance(p, torch.Tensor) or p.dim() != 2 or p.shape[0] == 0:
        return p
    p = p.detach().to(torch.float32)
    return p * p[p.abs().argmax(dim=0), torch.arange(p.shape[1])].sign()

def _pca_reference(x, k, centre=True, scores=True, smallest=False, columns=False, standardize=False):
    centred = x - x.mean(dim=0) if centre else x
    if standardize:
        centred = centred / centred.std(dim=0)
    u, s, vh = torch.linalg.svd(centred, full_matrices=False)
    if smallest:
        return centred @ vh.flip(0)[:k].T
    if columns:
        return centred @ vh[:, :k]
    return centred @ vh[:k].T if scores else u[:, :k]


@course.visible_check("pca_project")
def check_pca_project(pca_project):
    x = _pca_case()
    got = pca_project(x, 2)
    if not torch.equal(x, _pca_case()):
        raise course.CheckFailed("pca_project changed x in place (x -= mean?): centre into a new tensor, x - x.mean(dim=0)")
    course.expect_close(
        _canonical_signs(got),
        _canonical_signs(_pca_reference(x, 2)),
        "pca_project(x, 2), up to the sign of each column",
        mistakes={
            "the rows were not centred (subtract x.mean(dim=0) first)": _canonical_signs(_pca_reference(x, 2, centre=False)),
            "returned U[:, :k], the left singular vectors, without the singular values (project: centred @ Vh[:k].T)": _canonical_signs(_pca_reference(x, 2, scores=False)),
            "the directions of least variance, not most": _canonical_signs(_pca_reference(x, 2, smallest=True)),
            "projected on the columns of Vh; the directions are its rows (centred @ Vh[:k].T)": _canonical_signs(_pca_reference(x, 2, columns=True)),
            "each column was also divided by its standard deviation: PCA here only centres": _canonical_signs(_pca_reference(x, 2, standardize=True)),
        },
        hint="the result has one row per input row and k columns",
        atol=1e-4,
    )
    course.expect_raises(ValueError, pca_project, x, 4, what="pca_project(x of shape (6, 3), k=4)", hint="k must be between 1 and min(n, d)")


check_pca_project(pca_project)
print("pca_project: visible test passed")

# %%
#| test pca_project_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
for n, d, k, dtype in [(50, 10, 2, torch.float64), (8, 20, 3, torch.float32), (30, 4, 1, torch.float64), (5, 5, 5, torch.float64)]:
    x = torch.randn(n, d, dtype=dtype) * torch.linspace(3, 0.5, d, dtype=dtype) + 7
    centred = x.double() - x.double().mean(dim=0)
    eigenvalues, eigenvectors = torch.linalg.eigh(centred.T @ centred)  # independent of the SVD, ascending order
    expected = centred @ eigenvectors.flip(1)[:, :k]
    got = pca_project(x, k)
    assert isinstance(got, torch.Tensor) and got.shape == (n, k), "pca_project should return a tensor of shape (n, k)"
    if k < min(n, d):  # the last direction of a square case can be degenerate: check variance only
        course.expect_close(_canonical_signs(got.double()), _canonical_signs(expected).double(), "pca_project", atol=1e-3, rtol=1e-3)
    course.expect_close(got.double().var(dim=0, unbiased=False), (expected.var(dim=0, unbiased=False)), "pca_project's variances", atol=1e-3, rtol=1e-3)
# translating the data does not move the projection, and x is left as it was
x = torch.randn(20, 6, dtype=torch.float64)
before = x.clone()
pca_project(x, 3)
assert torch.equal(x, before), "pca_project must not modify x"
course.expect_close(_canonical_signs(pca_project(x + 100.0, 2)), _canonical_signs(pca_project(x, 2)), "pca_project is translation-invariant", atol=1e-4)
for k in (0, 7):
    course.expect_raises(ValueError, pca_project, x, k, what="pca_project with a k that is not valid")

### END HIDDEN TESTS

# %%
project = course.keep_going("pca_project", pca_project, reference_embedding.pca_project, check_pca_project)

# %% [markdown]
# Now the map. Projected together, the whole table's first direction would mostly
# separate the 297 identical never-seen rows from everything else (the next cell measures
# it), so we fit the PCA to a few dozen common words from six groups and draw those.

# %%
whole = project(trained, 1)[:, 0]
print(f"whole table, first principal component: never-seen tokens at {whole[never].mean().item():+.2f}, "
      f"the others at {whole[~never].mean().item():+.2f} ± {whole[~never].std().item():.2f}")

word_groups = {
    "pronouns": "I he she we they thou",
    "possessives": "my your his their thy",
    "people": "father mother king queen lord lady",
    "verbs": "speak hear see know swear",
    "adjectives": "good fair true noble sweet gentle",
    "numbers": "two three ten twenty",
}
words = [(group, word) for group, members in word_groups.items() for word in members.split()]
rows = trained[[token_id(" " + word) for _, word in words]]
coords = project(rows, 2)
coords = coords * coords[coords.abs().argmax(dim=0), [0, 1]].sign()  # a sign per column, so the map matches the text
share = (coords.var(dim=0).sum() / rows.var(dim=0).sum()).item()

fig, ax = plt.subplots(figsize=(7.5, 6.5))
span = coords.max(dim=0).values - coords.min(dim=0).values
for (group, word), (first, second) in zip(words, coords.tolist()):
    ax.text(first, second, word, color=f"C{list(word_groups).index(group)}", fontsize=10, ha="center", va="center")
for colour, group in enumerate(word_groups):
    ax.scatter([], [], color=f"C{colour}", label=group)
margin = 0.1 * span
ax.set_xlim(coords[:, 0].min() - margin[0], coords[:, 0].max() + margin[0])
ax.set_ylim(coords[:, 1].min() - margin[1], coords[:, 1].max() + margin[1])
ax.set_xlabel("first principal component")
ax.set_ylabel("second principal component")
ax.set_title(f"{len(words)} word embeddings of the trained mini-GPT, d = {trained.shape[1]}, "
             f"in 2-D ({share:.0%} of their variance)", fontsize=11)
ax.legend(loc="lower right", fontsize=8.5)
plt.show()

# %% [markdown]
# Six groups, six regions. The first direction puts the pronouns and possessives, the
# small words that hold a sentence together, on the right and the words that carry
# content on the left; the second runs from the numbers and verbs at the top to the nouns
# for people at the bottom, with the adjectives in between. A 2-D map always distorts
# (here two directions hold only about a quarter of these words' variance, as the title
# says): *good* drifts towards the pronouns, *see* towards the numbers. Check what a map
# suggests with the neighbours, which use all 128 dimensions.
#
# ### Written question 2
#
# A tied embedding receives a gradient on every row at every step, even on the rows of
# characters absent from the batch (we measured it in the weight-tying section), and in
# the trained mini-GPT the 297 tokens that never occur ended with long rows that all
# point the same way. In three to five sentences: where do the gradients of absent
# tokens come from, why do the rows of never-seen tokens all move in the same direction,
# and what would their input rows look like in an untied model?

# %% [markdown]
# #| written tied_gradients points=2
# ### BEGIN SOLUTION
# *Model answer.* In the tied model the matrix is also the output layer, and the softmax
# gives every token a score at every position: the gradient of the cross-entropy with
# respect to score $t$ is $p_t - [t = \text{target}]$, nonzero for every $t$, so row $t$
# receives $(p_t - [t = \text{target}])\, h$ from every position $h$. A token that is never
# the target only ever receives $+p_t h$, so gradient descent moves its row along
# $-\sum p_t h$: away from the hidden states the model produces, lowering its score
# everywhere ("I am never next"). All never-seen tokens see the same hidden states and
# start with similar small $p_t$, so they all move along nearly the same direction, and
# keep moving (growing longer) while they get any probability at all (Adam's normalized
# steps make even tiny gradients count). In an
# untied model their input rows would get no gradient at all: they would keep their
# random initialization (random directions, length about $0.02\sqrt{128} \approx 0.23$,
# shrunk only by weight decay); only the separate output layer's rows would be pushed.
#
# *Grading:* 1 point for the origin of the gradient on all rows (the tied output layer's
# softmax, $p_t h$ for every row), 1 point for why the never-seen rows share a direction
# (never the target, so always pushed away from the same hidden states) or, in its place,
# a clear statement of the untied contrast (input rows of never-seen tokens never move).
# ### END SOLUTION

# %% [markdown]
# ## Tee check
#
# > **The shirt:** the right sleeve draws "Code is art..." → token ids → *embeddings* →
# > "+" sinusoidal encodings: the embedding as the first step of a one-way flow.
#
# **What is right:** the embedding is a lookup, one learned row per id (Exercise 1
# showed it is a one-hot product), and it is the first thing a token meets.
#
# **What is loose:** two things the arrow hides.
# 1. In GPT-2 and the 2017 Transformer the same matrix is also the *last* step: the
#    output layer that turns the final hidden state into scores is the embedding,
#    transposed (weight tying). It is the single largest matrix of GPT-2 small, measured
#    below.
# 2. The "+" only works when the two summands have comparable sizes. The 2017 model,
#    which the sleeve draws, multiplies the embedding by $\sqrt{d_{model}}$ before the
#    sum; without it the position outweighs the token sixteen-fold at $d = 512$.

# %%
#| stable
gpt2 = PRESETS["gpt2"]
embedding_share = gpt2.vocab_size * gpt2.d_model / count_parameters(gpt2)
print(f"GPT-2 small: the embedding matrix is {gpt2.vocab_size:,d} × {gpt2.d_model} = "
      f"{gpt2.vocab_size * gpt2.d_model:,d} parameters, {embedding_share:.1%} of the model, used at both ends")
print(f"d = 512: |PE| / |e| = {math.sqrt(512 / 2) / 1.0:.0f} unscaled, {math.sqrt(512 / 2) / math.sqrt(512):.2f} scaled")

# %% [markdown]
# ## What `minillm` gained
#
# `minillm.embedding`:
# - `TokenEmbedding(vocab_size, d_model, scale=False)`: the lookup layer, with the
#   $\sqrt{d_{model}}$ switch and the tied output head `logits(x)`; chapter 07's GPT uses
#   it at both ends;
# - `one_hot_embed` and `embedding_weight_grad` (your Exercises 1–2): the lookup and its
#   gradient written out, checked in the course's tests against `F.embedding` and autograd;
# - `nearest_neighbours` and `pca_project` (Exercises 3–4): the tools to inspect any
#   embedding table, used above on the course's trained mini-GPT.
#
# ## Further reading
#
# - Bengio, Ducharme, Vincent & Jauvin, *A Neural Probabilistic Language Model* (2003):
#   learned word vectors as the first layer of a language model.
# - Mikolov et al., *Efficient Estimation of Word Representations in Vector Space* (2013):
#   word2vec, and the neighbours and analogies of embedding spaces.
# - Press & Wolf, *Using the Output Embedding to Improve Language Models* (2017), and
#   Inan, Khosravi & Socher, *Tying Word Vectors and Word Classifiers* (2017): weight tying.
# - Vaswani et al., *Attention Is All You Need* (2017), section 3.4: shared embeddings and
#   the $\sqrt{d_{model}}$ factor.
# - Radford et al., *Language Models are Unsupervised Multitask Learners* (2019): GPT-2,
#   tied and unscaled.
# - Gao, He, Tan, Qin, Wang & Liu, *Representation Degeneration Problem in Training
#   Natural Language Generation Models* (2019): how the tied softmax pushes the vectors of
#   rare tokens into one common direction, as measured above.
# - Pearson, *On Lines and Planes of Closest Fit to Systems of Points in Space* (1901):
#   principal component analysis.
