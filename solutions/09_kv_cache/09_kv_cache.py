# %% [markdown]
# # Chapter 09 · The KV cache
#
# **Where this sits on the tee:** the Tech Band's *KV Cache*, which the shirt sells as
# "fast O(1) step decode". It is the last stage of the back graphic, output generation,
# made fast: chapter 07's `generate` reruns the whole context for every new token; a cache
# keeps what does not change and computes only the new position.
#
# **You will be able to**
# - say why the keys and values of past tokens never change in a causal decoder, and keep
#   them in preallocated tensors, one pair per layer;
# - run a prompt through the model once (prefill) and then one token per step (decode),
#   and check that the logits equal recomputing everything, for every position encoding,
#   grouped-query attention and batches;
# - batch prompts of different lengths with a padding mask, as a server does;
# - measure what the cache buys and what it does not: per-token latency against context
#   length, prefill against decode throughput, and why decoding is memory-bound;
# - compute the cache's memory for real models, and what grouped-query attention saves;
# - continue past the model's context with a rolling window, and compare samplers on the
#   trained model.
#
# **Prerequisites:** chapter 04 (attention, grouped-query attention, `kv_cache_bytes`),
# chapter 03 (RoPE and ALiBi), chapter 07 (`GPT`, `generate`, the shipped model).
#
# **Time:** about 30 minutes of reading, 30 minutes of exercises (three coded, one written).
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
import math
import statistics
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from minillm import attention as reference_attention
import course_runtime as course
from minillm import data
from minillm.config import PRESETS, ModelConfig, count_parameters
from minillm.generate import generate
from minillm.model import GPT
from minillm.recipe import load_pretrained, recipe_config

device = course.setup(seed=0)  # this chapter times small models on the CPU, whatever `device` says
torch.set_num_threads(1)  # its models are small: one thread is as fast, and robust on a busy machine
QUICK = course.QUICK

# %% [markdown]
# Everything this chapter builds goes into `minillm/kvcache.py`. Its first cell holds the
# module's docstring and imports.

# %%
#| export minillm/kvcache.py
"""The KV cache: every layer's keys and values in preallocated tensors (chapter 09).

In a causal decoder the keys and values of a token never change once computed, so a cache
keeps them: the prompt goes through the model once (prefill), then each new token alone
(decode), its keys and values written after the others. ``KVCache(config, batch_size,
max_len)`` allocates, for each block, two tensors of shape (batch, n_kv_heads, max_len,
head_dim) and fills them left to right. It is what ``GPT.forward(..., kv_cache=...)`` and
``generate(..., kv_cache=...)`` take: ``length``, the positions held (the same in every
layer), and ``layer(i)``, block i's ``LayerKVCache``, whose ``update(k, v)`` is chapter
04's ``KVCacheLike``.

Past ``max_len``: with relative positions (RoPE, ALiBi) the cache rolls (``roll``): it
forgets its oldest positions and counts them in ``position_offset``, from which the model
numbers the new ones, so that every token attends to the last ``max_len`` tokens
(sliding-window attention) and no kept key changes. With absolute positions
(learned, sinusoidal) a key carries its position, so such a cache cannot roll: writing past
``max_len`` is a ``ValueError``, and ``generate`` empties it (``reset``) and refills it
with the last tokens instead.
"""
import torch

from minillm.checks import boolean, integer, positive_int
from minillm.model import GPTConfig, check_attention_mask
from minillm.positional import POSITIONS

# %% [markdown]
# ## What generation recomputes
#
# Chapter 07's `generate` without a cache runs the model on the whole context for every
# new token and keeps only the last position's logits. Look at what that pass computes in
# one attention layer. Position $t$ gets a query, a key and a value,
#
# $$q_t = W_Q x_t, \qquad k_t = W_K x_t, \qquad v_t = W_V x_t,$$
#
# and its output attends over the keys and values of positions $0..t$. In a *causal*
# model, $x_t$ in layer $\ell$ depends only on tokens $0..t$, so when token $t+1$ arrives
# nothing about positions $0..t$ changes: not their hidden states, not their keys, not
# their values. The pass for token $t+1$ recomputes all of them only to throw them away.
# A **KV cache** keeps $k_0..k_t$ and $v_0..v_t$ of every layer, and the next pass
# computes one position: its query attends over the cached keys plus its own.
#
# (Queries are not cached: only the newest position's query is ever used again, once. And
# a bidirectional encoder cannot be cached at all: a new token changes every earlier
# token's representation.)
#
# A first measurement on chapter 07's shipped model: the same greedy tokens (100 of
# them; 40 in quick mode), with and without a cache (chapter 07's simplest one, `use_cache=True`, which concatenates),
# are the same tokens, and the time differs.

# %%
model, tokenizer = load_pretrained()
prompt = torch.tensor([tokenizer.encode("ROMEO:")])
n_greedy = 40 if QUICK else 100
started = time.perf_counter()
plain = generate(model, prompt, n_greedy, temperature=0)
recompute_s = time.perf_counter() - started
started = time.perf_counter()
cached = generate(model, prompt, n_greedy, temperature=0, use_cache=True)
cache_s = time.perf_counter() - started
print(f"{n_greedy} tokens, the same: {torch.equal(plain, cached)}; without a cache {recompute_s * 1000:.0f} ms, "
      f"with chapter 07's cache {cache_s * 1000:.0f} ms ({recompute_s / cache_s:.1f}x)")
print(tokenizer.decode(cached[0].tolist())[:160])

# %% [markdown]
# ## The KV cache
#
# Where do the cached tensors live? Chapter 07's `ConcatModelCache` appends with
# `torch.cat`, which allocates a new tensor and copies everything held for every new
# token: $O(t)$ work and memory traffic per step, just to append. A real cache
# **preallocates** the whole buffer once, per layer two tensors of shape
#
# $$(\text{batch},\ n_{kv},\ \text{max\_len},\ d_{head}),$$
#
# and writes each new position into its slice: `k_buffer[:, :, t:t + new] = k`. The
# positions written so far are `k_buffer[:, :, :t + new]`, a *view* of the buffer (no
# copy), which is what attention reads. The memory is taken once, up front, and known in
# advance, which is what a server needs to decide how many requests fit.
#
# ### Exercise 1 · Write into the preallocated slice
#
# Complete `LayerKVCache.update(k, v)`. The constructor is given: it allocates `self.k`
# and `self.v`, zeros of shape `(batch_size, n_kv_heads, max_len, head_dim)`, and sets
# `self.length = 0`. `update` receives the new keys and values, each
# `(batch_size, n_kv_heads, new, head_dim)`, and must
#
# 1. check them: `TypeError` unless both are tensors of the cache's dtype; `ValueError`
#    naming `k` (or `v`) unless the shape is `(batch_size, n_kv_heads, new, head_dim)`
#    with `new >= 1`, the same for both; `ValueError` naming `max_len` when
#    `self.length + new` would pass it;
# 2. copy them into positions `self.length .. self.length + new - 1` of the buffers, in
#    place (no new buffer, no `torch.cat`), and advance `self.length` by `new`;
# 3. return the keys and values of every position so far, `self.k[:, :, :self.length]`
#    and the same of `self.v`: views of the buffers.
#
# Difficulty ●○○ · Importance ●●● · about 10 minutes
#
# <details><summary>Hint 1</summary>Slice assignment copies into the buffer in place: <code>self.k[:, :, start:end] = k</code>.</details>
# <details><summary>Hint 2</summary>Check before you write: a failed update must leave the cache as it was. <code>k.shape[:2]</code> must equal <code>self.k.shape[:2]</code> and <code>k.shape[-1]</code> must equal <code>self.k.shape[-1]</code>.</details>
# <details><summary>Hint 3</summary><code>end = self.length + k.shape[-2]</code>; write both slices, set <code>self.length = end</code>, return <code>self.k[:, :, :end], self.v[:, :, :end]</code>.</details>

# %%
#| answer layer_kv_cache
#| export minillm/kvcache.py
class LayerKVCache:
    """One block's keys and values, preallocated: ``k`` and ``v`` of shape (batch_size,
    n_kv_heads, max_len, head_dim), of which positions 0..length-1 are filled.

    ``update(k, v)`` (chapter 04's ``KVCacheLike``) writes the new positions after the
    cached ones, in place, and returns views of every position so far.
    """

    def __init__(self, batch_size: int, n_kv_heads: int, max_len: int, head_dim: int, dtype=None, device=None):
        shape = (batch_size, n_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v: (batch_size, n_kv_heads, new, head_dim) → all keys and values so far,
        (batch_size, n_kv_heads, length + new, head_dim) each, views of the buffers."""
        ### BEGIN SOLUTION
        batch, heads, max_len, head_dim = self.k.shape
        for name, new in (("k", k), ("v", v)):
            if not isinstance(new, torch.Tensor) or new.dtype != self.k.dtype:
                raise TypeError(f"{name} must be a tensor of the cache's dtype {self.k.dtype}, got "
                                f"{getattr(new, 'dtype', type(new).__name__)}: build the cache with the model's dtype")
            if new.dim() != 4 or new.shape[:2] != (batch, heads) or new.shape[-1] != head_dim or new.shape[2] < 1:
                raise ValueError(f"{name} must have shape (batch_size, n_kv_heads, new, head_dim) = ({batch}, {heads}, "
                                 f"new >= 1, {head_dim}), got {tuple(new.shape)}: a cache built for another batch "
                                 "size or config?")
        if v.shape != k.shape:
            raise ValueError(f"v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
        end = self.length + k.shape[2]
        if end > max_len:
            raise ValueError(f"the cache is full: it holds {self.length} of its max_len={max_len} positions, and "
                             f"{k.shape[2]} more do not fit (a KVCache with relative positions can roll; generate "
                             "rolls or refills it for you)")
        self.k[:, :, self.length:end] = k
        self.v[:, :, self.length:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]
        ### END SOLUTION

# %%
#| test layer_kv_cache_visible points=1
@course.visible_check("LayerKVCache")
def check_layer_cache(cache_class):
    """Prefill 3 positions, decode 1, and check the buffers, the views and the errors."""
    g = torch.Generator().manual_seed(9)
    k1, v1 = torch.randn(2, 2, 3, 4, generator=g), torch.randn(2, 2, 3, 4, generator=g)
    k2, v2 = torch.randn(2, 2, 1, 4, generator=g), torch.randn(2, 2, 1, 4, generator=g)
    cache = cache_class(2, 2, 6, 4)
    got = cache.update(k1.clone(), v1.clone())
    if not (isinstance(got, tuple) and len(got) == 2):
        raise course.CheckFailed(f"update must return (keys, values), got {course.describe(got)}")
    course.expect_close(got[0], k1, "the keys returned after a 3-position prefill",
                        mistakes={"keys and values swapped": v1},
                        hint="return the filled part only, self.k[:, :, :self.length], not the whole max_len buffer")
    course.expect_close(got[1], v1, "the values returned after a 3-position prefill",
                        mistakes={"keys and values swapped": k1})
    course.expect_equal(cache.length, 3, "cache.length after the prefill")
    course.expect_equal(tuple(cache.k.shape), (2, 2, 6, 4), "the shape of the buffer cache.k after the prefill",
                        hint="write into the preallocated buffer; never replace it by a concatenation")
    expected = torch.zeros(2, 2, 6, 4)
    expected[:, :, :3] = k1
    course.expect_close(cache.k, expected, "the buffer cache.k after the prefill",
                        mistakes={"the buffer was not written (a new tensor returned instead?)": torch.zeros(2, 2, 6, 4)})
    got = cache.update(k2.clone(), v2.clone())
    course.expect_close(got[0], torch.cat([k1, k2], dim=2), "the keys returned after one decode step",
                        mistakes={"the step overwrote position 0 instead of writing at position length":
                                  torch.cat([k2, k1[:, :, 1:]], dim=2),
                                  "only the new keys returned, not every position so far": k2})
    course.expect_close(got[1], torch.cat([v1, v2], dim=2), "the values returned after one decode step")
    course.expect_equal(cache.length, 4, "cache.length after one decode step")
    course.expect_raises(ValueError, cache.update, torch.zeros(2, 2, 3, 4), torch.zeros(2, 2, 3, 4), match="max_len",
                         what="update with 3 new positions when 2 of max_len=6 are free")
    course.expect_equal(cache.length, 4, "cache.length after a refused update (a failed update must change nothing)")
    course.expect_raises(ValueError, cache.update, torch.zeros(3, 2, 1, 4), torch.zeros(3, 2, 1, 4), match="k",
                         what="update with keys of batch 3 in a cache of batch 2")
    course.expect_raises(TypeError, cache.update, torch.zeros(2, 2, 1, 4, dtype=torch.float64),
                         torch.zeros(2, 2, 1, 4, dtype=torch.float64), what="update with float64 keys in a float32 cache")


check_layer_cache(LayerKVCache)
print("LayerKVCache: visible test passed")

# %%
#| test layer_kv_cache_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
for batch, heads, max_len, head_dim, dtype, steps in [(1, 1, 5, 2, torch.float64, [5]),
                                                      (3, 2, 9, 8, torch.float32, [4, 1, 1, 3]),
                                                      (2, 4, 7, 6, torch.float64, [1] * 7)]:
    cache = LayerKVCache(batch, heads, max_len, head_dim, dtype=dtype)
    assert cache.k.dtype == dtype and cache.length == 0, "the given constructor must stay as it is"
    keys, values = [], []
    for new in steps:
        k = 1e3 * torch.randn(batch, heads, new, head_dim, dtype=dtype)
        v = torch.randn(batch, heads, new, head_dim, dtype=dtype)
        before = k.clone()
        got_k, got_v = cache.update(k, v)
        assert torch.equal(k, before), "update changed its input k"
        keys.append(k)
        values.append(v)
        course.expect_close(got_k, torch.cat(keys, dim=2), "the keys after a sequence of updates", atol=0, rtol=0)
        course.expect_close(got_v, torch.cat(values, dim=2), "the values after a sequence of updates", atol=0, rtol=0)
        assert cache.length == sum(len(x[0, 0]) for x in keys), "length must count every position written"
    assert tuple(cache.k.shape) == (batch, heads, max_len, head_dim), "the buffers must keep their preallocated shape"
    filled = cache.length
    course.expect_close(cache.k[:, :, :filled], torch.cat(keys, dim=2), "the buffer holds the keys", atol=0, rtol=0)
    course.expect_close(cache.v[:, :, :filled], torch.cat(values, dim=2), "the buffer holds the values", atol=0, rtol=0)
    assert bool((cache.k[:, :, filled:] == 0).all()), "positions past length must stay untouched"
# filling to exactly max_len works; one more is a ValueError naming max_len, and changes nothing
cache = LayerKVCache(2, 2, 4, 3)
cache.update(torch.randn(2, 2, 4, 3), torch.randn(2, 2, 4, 3))
course.expect_raises(ValueError, cache.update, torch.randn(2, 2, 1, 3), torch.randn(2, 2, 1, 3), match="max_len",
                     what="update past max_len")
assert cache.length == 4, "a refused update must leave length as it was"
# shapes: the wrong batch, heads, head_dim or an empty step name k; a v unlike k names v
cache = LayerKVCache(2, 2, 6, 3)
for shape in [(1, 2, 1, 3), (2, 4, 1, 3), (2, 2, 1, 5), (2, 2, 0, 3)]:
    course.expect_raises(ValueError, cache.update, torch.zeros(shape), torch.zeros(shape), match="k",
                         what="update with keys of the wrong shape")
course.expect_raises(ValueError, cache.update, torch.zeros(2, 2, 2, 3), torch.zeros(2, 2, 1, 3), match="v",
                     what="update with values unlike the keys")
course.expect_raises(TypeError, cache.update, torch.zeros(2, 2, 1, 3, dtype=torch.float64), torch.zeros(2, 2, 1, 3),
                     what="update with keys of another dtype")
assert cache.length == 0, "refused updates must change nothing"
### END HIDDEN TESTS

# %%
from minillm import kvcache as reference_kvcache

layer_cache_class = course.keep_going("LayerKVCache", LayerKVCache, reference_kvcache.LayerKVCache, check_layer_cache)

# %% [markdown]
# The model-wide cache is given: one `LayerKVCache` per block, `length` (the model reads
# it once per forward pass to number the new positions) and `layer(i)`, as chapter 07's
# `GPT.forward` expects. Its other methods are for later sections: `roll` for running past
# the context, `reset` to empty it, `nbytes` for its memory, and `for_model`, which takes
# the dtype and device from a model's parameters.

# %%
#| export minillm/kvcache.py
class KVCache:
    """A model-wide KV cache in preallocated tensors: what ``GPT.forward(..., kv_cache=...)`` and
    ``generate(..., kv_cache=...)`` take.

    config: the model's ``GPTConfig`` (n_layers, n_kv_heads, head_dim, context_length,
    positions). batch_size: the rows it serves. max_len: the positions it holds, at most
    the context. dtype, device: of its buffers (default: torch's default dtype, the CPU);
    they must be the model's (``KVCache.for_model`` takes them from it).
    rolling: what happens past max_len. None (the default): roll when the positions are
    relative (RoPE, ALiBi); False: never, so writing past max_len is a ValueError; True:
    roll, a ValueError for absolute positions.

    ``length``: the positions held, the same in every layer. ``layer(i)``: block i's
    ``LayerKVCache``. ``roll(n)`` forgets the n oldest positions, ``reset()`` all of them.
    ``position_offset``: the positions rolled out before the first one held, an int (or a
    (batch_size,) tensor once rolled with a padding mask); the model adds it to every position.
    ``nbytes``: the bytes of its buffers, ``kv_cache_bytes(config, batch_size, max_len, element size)``.
    """

    def __init__(self, config: GPTConfig, batch_size: int, max_len: int, dtype=None, device=None,
                 rolling: bool | None = None):
        if not isinstance(config, GPTConfig):
            raise TypeError(f"config must be the model's GPTConfig, got {type(config).__name__}")
        positive_int("batch_size", batch_size)
        positive_int("max_len", max_len)
        if max_len > config.context_length:
            raise ValueError(f"max_len ({max_len}) must be <= the config's context_length ({config.context_length}): "
                             "the model numbers no position past its context")
        position = POSITIONS.get(config.positions)
        relative = position.role in ("rotary", "bias")  # scores depend on distances only
        rolling = relative if rolling is None else boolean("rolling", rolling)
        if rolling and not relative:
            raise ValueError(f"rolling=True needs relative positions (rope, alibi), but the config's positions are "
                             f"{config.positions!r}: an absolute position is part of every cached key and value")
        self.config, self.batch_size, self.max_len, self.rolling = config, batch_size, max_len, rolling
        self.position_offset: int | torch.Tensor = 0
        self.layers = [LayerKVCache(batch_size, config.n_kv_heads, max_len, config.head_dim, dtype=dtype, device=device)
                       for _ in range(config.n_layers)]

    @classmethod
    def for_model(cls, model, batch_size: int, max_len: int | None = None, rolling: bool | None = None) -> "KVCache":
        """A cache for ``model`` (a ``GPT``): its config, and the dtype and device of its
        parameters; max_len defaults to the model's context."""
        parameter = next(model.parameters())
        config = model.config
        return cls(config, batch_size, config.context_length if max_len is None else max_len,
                   dtype=parameter.dtype, device=parameter.device, rolling=rolling)

    @property
    def length(self) -> int:
        lengths = {layer.length for layer in self.layers}
        if len(lengths) > 1:
            raise ValueError(f"the cache's layers hold different numbers of positions ({sorted(lengths)}): a model "
                             f"with fewer than its {len(self.layers)} layers used it (a cache built for another "
                             "config), or a forward pass failed half way; reset() it")
        return self.layers[0].length

    def layer(self, index: int) -> LayerKVCache:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(self.layers):
            raise ValueError(f"layer {index!r} was asked of a cache with {len(self.layers)} layers: a cache built "
                             "for another config?")
        return self.layers[index]

    @property
    def nbytes(self) -> int:
        return sum(t.nelement() * t.element_size() for layer in self.layers for t in (layer.k, layer.v))

    def reset(self) -> None:
        """Forget every position (the buffers stay allocated)."""
        for layer in self.layers:
            layer.length = 0
        self.position_offset = 0

    def roll(self, n: int, attention_mask: torch.Tensor | None = None) -> None:
        """Forget the n oldest positions in every layer; no kept key or value changes.

        attention_mask: None, or the (batch_size, length) bool mask of the cached positions
        (True for real tokens) as the model got it; the caller drops its first n columns.
        The kept keys and values move down by n slots, and ``position_offset`` grows by
        the positions dropped (by each row's real tokens among them, with a mask), so the
        model numbers every position as it was numbered when written. A score depends only
        on the distance between a query and a key, with RoPE as with ALiBi, so each key is
        rotated once, when it is written, and a 16-bit cache gathers no rounding error roll
        after roll.
        """
        if not self.rolling:
            raise ValueError(f"this cache does not roll (rolling={self.rolling}, positions {self.config.positions!r}): "
                             "reset() it and refill it with the last tokens instead")
        length = self.length
        integer("n", n, least=1)
        if n > length:
            raise ValueError(f"n ({n}) must be <= the {length} positions held")
        if attention_mask is not None:
            check_attention_mask(attention_mask, (self.batch_size, length), "(batch_size, length)")
        keep = length - n
        for layer in self.layers:
            for buffer in (layer.k, layer.v):
                buffer[:, :, :keep] = buffer[:, :, n:length].clone()  # the slices overlap: copy first
            layer.length = keep
        dropped = n if attention_mask is None else attention_mask[:, :n].sum(dim=-1)
        self.position_offset = self.position_offset + dropped

# %% [markdown]
# Cached and recomputed, compared: the shipped model's logits over 40 tokens of the
# validation text in one full pass, against a 30-token prefill into a `KVCache` followed by ten one-token steps.
# (From here on, the package's `kvcache.KVCache` is used, so that what follows does not
# depend on your Exercise 1.)

# %%
validation_text = data.split_corpus(data.corpus_text())[1]
ids = torch.tensor([tokenizer.encode(validation_text[:1000])[:40]])
with torch.no_grad():
    full, _ = model(ids)
    cache = reference_kvcache.KVCache.for_model(model, batch_size=1)
    pieces = [model(ids[:, :30], kv_cache=cache)[0]] + [model(ids[:, t:t + 1], kv_cache=cache)[0] for t in range(30, 40)]
stepwise = torch.cat(pieces, dim=1)
print(f"cache holds {cache.length} positions; largest logit difference {(stepwise - full).abs().max().item():.0e}; "
      f"same argmax everywhere: {torch.equal(stepwise.argmax(-1), full.argmax(-1))}")

# %% [markdown]
# The differences are float32 rounding: the cached pass sums the same products in another
# order. The tests of `minillm.kvcache` check this for every position encoding (learned,
# sinusoidal, RoPE, ALiBi), for grouped-query and multi-query attention, and for batches:
# identical greedy tokens, logits within $10^{-5}$.
#
# ## Prefill and decode
#
# Cached generation has two phases. **Prefill** runs the whole prompt at once, exactly a
# training-style forward pass, and fills the cache with its keys and values. **Decode**
# then feeds one token per step. In each layer the new token's single query attends over
# everything cached, including its own key, written just before. With $n$ new queries at
# the end of `length` cached positions, query $i$ (counting from 0) may see key $j$ when
#
# $$ j \le (\text{length} - n) + i ,$$
#
# the causal mask aligned to the *bottom right*: for a prefill ($n$ = length) it is the
# usual triangle; for a decode step ($n = 1$) the one query sees every key. Chapter 04's
# backends do this alignment (`F.scaled_dot_product_attention(is_causal=True)` aligns
# the triangle top-left, which is wrong as soon as keys are cached).
#
# ### Exercise 2 · Attention over a preallocated cache
#
# Write `cached_attention(q, k_cache, v_cache, length)`: the attention of one layer during
# a prefill or a decode step, read straight from the buffers.
#
# - `q`: `(batch, n_heads, n, head_dim)`, the queries of the $n$ newest positions;
# - `k_cache`, `v_cache`: `(batch, n_kv_heads, max_len, head_dim)`, preallocated, whose
#   first `length` positions are filled (the $n$ new ones included, at the end); what
#   lies past `length` is stale and must not be read;
# - grouped-query attention: `n_kv_heads` divides `n_heads`, and query head $h$ uses K/V
#   head $h \,//\, (n_\text{heads} / n_{kv})$ (chapter 04);
# - the scale $1/\sqrt{d_{head}}$ and the bottom-right causal mask above.
#
# Return `(batch, n_heads, n, head_dim)`. `ValueError` naming `length` unless
# $n \le \text{length} \le \text{max\_len}$.
#
# Difficulty ●●○ · Importance ●●● · about 15 minutes
#
# <details><summary>Hint 1</summary>Slice first: <code>k = k_cache[:, :, :length]</code>. Then repeat each K/V head for its group: <code>k.repeat_interleave(n_heads // n_kv_heads, dim=1)</code>.</details>
# <details><summary>Hint 2</summary>The mask: <code>torch.ones(n, length, dtype=torch.bool).tril(diagonal=length - n)</code>.</details>
# <details><summary>Hint 3</summary><code>scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])</code>, <code>masked_fill(~mask, float("-inf"))</code>, softmax over the last axis, <code>@ v</code>. (<code>F.scaled_dot_product_attention(q, k, v, attn_mask=mask)</code> does the last three steps.)</details>

# %%
#| answer cached_attention
def cached_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, length: int) -> torch.Tensor:
    """Attention of the n newest queries over the first ``length`` positions of a preallocated cache.

    q: (batch, n_heads, n, head_dim); k_cache, v_cache: (batch, n_kv_heads, max_len, head_dim),
    n_kv_heads dividing n_heads. Query i may attend to key j when j <= length - n + i.
    Returns (batch, n_heads, n, head_dim).
    """
    ### BEGIN SOLUTION
    n, max_len = q.shape[2], k_cache.shape[2]
    if isinstance(length, bool) or not isinstance(length, int) or not n <= length <= max_len:
        raise ValueError(f"length must be an int with n ({n}) <= length <= max_len ({max_len}), got {length!r}")
    group = q.shape[1] // k_cache.shape[1]
    k = k_cache[:, :, :length].repeat_interleave(group, dim=1)
    v = v_cache[:, :, :length].repeat_interleave(group, dim=1)
    mask = torch.ones(n, length, dtype=torch.bool, device=q.device).tril(diagonal=length - n)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v
    ### END SOLUTION

# %%
#| test cached_attention_visible points=1
def reference_cached_attention(q, k_cache, v_cache, length):
    """The course's reference: chapter 04's "math" backend on the filled part of the cache."""
    return reference_attention.math_attention(q, k_cache[:, :, :length], v_cache[:, :, :length], causal=True)


@course.visible_check("cached_attention")
def check_cached_attention(attend):
    """A prefill of 4 queries and a decode step of 1, with GQA (4 query heads, 2 K/V heads)
    and stale values past the filled positions."""
    g = torch.Generator().manual_seed(5)
    k_cache, v_cache = 100 * torch.randn(1, 2, 8, 4, generator=g), 100 * torch.randn(1, 2, 8, 4, generator=g)
    k_cache[:, :, :5], v_cache[:, :, :5] = torch.randn(1, 2, 5, 4, generator=g), torch.randn(1, 2, 5, 4, generator=g)
    q = torch.randn(1, 4, 5, 4, generator=g)

    def sdpa(q, k, v, mask=None, scale=None):
        k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)

    filled_k, filled_v = k_cache[:, :, :5], v_cache[:, :, :5]
    triangle = torch.ones(5, 5, dtype=torch.bool).tril()
    course.expect_close(
        attend(q, k_cache.clone(), v_cache.clone(), 5), sdpa(q, filled_k, filled_v, triangle),
        "cached_attention for a prefill of 5 positions",
        mistakes={
            "the stale positions past length were read: slice the cache to k_cache[:, :, :length]":
                sdpa(q, k_cache, v_cache, torch.ones(5, 8, dtype=torch.bool).tril()),
            "no causal mask: the prefill's queries see later keys": sdpa(q, filled_k, filled_v),
            "the scale 1/sqrt(head_dim) is missing": sdpa(q, filled_k, filled_v, triangle, scale=1.0),
            "the K/V heads are tiled (repeat), not grouped: query head h must use K/V head h // group "
            "(repeat_interleave)": F.scaled_dot_product_attention(q, filled_k.repeat(1, 2, 1, 1),
                                                                  filled_v.repeat(1, 2, 1, 1), attn_mask=triangle),
        })
    last = q[:, :, -1:]
    course.expect_close(
        attend(last, k_cache.clone(), v_cache.clone(), 5), sdpa(last, filled_k, filled_v),
        "cached_attention for one decode step (1 query, 5 cached keys)",
        mistakes={"the causal mask is aligned top-left (torch's is_causal): the one new query sees only key 0; "
                  "align it to the bottom right, tril(diagonal=length - n)":
                  sdpa(last, filled_k, filled_v, torch.tensor([[True, False, False, False, False]]))})
    course.expect_raises(ValueError, attend, last, k_cache, v_cache, 9, match="length",
                         what="cached_attention with length 9 in a cache of max_len 8")


check_cached_attention(cached_attention)
print("cached_attention: visible test passed")

# %%
#| test cached_attention_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
def _naive_cached_attention(q, k_cache, v_cache, length):
    batch, heads, n, head_dim = q.shape
    group = heads // k_cache.shape[1]
    out = torch.zeros_like(q)
    for b in range(batch):
        for h in range(heads):
            for i in range(n):
                keys = k_cache[b, h // group, :length - n + i + 1]
                weights = torch.softmax(keys @ q[b, h, i] / math.sqrt(head_dim), dim=0)
                out[b, h, i] = weights @ v_cache[b, h // group, :length - n + i + 1]
    return out


for batch, heads, kv_heads, n, length, max_len, head_dim, dtype in [
        (2, 4, 4, 3, 3, 6, 8, torch.float64), (1, 6, 2, 1, 7, 9, 4, torch.float64),
        (3, 4, 1, 2, 5, 5, 6, torch.float32), (2, 8, 2, 4, 9, 12, 16, torch.float32)]:
    q = torch.randn(batch, heads, n, head_dim, dtype=dtype)
    k_cache = torch.randn(batch, kv_heads, max_len, head_dim, dtype=dtype)
    v_cache = torch.randn(batch, kv_heads, max_len, head_dim, dtype=dtype)
    k_cache[:, :, length:], v_cache[:, :, length:] = 1e4, float("nan")  # stale: never read
    got = cached_attention(q, k_cache, v_cache, length)
    course.expect_close(got, _naive_cached_attention(q, k_cache, v_cache, length),
                        "cached_attention",
                        atol=1e-5 if dtype == torch.float32 else 1e-10)
    assert got.dtype == dtype, "the output must keep the input's dtype"
# large scores stay finite
q, k_cache, v_cache = 50 * torch.randn(1, 2, 1, 32), 50 * torch.randn(1, 2, 4, 32), torch.randn(1, 2, 4, 32)
got = cached_attention(q, k_cache, v_cache, 4)
assert torch.isfinite(got).all(), "cached_attention overflows for large scores"
course.expect_close(got, _naive_cached_attention(q.double(), k_cache.double(), v_cache.double(), 4).float(),
                    "cached_attention with large scores", atol=1e-4)
for bad in (0, 5):
    course.expect_raises(ValueError, cached_attention, torch.randn(1, 2, 2, 4), torch.randn(1, 2, 4, 4),
                         torch.randn(1, 2, 4, 4), bad if bad else 1, match="length",
                         what="cached_attention with an impossible length")
### END HIDDEN TESTS

# %%
attend_cached = course.keep_going("cached_attention", cached_attention, reference_cached_attention,
                                  check_cached_attention)

# %% [markdown]
# This is exactly what `MultiHeadAttention` does with a `LayerKVCache`: `update` writes
# the new keys and values and returns `k_buffer[:, :, :length]`, and the backend attends
# with the bottom-right causal mask. One layer of the shipped model, by hand, equals the
# layer itself run with the package's cache:

# %%
block = model.blocks[0].attn
x = torch.randn(1, 6, model.config.d_model)
with torch.no_grad():
    layer_cache = reference_kvcache.LayerKVCache(1, block.n_kv_heads, 16, block.head_dim)
    by_module = torch.cat([block(x[:, :5], positions=torch.arange(5), kv_cache=layer_cache),
                           block(x[:, 5:], positions=torch.tensor([5]), kv_cache=layer_cache)], dim=1)
    kv_width = block.n_kv_heads * block.head_dim
    q, k, v = block.qkv(x).split([block.d_model, kv_width, kv_width], dim=-1)
    split = lambda t, h: t.reshape(1, 6, h, block.head_dim).transpose(1, 2)  # noqa: E731
    q, k, v = split(q, block.n_heads), split(k, block.n_kv_heads), split(v, block.n_kv_heads)
    q, k = block.rotary(q, torch.arange(6)), block.rotary(k, torch.arange(6))
    buffers = torch.zeros(2, 1, block.n_kv_heads, 16, block.head_dim)
    buffers[0, :, :, :6], buffers[1, :, :, :6] = k, v
    by_hand = torch.cat([attend_cached(q[:, :, :5], buffers[0], buffers[1], 5),
                         attend_cached(q[:, :, 5:], buffers[0], buffers[1], 6)], dim=2)
    by_hand = block.out(by_hand.transpose(1, 2).reshape(1, 6, block.d_model))
print(f"largest difference, by hand against the module with its cache: {(by_hand - by_module).abs().max().item():.0e}")

# %% [markdown]
# ## Batches of prompts of different lengths
#
# A server does not answer one request at a time: it batches the prompts of many users,
# because (the next section measures it) a decode step over a batch of 8 costs little more
# than over one. The prompts have different lengths, so the batch is padded, on the
# *left*, so that every row's newest token sits in the last column and the next token
# goes after it. Chapter 07's `attention_mask`, `True` for real tokens, does two things:
# no query attends to padding, and each row numbers its own positions by counting its
# real tokens. A row padded with three tokens must see its first real token at position
# 0, exactly as when it runs alone. With a cache the mask covers the cached positions
# and the new ones, and the positions of the new tokens come from the whole mask.
#
# ### Exercise 3 · Positions from the padding mask
#
# Write `positions_from_mask(attention_mask)`: for a bool `(batch, k_len)` mask, the
# position of every column, `(batch, k_len)` int64: the number of real tokens *before*
# it in its row. Padding columns get 0 (nothing attends to them; 0 keeps every position
# table lookup valid). `TypeError` naming `attention_mask` unless it is a bool tensor;
# `ValueError` naming it unless it has two dimensions.
#
# Difficulty ●○○ · Importance ●●○ · about 10 minutes
#
# <details><summary>Hint 1</summary><code>attention_mask.cumsum(dim=-1)</code> counts the real tokens up to and including each column (bools sum as integers).</details>
# <details><summary>Hint 2</summary>Subtract one: the first real token is position 0. Then give every padding column 0: <code>torch.where(attention_mask, counts - 1, 0)</code>.</details>

# %%
#| answer positions_from_mask
#| export minillm/kvcache.py
def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """The position of every column of a padding mask: (batch, k_len) bool → (batch, k_len) int64.

    A real token (True) is at the number of real tokens before it in its row; padding
    (False) gets 0. TypeError unless attention_mask is a bool tensor, ValueError unless it
    is (batch, k_len).
    """
    ### BEGIN SOLUTION
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.dtype != torch.bool:
        raise TypeError(f"attention_mask must be a bool tensor, got "
                        f"{getattr(attention_mask, 'dtype', type(attention_mask).__name__)}")
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must have shape (batch, k_len), got {tuple(attention_mask.shape)}")
    return torch.where(attention_mask, attention_mask.long().cumsum(dim=-1) - 1, 0)
    ### END SOLUTION

# %%
#| test positions_from_mask_visible points=1
@course.visible_check("positions_from_mask")
def check_positions_from_mask(positions):
    """Three rows: no padding, two padding tokens on the left, and one (right-padded) gap."""
    mask = torch.tensor([[True, True, True, True, True], [False, False, True, True, True],
                         [True, True, False, True, True]])
    expected = torch.tensor([[0, 1, 2, 3, 4], [0, 0, 0, 1, 2], [0, 1, 0, 2, 3]])
    got = positions(mask.clone())
    course.expect_close(got, expected, "positions_from_mask on three rows", atol=0, rtol=0, mistakes={
        "the padding is ignored: every row counts 0, 1, 2, ... from its first column": torch.arange(5).expand(3, 5),
        "counted from 1: a row's first real token is position 0 (subtract 1 from the count)":
            mask.long().cumsum(-1),
        "padding got the count minus 1 (-1 before the first real token): set every padding column to 0":
            mask.long().cumsum(-1) - 1,
        "clamped at 0, so the padding inside row 2 kept the previous token's position: set every padding column "
        "to 0 (torch.where(attention_mask, ..., 0))": (mask.long().cumsum(-1) - 1).clamp(min=0),
    })
    if got.dtype != torch.int64:
        raise course.CheckFailed(f"positions_from_mask must return int64 positions (they index tables), got {got.dtype}")
    course.expect_raises(TypeError, positions, torch.ones(2, 3), match="attention_mask",
                         what="positions_from_mask of a float mask")
    course.expect_raises(ValueError, positions, torch.ones(3, dtype=torch.bool), match="attention_mask",
                         what="positions_from_mask of a 1-D mask")


check_positions_from_mask(positions_from_mask)
print("positions_from_mask: visible test passed")

# %%
#| test positions_from_mask_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
def _naive_positions(mask):
    rows = []
    for row in mask.tolist():
        seen, out = 0, []
        for real in row:
            out.append(seen if real else 0)
            seen += int(real)
        rows.append(out)
    return torch.tensor(rows, dtype=torch.int64)


for batch, k_len in [(1, 1), (4, 9), (7, 33), (2, 300)]:
    mask = torch.rand(batch, k_len) < 0.7
    course.expect_close(positions_from_mask(mask), _naive_positions(mask), "positions_from_mask",
                        atol=0, rtol=0)
# left padding, as generate pads: the real tokens of each row count 0, 1, 2, ...
lengths = torch.randint(1, 12, (5,))
mask = torch.arange(12)[None, :] >= 12 - lengths[:, None]
got = positions_from_mask(mask)
assert got.dtype == torch.int64, "positions must be int64"
for row, n in zip(got, lengths.tolist()):
    assert row[12 - n:].tolist() == list(range(n)) and not row[:12 - n].any(), "left padding: positions 0.. n-1"
# a row without a real token, and one token
assert positions_from_mask(torch.zeros(2, 4, dtype=torch.bool)).tolist() == [[0] * 4] * 2, "all padding gives zeros"
mask = torch.tensor([[False, True]])
before = mask.clone()
assert positions_from_mask(mask).tolist() == [[0, 0]] and torch.equal(mask, before)
course.expect_raises(TypeError, positions_from_mask, torch.ones(2, 3, dtype=torch.int64), match="attention_mask",
                     what="an int mask")
course.expect_raises(ValueError, positions_from_mask, torch.ones(2, 3, 4, dtype=torch.bool), match="attention_mask",
                     what="a 3-D mask")
### END HIDDEN TESTS

# %%
mask_positions = course.keep_going("positions_from_mask", positions_from_mask, reference_kvcache.positions_from_mask,
                                   check_positions_from_mask)

# %% [markdown]
# Three prompts in one batch, generated greedily with one `KVCache` of batch 3, against
# each prompt alone: row by row the same tokens. The positions of the padded batch, from
# your function, show why: each row starts counting at its first real token.

# %%
texts = ["ROMEO:", "JULIET:\nO Romeo, Romeo!", "KING RICHARD III:\nNow is the winter"]
encoded = [tokenizer.encode(text) for text in texts]
width = max(len(e) for e in encoded)
ids = torch.tensor([[0] * (width - len(e)) + e for e in encoded])
mask = torch.tensor([[False] * (width - len(e)) + [True] * len(e) for e in encoded])
print("positions of the padded batch:\n", mask_positions(mask))
n_batch = 12 if QUICK else 30
batch_cache = reference_kvcache.KVCache.for_model(model, batch_size=3)
together = generate(model, ids, n_batch, temperature=0, attention_mask=mask, kv_cache=batch_cache)
for row, e in enumerate(encoded):
    alone = generate(model, torch.tensor([e]), n_batch, temperature=0,
                     kv_cache=reference_kvcache.KVCache.for_model(model, 1))
    print(f"row {row}: same {n_batch} new tokens as alone: {torch.equal(together[row, -n_batch:], alone[0, -n_batch:])}; "
          f"{tokenizer.decode(alone[0, -n_batch:].tolist())[:40]!r}")

# %% [markdown]
# ## The cost, measured
#
# What does the cache buy? Counting arithmetic: without it, the step at context $t$ runs
# the model over $t$ positions, about $2 N t$ multiply-adds for $N$ parameters, plus the
# attention over $t^2/2$ pairs; with it, one position, $2N$ plus the attention of one
# query over $t$ keys. So the uncached step grows linearly with $t$ (and generating $T$
# tokens quadratically), and the cached step is "constant", plus a term that grows with
# $t$: the new query reads every cached key and value of every layer,
# $4\, n_\text{layers}\, t\, d_\text{model}$ multiply-adds.
#
# To see this, the context must be long. The shipped model's is 128 tokens, so the
# timings use a **randomly initialized model of the shipped shape** (4 layers, $d$ = 128,
# 4 heads, vocabulary 2,048) with a context of 1,024: the weights do not change the cost.
# Each point is the best of several runs on one CPU thread, as everywhere in this chapter
# (the best run is the one least disturbed by whatever else the machine is doing). The
# attention of the step alone (one query over $t$ cached keys and values, in all four
# layers) is timed too.

# %%
long_config = recipe_config(2048, context_length=1024)
torch.manual_seed(0)
long_model = GPT(long_config).eval()
contexts = [64, 1024] if QUICK else [64, 128, 256, 512, 768, 1024]
repeats = 3 if QUICK else 15


def best_ms(run, repeats):
    """The fastest of ``repeats`` runs of ``run()``, in milliseconds: the least disturbed by a busy machine."""
    return 1000 * course.best_seconds(run, repeats)


def cached_step_ms(model, ids, t, repeats):
    """The best time of one cached decoding step at context t (t - 1 positions cached); returns (ms, cache)."""
    cache = reference_kvcache.KVCache.for_model(model, 1)
    model(ids[:, :t - 1], kv_cache=cache)

    def step():
        model(ids[:, t - 1:t], kv_cache=cache)
        for layer in cache.layers:  # only for timing: the next repeat writes the same position again
            layer.length = t - 1
    return best_ms(step, repeats), cache


timings = {"without cache": [], "with cache": [], "attention over the cache": []}
ids = torch.randint(0, 2048, (1, 1024))
with torch.no_grad():
    for t in contexts:
        timings["without cache"].append(best_ms(lambda: long_model(ids[:, :t]), repeats))
        step_time, cache = cached_step_ms(long_model, ids, t, repeats)
        timings["with cache"].append(step_time)
        q = torch.randn(1, long_config.n_heads, 1, long_config.head_dim)
        kv = [(layer.k[:, :, :t], layer.v[:, :, :t]) for layer in cache.layers]
        timings["attention over the cache"].append(best_ms(
            lambda: [F.scaled_dot_product_attention(q, k, v) for k, v in kv], repeats))
for name, values in timings.items():
    print(f"{name:>26s}: " + "  ".join(f"t={t}: {ms:6.2f} ms" for t, ms in zip(contexts, values))
          + f"   (x{values[-1] / values[0]:.1f} from t={contexts[0]} to t={contexts[-1]})")
print(f"at t={contexts[-1]} the cached step is {timings['without cache'][-1] / timings['with cache'][-1]:.0f}x cheaper; "
      f"its attention over the cache takes {timings['attention over the cache'][-1] / timings['with cache'][-1]:.0%} of it")

# %%
fig, ax = plt.subplots(figsize=(7, 4))
for (name, values), style in zip(timings.items(), ("o-", "s-", "^--")):
    ax.plot(contexts, values, style, label=name)
attention_end = timings["attention over the cache"][-1]
ax.plot(contexts, [attention_end * t / contexts[-1] for t in contexts], ":", color="grey", label="proportional to t")
ax.set_xlabel("context length t (tokens)")
ax.set_ylabel("time of one decoding step (ms)")
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_title("Per-token decode latency, shipped shape with a 1,024-token context")
ax.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# Without a cache the step time grows steadily with the context: every step reruns it.
# With the cache the step is many times cheaper at long contexts (the printed ratio) and
# nearly flat, but the attention over the cache is not: it grows with $t$, in proportion
# to it at long contexts (the dotted line). On this small CPU model it stays a small share
# of the step (the printed percentage), which is mostly the fixed cost of a forward pass
# (chapter 07 measured it), and on a busy machine the noise between runs is larger than
# its growth. Count bytes instead of milliseconds and the picture changes: the weights
# hold $1.07 \times 10^6$ numbers, and at $t$ = 1,024 the cache holds
# $2 \times 4 \times 1024 \times 128 \approx 1.05 \times 10^6$: from this length on, every
# step reads as many cached numbers as weights. That is the Tee check below.
#
# **Prefill against decode.** Prefill processes the prompt's positions in one pass: every
# weight matrix multiplies a `(prompt, d)` matrix, a matrix-matrix product that reads each
# weight once for all positions. A decode step multiplies each weight matrix by one
# vector: the same weights are read from memory for two operations per weight. Measured
# as tokens per second, on a 256-token prompt and the first step after it (best of
# several runs, as above):

# %%
with torch.no_grad():
    prefill_ms = best_ms(lambda: long_model(ids[:, :256], kv_cache=reference_kvcache.KVCache.for_model(long_model, 1)),
                         repeats)
    decode_ms, _ = cached_step_ms(long_model, ids, 257, repeats)  # the first step after that prompt
print(f"prefill: {256 / prefill_ms * 1000:8.0f} tokens/s ({prefill_ms:.1f} ms for 256 tokens)")
print(f"decode:  {1 / decode_ms * 1000:8.0f} tokens/s ({decode_ms:.2f} ms per token)")
print(f"prefill runs {decode_ms * 256 / prefill_ms:.0f}x more tokens per second than decoding")

# %% [markdown]
# Prefill processes many times more tokens per second than decode (the printed ratio), on
# the same model and the same arithmetic per token. The difference is how much work each number read from
# memory pays for (the *arithmetic intensity*): a decode step does about one
# multiply-add per weight it reads, a prefill about one per weight *per prompt token*. On
# a CPU part of the gap is also the fixed cost of a forward pass (chapter 07 measured it):
# a decode step pays it for a single token. Both are why servers batch decode steps
# across users, and why prefill and decode are scheduled separately.
#
# One question to think about (graded by your instructor):

# %% [markdown]
# #| written decode_memory_bound points=2
# **Question.** A decode step of a 7-billion-parameter model in 16-bit floats, batch 1,
# does about $2 \times 7 \times 10^9$ floating-point operations. A GPU does about
# $10^{15}$ operations per second and reads about $3 \times 10^{12}$ bytes per second from
# its memory. Estimate the time of one step from each limit, say which one sets it, and
# why. What changes with a batch of 64 requests, and what grows with the context length?
# Answer in four to six sentences.
#
# ### BEGIN SOLUTION
# *Model answer.* Arithmetic alone would take $1.4 \times 10^{10} / 10^{15} \approx 14$
# microseconds; but every weight must be read once per step, $1.4 \times 10^{10}$ bytes
# at $3 \times 10^{12}$ bytes/s, about 4.7 ms, over 300 times longer. A decode step
# multiplies each weight matrix by a single vector, so it does about one multiply-add per
# weight read (an arithmetic intensity near 1 operation per byte, far below the
# roughly 300 the hardware needs to be busy): it is memory-bound, and the time per token
# is set by bytes moved, not by FLOPs. A batch of 64 reads the same weights once for 64
# tokens, so it costs about the same time and yields 64 times the tokens, until the
# arithmetic catches up with the memory (intensity near 64). What grows with the context
# is the KV cache: each step also reads every cached key and value, per request, and
# batching does not share those bytes, so at long contexts and large batches the cache,
# not the weights, dominates the traffic (hence GQA, MQA and quantized caches).
#
# *Grading:* 1 point for the two estimates (microseconds against milliseconds) and the
# conclusion that memory traffic sets the time (one use of each weight per read); 1 point
# for batching amortizing the weights but not the per-request cache, which grows with the
# context.
# ### END SOLUTION

# %% [markdown]
# ## The cache's memory
#
# Chapter 04's `kv_cache_bytes(config, batch, seq, bytes_per_element)` counts it:
# keys and values, in every layer, for every position and every K/V head,
#
# $$ 2 \cdot n_\text{layers} \cdot \text{batch} \cdot \text{seq} \cdot n_{kv} \cdot d_\text{head} \cdot \text{bytes}. $$
#
# Grouped-query attention divides it by $n_\text{heads} / n_{kv}$, multi-query attention
# by $n_\text{heads}$. For real models, at their full context, batch 1, in 16-bit floats,
# beside their weights in 16-bit floats (chapter 00's `count_parameters`):

# %%
#| stable
def llama_like(name, d_model, n_layers, n_heads, n_kv_heads, context, d_ff):
    return ModelConfig(name=name, vocab_size=32000, context_length=context, d_model=d_model, n_layers=n_layers,
                       n_heads=n_heads, n_kv_heads=n_kv_heads, d_ff=d_ff, positions="rope", norm="rmsnorm",
                       ffn="swiglu", bias=False, tie_embeddings=False)


real_models = [
    PRESETS["gpt2"],
    llama_like("Llama-2-7B", 4096, 32, 32, 32, 4096, 11008),
    llama_like("Llama-2-70B (GQA 8)", 8192, 80, 64, 8, 4096, 28672),
    llama_like("Mistral-7B (GQA 8)", 4096, 32, 32, 8, 8192, 14336),
]
print(f"{'model':20s} {'weights':>9s} {'KiB per token':>14s} {'full context':>13s} {'as MHA':>10s} {'as MQA':>10s}")
for config in real_models:
    per_token = reference_attention.kv_cache_bytes(config, 1, 1, 2)
    full = reference_attention.kv_cache_bytes(config, 1, config.context_length, 2)
    as_mha = full * config.n_heads // config.n_kv_heads
    print(f"{config.name:20s} {count_parameters(config) * 2 / 1e9:6.1f} GB {per_token / 2**10:14.0f} "
          f"{full / 2**30:9.2f} GiB {as_mha / 2**30:6.2f} GiB {as_mha / config.n_heads / 2**30:6.3f} GiB")

# %% [markdown]
# Llama-2-7B needs 512 KiB for every token it keeps, 2 GiB for one full 4,096-token
# context: a batch of 32 such requests needs 64 GiB of cache, several times its 13.5 GB
# of weights. Llama-2-70B has over twice the layers and twice the width, yet with 8 K/V
# heads for its 64 query heads its cache per token is smaller (320 KiB); as plain
# multi-head attention it would be 8 times that. Mistral-7B keeps 8 K/V heads too, and
# its sliding window of 4,096 tokens bounds its cache at that length, whatever the
# context: the rolling buffer of the next section. (The table counts 16-bit caches;
# quantized caches halve it again.)
#
# The same formula for our own allocation: a `KVCache` of the shipped model, in float32,
# and the bytes its tensors really hold.

# %%
#| stable
shipped_cache = reference_kvcache.KVCache.for_model(model, batch_size=8)
formula = reference_attention.kv_cache_bytes(model.config, 8, model.config.context_length, bytes_per_element=4)
print(f"KVCache(batch 8, max_len {shipped_cache.max_len}): {shipped_cache.nbytes:,d} bytes allocated; "
      f"kv_cache_bytes says {formula:,d}: equal {shipped_cache.nbytes == formula}")
print(f"the model's weights: {sum(p.numel() * p.element_size() for p in model.parameters()):,d} bytes")

# %% [markdown]
# ## Past the context
#
# The shipped model has a context of 128 tokens, and `python -m minillm generate` makes
# 200. Without a cache, `generate` crops the input to the last 128 tokens and recomputes;
# every step restarts from an empty history. A cache cannot crop: what is cached was
# computed with positions numbered from the start. Two policies, by position encoding:
#
# - **Relative positions (RoPE, ALiBi): a rolling window.** The attention scores depend
#   only on distances, so the cache can forget its oldest position and keep the others
#   as they are (`KVCache.roll`). It counts what it dropped in `position_offset`, and the
#   model numbers the new token from there: position 300 stays position 300, although
#   the cache holds only the last 128. A RoPE key is rotated once, when it is written,
#   and never again; nothing is renumbered, so a cache in 16 bits gathers no rounding
#   error, roll after roll. Every token then attends to the last `max_len` tokens: this is
#   **sliding-window attention**, which Mistral-7B uses by design with a rolling buffer.
#   It is not the same as cropping: a cached key in layer 2 was computed when its token
#   could still see tokens that have since left the window, so information travels
#   further back than the window, one window per layer. With more than one layer, a
#   rolling cache past the context is therefore *not* a recompute of its last window,
#   even in exact arithmetic. The tests check that rolling equals recomputing the same
#   sliding-window attention without a cache, and, for one layer, where both coincide,
#   cropping.
# - **Absolute positions (learned, sinusoidal): refill.** A key's position is baked into
#   it, so nothing can be renumbered. `generate` empties the cache and refills it with
#   the last half of the window in one prefill, then decodes on; every token then sees
#   between half a window and a whole one.
#
# `generate` does either for you, asking the cache which: a `KVCache` of a RoPE model
# rolls. The shipped model (RoPE) past its context, 300 tokens from "ROMEO:" (140 in
# quick mode), and then the two ways' next-token distributions compared over the same
# text, step by step past the context:

# %%
context = model.config.context_length
n_long, n_compared = (140, 6) if QUICK else (300, 40)
with torch.no_grad():
    started = time.perf_counter()
    rolled = generate(model, prompt, n_long, temperature=0.8, top_p=0.95, generator=torch.Generator().manual_seed(0),
                      kv_cache=reference_kvcache.KVCache.for_model(model, 1))
    rolled_s = time.perf_counter() - started
    started = time.perf_counter()
    cropped = generate(model, prompt, n_long, temperature=0.8, top_p=0.95, generator=torch.Generator().manual_seed(0))
    cropped_s = time.perf_counter() - started
    # the next-token distributions of both ways, over the same text, past the context
    cache = reference_kvcache.KVCache.for_model(model, 1)
    model(rolled[:, :context], kv_cache=cache)
    gaps = []
    for t in range(context, context + n_compared):
        cache.roll(1)
        by_rolling = torch.softmax(model(rolled[:, t:t + 1], kv_cache=cache)[0][0, -1], dim=-1)
        by_cropping = torch.softmax(model(rolled[:, t - context + 1:t + 1])[0][0, -1], dim=-1)
        gaps.append(0.5 * (by_rolling - by_cropping).abs().sum().item())
same = int((rolled[0] == cropped[0]).cumprod(0).sum()) - prompt.shape[1]
print(f"rolling cache {rolled_s:.2f} s, cropping without a cache {cropped_s:.2f} s; the first {same} of {n_long} new "
      f"tokens agree")
print(f"past the context, the two next-token distributions differ by a total variation distance of "
      f"{statistics.median(gaps):.4f} (median over {n_compared} steps; largest {max(gaps):.4f})")
print(tokenizer.decode(rolled[0, -120:].tolist()))

# %% [markdown]
# Both ways give nearly the same next-token distributions past the context: the share of
# probability that moves (the total variation distance, printed) is small, because what
# the deeper layers' cached keys remember from beyond the window weighs little in this
# model. Small enough, in this run, that the same seed drew the same tokens for as long as
# the count above says. Neither way is "right": the model never saw more than 128 tokens
# in training. What differs is the cost: the rolling cache pays one position per step,
# cropping a whole window.
#
# ## Sampling, compared
#
# With generation cheap, we can afford to compare chapter 07's samplers on the trained
# model: greedy decoding, temperature, top-k and top-p. For each setting, a batch of
# samples from "ROMEO:" (one batched `KVCache`), scored two ways:
#
# - **diversity**: the share of distinct token bigrams among all bigrams of the samples
#   (1 = no bigram repeats; greedy decoding repeats itself);
# - **likelihood**: the mean log-probability per token that the model itself, at
#   temperature 1, gives the sampled text (0 would be certainty).

# %%
settings = {"greedy": dict(temperature=0), "T=0.7": dict(temperature=0.7), "T=1.0": dict(temperature=1.0),
            "T=1.3": dict(temperature=1.3), "top-k 5": dict(top_k=5), "top-k 40": dict(top_k=40),
            "top-p 0.5": dict(top_p=0.5), "top-p 0.9": dict(top_p=0.9)}
n_samples, n_new = (3, 24) if QUICK else (8, 100)
start = prompt.expand(n_samples, -1)
scores = {}
with torch.no_grad():
    for name, setting in settings.items():
        out = generate(model, start, n_new, generator=torch.Generator().manual_seed(1),
                       kv_cache=reference_kvcache.KVCache.for_model(model, n_samples), **setting)
        logits, _ = model(out[:, :-1])
        new_logprobs = torch.log_softmax(logits[:, -n_new:], dim=-1).gather(-1, out[:, -n_new:, None])
        bigrams = [tuple(pair) for row in out[:, -n_new:].tolist() for pair in zip(row, row[1:])]
        scores[name] = (len(set(bigrams)) / len(bigrams), new_logprobs.mean().item(), out[0])
for name, (diversity, logprob, sample) in scores.items():
    print(f"--- {name}: distinct bigrams {diversity:.2f}, mean log-probability {logprob:.2f}")
    print(tokenizer.decode(sample.tolist())[:110].replace("\n", " / "))

# %%
fig, ax = plt.subplots(figsize=(6.5, 4.2))
families = {"greedy and temperature": "C1", "top-k": "C0", "top-p": "C2"}
for name, (diversity, logprob, _) in scores.items():
    family = "top-k" if name.startswith("top-k") else "top-p" if name.startswith("top-p") else "greedy and temperature"
    ax.scatter(logprob, diversity, color=families[family])
    ax.annotate(name, (logprob, diversity), textcoords="offset points", fontsize=8,
                xytext=(5, -11) if family == "top-k" else (5, 4))
for family, color in families.items():
    ax.scatter([], [], color=color, label=family)
ax.legend(loc="lower left", fontsize=8)
ax.set_xlabel("mean log-probability per token under the model (nats)")
ax.set_ylabel("distinct bigrams among the samples")
ax.set_title("Samplers trade likelihood for diversity (shipped model)")
plt.tight_layout()
plt.show()

# %% [markdown]
# Every sampler lies on one trade-off curve: the likelier the text by the model's own
# judgement, the more it repeats itself. Greedy decoding is the extreme, with the highest
# likelihood and the most repetition; a high temperature the other extreme, diverse and
# improbable (the samples above read so). Top-k and top-p trim the tail instead of
# rescaling it: with a loose threshold (top-k 40, top-p 0.9) they sit between
# temperatures 0.7 and 1, with a strict one (top-k 5, top-p 0.5) closer to greedy than
# temperature 0.7 is. What the cache changed here is only the cost: each setting's batch was
# one prefill and a few dozen decode steps.
#
# ## Tee check: "fast O(1) step decode"
#
# > *KV Cache · fast O(1) step decode* (the Tech Band)
#
# **What is right:** the cache removes the recomputation of the past. Without it, the
# step at context $t$ costs $O(t)$ passes' worth of position work; with it, the
# projections and the feed-forward networks run for one position whatever $t$ is. The
# figure shows it: many times cheaper at 1,024 tokens (the printed ratio).
#
# **What is loose:** the step is not $O(1)$. Its attention still reads every cached key
# and value of every layer, $4\, n_\text{layers}\, t\, d$ multiply-adds and
# $2\, n_\text{layers}\, t\, d$ numbers from memory, so the step's cost grows linearly
# with the context: the attention line of the figure rises in proportion to $t$. On our
# small CPU model the fixed cost of a forward pass hides most of it, but in bytes it is
# already there: at $t$ = 1,024 the cache that each step reads is as large as the
# model's weights. For Llama-2-7B at its full 4,096-token context, one request's cache
# is 2 GiB (the table above) against 13.5 GB of weights; a batch of 32 requests, which
# shares the weights but not the caches, reads 64 GiB of cache in every step. At long
# contexts and large batches the cache dominates the step, which is why GQA, MQA,
# sliding windows and cache quantization exist. A fairer line for the shirt:
# *"KV cache: O(t) step decode instead of O(t²)."*
#
# ## What `minillm` gained
#
# - `minillm.kvcache`: `LayerKVCache` (Exercise 1: `update` writes into the preallocated
#   slice), `KVCache(config, batch_size, max_len, dtype=None, device=None, rolling=None)`
#   with `length`, `layer(i)`, `reset`, `roll` (a rolling window for RoPE and ALiBi,
#   counted in `position_offset`), `nbytes` and `KVCache.for_model(model, batch_size)`, and `positions_from_mask`
#   (Exercise 3).
# - `generate(..., kv_cache=KVCache(...))` decodes with it and continues past the context:
#   rolling for relative positions, refilling for absolute ones. `python -m minillm
#   generate` uses it, and `bench/kvcache.py` measures what it buys.
#
# Chapter 10 makes the attention itself cheaper in memory traffic (FlashAttention), the
# same bottleneck seen from the training side.
#
# ## Further reading
#
# - Vaswani et al., *Attention Is All You Need* (2017): incremental decoding in the original Tensor2Tensor code.
# - Shazeer, *Fast Transformer Decoding: One Write-Head is All You Need* (2019): multi-query attention, and the memory-bandwidth argument.
# - Pope et al., *Efficiently Scaling Transformer Inference* (2022): prefill against decode, arithmetic intensity, the cache at scale.
# - Ainslie et al., *GQA: Training Generalized Multi-Query Transformer Models from Multi-Head Checkpoints* (2023).
# - Jiang et al., *Mistral 7B* (2023): sliding-window attention and the rolling buffer cache.
# - Kwon et al., *Efficient Memory Management for Large Language Model Serving with PagedAttention* (2023): vLLM, the cache in pages.
# - Xiao et al., *Efficient Streaming Language Models with Attention Sinks* (2023): positions renumbered inside a rolling cache.
