# %% [markdown]
# # Chapter 07 · The mini-LLM: assemble, train, sample
#
# **Where this sits on the tee:** the back graphic, end to end. Text becomes token ids
# (chapter 01) and vectors (02) that carry their positions (03); a stack of blocks of
# attention (04), feed-forward networks (05) and Add & Norm (06) transforms them; and the
# last stage, *output generation*, turns the final vectors into a probability for every
# token of the vocabulary and draws the next token. This chapter writes that last stage,
# puts the parts together into a GPT, trains it on the bundled Shakespeare, and talks to it.
#
# **You will be able to**
# - assemble a decoder-only Transformer from the course's components, switch between the
#   variants taught so far from one config, and check its size against chapter 00's count;
# - measure a language model's loss in nats per token and in nats per character, and say
#   why only the second compares models with different tokenizers;
# - write the pieces of a modern training loop: AdamW with weight-decay groups, warmup and
#   cosine decay, gradient clipping, held-out evaluation, and checkpoints that resume
#   exactly;
# - turn logits into text with greedy decoding, temperature, top-k and top-p sampling,
#   reproducibly;
# - contrast the GPT with a BERT-style masked language model, and say what each sees.
#
# **Prerequisites:** chapters 00–06 (the config and parameter count, the BPE tokenizer,
# embeddings, positions, attention, the feed-forward network and the Transformer block).
#
# **Time:** about 50 minutes of reading, 70 minutes of exercises (four coded, two written).
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

import course_runtime as course
from minillm import data
from minillm.config import count_parameters as chapter_00_count  # chapter 00's formula; this chapter writes the model's own
from minillm.curves import plot_history

device = course.setup(seed=0)  # this chapter runs on the CPU whatever `device` says: its models are small
torch.set_num_threads(1)  # this chapter's models are small: one thread is as fast, and robust on a busy machine

# %% [markdown]
# ## The model, assembled
#
# Every part of the back graphic exists already. What is left is to stack them:
#
# $$
# \begin{aligned}
# h_0 &= E[\text{ids}] + P[\text{positions}] && \text{token embedding (02) + positions (03)}\\
# h_\ell &= \operatorname{Block}_\ell(h_{\ell-1}), \quad \ell = 1, \dots, L && \text{attention (04), FFN (05), Add \& Norm (06)}\\
# \text{logits} &= \operatorname{Norm}(h_L)\, W_{\text{out}}^\top && W_{\text{out}} = E \text{ when tied}
# \end{aligned}
# $$
#
# The logits have shape `(batch, seq, vocab)`: position $t$ holds a score for every token
# that could come after `ids[:, t]`. Because the attention is causal, position $t$ sees
# only tokens $\le t$, so one forward pass makes `seq` next-token predictions at once,
# each from its own prefix. That is what makes training a GPT efficient.
#
# The model is described by a `GPTConfig`: chapter 00's `ModelConfig` (the same fields,
# meaning the same), plus what building and training need. Its switches select the
# variants of chapters 02–06:
#
# | switch | values | chapter |
# | --- | --- | --- |
# | `positions` | `"learned"` (GPT-2), `"sinusoidal"` (2017), `"rope"` (Llama), `"alibi"` | 03 |
# | `n_kv_heads` | `n_heads` (MHA), fewer (GQA), 1 (MQA) | 04 |
# | `attention_backend` | `"sdpa"` (PyTorch's fused kernel, the default), `"math"` (written out) | 04 |
# | `fused_qkv` | one projection for Q, K and V (the default), or three | 04 |
# | `ffn`, `d_ff`, `ffn_options` | `"gelu"`, `"gelu_tanh"` (GPT-2's), `"relu"`, `"swiglu"` (Llama); the width (default: the FFN's own rule) | 05 |
# | `norm`, `norm_placement` | `"layernorm"`, `"rmsnorm"`; `"pre"`, `"post"` | 06 |
# | `tie_embeddings`, `bias`, `dropout`, `scale_embeddings` | GPT-2: tied, biases, 0.1, off | 02, 06 |
#
# Each name is looked up in its chapter's registry (`POSITIONS`, `ATTENTION_BACKENDS`,
# `FFNS`, `NORMS`), so the table's values are the names registered so far: chapter 10
# adds the backend `"flash"`, chapter 11 the FFN `"moe"`.
#
# The model's code is given: it is assembly, and reading it is the exercise. Everything
# below goes into `minillm/model.py`.

# %%
#| export minillm/model.py
"""The mini-LLM: ``GPTConfig`` and ``GPT``, assembled from the earlier chapters (chapter 07).

Token ids (batch, seq) → token embeddings (chapter 02) + positions (chapter 03) → a stack
of Transformer blocks (attention, chapter 04; feed-forward network, chapter 05; norms
and residuals, chapter 06) → a final norm → a linear map to one logit per vocabulary
entry, (batch, seq, vocab). The config names each component, and the name is looked up in
that component's registry (``POSITIONS``, ``ATTENTION_BACKENDS``, ``FFNS``, ``NORMS``): a
component registered later, such as chapter 11's "moe", needs no change here.
``count_parameters(config)`` counts the parameters of the model a config describes.

What the model asks of its components:
- Initialization: every ``nn.Linear`` gets N(0, init_std²), and every module marked by
  ``minillm.markers.mark_residual_projection`` (attention's output, the FFN's
  down-projection, each expert's) gets init_std / sqrt(2 n_layers), whatever its name.
- Auxiliary losses: a module with a loss of its own (chapter 11's load balancing) sets
  ``self.aux_loss`` in its forward: a 0-dim tensor, already multiplied by its weight, or
  None. It may also set ``self.aux_losses``, a dict of named 0-dim tensors, to be logged
  apart. ``GPT.forward`` with targets adds every module's ``aux_loss`` to the loss it
  returns; ``GPT.last_aux_losses`` then gives floats for the logs: "aux_loss", the sum,
  and each name of the modules' ``aux_losses``, summed over the modules.
- Active parameters: a module that uses only some of its parameters for each token
  (chapter 11's experts) may define ``active_parameter_count()``, the parameters one token
  uses; ``count_parameters(config, active=True)`` asks it.
- Padding: ``forward(..., attention_mask=mask)``, True for the real tokens, gives each row
  of the batch its own positions (the count of its real tokens so far, minus 1), and no
  token attends to padding. A left-padded row gets the logits it gets alone.
- Caches (chapter 09): ``forward(ids, kv_cache=cache)`` takes a model-wide cache with
  ``length``, an int, the positions it holds (the same for every row, padding included),
  and ``layer(i)``, the ``KVCacheLike`` of block i. Which cached positions are padding, the
  model learns from ``attention_mask``, which then covers the cached positions and the
  new ones; a cache that keeps lengths per row keeps them for itself. A rolling cache
  that has dropped its oldest positions says how many in ``position_offset`` (an int, or
  one per row): positions then continue from where the sequence really is, so no cached
  key ever has to be rotated again.
"""
import copy
import math
from dataclasses import asdict, dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from minillm.attention import ATTENTION_BACKENDS, KVCacheLike
from minillm.block import TransformerBlock
from minillm.checkpoint import config_from_dict
from minillm.checks import boolean, number, one_of, positive_int, positive_number, probability
from minillm.config import CHOICES, ModelConfig
from minillm.embedding import TokenEmbedding
from minillm.ffn import FFNS, default_d_ff
from minillm.markers import is_residual_projection
from minillm.norm import NORMS, build_norm
from minillm.positional import POSITIONS
from minillm.precision import compute_dtype

IGNORE_INDEX = -100  # a target equal to this is left out of the loss (as in F.cross_entropy)

# %% [markdown]
# `GPTConfig` is a frozen dataclass that *extends* `ModelConfig`: every field of chapter
# 00 keeps its meaning, and the new fields have defaults that change nothing about the
# count. Two things differ. The names of the components are not chapter 00's fixed lists
# but whatever their registries hold (`choices()` is the hook chapter 00 left for it), so
# a feed-forward network registered in chapter 11 is a valid `ffn` at once. And `d_ff`
# defaults to None, which asks the FFN for its own width rule (`default_d_ff`, chapter
# 05): $4d$ for GELU, the 2/3 rule for SwiGLU, so `GPTConfig(d_model=128, ffn="swiglu")`
# gets the 352 of the course's model and not GPT-2 small's 3072.

# %%
#| export minillm/model.py
@dataclass(frozen=True)
class GPTConfig(ModelConfig):
    """A ``ModelConfig`` (same fields, same meaning) plus what training and building need.

    Each component is a name in its registry, and a name registered later is valid at
    once: positions (``POSITIONS``: "learned", "sinusoidal", "rope", "alibi"), norm
    (``NORMS``: "layernorm", "rmsnorm"), ffn (``FFNS``: "gelu", "gelu_tanh" (GPT-2's),
    "relu", "swiglu"; chapter 11 adds "moe"), attention_backend (``ATTENTION_BACKENDS``:
    "sdpa", PyTorch's fused kernels, by default; "math", written out in chapter 04).
    architecture: "decoder" (causal, a GPT) or "encoder" (bidirectional, BERT-style; for
    the masked-LM contrast).
    d_ff: the FFN's hidden width; None (the default) takes the FFN's own rule,
    ``minillm.ffn.default_d_ff``: 4 d_model for GELU and ReLU, the 2/3 rule for SwiGLU
    (352 for d_model 128). The config holds the width it resolved.
    ffn_options: None or a dict of keyword arguments for the FFN's constructor, plain data
    (checkpoints store it), for example ``{"n_experts": 8, "top_k": 2}``.
    fused_qkv: one Linear for queries, keys and values (fast), or three, ``q``, ``k``, ``v``
    (so that chapter 12 can adapt Q and V alone).
    dropout: on the embeddings, attention weights and both residual branches while
    training. eps: the norms' epsilon. scale_embeddings: multiply token embeddings by
    sqrt(d_model) (the 2017 Transformer; off, as in GPT-2). rope_theta: RoPE's base.
    init_std: standard deviation of the initial weights (GPT-2's 0.02; residual output
    projections get init_std / sqrt(2 n_layers)).
    """

    d_ff: int | None = None
    dropout: float = 0.0
    attention_backend: str = "sdpa"
    eps: float = 1e-5
    scale_embeddings: bool = False
    rope_theta: float = 10000.0
    init_std: float = 0.02
    ffn_options: dict | None = None
    fused_qkv: bool = True

    def __post_init__(self):
        if self.ffn_options is not None:
            object.__setattr__(self, "ffn_options", _plain_options(self.ffn_options))
        if self.d_ff is None:  # the FFN's own rule; ModelConfig then checks the width like a given one
            positive_int("d_model", self.d_model)
            one_of("ffn", self.ffn, FFNS.names())
            object.__setattr__(self, "d_ff", default_d_ff(self.ffn, self.d_model, **(self.ffn_options or {})))
        super().__post_init__()
        if self.n_token_types or self.pooler:
            raise ValueError("n_token_types and pooler are BERT's extras; a GPT has neither "
                             f"(got n_token_types={self.n_token_types}, pooler={self.pooler})")
        probability("dropout", self.dropout)
        positive_number("eps", self.eps)
        positive_number("init_std", self.init_std)
        number("rope_theta", self.rope_theta, low=1.0, low_open=True)
        boolean("scale_embeddings", self.scale_embeddings)
        boolean("fused_qkv", self.fused_qkv)
        one_of("attention_backend", self.attention_backend, ATTENTION_BACKENDS.names())
        # Resolve every name now: a later chapter's component that this installation lacks
        # is an error naming that chapter, here rather than when the model is built.
        for registry, name in ((FFNS, self.ffn), (NORMS, self.norm), (ATTENTION_BACKENDS, self.attention_backend)):
            registry.get(name)
        with torch.device("meta"):  # the position layer's own rules (an even d_model for the sinusoids, ...)
            POSITIONS.get(self.positions).from_config(self)

    def choices(self) -> dict[str, tuple[str, ...]]:
        """Chapter 00's choices, with the registered names for positions, norm and ffn."""
        return {**CHOICES, "architecture": ("decoder", "encoder"), "positions": POSITIONS.names(),
                "norm": NORMS.names(), "ffn": FFNS.names()}

    def to_dict(self) -> dict:
        """The fields as a plain dict (what checkpoints store)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "GPTConfig":
        """The config ``to_dict`` wrote; ``ValueError`` naming unknown keys."""
        return config_from_dict(cls, values)


def _plain_options(options) -> dict:
    """A copy of ``ffn_options``, refused (``TypeError``) unless it is a dict with str keys and
    plain-data values (None, bool, int, float, str, and lists, tuples and dicts of them)."""
    def plain(value) -> bool:
        if value is None or isinstance(value, (bool, int, float, str)):
            return True
        if isinstance(value, (list, tuple)):
            return all(plain(item) for item in value)
        return isinstance(value, dict) and all(isinstance(key, str) and plain(item) for key, item in value.items())

    if not isinstance(options, dict) or not all(isinstance(key, str) for key in options):
        raise TypeError(f"ffn_options must be None or a dict with str keys, got {options!r}")
    for key, value in options.items():
        if not plain(value):
            raise TypeError(f"ffn_options[{key!r}] must be plain data (None, bool, int, float, str, or lists and "
                            f"dicts of them) so that a checkpoint can store it, got {type(value).__name__}")
    return copy.deepcopy(options)

# %% [markdown]
# Now the model. A few details deserve a look before you read it:
#
# - **Positions** come from chapter 03's registry, `POSITIONS`, and the layer's `role`
#   says where it acts. Learned and sinusoidal positions are *added* to the token
#   embeddings; RoPE rotates queries and keys *inside* attention (each block gets the
#   layer as `rotary=`), and ALiBi adds a bias to the attention scores (passed to every
#   block as a float `mask`). All need the positions of the tokens, which start after
#   whatever a KV cache already holds.
# - **Weight tying**: with `tie_embeddings` there is no output matrix; the logits are
#   `h @ E.T`, `TokenEmbedding.logits` from chapter 02. A token's input vector and its
#   output vector are the same row.
# - **Initialization** follows GPT-2: every weight from $\mathcal{N}(0, 0.02^2)$, except
#   the projections that write into the residual stream in each block (attention's `out`
#   and the FFN's `w2`), which get $0.02/\sqrt{2L}$. The residual stream adds $2L$ such
#   contributions; the smaller scale keeps its variance from growing with depth. With
#   small weights the initial logits are nearly zero, so the untrained model predicts
#   nearly uniformly: its loss starts at $\ln V$.
# - **`kv_cache` and `attention_mask`** are for generation (chapter 09), and you can skip
#   their lines for now: in this chapter's training both are `None`. `ModelCacheLike` is a
#   `typing.Protocol`, a description of what a cache must offer (a `length`, the number of
#   positions it already holds, and `layer(i)`, the cache of block `i`) without an
#   implementation; chapter 09 writes a class that has both. `attention_mask` marks the
#   real tokens of a batch of prompts of different lengths, padded on the left: each row
#   then counts its own positions, and no token attends to padding.
# - **Auxiliary losses**: a component with a loss of its own (chapter 11's mixture of
#   experts keeps its experts evenly loaded with one) leaves it in its `aux_loss`, and
#   `forward` adds it to the loss; the module's docstring states the convention.
#
# Read the class with four questions in mind (answers below the cell):
#
# 1. Find where the model decides whether attention is causal. (It is not in `forward`.)
# 2. Find where the tied output head is used instead of `lm_head`, and what it computes.
# 3. Find how `reset_parameters` recognizes the projections that write into the residual
#    stream, and what standard deviation they get.
# 4. Find where the positions of the tokens are computed, and why they do not always
#    start at 0.

# %%
#| export minillm/model.py
class ModelCacheLike(Protocol):
    """What ``GPT.forward(..., kv_cache=...)`` needs from a cache (chapter 09 builds one).

    A rolling cache may also have ``position_offset``: the positions it has dropped before
    its first one, an int or a (batch,) int tensor; the model numbers the cached
    positions from there (absent: 0).
    """

    length: int  # positions already cached (the same for every row, padding included), read once per forward

    def layer(self, index: int) -> KVCacheLike:
        """The cache of block ``index``: ``update(k, v)`` appends and returns all keys and values."""
        ...


class GPT(nn.Module):
    """A decoder-only Transformer language model built from ``minillm``'s components.

    Submodules: ``token_embedding`` (a ``TokenEmbedding``; its weight is the output head
    when ``tie_embeddings``); the position layer from ``POSITIONS``, under the name of its
    role: ``position_embedding`` (learned or sinusoidal), ``rotary`` (RoPE, handed to
    every block) or ``score_bias`` (ALiBi), the other two None; ``embedding_norm`` (or
    None), ``blocks`` (a ModuleList of ``TransformerBlock``), ``final_norm`` (or None) and
    ``lm_head`` (a bias-free Linear, or None when tied).
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
        self.config = c = config
        self.token_embedding = TokenEmbedding(c.vocab_size, c.d_model, scale=c.scale_embeddings, init_std=c.init_std)
        position = POSITIONS.get(c.positions).from_config(c)
        one_of(f"the role of position layer {c.positions!r}", position.role, ("embedding", "rotary", "bias"))
        self.position_embedding = position if position.role == "embedding" else None
        self.rotary = position if position.role == "rotary" else None
        self.score_bias = position if position.role == "bias" else None
        self.embedding_norm = build_norm(c.norm, c.d_model, eps=c.eps, bias=c.bias) if c.embedding_norm else None
        self.dropout = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(c.d_model, c.n_heads, c.d_ff, n_kv_heads=c.n_kv_heads, norm=c.norm,
                             norm_placement=c.norm_placement, ffn=c.ffn, ffn_options=c.ffn_options, bias=c.bias,
                             dropout=c.dropout, attention_backend=c.attention_backend, rotary=self.rotary,
                             eps=c.eps, causal=c.architecture == "decoder", fused_qkv=c.fused_qkv)
            for _ in range(c.n_layers)
        )
        self.final_norm = build_norm(c.norm, c.d_model, eps=c.eps, bias=c.bias) if c.final_norm else None
        self.lm_head = None if c.tie_embeddings else nn.Linear(c.d_model, c.vocab_size, bias=False)
        self._aux_parts: dict[str, torch.Tensor] = {}
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2's initialization: the weights of every ``nn.Linear`` and of the embedding
        tables N(0, init_std²); residual projections (the modules marked by
        ``mark_residual_projection``, whatever their type) N(0, init_std² / (2 n_layers));
        their biases 0. Other modules (the norms, a component's own parameters) keep the
        initialization they gave themselves."""
        std = self.config.init_std
        residual_std = std / math.sqrt(2 * self.config.n_layers)
        for module in self.modules():
            if is_residual_projection(module):
                nn.init.normal_(module.weight, mean=0.0, std=residual_std)
            elif isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=std)
            else:
                continue
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        nn.init.normal_(self.token_embedding.weight, mean=0.0, std=std)
        if isinstance(getattr(self.position_embedding, "weight", None), nn.Parameter):
            nn.init.normal_(self.position_embedding.weight, mean=0.0, std=std)

    def extra_repr(self) -> str:
        c = self.config
        return (f"{c.positions} positions, {c.norm_placement}-{c.norm}, ffn={c.ffn}, "
                f"{'tied' if c.tie_embeddings else 'untied'} embeddings, {c.architecture}")

    def forward(self, ids: torch.Tensor, targets: torch.Tensor | None = None, kv_cache: ModelCacheLike | None = None,
                attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ids: (batch, seq) integer token ids. Returns (logits, loss).

        logits: (batch, seq, vocab_size); position t scores the token that follows ids[:, t].
        loss: None without targets; else the mean cross-entropy (nats per token) of
        targets (batch, seq), leaving out targets equal to -100, plus the modules'
        auxiliary losses (see the module's docstring).
        kv_cache: None, or a cache holding the keys and values of the ``kv_cache.length``
        positions before ids (chapter 09); the new ones are appended. A rolling cache's
        ``position_offset`` (absent: 0) is added to every position.
        attention_mask: None, or a bool (batch, k_len) tensor, True for a real token and
        False for padding, k_len = cached + seq; each row's positions count its real
        tokens, and no token attends to padding (give padded targets -100).
        A sequence longer than the context (cached positions included) is a ``ValueError``.
        """
        start = self._check_inputs(ids, targets, kv_cache, attention_mask)
        seq = ids.shape[1]
        if attention_mask is None:  # the same positions for every row
            key_positions = torch.arange(start + seq, device=ids.device)
        else:  # each row counts its real tokens; padding gets position 0, and nothing attends to it
            key_positions = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)
        offset = 0 if kv_cache is None else getattr(kv_cache, "position_offset", 0)
        if isinstance(offset, torch.Tensor):  # one offset per row: (batch,) → (batch, 1)
            key_positions = key_positions + offset.to(ids.device)[:, None]
        elif offset:  # a training step has no cache: nothing is added
            key_positions = key_positions + offset
        positions = key_positions[..., start:] if start else key_positions  # no cache: every position is new
        x = self.token_embedding(ids)
        if self.position_embedding is not None:
            x = x + self.position_embedding(positions).to(x.dtype)
        if self.embedding_norm is not None:
            x = self.embedding_norm(x)
        x = self.dropout(x)
        mask = None
        if self.score_bias is not None:
            mask = self.score_bias(positions, key_positions).to(x.dtype)
        if attention_mask is not None:
            keys = attention_mask[:, None, None, :]  # (batch, 1, 1, k_len)
            mask = keys if mask is None else mask.masked_fill(~keys, float("-inf"))
        for index, block in enumerate(self.blocks):
            layer_cache = None if kv_cache is None else kv_cache.layer(index)
            x = block(x, mask=mask, positions=positions, kv_cache=layer_cache)
        if self.final_norm is not None:
            x = self.final_norm(x)
        logits = self.token_embedding.logits(x) if self.lm_head is None else self.lm_head(x)
        if targets is None:
            return logits, None
        flat_logits = logits.reshape(-1, self.config.vocab_size)  # a half-precision softmax would round the loss
        loss = F.cross_entropy(flat_logits.to(compute_dtype(logits.dtype)), targets.reshape(-1).long(),
                               ignore_index=IGNORE_INDEX)
        aux_loss = self._collect_aux_losses()
        return logits, loss if aux_loss is None else loss + aux_loss

    @property
    def last_aux_losses(self) -> dict[str, float]:
        """The auxiliary losses of the last forward pass with targets, as floats for the logs:
        "aux_loss" (their sum, added to the loss) and each named part; empty without any."""
        return {name: float(value) for name, value in self._aux_parts.items()}

    def _collect_aux_losses(self) -> torch.Tensor | None:
        """The sum of the modules' ``aux_loss`` (None when no module has one); keeps the parts
        for ``last_aux_losses``, detached (read as floats only when asked, outside the graph)."""
        total, parts = None, {}
        for module in self.modules():
            attributes = vars(module)  # not getattr: nn.Module's lookup of a missing name is slow
            aux_loss = attributes.get("aux_loss")
            if aux_loss is None:
                continue
            total = aux_loss if total is None else total + aux_loss
            for name, value in (attributes.get("aux_losses") or {}).items():
                parts[name] = value.detach() + parts[name] if name in parts else value.detach()
        if total is not None:
            parts["aux_loss"] = total.detach()
        self._aux_parts = parts
        return total

    def _check_inputs(self, ids, targets, kv_cache, attention_mask) -> int:
        """Check forward's arguments (types, shapes, lengths; the ids' values are checked by the
        embedding) and return the number of cached positions."""
        check_token_batch(ids)
        batch, seq = ids.shape
        start = 0
        if kv_cache is not None:
            if not callable(getattr(kv_cache, "layer", None)) or not hasattr(kv_cache, "length"):
                raise TypeError(f"kv_cache must have a length and a method layer(index), got {type(kv_cache).__name__}")
            start = int(kv_cache.length)
        context = self.config.context_length
        if start + seq > context:
            cached = f" after {start} cached positions" if start else ""
            raise ValueError(f"ids holds {seq} positions{cached}, more than the context length "
                             f"{context}: crop the input to its last {context - start} tokens")
        if attention_mask is not None:
            check_attention_mask(attention_mask, (batch, start + seq), "(batch, cached + seq)")
        if targets is not None:
            if not isinstance(targets, torch.Tensor) or targets.shape != ids.shape:
                raise ValueError(f"targets must be a tensor of ids' shape {tuple(ids.shape)}, "
                                 f"got {getattr(targets, 'shape', type(targets).__name__)}")
            if targets.dtype.is_floating_point or targets.dtype == torch.bool:
                raise TypeError(f"targets must be an integer tensor, got {targets.dtype}")
        return start


def check_token_batch(ids) -> None:
    """Refuse ids that are not an integer tensor of shape (batch, seq) with seq >= 1."""
    if not isinstance(ids, torch.Tensor) or ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise TypeError(f"ids must be an integer tensor, got {getattr(ids, 'dtype', type(ids).__name__)}")
    if ids.dim() != 2 or ids.shape[1] == 0:
        raise ValueError(f"ids must have shape (batch, seq) with seq >= 1, got {tuple(ids.shape)}")


def check_attention_mask(attention_mask, shape: tuple[int, int], described: str = "(batch, seq)") -> None:
    """Refuse an attention mask that is not a bool tensor of ``shape`` (``described`` says what it is)."""
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.dtype != torch.bool:
        raise TypeError("attention_mask must be a bool tensor (True for a real token, False for padding), "
                        f"got {getattr(attention_mask, 'dtype', type(attention_mask).__name__)}")
    if attention_mask.shape != shape:
        raise ValueError(f"attention_mask must have shape {described} = {tuple(shape)}, "
                         f"got {tuple(attention_mask.shape)}")

# %% [markdown]
# <details><summary>Answers to the four questions</summary>
#
# 1. In `__init__`: every `TransformerBlock` gets `causal=c.architecture == "decoder"`,
#    and its attention applies the causal mask itself. `forward` passes a `mask` only for
#    ALiBi, whose bias it adds to the scores.
# 2. Near the end of `forward`: `logits = self.token_embedding.logits(x)`
#    when `lm_head` is None, which is `x @ E.T` (chapter 02): one score per vocabulary
#    entry, the dot product of the final vector with that token's embedding.
# 3. Not by name but by a mark: chapters 04 and 05 marked attention's `out` and the FFN's
#    `w2` with `mark_residual_projection` where they built them, and `reset_parameters`
#    asks `is_residual_projection(module)`. Those get `init_std / sqrt(2 * n_layers)`,
#    0.02 / √8 ≈ 0.007 for the course's four layers. A mark travels with the layer, so an
#    expert's down-projection in chapter 11, whatever it is called, gets it too.
# 4. At the top of `forward`: `positions = torch.arange(start, start + seq)`, with
#    `start = kv_cache.length`: with a cache the new tokens come after the cached ones, so
#    their positions continue from there (chapter 09). Without a cache `start` is 0. With
#    an `attention_mask` each row counts its own real tokens instead (`cumsum`), so a
#    prompt padded on the left starts at position 0 all the same.
# </details>
#
# Chapter 00's `count_parameters(config)` is a formula for the components chapter 00
# knows. The model has a count of its own, `minillm.model.count_parameters`, which builds
# the model on PyTorch's *meta* device (tensors with a shape and no memory, so even
# GPT-3's shape costs nothing) and asks each component for its parameters. It is exact for
# any registered component, chapter 11's mixture of experts included, and it knows two
# variants of the question: `non_embedding=True` leaves out the embedding tables (the
# convention of scaling laws, chapter 08), and `active=True` counts the parameters one
# token uses (chapter 11's experts answer for themselves).

# %%
#| export minillm/model.py
def count_parameters(config: GPTConfig, *, active: bool = False, non_embedding: bool = False) -> int:
    """The number of parameters of ``GPT(config)``, built on the meta device (no memory) and counted
    component by component; tied weights count once.

    active: count what one token uses. A module that defines ``active_parameter_count()``
    answers for itself and its submodules (chapter 11's mixture of experts: its router and
    top_k experts); every other module counts all its parameters.
    non_embedding: leave out the token embedding table and the learned position table, as
    scaling laws do (Kaplan et al., 2020). An untied output head is counted; a tied one is
    the token table, and is left out with it.
    For the components chapter 00 knows, the total equals ``minillm.config.count_parameters``.
    """
    if not isinstance(config, GPTConfig):
        raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
    boolean("active", active)
    boolean("non_embedding", non_embedding)
    with torch.device("meta"):
        model = GPT(config)
    seen: set[int] = set()  # parameters counted (or left out) already: a shared one counts once
    if non_embedding:
        embeddings = [model.token_embedding]
        if model.position_embedding is not None:
            embeddings.append(model.position_embedding)
        seen.update(id(p) for module in embeddings for p in module.parameters())

    def count(module: nn.Module) -> int:
        own = getattr(module, "active_parameter_count", None) if active else None
        if own is not None:
            seen.update(id(p) for p in module.parameters())
            return int(own())
        total = 0
        for p in module.parameters(recurse=False):
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel()
        return total + sum(count(child) for child in module.children())

    return count(model)

# %% [markdown]
# Here is the model in the course's default shape, the one `make train` trains: about a
# million parameters, Llama-style (RoPE, RMSNorm, SwiGLU with the 2/3 rule, no biases).
# Beside it, the same size in GPT-2's style (learned positions, LayerNorm, GELU, biases,
# and `d_ff=None`, so GELU's own $4d$) and with grouped-query attention. Chapter 00's
# formula, the model's count and the built model agree:

# %%
#| stable
from minillm import model as reference_model
from minillm.recipe import recipe_config

recipe = recipe_config(vocab_size=2048)
gpt2_style = reference_model.GPTConfig(**{**recipe.to_dict(), "positions": "learned", "norm": "layernorm", "ffn": "gelu",
                                          "d_ff": None, "bias": True})
gqa = reference_model.GPTConfig(**{**recipe.to_dict(), "n_kv_heads": 2, "tie_embeddings": False})
for name, cfg in (("course default", recipe), ("GPT-2 style", gpt2_style), ("GQA, untied", gqa)):
    built = reference_model.GPT(cfg)
    n_built = sum(p.numel() for p in built.parameters())
    print(f"{name:15s} chapter 00 {chapter_00_count(cfg):>9,d} · model.count_parameters "
          f"{reference_model.count_parameters(cfg):>9,d} · built {n_built:>9,d} · {cfg.positions}, {cfg.norm}, "
          f"{cfg.ffn} (d_ff {cfg.d_ff}), n_kv_heads {cfg.n_kv_heads}")
print(f"course default without the embedding table: "
      f"{reference_model.count_parameters(recipe, non_embedding=True):,d} parameters")
print(reference_model.GPT(recipe).blocks[0])

# %% [markdown]
# The logits of an untrained model are nearly zero (small weights, tied head), so it
# predicts nearly uniformly: on a batch of 16 windows of 128 random tokens its loss is
# close to $\ln V$, and a little above it, since the logits are small but not exactly
# equal. And each position's prediction depends on its own prefix only. Change the token
# at position 5 of a short sequence and the logits of positions 0–4 do not move at all:

# %%
#| stable
torch.manual_seed(0)
untrained = reference_model.GPT(recipe).eval()
batch = torch.randint(0, recipe.vocab_size, (16, recipe.context_length + 1))
ids = torch.randint(0, recipe.vocab_size, (1, 12))
changed = ids.clone()
changed[0, 5] = (changed[0, 5] + 1) % recipe.vocab_size
with torch.no_grad():
    logits, loss = untrained(batch[:, :-1], batch[:, 1:])
    moved = (untrained(changed)[0] - untrained(ids)[0]).abs().amax(dim=-1)[0]
print(f"logits {tuple(logits.shape)}; loss {loss.item():.3f} nats per token; ln V = {math.log(recipe.vocab_size):.3f}")
print("positions whose logits changed:", (moved > 0).nonzero().flatten().tolist())

# %% [markdown]
# Where do the million parameters live? In a model this small the vocabulary matters:
# the embedding table, $V \times d$, is the largest single matrix. (Chapter 00 showed the
# opposite for GPT-3, where the blocks, growing as $d^2$ per layer, dominate.)

# %%
def parameter_shares(model) -> dict:
    shares = {"token embedding (= output head)": model.token_embedding.weight.numel(),
              "positions": sum(p.numel() for p in model.position_embedding.parameters()) if model.position_embedding else 0,
              "attention": sum(p.numel() for b in model.blocks for p in b.attn.parameters()),
              "feed-forward": sum(p.numel() for b in model.blocks for p in b.ffn.parameters()),
              "norms": sum(p.numel() for n, p in model.named_parameters() if "norm" in n)}
    return shares


shares = {k: v for k, v in parameter_shares(reference_model.GPT(recipe)).items() if v}  # RoPE has no parameters
fig, ax = plt.subplots(figsize=(7, 2.8))
ax.barh(list(shares), [v / 1e6 for v in shares.values()], color=["C0", "C1", "C2", "C3", "C4"])
for i, v in enumerate(shares.values()):
    ax.text(v / 1e6, i, f" {v:,d} ({v / sum(shares.values()):.0%})", va="center", fontsize=9)
ax.invert_yaxis()
ax.set_xlabel("parameters (millions)")
ax.set_xlim(0, 1.35 * max(shares.values()) / 1e6)
ax.set_title(f"Where the course model's {sum(shares.values()) / 1e6:.1f}M parameters live")
plt.tight_layout()
plt.show()

# %% [markdown]
# The four blocks' feed-forward networks hold half the parameters (SwiGLU's three
# matrices of $d \times 352$, about $8d^2$, per block), attention a quarter ($4d^2$ per
# block), and the embedding table, $2048 \times 128$, the last quarter. It does double
# duty: with tied weights it is the output head too. RoPE adds no parameters, and the
# norms only 128 each.

# %% [markdown]
# ## The loss, in nats per token and per character
#
# A language model assigns a probability to every continuation. Its loss on a text is
# the **negative log-likelihood** (the cross-entropy) of the tokens that actually follow:
#
# $$\mathcal{L} = -\sum_{t} \ln p_\theta(x_{t+1} \mid x_{\le t}),
# \qquad p_\theta(\cdot \mid x_{\le t}) = \operatorname{softmax}(\text{logits}_t).$$
#
# With the natural logarithm the unit is the **nat** ($\ln 2 \approx 0.693$ nats make a
# bit). A model that spreads its probability evenly over $V$ tokens pays $\ln V$ nats per
# token: $\ln 2048 \approx 7.62$ for our tokenizer; a model that is certain and right pays 0.
#
# Per token, losses of models with different tokenizers cannot be compared: a tokenizer
# with longer tokens has fewer, harder tokens to predict. Per **character** they can. The
# summed loss is the negative log-probability of the whole text, whatever the tokenizer cut
# it into, so dividing it by the number of characters gives a number that depends only on
# how well the model predicts the text:
#
# $$\text{nats per character} = \frac{-\sum_t \ln p_\theta(x_{t+1} \mid x_{\le t})}{\text{number of characters}}.$$
#
# A character-level model's nats per token *are* its nats per character; for ours, nats
# per token divided by the characters per token (about 2.6 on the validation text). The
# course defines the validation loss this way, on the last 10% of the corpus, which no
# tokenizer has seen.
#
# ### Exercise 1 · The summed negative log-likelihood
#
# Implement `summed_nll(logits, targets)`: the sum over positions of
# $-\ln \operatorname{softmax}(\text{logits})[\text{target}]$, in nats, leaving out
# positions whose target is `-100` (padding, or tokens a masked language model does not
# predict). `logits` has shape `(..., vocab)`, `targets` the same shape without the last
# axis. Use `torch.log_softmax`, which is computed stably (chapter 04's max trick), not
# `torch.log(torch.softmax(...))`, which turns a very unlikely token's probability into 0
# and its log into $-\infty$. `F.cross_entropy` is what the tests compare with, so not that.
#
# Difficulty ●○○ · Importance ●●● · about 10 minutes
#
# <details><summary>Hint 1</summary><code>log_probs = torch.log_softmax(logits, dim=-1)</code> has the logits' shape; you need the entry of each position's target, along the last axis.</details>
# <details><summary>Hint 2</summary>Keep the positions with <code>keep = targets != -100</code>; <code>log_probs[keep]</code> is <code>(n_kept, vocab)</code> and <code>targets[keep]</code> is <code>(n_kept,)</code>.</details>
# <details><summary>Hint 3</summary><code>-log_probs[keep].gather(-1, targets[keep][:, None]).sum()</code>. A sum, not a mean: the per-character loss divides the total by characters, not tokens.</details>

# %%
#| export minillm/loss.py
"""The loss of a language model, in nats: summed, per token and per character (chapter 07).

- ``summed_nll(logits, targets)``: the summed negative log-likelihood of the targets.
- ``token_nll(model, ids)``: a model's summed loss over a token stream, in windows, and how
  many tokens it covers.
- ``nats_per_char(model, ids, n_chars)``: that loss over the characters of the text, which
  does not depend on the tokenizer.
"""
import torch
from torch import nn

from minillm.model import IGNORE_INDEX
from minillm.precision import compute_dtype

# %%
#| answer summed_nll
#| export minillm/loss.py
def summed_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Summed negative log-likelihood, in nats, of ``targets`` under ``logits``.

    logits: (..., vocab); targets: integer ids of shape logits.shape[:-1]; a target equal
    to -100 is left out. Returns a 0-dim tensor in the logits' dtype:
    sum over kept positions of -log softmax(logits)[target] (0 when none is kept).
    """
    ### BEGIN SOLUTION
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"targets must have shape {tuple(logits.shape[:-1])}, got {tuple(targets.shape)}")
    log_probs = torch.log_softmax(logits, dim=-1)
    keep = targets != IGNORE_INDEX
    return -log_probs[keep].gather(-1, targets[keep].long()[:, None]).sum()
    ### END SOLUTION

# %%
#| test summed_nll_visible points=1
def _nll_case():
    """Two sequences of three positions over a vocabulary of 4; one target is padding (-100)."""
    logits = torch.tensor([[[2.0, 0.5, -1.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 3.0, 0.5, -2.0]],
                           [[-1.0, 0.0, 4.0, 1.0], [0.5, 0.5, 2.5, -0.5], [3.0, -3.0, 0.0, 1.0]]])
    targets = torch.tensor([[0, 3, 1], [2, 0, -100]])
    return logits, targets


@course.visible_check("summed_nll")
def check_summed_nll(summed_nll):
    logits, targets = _nll_case()
    expected = F.cross_entropy(logits.reshape(-1, 4), targets.reshape(-1), reduction="sum")
    course.expect_close(
        summed_nll(logits, targets), expected, "summed_nll on a (2, 3, 4) case with one padded target", atol=1e-5,
        mistakes={
            "the mean over tokens, not the sum": expected / 5,
            "the mean over all 6 positions, padding included": expected / 6,
            "the sign: a log-likelihood instead of a negative log-likelihood": -expected,
            "bits (log base 2) instead of nats": expected / math.log(2),
            "probabilities instead of log-probabilities": -torch.softmax(logits, -1)[targets != -100].gather(
                -1, targets[targets != -100][:, None]).sum(),
        },
        hint="sum -log_softmax(logits)[target] over the positions whose target is not -100",
    )
    big = torch.tensor([[0.0, -200.0, 5.0]])  # the target's probability is about e^-205: it underflows in float32
    course.expect_close(summed_nll(big, torch.tensor([1])), torch.tensor(205.0067), "summed_nll with a very unlikely target",
                        atol=1e-3, hint="got inf? torch.log(torch.softmax(...)) underflows to log(0); use torch.log_softmax")
    got = summed_nll(logits.double(), targets)
    if not (isinstance(got, torch.Tensor) and got.dim() == 0 and got.dtype == torch.float64):
        raise course.CheckFailed(f"summed_nll of float64 logits returned {course.describe(got)}: return a 0-dim tensor "
                                 "in the logits' dtype (no .item(), no .float())")


check_summed_nll(summed_nll)
print("summed_nll: visible test passed")

# %%
#| test summed_nll_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
for shape, vocab, dtype in [((5,), 9, torch.float64), ((3, 4), 17, torch.float32), ((2, 3, 5), 50, torch.float64),
                            ((1, 1), 2, torch.float32)]:
    logits = 4 * torch.randn(*shape, vocab, dtype=dtype)
    targets = torch.randint(0, vocab, shape)
    if targets.numel() > 2:
        targets.view(-1)[::3] = -100
    got = summed_nll(logits, targets)
    assert isinstance(got, torch.Tensor) and got.dim() == 0 and got.dtype == dtype, \
        "summed_nll must return a 0-dim tensor in the logits' dtype"
    expected = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1), reduction="sum", ignore_index=-100)
    course.expect_close(got, expected, "summed_nll", atol=1e-6, rtol=1e-6)
# uniform logits: every kept position costs ln V
logits = torch.zeros(3, 7, 11, dtype=torch.float64)
targets = torch.randint(0, 11, (3, 7))
targets[0] = -100
course.expect_close(torch.as_tensor(summed_nll(logits, targets)).double(), torch.tensor(14 * math.log(11), dtype=torch.float64),
                    "summed_nll of uniform logits", atol=1e-9)
# shift invariance and huge logits stay finite
logits = 3 * torch.randn(4, 6) + 1e4
targets = torch.tensor([0, 5, 2, 3])
got = torch.as_tensor(summed_nll(logits, targets))
assert torch.isfinite(got), "summed_nll must stay finite for logits near 1e4"
course.expect_close(got.float(), F.cross_entropy(logits - 1e4, targets, reduction="sum"), "summed_nll near 1e4", atol=1e-2)
# targets far below the best logit: their probabilities underflow to 0 (below e^-104 in float32, e^-745 in
# float64), so log(softmax(...)) gives inf; log_softmax keeps them exact
for offset, dtype in [(300.0, torch.float32), (1000.0, torch.float64)]:
    logits = torch.randn(6, 10, dtype=dtype)
    logits[:, 0] += offset
    targets = torch.randint(1, 10, (6,))
    got = summed_nll(logits, targets)
    assert isinstance(got, torch.Tensor) and torch.isfinite(got), "summed_nll must stay finite for targets far below the best logit"
    course.expect_close(got, F.cross_entropy(logits, targets, reduction="sum"),
                        "summed_nll of targets far below the best logit", atol=1e-3, rtol=1e-6)
# everything padded: nothing to predict
got = summed_nll(torch.randn(2, 3), torch.tensor([-100, -100]))
assert isinstance(got, torch.Tensor) and got.dim() == 0, "summed_nll must return a 0-dim tensor when every target is padded"
course.expect_close(got, torch.tensor(0.0), "summed_nll with every target padded")
### END HIDDEN TESTS

# %%
from minillm import batches as reference_batches, loss as reference_loss
from minillm import optim as reference_optim, train as reference_train

nll_sum = course.keep_going("summed_nll", summed_nll, reference_loss.summed_nll, check_summed_nll)

# %% [markdown]
# The validation text is cut into non-overlapping windows of the context length; each
# window predicts its next `context` tokens, so every token but the very first is predicted
# exactly once. (Overlapping windows, sliding one token at a time, would give every
# prediction a full context and a slightly lower loss, at `context` times the cost.)

# %%
#| export minillm/loss.py
@torch.no_grad()
def token_nll(model: nn.Module, ids: torch.Tensor, context: int | None = None, batch_size: int = 32,
              max_windows: int | None = None) -> tuple[float, int]:
    """Summed negative log-likelihood (nats) of a 1-D token stream, and how many tokens it covers.

    The stream is cut into non-overlapping windows of ``context`` inputs (default: the
    model's context length); each window predicts its next ``context`` tokens, so every
    token but the first is predicted once, from the tokens of its own window.
    ``max_windows``: use only that many windows, evenly spaced over the stream (a quick
    estimate). Runs in eval mode.
    """
    if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or len(ids) < 2:
        raise ValueError(f"ids must be a 1-D tensor of at least 2 tokens, got {getattr(ids, 'shape', ids)}")
    context = model.config.context_length if context is None else context
    device = next(model.parameters()).device
    starts = list(range(0, len(ids) - 1, context))
    if max_windows is not None and max_windows < len(starts):
        picked = torch.linspace(0, len(starts) - 1, max_windows).round().long().unique().tolist()
        starts = [starts[i] for i in picked]
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        for i in range(0, len(starts), batch_size):
            chunk = starts[i: i + batch_size]
            full = [s for s in chunk if s + context + 1 <= len(ids)]
            groups = [full] + [[s] for s in chunk if s + context + 1 > len(ids)]  # the short last window alone
            for group in groups:
                if not group:
                    continue
                width = min(context, len(ids) - 1 - group[0])
                windows = torch.stack([ids[s: s + width + 1] for s in group]).long().to(device)
                logits, _ = model(windows[:, :-1])
                total += summed_nll(logits.to(compute_dtype(logits.dtype)), windows[:, 1:]).item()
                count += windows[:, 1:].numel()
    finally:
        model.train(was_training)
    return total, count


def nats_per_char(model: nn.Module, ids: torch.Tensor, n_chars: int, **kwargs) -> float:
    """Summed token NLL of ``ids`` (``token_nll``) divided by ``n_chars``, the length of the
    text ids encodes: a loss that does not depend on the tokenizer. (A character-level
    model's nats per token are its nats per character.)"""
    if isinstance(n_chars, bool) or not isinstance(n_chars, int) or n_chars < 1:
        raise ValueError(f"n_chars must be a positive int, got {n_chars!r}")
    total, _ = token_nll(model, ids, **kwargs)
    return total / n_chars

# %% [markdown]
# The course ships a model trained by `make train` (next section) with its tokenizer, in
# the data folder, and `minillm.recipe.load_pretrained()` loads both. Here is what the
# loss looks like before and after training, on the first part of the validation text,
# measured both ways:

# %%
#| stable
from minillm.recipe import load_pretrained

trained, tokenizer = load_pretrained()
train_text, val_text = data.split_corpus(data.corpus_text())
val_slice = val_text[: 20_000]
val_ids = torch.tensor(tokenizer.encode(val_slice))
print(f"{len(val_slice):,d} validation characters = {len(val_ids):,d} tokens ({len(val_slice) / len(val_ids):.2f} characters per token)")
for name, model in (("untrained", reference_model.GPT(trained.config)), ("trained", trained)):
    total, count = reference_loss.token_nll(model, val_ids)
    print(f"{name:9s}: {total / count:.3f} nats per token · {total / len(val_slice):.3f} nats per character")

# %% [markdown]
# The untrained model pays about $\ln 2048 = 7.62$ nats per token, as promised. Training
# brings it to less than half of that. Per character the trained model pays about 1.4
# nats on this slice (1.47 over the whole validation text): its probability for the true
# next character is about $e^{-1.47} \approx 0.23$ on average (geometrically), where
# uniform guessing over the 65 characters of the corpus would give $1/65$. Your
# `summed_nll` on one window gives the same numbers as the package:

# %%
#| stable
with torch.no_grad():
    window = val_ids[: trained.config.context_length + 1][None]
    logits, _ = trained(window[:, :-1])
    mine = nll_sum(logits, window[:, 1:]).item()
    print(f"one window: {mine:.2f} nats over {window.shape[1] - 1} tokens = {mine / (window.shape[1] - 1):.3f} per token "
          f"(package: {reference_loss.summed_nll(logits, window[:, 1:]).item():.2f})")

# %% [markdown]
# ## Training
#
# Training repeats one step: take a batch of windows from the training text, compute the
# loss of every next-token prediction in them, backpropagate, update the weights. Four
# ingredients turn that into a recipe that works:
#
# 1. **AdamW** (Loshchilov & Hutter, 2019): Adam's per-parameter step sizes, with
#    *decoupled* weight decay, which shrinks each weight by a factor $1 - \eta\lambda$ per
#    step, separately from the gradient step. Decay pulls weights towards zero; it makes
#    sense for the matrices (linear maps, embeddings), whose size grows the function's
#    sharpness, and not for biases and the gains of the norms, whose natural values are 0
#    and 1. So the parameters go into two groups.
# 2. **A schedule** for the learning rate: a short linear **warmup** (Adam's early moment
#    estimates are noisy, and large first steps from a random start can wreck the model),
#    then **cosine decay** to a floor: large steps while the loss falls fast, small steps
#    at the end to settle into a minimum.
# 3. **Gradient clipping**: if the gradient's norm over all parameters exceeds 1, scale it
#    down to 1. Rare bad batches then cannot throw the weights far.
# 4. **Held-out evaluation**: the loss on text the model never trains on, measured every
#    so often. The training loss can keep falling while the model memorizes; the
#    validation loss tells when that starts.

# %%
#| export minillm/optim.py
"""AdamW and the learning-rate schedule of the mini-LLM's training (chapter 07).

- ``param_groups`` / ``build_optimizer``: AdamW with weight decay on the matrices only.
- ``lr_schedule`` / ``build_scheduler``: linear warmup, then cosine decay to ``min_lr``.
"""
import math
from functools import partial

import torch
from torch import nn


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW parameter groups: matrices (linear weights, embeddings) decay; vectors
    (biases, norm scales and shifts) do not. A tied weight appears once."""
    if not weight_decay >= 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay!r}")
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def build_optimizer(model: nn.Module, lr: float, weight_decay: float = 0.1,
                    betas: tuple[float, float] = (0.9, 0.95)) -> torch.optim.AdamW:
    """AdamW over ``param_groups(model, weight_decay)``."""
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=betas)

# %%
#| stable
groups = reference_optim.param_groups(reference_model.GPT(recipe), weight_decay=0.1)
for group in groups:
    print(f"weight decay {group['weight_decay']}: {len(group['params'])} tensors, "
          f"{sum(p.numel() for p in group['params']):,d} parameters")

# %% [markdown]
# ### Exercise 2 · Warmup, then cosine decay
#
# Implement `lr_schedule(step, max_lr, warmup_steps, total_steps, min_lr)`, the learning
# rate at optimizer step `step` (counted from 0):
#
# $$
# \eta(s) = \begin{cases}
# \eta_{\max} \, \dfrac{s + 1}{W} & s < W \quad\text{(warmup: the first step already moves)}\\[1.2ex]
# \eta_{\min} + \tfrac{1}{2}(\eta_{\max} - \eta_{\min})\left(1 + \cos \pi \dfrac{s - W}{T - W}\right) & W \le s \le T\\[1.2ex]
# \eta_{\min} & s > T
# \end{cases}
# $$
#
# with $W$ = `warmup_steps` and $T$ = `total_steps`. At $s = W$ the cosine term is
# $\eta_{\max}$; at $s = T$ it has fallen to $\eta_{\min}$.
#
# Difficulty ●○○ · Importance ●●○ · about 10 minutes
#
# <details><summary>Hint 1</summary>Three cases, in that order: <code>if step < warmup_steps: ...</code>, <code>if step >= total_steps: return min_lr</code>, then the cosine.</details>
# <details><summary>Hint 2</summary>The cosine's progress, <code>(step - warmup_steps) / (total_steps - warmup_steps)</code>, runs from 0 to 1 over the decay, not over the whole run.</details>
# <details><summary>Hint 3</summary>With that progress as <code>p</code>: <code>min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * p))</code></details>

# %%
#| answer lr_schedule
#| export minillm/optim.py
def lr_schedule(step: int, max_lr: float, warmup_steps: int, total_steps: int, min_lr: float = 0.0) -> float:
    """The learning rate at ``step`` (0-based): linear warmup, then cosine decay.

    step < warmup_steps: max_lr * (step + 1) / warmup_steps, rising to max_lr.
    warmup_steps <= step <= total_steps: min_lr + (max_lr - min_lr) * (1 + cos(pi * t)) / 2
    with t = (step - warmup_steps) / (total_steps - warmup_steps), falling from max_lr to
    min_lr. After total_steps: min_lr.
    """
    ### BEGIN SOLUTION
    for name, value in (("step", step), ("warmup_steps", warmup_steps), ("total_steps", total_steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    if warmup_steps > total_steps:
        raise ValueError(f"warmup_steps ({warmup_steps}) must be <= total_steps ({total_steps})")
    if not 0 <= min_lr <= max_lr:
        raise ValueError(f"need 0 <= min_lr <= max_lr, got min_lr={min_lr!r}, max_lr={max_lr!r}")
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= total_steps:
        return min_lr
    progress = (step - warmup_steps) / (total_steps - warmup_steps)
    return min_lr + (max_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
    ### END SOLUTION

# %%
#| test lr_schedule_visible points=1
def _schedule_case():
    """max_lr 1.0, min_lr 0.1, 4 warmup steps, 12 steps in all; the rates at steps 0..14, by hand."""
    expected = [0.25, 0.5, 0.75, 1.0, 1.0, 0.965746, 0.868198, 0.722208, 0.55, 0.377792, 0.231802, 0.134254,
                0.1, 0.1, 0.1]
    return (1.0, 4, 12, 0.1), expected


@course.visible_check("lr_schedule")
def check_lr_schedule(lr_schedule):
    args, expected = _schedule_case()
    got = [lr_schedule(s, args[0], args[1], args[2], args[3]) for s in range(15)]
    course.expect_close(
        torch.tensor(got, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64),
        "lr_schedule at steps 0..14 (max 1.0, min 0.1, warmup 4, total 12)", atol=1e-6,
        mistakes={
            "warmup starts at 0: use (step + 1) / warmup_steps, so the first step already moves":
                torch.tensor([0.0, 0.25, 0.5, 0.75] + expected[4:], dtype=torch.float64),
            "the cosine decays to 0 instead of min_lr": torch.tensor(
                expected[:4] + [0.5 * (1 + math.cos(math.pi * min(s - 4, 8) / 8)) for s in range(4, 15)], dtype=torch.float64),
            "the cosine's progress counts from step 0, not from the end of warmup": torch.tensor(
                expected[:4] + [0.1 + 0.45 * (1 + math.cos(math.pi * s / 12)) if s <= 12 else 0.1 for s in range(4, 15)],
                dtype=torch.float64),
            "a linear decay instead of a cosine": torch.tensor(
                expected[:4] + [1.0 - 0.9 * min(s - 4, 8) / 8 for s in range(4, 15)], dtype=torch.float64),
        },
        hint="warmup: max_lr * (step + 1) / warmup_steps; then min_lr + (max_lr - min_lr) * (1 + cos(pi t)) / 2",
    )


check_lr_schedule(lr_schedule)
print("lr_schedule: visible test passed")

# %%
#| test lr_schedule_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
def _reference_lr(step, max_lr, warmup, total, min_lr):
    if step < warmup:
        return max_lr * (step + 1) / warmup
    if step >= total:
        return min_lr
    return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))


for max_lr, warmup, total, min_lr in [(3e-4, 100, 5000, 3e-5), (1e-2, 1, 7, 0.0), (0.5, 0, 10, 0.05), (2.0, 9, 10, 1.0)]:
    steps = sorted({0, max(warmup - 1, 0), warmup, (warmup + total) // 2, total - 1, total, total + 3, 2 * total + 1})
    got = torch.tensor([float(lr_schedule(s, max_lr, warmup, total, min_lr)) for s in steps], dtype=torch.float64)
    expected = torch.tensor([_reference_lr(s, max_lr, warmup, total, min_lr) for s in steps], dtype=torch.float64)
    # relative to max_lr: an answer computed in float32 (torch.cos of a tensor) is off by about 1e-7 of it, and right
    course.expect_close(got, expected, "lr_schedule", atol=1e-6 * max_lr, rtol=1e-6)
# the defining properties: continuous at the end of warmup, halfway at the middle of the decay, monotone decay
max_lr, warmup, total, min_lr = 6e-4, 20, 220, 6e-5
assert math.isclose(float(lr_schedule(warmup - 1, max_lr, warmup, total, min_lr)), max_lr, rel_tol=1e-6), \
    "lr_schedule: the last warmup step must reach max_lr"
assert math.isclose(float(lr_schedule(warmup, max_lr, warmup, total, min_lr)), max_lr, rel_tol=1e-6), \
    "lr_schedule: the decay must start at max_lr"
assert math.isclose(float(lr_schedule(120, max_lr, warmup, total, min_lr)), (max_lr + min_lr) / 2, rel_tol=1e-6), \
    "lr_schedule: halfway through the decay the rate must be (max_lr + min_lr) / 2"
decay = [float(lr_schedule(s, max_lr, warmup, total, min_lr)) for s in range(warmup, total + 5)]
assert all(a >= b for a, b in zip(decay, decay[1:])), "lr_schedule: the learning rate must not rise after warmup"
### END HIDDEN TESTS

# %%
schedule = course.keep_going("lr_schedule", lr_schedule, reference_optim.lr_schedule, check_lr_schedule)

# %%
from minillm.recipe import DEFAULT_RECIPE, recipe_train_config

recipe_steps, recipe_lr = DEFAULT_RECIPE["steps"], DEFAULT_RECIPE["lr"]
recipe_warmup = recipe_train_config().warmup_steps
steps = range(recipe_steps + 1)
fig, ax = plt.subplots(figsize=(7, 3.2))
ax.plot(steps, [schedule(s, recipe_lr, recipe_warmup, recipe_steps, recipe_lr / 10) for s in steps])
ax.axvline(recipe_warmup, color="0.6", linestyle=":", label=f"end of warmup (step {recipe_warmup})")
ax.set_xlabel("optimizer step")
ax.set_ylabel("learning rate")
ax.set_title("The course's schedule: warmup over 3% of the steps, then cosine decay to a tenth")
ax.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# The optimizer is handed the schedule as a multiplier of its base rate, through
# PyTorch's `LambdaLR`, so that the scheduler's state is saved and restored with the rest.

# %%
#| export minillm/optim.py
def _lr_factor(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    return lr_schedule(step, 1.0, warmup_steps, total_steps, min_ratio)


def build_scheduler(optimizer, warmup_steps: int, total_steps: int, min_ratio: float = 0.1):
    """A ``LambdaLR`` that multiplies each group's lr by ``lr_schedule(step, 1, ...)``."""
    factor = partial(_lr_factor, warmup_steps=warmup_steps, total_steps=total_steps, min_ratio=min_ratio)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)

# %% [markdown]
# Batches come from a `BatchSampler`. Each epoch cuts the token stream into windows of
# `context + 1` tokens (inputs, and the same shifted by one as targets) starting at a
# random offset, and visits them in a random order; the next epoch uses another offset.
# Everything it will do is fixed by its seed, so its state is a cursor, (epoch, position),
# which a checkpoint stores in two numbers. For data-parallel training (chapter 08),
# `batch_size` is the *global* batch: `world_size` processes each take their own `rank`'s
# share of every batch, so that together they see exactly what one process would.

# %%
#| export minillm/batches.py
"""Training batches: context windows of a token stream in a seeded, resumable order (chapter 07).

``BatchSampler`` keeps a cursor, so that a resumed run sees the batches the uninterrupted
one would; in data-parallel training each rank takes its own share of every batch.
"""
import torch

from minillm.checks import integer, non_negative_int, positive_int


class BatchSampler:
    """Training windows from a 1-D token stream, in a seeded order, resumable.

    Each epoch cuts ``ids`` into windows of ``context + 1`` tokens starting at a random
    offset below ``context``, shuffles them, and yields batches: x (batch, context) and
    y = x shifted by one (the next tokens). The cursor (epoch, position) is the whole
    state: ``state_dict`` / ``load_state_dict`` resume exactly where it stopped.

    ``batch_size`` is the global batch. With ``world_size`` processes, rank ``rank`` yields
    rows ``rank * b : (rank + 1) * b`` of every global batch, b = batch_size / world_size:
    x and y are (b, context), and the ranks' shards, stacked in rank order, are the batch
    one process would yield. The cursor counts global rows, so it is the same on every rank.
    """

    def __init__(self, ids: torch.Tensor, batch_size: int, context: int, seed: int = 0, rank: int = 0,
                 world_size: int = 1):
        if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or ids.dtype.is_floating_point:
            raise TypeError(f"ids must be a 1-D integer tensor, got {getattr(ids, 'shape', type(ids).__name__)}")
        positive_int("batch_size", batch_size)
        positive_int("context", context)
        integer("seed", seed)
        positive_int("world_size", world_size)
        if not 0 <= non_negative_int("rank", rank) < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        if batch_size % world_size:
            raise ValueError(f"batch_size (the global batch, {batch_size}) must be divisible by world_size "
                             f"({world_size}): every process takes an equal share")
        if len(ids) < 2 * context + 1:
            raise ValueError(f"ids holds {len(ids)} tokens, too few for windows of context {context} "
                             f"(need at least {2 * context + 1})")
        self.ids, self.batch_size, self.context, self.seed = ids.long(), batch_size, context, seed
        self.rank, self.world_size = rank, world_size
        self.epoch, self.position = 0, 0
        self._starts = self._epoch_starts(0)

    def _epoch_starts(self, epoch: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        offset = int(torch.randint(self.context, (1,), generator=generator))
        starts = torch.arange(offset, len(self.ids) - self.context, self.context + 1)
        return starts[torch.randperm(len(starts), generator=generator)]

    def __iter__(self):
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        rows = []
        while len(rows) < self.batch_size:
            if self.position == len(self._starts):
                self.epoch, self.position = self.epoch + 1, 0
                self._starts = self._epoch_starts(self.epoch)
            rows.append(self._starts[self.position])
            self.position += 1
        share = self.batch_size // self.world_size
        mine = rows[self.rank * share: (self.rank + 1) * share]
        windows = torch.stack([self.ids[s: s + self.context + 1] for s in mine])
        return windows[:, :-1], windows[:, 1:]

    def state_dict(self) -> dict:
        return {"seed": self.seed, "epoch": self.epoch, "position": self.position, "batch_size": self.batch_size,
                "context": self.context}

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state_dict()``'s cursor; ``ValueError`` when it is a cursor over
        other batches (another global batch size or context)."""
        for key in ("batch_size", "context"):
            if key in state and int(state[key]) != getattr(self, key):
                raise ValueError(f"the saved sampler state has {key} {state[key]}, this sampler {getattr(self, key)}")
        self.seed, self.epoch, self.position = int(state["seed"]), int(state["epoch"]), int(state["position"])
        self._starts = self._epoch_starts(self.epoch)

# %% [markdown]
# ### The loop, bare
#
# All the pieces are there. Here is the whole of training in ten lines, on a small model
# (two layers, $d = 64$, context 64, the course's Llama-style switches) for a few dozen
# steps. Each step:
#
# 1. `next(batches)` gives `x`, 16 windows of 64 tokens, and `y`, the same windows
#    shifted by one token: the next token of every position.
# 2. `model(x, y)` returns the logits and the mean cross-entropy of its $16 \times 64$
#    next-token predictions, one number.
# 3. `optimizer.zero_grad()` clears the previous step's gradients (PyTorch adds new
#    gradients to old ones otherwise), and `loss.backward()` computes the gradient of the
#    loss with respect to every parameter.
# 4. `clip_grad_norm_` measures the norm of all the gradients together and, when it
#    exceeds 1, scales them all down so that it is 1.
# 5. `optimizer.step()` moves every weight (AdamW, at the current learning rate), and
#    `scheduler.step()` sets the next step's learning rate (warmup, then cosine).

# %%
train_tokens = torch.tensor(tokenizer.encode(train_text[: 150_000] if course.QUICK else train_text))
small = dict(context_length=64, d_model=64, n_layers=2, n_heads=4, d_ff=176, positions="rope", norm="rmsnorm",
             ffn="swiglu", bias=False, attention_backend="sdpa")
bare_steps = 20 if course.QUICK else 60
torch.manual_seed(0)
model = reference_model.GPT(reference_model.GPTConfig(vocab_size=len(tokenizer), **small))
optimizer = reference_optim.build_optimizer(model, lr=6e-3)
scheduler = reference_optim.build_scheduler(optimizer, warmup_steps=bare_steps // 10, total_steps=bare_steps)
batches = reference_batches.BatchSampler(train_tokens, batch_size=16, context=64)
for step in range(bare_steps):
    x, y = next(batches)                                        # (16, 64) inputs, (16, 64) next tokens
    _, loss = model(x, y)                                       # mean cross-entropy, nats per token
    optimizer.zero_grad()
    loss.backward()                                             # a gradient for every parameter
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)     # gradient clipping
    optimizer.step()                                            # AdamW
    scheduler.step()                                            # warmup, then cosine decay
    if step % 10 == 0 or step == bare_steps - 1:
        print(f"step {step:3d}: loss {loss.item():.2f} nats per token, next learning rate {scheduler.get_last_lr()[0]:.2e}")

# %% [markdown]
# That is training. The package's loop adds what makes it usable: the hyper-parameters
# in a `TrainConfig`, and weights-only model files written by `save_model` and read back
# by `load_model`. A model wrapped for data-parallel training (chapter 08 wraps it in
# PyTorch's `DistributedDataParallel`) trains as it is, and `unwrap` reaches the model
# inside, the one whose weights and config a file keeps:

# %%
#| export minillm/train.py
"""Training the mini-LLM: the loop and its configuration (chapter 07).

- ``TrainConfig``: steps, AdamW, the schedule, clipping, evaluation and checkpoints.
- ``train(model, batches, config, *, loss_fn=lm_loss, evaluate=None, state=None, ...)``:
  the loop (gradient clipping, accumulation, periodic evaluation, a ``tqdm`` bar) for any
  module, a ``DistributedDataParallel`` wrapper included, any batch iterator and any loss.
- ``lm_loss`` (the default loss) and ``held_out_loss`` (an ``evaluate`` callback).

What a run saves is in ``minillm.train_state``: ``TrainState`` (resumable training) and
``save_model`` / ``load_model`` (weights only), importable from here too. The loss is in
``minillm.loss``, the optimizer and schedule in ``minillm.optim``, the batches in
``minillm.batches``. The recipe of ``make train`` and the shipped model's files are in
``minillm.recipe``.
"""
import contextlib
from dataclasses import dataclass

import torch
from torch import nn
from tqdm.auto import tqdm

from minillm.checkpoint import config_from_dict, rank_and_world_size, rng_states, set_rng_states
from minillm.checks import non_negative_int, number, positive_int, positive_number
from minillm.loss import token_nll
# save_model and load_model are imported for the callers that have always found them here
from minillm.train_state import HISTORY, TrainState, load_model, save_model, unwrap


@dataclass(frozen=True)
class TrainConfig:
    """How to optimize: steps, AdamW, the schedule, clipping, when to evaluate and checkpoint.

    lr decays from ``lr`` to ``lr * min_lr_ratio`` by a cosine after ``warmup_steps``.
    Every ``eval_every`` steps (and at step ``steps``) ``train`` calls its ``evaluate``;
    every ``checkpoint_every`` steps (and at its last step) it writes a checkpoint, when it
    has a path. The batches, and so the batch size, come from the iterator ``train`` is given:
    each optimizer step takes ``grad_accum_steps`` batches from it and averages their
    gradients (gradient accumulation), so a step sees ``grad_accum_steps`` times the
    iterator's batch while memory holds only one.
    """

    steps: int = 2000
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_every: int = 250
    checkpoint_every: int = 500
    grad_accum_steps: int = 1

    def __post_init__(self):
        for name in ("steps", "eval_every", "checkpoint_every", "grad_accum_steps"):
            positive_int(name, getattr(self, name))
        if not 0 <= non_negative_int("warmup_steps", self.warmup_steps) <= self.steps:
            raise ValueError(f"warmup_steps must be in [0, steps={self.steps}], got {self.warmup_steps!r}")
        positive_number("lr", self.lr)
        number("min_lr_ratio", self.min_lr_ratio, low=0.0, high=1.0)
        number("weight_decay", self.weight_decay, low=0.0)
        for name in ("beta1", "beta2"):
            number(name, getattr(self, name), low=0.0, high=1.0, high_open=True)
        number("grad_clip", self.grad_clip, low=0.0, low_open=True)

    @classmethod
    def from_dict(cls, values: dict) -> "TrainConfig":
        """The config ``asdict`` wrote; ``ValueError`` naming unknown keys."""
        return config_from_dict(cls, values)


# %%
#| export minillm/train_state.py
"""What a training run saves (chapter 07): ``TrainState`` and weights-only model files.

- ``TrainState``: everything the next step depends on besides the weights (optimizer,
  scheduler, data cursor, every rank's random generators, step, history); it saves and
  loads as a checkpoint, so that a resumed run repeats the uninterrupted one exactly.
- ``save_model`` / ``load_model``: a GPT's config and weights, nothing else.
- ``unwrap``: the model inside a ``DistributedDataParallel`` or ``torch.compile`` wrapper,
  the one whose weights and config a file keeps.

The file format (atomic writes, safe loading, random-generator states) is in
``minillm.checkpoint``; the loop that fills a ``TrainState`` is ``minillm.train``.
"""
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from minillm.checkpoint import CheckpointError, is_main_process, load_checkpoint, save_checkpoint
from minillm.model import GPT, GPTConfig
from minillm.optim import build_optimizer, build_scheduler

if TYPE_CHECKING:
    from minillm.train import TrainConfig


def unwrap(model: nn.Module) -> nn.Module:
    """The module a wrapper trains: ``model.module`` of a ``DistributedDataParallel`` or
    ``DataParallel``, the original of a ``torch.compile``d model; ``model`` itself otherwise."""
    while True:
        if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):  # torch.compile's wrapper
            model = model._orig_mod
        else:
            return model


def save_model(path, model: nn.Module, **extra) -> None:
    """A weights-only checkpoint of a GPT (or a wrapper of one): {"config", "model"} and any
    ``extra`` entries (plain data)."""
    model = unwrap(model)
    save_checkpoint(path, {"config": model.config.to_dict(), "model": model.state_dict(), **extra})


def load_model(path, map_location="cpu") -> GPT:
    """The ``GPT`` a checkpoint holds (one written by ``save_model`` or ``train``), in eval mode.

    A missing or corrupt file is a ``CheckpointError`` (a ``ValueError``) naming it.
    """
    state = load_checkpoint(path, required=("config", "model"), map_location=map_location)
    if not isinstance(state["config"], dict):
        raise CheckpointError(f"checkpoint {str(path)!r} holds no GPT config (it is a checkpoint of another module)")
    model = GPT(GPTConfig.from_dict(state["config"]))
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as error:
        raise CheckpointError(f"checkpoint {str(path)!r} does not fit its own config: {error}") from error
    return model.eval()

# %% [markdown]
# `train` is the bare loop above (find it between `while state.step < last:` and
# `state.step += 1`), opened up in three places and with four additions. What it trains
# is open:
#
# - **Any model, any batches, any loss**: `train(model, batches, config, loss_fn=lm_loss)`
#   takes a module, an iterator of batches and a function `loss_fn(model, batch)` that
#   returns the loss. The default, `lm_loss`, is the bare loop's `model(x, y)[1]`. Another
#   objective is another function: the masked language model below trains through the
#   same `train`, and so does chapter 13's DPO. A `loss_fn` may return
#   `(loss, {"name": value})`, and the numbers it names are logged beside the loss.
# - **Evaluation** is a function too: every `eval_every` steps, `evaluate(model)` runs in
#   eval mode and returns a dict of numbers, which the history logs. `held_out_loss(ids)`
#   makes the usual one, the loss on a few windows of the held-out text (`token_nll`).
# - **Data-parallel training**: every process (every *rank*) runs `train` on its own share
#   of each batch (`BatchSampler(..., rank=, world_size=)`) with the model wrapped in
#   `DistributedDataParallel`, which averages the gradients. The history logs the mean
#   loss over the ranks; only the main process (rank 0) writes checkpoints and shows
#   the progress bar. Chapter 08 launches it.
#
# And what it adds to the bare loop:
#
# - **A state**: a `TrainState` holds everything the next step depends on besides the
#   weights: AdamW's moment estimates (in the optimizer), the scheduler's step, the
#   sampler's cursor, the state of every random generator of every rank (dropout draws
#   from torch's), the step count, and the history of losses and learning rates. `train`
#   returns it, and takes one to continue from.
# - **Checkpoints**: every `checkpoint_every` steps, the weights and the state. The files
#   are written to a temporary name and then renamed
#   (`minillm.checkpoint.save_checkpoint`), so a crash while saving leaves the previous
#   checkpoint intact; a missing or corrupt file is a `CheckpointError` naming it.
# - **Resuming**: `TrainState.load(path, model, config)` first checks that the checkpoint
#   belongs to this run (the same `TrainConfig`, the same model config), then restores
#   all of it, and `train(..., state=state)` takes *exactly* the steps the uninterrupted
#   run would have taken. That needs batches that can save and restore their place
#   (`state_dict` / `load_state_dict`, as `BatchSampler` does); any other iterator still
#   trains, but a resume from it is refused with an error rather than continued from
#   the wrong batch.
# - **A `tqdm` progress bar.**

# %%
#| export minillm/train.py
def lm_loss(model: nn.Module, batch) -> torch.Tensor | tuple[torch.Tensor, dict[str, float]]:
    """``train``'s default loss: ``model(x, y)[1]`` for a batch ``(x, y)`` of (batch, seq)
    ids, a GPT's mean next-token cross-entropy (its auxiliary losses included).

    A model that keeps the parts of its auxiliary losses in ``last_aux_losses`` (a dict of
    floats, as chapter 11's MoE does) has them returned too, ``(loss, parts)``, to be logged.
    """
    x, y = batch
    _, loss = model(x, y)
    parts = getattr(unwrap(model), "last_aux_losses", None)
    return (loss, dict(parts)) if parts else loss


def held_out_loss(ids: torch.Tensor, max_windows: int | None = 64, batch_size: int = 32):
    """An ``evaluate`` for ``train``: ``{"val_loss": nats per token}`` of the model on
    ``max_windows`` evenly spaced windows of the 1-D token stream ``ids`` (``token_nll``)."""
    if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or len(ids) < 2:
        raise ValueError(f"ids must be a 1-D tensor of at least 2 tokens, got {getattr(ids, 'shape', ids)}")
    positive_int("batch_size", batch_size)
    if max_windows is not None:
        positive_int("max_windows", max_windows)

    def evaluate(model: nn.Module) -> dict[str, float]:
        total, count = token_nll(unwrap(model), ids, batch_size=batch_size, max_windows=max_windows)
        return {"val_loss": total / count}

    return evaluate

# %%
#| export minillm/train_state.py
HISTORY = ("train_loss", "lr", "val_step")  # the lists every history has; loss_fn and evaluate add their own
_RUN = ("format", "config", "train_config", "model", "optimizer", "scheduler", "step", "history", "batches", "rng")


@dataclass(eq=False)
class TrainState:
    """Everything the next training step depends on, besides the model's weights.

    optimizer, scheduler: they hold their own state (AdamW's moments, the schedule's step).
    step: optimizer steps taken. history: lists, {"train_loss": the loss of each step's
    batch, "lr": the learning rate of each step, "val_step": the steps at which
    ``evaluate`` ran}, plus a list for every name that ``loss_fn`` (one entry a step) or
    ``evaluate`` (one entry an evaluation) reported. batches: the batch iterator's
    ``state_dict()`` at ``step``; rng: every rank's random generators at ``step``
    (``minillm.checkpoint.rng_states``), in rank order. ``train`` brings those two up to
    date at each checkpoint and at its end; None means "not recorded".

    ``TrainState.new(model, config)`` starts afresh; ``save`` and ``TrainState.load``
    write and read it, with the weights, as a training checkpoint.
    """

    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    step: int = 0
    history: dict = field(default_factory=lambda: {key: [] for key in HISTORY})
    batches: dict | None = None
    rng: list | None = None

    @classmethod
    def new(cls, model: nn.Module, config: "TrainConfig") -> "TrainState":
        """Step 0: AdamW over ``param_groups(model)`` and the warmup-then-cosine schedule of ``config``."""
        optimizer = build_optimizer(model, config.lr, config.weight_decay, (config.beta1, config.beta2))
        return cls(optimizer, build_scheduler(optimizer, config.warmup_steps, config.steps, config.min_lr_ratio))

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(), "step": self.step,
                "history": self.history, "batches": self.batches, "rng": self.rng}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = int(state["step"])
        self.history = {key: list(values) for key, values in state["history"].items()}
        self.batches, self.rng = state["batches"], state["rng"]

    def save(self, path, model: nn.Module, config: "TrainConfig", **extra):
        """Write a training checkpoint at ``path``: the weights and config of ``unwrap(model)``
        (so that ``load_model`` reads them without the wrapper), ``config``, this state and
        ``extra`` plain data. Only the main process writes: it returns the path, every
        other rank None."""
        clash = sorted(set(extra) & set(_RUN))
        if clash:
            raise ValueError(f"extra must not use the checkpoint's own keys {clash}")
        if not is_main_process():
            return None
        inner = unwrap(model)
        return save_checkpoint(path, {"format": "minillm training checkpoint", "config": _model_config(inner),
                                      "train_config": asdict(config), "model": inner.state_dict(),
                                      **self.state_dict(), **extra})

    @classmethod
    def load(cls, path, model: nn.Module, config: "TrainConfig", map_location=None) -> "TrainState":
        """The state a training checkpoint holds, for ``train(..., state=...)``; its weights
        are loaded into ``unwrap(model)``.

        ``CheckpointError`` naming the path when the file is missing or corrupt, or belongs
        to another run (another ``TrainConfig``, another model config); the model is then
        left as it was. map_location: default, the device of the model's parameters.
        """
        inner = unwrap(model)
        if map_location is None:
            map_location = next(inner.parameters()).device
        saved = load_checkpoint(path, required=_RUN[2:], map_location=map_location)
        if saved["train_config"] != asdict(config):  # checked before anything is loaded into the model
            raise CheckpointError(f"checkpoint {str(path)!r} was written with another TrainConfig: "
                                  f"{saved['train_config']} (this run: {asdict(config)})")
        if saved.get("config") != _model_config(inner):
            raise CheckpointError(f"checkpoint {str(path)!r} holds another model: {saved.get('config')} "
                                  f"(this run: {_model_config(inner)})")
        try:
            inner.load_state_dict(saved["model"])
        except RuntimeError as error:
            raise CheckpointError(f"checkpoint {str(path)!r} does not fit the model: {error}") from error
        state = cls.new(model, config)
        state.load_state_dict(saved)
        return state


def _model_config(model: nn.Module) -> dict | None:
    config = getattr(model, "config", None)
    return config.to_dict() if hasattr(config, "to_dict") else None

# %% [markdown]
# The loop itself. Apart from the bookkeeping, every line of the bare loop is in it, in
# the same order:

# %%
#| export minillm/train.py
def train(model: nn.Module, batches, config: TrainConfig, *, loss_fn=lm_loss, evaluate=None,
          state: TrainState | None = None, checkpoint_path=None, stop_after: int | None = None,
          progress: bool = True, extra: dict | None = None) -> TrainState:
    """Train ``model`` for ``config.steps`` optimizer steps, ``config.grad_accum_steps``
    batches of ``batches`` each (one by default).

    model: any module; a ``DistributedDataParallel`` wrapper trains data-parallel (every
    rank calls ``train`` with the same arguments and its own shard of each batch).
    batches: an iterator of batches (tensors, or tuples, lists or dicts of them; they are
    moved to the model's device). One with ``state_dict()`` / ``load_state_dict()``, such
    as ``BatchSampler``, resumes exactly; any other trains but refuses to resume a ``state``.
    loss_fn(model, batch): the loss to minimize, a 0-dim tensor, or ``(loss, dict)`` whose
    numbers are logged, one entry a step. evaluate(model): a dict of numbers, logged every
    ``config.eval_every`` steps and at step ``config.steps``; it runs on every rank, in
    eval mode, without gradients. state: a ``TrainState`` to continue (the one a previous
    call returned, or ``TrainState.load``); None starts afresh. checkpoint_path: where
    checkpoints go, every ``config.checkpoint_every`` steps and at the last step (only
    rank 0 writes). stop_after: stop after this many steps in all, as if interrupted (the
    schedule still spans ``config.steps``). extra: plain data stored in every checkpoint.

    Returns the state after the last step. Its history covers the whole run, the steps
    before a resume included; with several ranks its losses are the means over the ranks.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be a function (model, batch) -> loss, got {type(loss_fn).__name__}")
    if evaluate is not None and not callable(evaluate):
        raise TypeError(f"evaluate must be None or a function (model) -> dict, got {type(evaluate).__name__}")
    if stop_after is not None:
        non_negative_int("stop_after", stop_after)
    parameter = next(model.parameters(), None)
    if parameter is None:
        raise ValueError("model has no parameters to train")
    device = parameter.device
    rank, world_size = rank_and_world_size()
    resumable = callable(getattr(batches, "state_dict", None)) and callable(getattr(batches, "load_state_dict", None))
    if state is None:
        state = TrainState.new(model, config)
    elif not isinstance(state, TrainState):
        raise TypeError(f"state must be a TrainState or None, got {type(state).__name__}")
    else:
        _restore(state, batches, resumable, world_size)
    iterator = iter(batches)
    optimizer, scheduler, history = state.optimizer, state.scheduler, state.history
    last = config.steps if stop_after is None else min(stop_after, config.steps)

    model.train()
    bar = tqdm(total=last, initial=state.step, desc="training", disable=not (progress and rank == 0))
    while state.step < last:
        optimizer.zero_grad(set_to_none=True)
        loss, metrics = _accumulate(model, iterator, loss_fn, device, config.grad_accum_steps,
                                    f"batches (a {type(batches).__name__}) ran out after step {state.step} "
                                    f"of {config.steps}")
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        history["lr"].append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
        state.step += 1
        for name, value in _mean_over_ranks({"train_loss": loss, **metrics}, world_size).items():
            history.setdefault(name, []).append(value)
        if evaluate is not None and (state.step % config.eval_every == 0 or state.step == config.steps):
            model.eval()
            with torch.no_grad():
                results = evaluate(model)
            model.train()
            history["val_step"].append(state.step)
            for name, value in _numbers(results, "evaluate").items():
                history.setdefault(name, []).append(_as_float(value))
        if checkpoint_path is not None and (state.step % config.checkpoint_every == 0 or state.step == last):
            _record(state, batches, resumable)
            state.save(checkpoint_path, model, config, **(extra or {}))
        bar.update(1)
        if state.step % 10 == 0 or state.step == last:
            shown = ("train_loss", "val_loss")
            bar.set_postfix({name: f"{history[name][-1]:.3f}" for name in shown if history.get(name)})
    bar.close()
    _record(state, batches, resumable)
    model.eval()
    return state


def _accumulate(model: nn.Module, iterator, loss_fn, device, micro_steps: int, ran_out: str):
    """Backpropagate ``micro_steps`` batches of ``iterator``, each loss divided by
    ``micro_steps`` so that the summed gradients are those of their mean; return the mean
    loss and metrics (one batch: its loss and metrics as they are). Under
    ``DistributedDataParallel`` the gradients are all-reduced once, on the last batch:
    ``no_sync`` skips the all-reduce of the others."""
    losses, logged = [], []
    for micro in range(micro_steps):
        try:
            batch = next(iterator)
        except StopIteration:
            raise ValueError(ran_out) from None
        last = micro == micro_steps - 1
        no_sync = getattr(model, "no_sync", None)
        with contextlib.nullcontext() if last or no_sync is None else no_sync():
            loss, metrics = _loss_and_metrics(loss_fn(model, _to_device(batch, device)))
            (loss if micro_steps == 1 else loss / micro_steps).backward()
        losses.append(loss.detach())
        logged.append(metrics)
    if micro_steps == 1:
        return loss, metrics
    if any(set(metrics) != set(logged[0]) for metrics in logged):
        raise ValueError("loss_fn must give the same numbers for every batch of an accumulated step")
    mean = {name: sum(_as_float(m[name]) for m in logged) / micro_steps for name in logged[0]}
    return torch.stack(losses).mean(), mean


def _restore(state: TrainState, batches, resumable: bool, world_size: int) -> None:
    """Put the batches and every rank's random generators where ``state`` left them."""
    if state.step > 0 or state.batches is not None:
        if not resumable:
            raise TypeError(f"batches (a {type(batches).__name__}) has no state_dict() / load_state_dict(), so it "
                            f"cannot resume a TrainState at step {state.step}: use batches that can (BatchSampler), "
                            f"or start afresh with state=None")
        if state.batches is None:
            raise ValueError(f"state (step {state.step}) holds no position of the batches: it was trained from an "
                             f"iterator that cannot resume")
        batches.load_state_dict(state.batches)
    if state.rng is not None:
        if len(state.rng) != world_size:
            raise ValueError(f"state holds the random generators of {len(state.rng)} process(es), this run has "
                             f"{world_size}: resume with as many processes")
        set_rng_states(state.rng)


def _record(state: TrainState, batches, resumable: bool) -> None:
    """Bring ``state.batches`` and ``state.rng`` up to date (on every rank: it gathers)."""
    state.batches = batches.state_dict() if resumable else None
    state.rng = rng_states()


def _loss_and_metrics(result) -> tuple[torch.Tensor, dict]:
    if isinstance(result, tuple) and len(result) != 2:
        raise ValueError(f"loss_fn must return a loss or (loss, dict), got a tuple of {len(result)}")
    loss, metrics = result if isinstance(result, tuple) else (result, {})
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        got = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ValueError(f"loss_fn must return a 0-dim tensor as its loss, got {got}")
    return loss, _numbers(metrics, "loss_fn")


def _numbers(values, source: str) -> dict:
    """``values`` checked: a dict of numbers (or 0-dim tensors) whose names the history does not reserve."""
    if not isinstance(values, dict):
        raise TypeError(f"{source} must give a dict of numbers, got {type(values).__name__}")
    taken = sorted(set(values) & set(HISTORY))
    if taken:
        raise ValueError(f"{source} must not name its numbers {taken}: the history keeps those itself")
    return values


def _as_float(value) -> float:
    """A number or a 0-dim tensor as a Python float (a float32 tensor's value, exactly)."""
    return value.item() if isinstance(value, torch.Tensor) else float(value)


def _mean_over_ranks(values: dict, world_size: int) -> dict[str, float]:
    """Plain floats of ``values``, averaged over the ranks (one all-reduce) when there are several."""
    if world_size == 1:
        return {name: _as_float(value) for name, value in values.items()}
    device = values["train_loss"].device
    stacked = torch.stack([torch.as_tensor(value, dtype=torch.float32, device=device).detach().reshape(())
                           for value in values.values()])
    torch.distributed.all_reduce(stacked)
    return dict(zip(values, (stacked / world_size).tolist()))


def _to_device(batch, device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {key: _to_device(value, device) for key, value in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a named tuple
        return type(batch)(*(_to_device(value, device) for value in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(_to_device(value, device) for value in batch)
    return batch

# %% [markdown]
# The recipe that `make train` runs, and the helpers that load what it ships, are in
# `minillm.recipe`. The model is Llama-style rather than GPT-2-style because it learns
# faster here. Given the same budget, 3,000 steps of 8 windows of 128 tokens (3.1 million
# tokens, about nine passes over the 347,000 training tokens), the shipped model reached
# 1.467 nats per character on the validation text, and a GPT-2-style model of exactly the
# same size (1,066,112 parameters: learned positions, LayerNorm, GELU; neither has biases)
# 1.524. The second run is
#
#     python -m minillm train --threads 1 --positions learned --norm layernorm --ffn gelu --out build/gpt2-style.pt
#
# (7.3 minutes on a busy two-core machine). `python -m minillm train` with no options
# repeats the recipe itself; it writes into `build/`, so the shipped model in `data/`
# stays as it is (only `make train` replaces it), and it prints the command that talks
# to the model it trained.
#
# Here is `train` at work on the same small shape, trained from scratch for 500 steps
# (40 in quick mode). It uses the package's `train`, so the schedule is the course's
# reference whatever happened in Exercise 2. The BERT-style section below trains a twin
# of this model.

# %%
demo_steps = 40 if course.QUICK else 500
torch.manual_seed(0)
demo = reference_model.GPT(reference_model.GPTConfig(vocab_size=len(tokenizer) + 1, **small))  # + 1: see below
demo_config = reference_train.TrainConfig(steps=demo_steps, lr=6e-3, warmup_steps=demo_steps // 20,
                                          eval_every=demo_steps // 4)
demo_batches = reference_batches.BatchSampler(train_tokens, batch_size=16, context=64)
started = time.perf_counter()
demo_state = reference_train.train(demo, demo_batches, demo_config,
                                   evaluate=reference_train.held_out_loss(val_ids, max_windows=16, batch_size=16))
demo_history = demo_state.history
print(f"{demo_steps} steps in {time.perf_counter() - started:.1f} s; training loss (mean of 10 batches) "
      f"{sum(demo_history['train_loss'][:10]) / 10:.2f} → {sum(demo_history['train_loss'][-10:]) / 10:.2f} nats per "
      f"token; validation (16 windows) {demo_history['val_loss'][-1]:.2f}")
on_train, on_val = (reference_loss.token_nll(demo, ids, max_windows=256) for ids in (train_tokens, val_ids))
print(f"the final model on 256 windows of each text: training {on_train[0] / on_train[1]:.2f}, "
      f"validation {on_val[0] / on_val[1]:.2f} nats per token")

# %% [markdown]
# The last validation loss (4.43) lies below the last training loss (4.66), which is
# only noise. The training figure is the mean over the last 10 batches, each measured
# before its step; the validation figure comes from 16 windows. Both are small samples,
# and on 256 windows of each text the final model scores about the same on both, 4.62
# on training text and 4.58 on validation text: after 500 steps, one and a half passes
# over the training text, it has not begun to memorize.
#
# The shipped model went through the same loop for much longer: `make train` ran the
# recipe above (its numbers are in `minillm.recipe.DEFAULT_RECIPE`) in 12 minutes on one
# CPU thread of a heavily loaded machine. Its checkpoint keeps the history of that run:

# %%
from minillm.checkpoint import load_checkpoint
from minillm.recipe import pretrained_paths

shipped = load_checkpoint(pretrained_paths()[0])
fig = plot_history(shipped, title="make train: the shipped model's loss curves")
plt.show()
print(f"validation loss of the shipped model: {shipped['val_nats_per_char']:.3f} nats per character "
      f"(the whole validation text, {len(val_text):,d} characters)")

# %% [markdown]
# For the first thousand steps or so the training loss (measured on each batch, before
# the step) and the validation loss fall together: the steep start is the model learning
# frequent tokens and short words, the long tail is spelling, names, the shape of verse.
# Then they part. The training loss drops in steps, one per pass over the training text
# (about 340 steps of 8 windows each): every pass, the model recognizes a little more of
# text it has already seen. The validation loss flattens. This is the beginning of
# **memorization**, and it says what the next improvement is: not more steps of this
# model on this text, but regularization (dropout, weight decay), more text, or, for a
# fixed budget, a better shape (chapter 08).
#
# ### Resuming exactly
#
# A checkpoint that restores everything makes an interrupted run indistinguishable from
# one that never stopped. The cell trains a tiny model with dropout (so the random
# generators matter) for 16 steps, then again with an interruption after step 7 and a
# resume into a freshly built model, and compares the two loss trajectories bit for bit.
# Last, it tries to resume from batches that cannot say where they are, a plain Python
# iterator over the same windows: `train` refuses.

# %%
#| stable
import tempfile
from pathlib import Path

tiny = reference_model.GPTConfig(vocab_size=len(tokenizer), context_length=16, d_model=32, n_layers=2, n_heads=2,
                                  d_ff=64, dropout=0.2)
tiny_run = reference_train.TrainConfig(steps=16, warmup_steps=2, eval_every=8, checkpoint_every=4)


def tiny_batches():
    return reference_batches.BatchSampler(train_tokens, batch_size=4, context=16)


torch.manual_seed(1)
whole = reference_train.train(reference_model.GPT(tiny), tiny_batches(), tiny_run, progress=False)
with tempfile.TemporaryDirectory() as folder:
    checkpoint = Path(folder) / "run.pt"
    torch.manual_seed(1)
    reference_train.train(reference_model.GPT(tiny), tiny_batches(), tiny_run, checkpoint_path=checkpoint,
                          stop_after=7, progress=False)
    torch.manual_seed(99)  # another initialization, another random state: the checkpoint must restore them
    model = reference_model.GPT(tiny)
    state = reference_train.TrainState.load(checkpoint, model, tiny_run)
    resumed = reference_train.train(model, tiny_batches(), tiny_run, state=state, checkpoint_path=checkpoint,
                                    progress=False)
print("identical loss trajectories:", whole.history["train_loss"] == resumed.history["train_loss"])
try:
    reference_train.load_model(Path(folder) / "run.pt")  # the temporary folder is gone
except ValueError as error:
    print(f"loading a missing checkpoint: {type(error).__name__}, naming the path: {str(checkpoint) in str(error)}")
try:
    reference_train.train(model, (batch for batch in tiny_batches()), tiny_run, state=resumed, progress=False)
except TypeError as error:
    print(f"resuming from a plain iterator: {type(error).__name__}: {str(error).split(':')[0]}")

# %% [markdown]
# ## Output generation
#
# The last stage of the back graphic. The model's final vectors become logits, one score
# per vocabulary entry; a softmax turns the scores at the *last* position into the
# distribution of the next token; a token is chosen, appended, and the model runs again:
#
# $$p(x_{t+1} = v \mid x_{\le t}) = \frac{e^{z_v / \tau}}{\sum_{u} e^{z_u / \tau}},
# \qquad z = \text{logits}_t \in \mathbb{R}^V .$$
#
# How to choose is a decision of its own, separate from the model:
#
# - **Greedy**: always the most likely token. Deterministic, and prone to loops: a small
#   model soon finds a phrase whose most likely continuation is itself.
# - **Sampling** with **temperature** $\tau$: draw from the softmax of $z/\tau$. $\tau < 1$
#   sharpens the distribution towards greedy ($\tau \to 0$ is greedy), $\tau > 1$ flattens
#   it towards uniform. Plain sampling at $\tau = 1$ reproduces the model's own
#   distribution, tail included: among 2,048 tokens the many unlikely ones together get a
#   real share, and one bad draw derails the text.
# - **Top-k** (Fan et al., 2018): sample only among the $k$ most likely tokens.
# - **Top-p**, or *nucleus* sampling (Holtzman et al., 2019): sample among the smallest
#   set of most likely tokens whose probabilities add up to at least $p$. When the model
#   is sure, that is one or two tokens; when it hesitates, many.
#
# The filters set the logits of the tokens they exclude to $-\infty$, so the softmax gives
# them probability exactly 0. Everything goes into `minillm/sampling.py`.

# %%
#| export minillm/sampling.py
"""Output generation: from the last position's logits to the next token (chapter 07).

Every function takes ``logits`` of shape ``(..., vocab)``, the scores a model gives each
token of the vocabulary, and works on the last axis. The filters return logits of the
same shape in which the tokens they rule out are ``-inf``, so that a softmax gives them
probability 0. ``sample_next`` chains them in the order Hugging Face's ``generate`` uses:
temperature, then top-k, then top-p, then one draw per row. Drawing with a seeded
``torch.Generator`` (or after ``torch.manual_seed``) makes samples reproducible.
"""
import torch

from minillm.precision import compute_dtype


def _check_logits(logits) -> None:
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if not logits.is_floating_point():
        raise TypeError(f"logits must be a floating tensor, got dtype {logits.dtype}")
    if logits.dim() == 0 or logits.shape[-1] == 0:
        raise ValueError(f"logits must have shape (..., vocab) with vocab >= 1, got {tuple(logits.shape)}")


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """The most likely token of each row: logits (..., vocab) → ids (...,), int64.

    Ties go to the smallest id (``torch.argmax``'s rule).
    """
    _check_logits(logits)
    return logits.argmax(dim=-1)


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / temperature, shape (..., vocab). Below 1 sharpens the distribution, above 1 flattens it.

    temperature must be > 0; the limit 0 is greedy decoding, which ``sample_next`` handles.
    """
    _check_logits(logits)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
        raise ValueError(f"temperature must be a number > 0, got {temperature!r}")
    return logits / temperature

# %% [markdown]
# What the trained model expects after a prompt, and what temperature does to it:

# %%
from minillm import sampling as reference_sampling

prompt = "ROMEO:\nI will"
prompt_ids = torch.tensor([tokenizer.encode(prompt)])
with torch.no_grad():
    next_logits = trained(prompt_ids)[0][0, -1]
top = torch.topk(next_logits, 12).indices
labels = [repr(tokenizer.decode([i]))[1:-1] for i in top.tolist()]
fig, axes = plt.subplots(1, 3, figsize=(11, 3.4), sharey=True)
for ax, tau in zip(axes, (0.5, 1.0, 2.0)):
    probs = torch.softmax(reference_sampling.apply_temperature(next_logits, tau), dim=-1)
    ax.bar(range(12), probs[top], color="C0")
    ax.set_xticks(range(12), labels, rotation=70, fontsize=8)
    ax.set_title(f"temperature {tau}: top 12 hold {probs[top].sum():.0%}")
axes[0].set_ylabel("probability of the next token")
fig.suptitle(f"The trained model's next token after {prompt!r}")
plt.tight_layout()
plt.show()

# %% [markdown]
# At temperature 0.5 the first few candidates take nearly everything; at 2 the top twelve
# hold only a small part and the rest is spread over two thousand mostly absurd tokens.
# Temperature changes how much of the tail is sampled, but never cuts it off; the filters
# do.
#
# ### Exercise 3 · The top-k filter
#
# Implement `top_k_filter(logits, k)`: keep the `k` largest logits of each row (the last
# axis) unchanged and set all others to `-inf`. If several logits equal the $k$-th largest,
# keep them all (so a tie can keep more than $k$). `k` at least the vocabulary size keeps
# everything. Work on any number of leading dimensions, and return the logits' dtype. A `k`
# that is not a positive int is a `ValueError`.
#
# Difficulty ●○○ · Importance ●●○ · about 10 minutes
#
# <details><summary>Hint 1</summary><code>torch.topk(logits, k, dim=-1).values</code> holds the <code>k</code> largest values of each row, largest first.</details>
# <details><summary>Hint 2</summary>The threshold is the smallest of them, <code>values[..., -1:]</code> (keep the last axis, so that it broadcasts against <code>logits</code>).</details>
# <details><summary>Hint 3</summary><code>logits.masked_fill(logits < threshold, float("-inf"))</code>; return <code>logits</code> unchanged when <code>k >= logits.shape[-1]</code> (<code>torch.topk</code> would fail).</details>

# %%
#| answer top_k_filter
#| export minillm/sampling.py
def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits of each row, set the others to -inf: (..., vocab) → (..., vocab).

    A logit equal to the k-th largest is kept too, so a tie at the boundary can keep more
    than k tokens. k >= vocab keeps everything. The result has the logits' dtype. ``ValueError``
    unless k is a positive int.
    """
    ### BEGIN SOLUTION
    _check_logits(logits)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    if k >= logits.shape[-1]:
        return logits
    kth_largest = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth_largest, float("-inf"))
    ### END SOLUTION

# %%
#| test top_k_filter_visible points=1
def _top_k_case():
    """Three rows of five logits and k = 2; the third row ties at the boundary (two logits equal 1.0)."""
    return torch.tensor([[1.0, 3.0, -0.5, 2.0, 0.0], [0.2, -1.0, 0.7, 0.1, 1.5], [0.0, 1.0, -1.0, 1.0, 2.0]]), 2


@course.visible_check("top_k_filter")
def check_top_k_filter(top_k_filter):
    logits, k = _top_k_case()
    given = logits.clone()
    got = top_k_filter(given, k)
    if not torch.equal(given, logits):
        raise course.CheckFailed("top_k_filter(logits, k=2): the filter modified its input. Return a new tensor "
                                 "(masked_fill, not logits[...] = ...): the caller's logits must stay as they were")
    inf = float("-inf")
    expected = torch.tensor([[inf, 3.0, inf, 2.0, inf], [inf, inf, 0.7, inf, 1.5], [inf, 1.0, inf, 1.0, 2.0]])
    smallest = logits.masked_fill(logits > torch.topk(logits, 2, largest=False).values[..., -1:], inf)
    exactly_k = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, torch.topk(logits, 2).indices, True)
    course.expect_close(
        got, expected, "top_k_filter(logits, k=2)",
        mistakes={
            "kept the k smallest logits instead of the k largest": smallest,
            "kept k + 1 tokens (off by one)": logits.masked_fill(logits < torch.topk(logits, 3).values[..., -1:], inf),
            "the removed logits are 0, not -inf (a softmax still gives them probability)": expected.masked_fill(
                expected == inf, 0.0),
            "the removed logits are -1e9, not -inf: use float('-inf'), which a softmax turns into exactly 0 "
            "whatever the other logits are": expected.masked_fill(expected == inf, -1e9),
            "exactly k tokens kept in the tied row (scattering topk's indices): keep every logit equal to the k-th "
            "largest": logits.masked_fill(~exactly_k, inf),
            "returned probabilities, not logits": torch.softmax(expected, dim=-1),
            "only the single largest logit kept": logits.masked_fill(logits < logits.amax(-1, keepdim=True), inf),
        },
        hint="the k-th largest value of each row is torch.topk(logits, k).values[..., -1:]; mask what lies below it",
    )
    course.expect_close(top_k_filter(logits.clone(), 5), logits, "top_k_filter with k equal to the vocabulary size")
    course.expect_raises(ValueError, top_k_filter, logits.clone(), 0, what="top_k_filter(logits, k=0)",
                         hint="k must be a positive int: check it and raise ValueError")


check_top_k_filter(top_k_filter)
print("top_k_filter: visible test passed")

# %%
#| test top_k_filter_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
for shape, k, dtype in [((4, 13), 3, torch.float32), ((2, 3, 29), 7, torch.float64), ((1, 6), 1, torch.float32),
                        ((5, 8), 8, torch.float64), ((3, 4), 100, torch.float32)]:
    logits = 3 * torch.randn(*shape, dtype=dtype)
    before = logits.clone()
    got = top_k_filter(logits, k)
    assert torch.equal(logits, before), "the filter modified its input"
    kth = torch.topk(logits, min(k, shape[-1]), dim=-1).values[..., -1:]
    expected = logits.masked_fill(logits < kth, float("-inf"))
    assert isinstance(got, torch.Tensor) and got.shape == logits.shape, "top_k_filter must keep the shape of the logits"
    assert got.dtype == dtype, "top_k_filter must keep the logits' dtype"
    assert torch.equal(torch.isinf(got), torch.isinf(expected)), "top_k_filter kept the wrong tokens"
    assert torch.equal(got[~torch.isinf(got)], logits[~torch.isinf(expected)]), "kept logits must be unchanged"
    assert bool((torch.isfinite(got).sum(-1) == min(k, shape[-1])).all()), "without ties exactly k tokens are kept"
# k = 1 keeps the argmax alone
logits = torch.randn(6, 40)
assert torch.equal(torch.isfinite(top_k_filter(logits, 1)), torch.nn.functional.one_hot(logits.argmax(-1), 40).bool())
# ties at the boundary are kept, the input is left alone
tied = torch.tensor([[0.5, 2.0, 0.5, -1.0, 0.5]])
assert torch.isfinite(top_k_filter(tied, 2)).tolist() == [[True, True, True, False, True]], "ties with the k-th are kept"
assert torch.equal(tied, torch.tensor([[0.5, 2.0, 0.5, -1.0, 0.5]])), "the filter modified its input"
for bad in (0, -3, 2.5):
    course.expect_raises(ValueError, top_k_filter, tied, bad, what="top_k_filter with a k that is not valid")
### END HIDDEN TESTS

# %%
top_k = course.keep_going("top_k_filter", top_k_filter, reference_sampling.top_k_filter, check_top_k_filter)

# %% [markdown]
# ### Exercise 4 · The top-p (nucleus) filter
#
# Implement `top_p_filter(logits, p)`. Sort each row's probabilities
# ($\operatorname{softmax}$ of the logits) in decreasing order and keep a token when the
# tokens *before* it in that order hold less than $p$:
#
# $$\text{keep } x_{(i)} \iff \sum_{j < i} P(x_{(j)}) < p .$$
#
# That keeps the smallest prefix whose mass reaches $p$ (the token that crosses $p$ is
# kept; the next is not), and always the most likely token. Set the others to `-inf`, in
# the original (unsorted) positions, in the logits' dtype. `p = 1` keeps everything; a `p`
# outside $(0, 1]$ is a `ValueError`.
#
# Difficulty ●●○ · Importance ●●● · about 20 minutes
#
# <details><summary>Hint 1</summary><code>sorted_logits, order = torch.sort(logits, dim=-1, descending=True)</code>; the probabilities of the sorted row are <code>torch.softmax(sorted_logits, dim=-1)</code>.</details>
# <details><summary>Hint 2</summary>The mass before token <i>i</i> is <code>probs.cumsum(dim=-1) - probs</code>; the sorted token is removed when that is <code>>= p</code>.</details>
# <details><summary>Hint 3</summary>Map the decision back to the original positions: <code>remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)</code>, then <code>logits.masked_fill(remove, float("-inf"))</code>.</details>

# %%
#| answer top_p_filter
#| export minillm/sampling.py
def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filter (Holtzman et al., 2019): keep the smallest set of most likely tokens
    whose probabilities sum to at least p; set the others to -inf. (..., vocab) → (..., vocab).

    Tokens are taken in order of decreasing probability; a token is kept when the tokens
    before it hold less than p. The most likely token is always kept. The result has the
    logits' dtype. p = 1 keeps everything; ``ValueError`` unless p is in (0, 1].
    """
    ### BEGIN SOLUTION
    _check_logits(logits)
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p <= 1.0:
        raise ValueError(f"p must be a number in (0, 1], got {p!r}")
    if p == 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits.to(compute_dtype(logits.dtype)), dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    remove_sorted = mass_before >= p
    remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))
    ### END SOLUTION

# %%
#| test top_p_filter_visible points=1
def _top_p_case():
    """Two rows whose probabilities are exact: [0.05, 0.5, 0.15, 0.3] and [0.4, 0.1, 0.15, 0.35]."""
    return torch.log(torch.tensor([[0.05, 0.5, 0.15, 0.3], [0.4, 0.1, 0.15, 0.35]]))


@course.visible_check("top_p_filter")
def check_top_p_filter(top_p_filter):
    logits = _top_p_case()
    given = logits.clone()
    got = top_p_filter(given, 0.7)
    if not torch.equal(given, logits):
        raise course.CheckFailed("top_p_filter(logits, p=0.7): the filter modified its input. Return a new tensor "
                                 "(masked_fill, not logits[...] = ...): the caller's logits must stay as they were")
    inf = float("-inf")
    keep = lambda rows: logits.masked_fill(~torch.tensor(rows), inf)  # noqa: E731
    course.expect_close(
        got, keep([[False, True, False, True], [True, False, False, True]]), "top_p_filter(p=0.7)",
        atol=1e-6,
        mistakes={
            "the token that crosses p was dropped (keep a token when the mass BEFORE it is below p)":
                keep([[False, True, False, False], [True, False, False, False]]),
            "nothing was removed: sorted in increasing order, or compared the wrong quantity with p?": logits,
            "the result is in sorted order: scatter the decision back to the original positions": torch.sort(
                logits, descending=True).values.masked_fill(torch.tensor([[False, False, True, True]] * 2), inf),
            "the removed logits are 0, not -inf": logits.masked_fill(torch.tensor([[True, False, True, False],
                                                                                    [False, True, True, False]]), 0.0),
            "the removed logits are -1e9, not -inf: use float('-inf')": logits.masked_fill(
                torch.tensor([[True, False, True, False], [False, True, True, False]]), -1e9),
        },
        hint="sort descending, mass_before = cumsum - probs, remove where mass_before >= p, scatter back",
    )
    course.expect_close(top_p_filter(logits.clone(), 0.85), keep([[False, True, True, True], [True, False, True, True]]),
                        "top_p_filter(p=0.85)", atol=1e-6)
    course.expect_close(top_p_filter(logits.clone(), 1e-3), keep([[False, True, False, False], [True, False, False, False]]),
                        "top_p_filter with a tiny p: only the most likely token", atol=1e-6)
    course.expect_raises(ValueError, top_p_filter, logits.clone(), 0.0, what="top_p_filter(logits, p=0.0)",
                         hint="p must be in (0, 1]: check it and raise ValueError")


check_top_p_filter(top_p_filter)
print("top_p_filter: visible test passed")

# %%
#| test top_p_filter_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
def _naive_nucleus(row, p):
    probs = torch.softmax(row.double(), -1).tolist()
    keep, mass = [False] * len(probs), 0.0
    for i in sorted(range(len(probs)), key=lambda i: -probs[i]):
        if mass >= p:
            break
        keep[i], mass = True, mass + probs[i]
    return keep


for shape, p, dtype in [((6, 17), 0.9, torch.float32), ((2, 3, 31), 0.5, torch.float64), ((3, 9), 0.2, torch.float64),
                        ((4, 50), 0.97, torch.float32)]:
    logits = 2.5 * torch.randn(*shape, dtype=dtype)
    before = logits.clone()
    got = top_p_filter(logits, p)
    assert torch.equal(logits, before), "the filter modified its input"
    assert isinstance(got, torch.Tensor) and got.shape == logits.shape, "top_p_filter must keep the shape of the logits"
    assert got.dtype == dtype, "top_p_filter must keep the logits' dtype"
    for row, out in zip(logits.reshape(-1, shape[-1]), got.reshape(-1, shape[-1])):
        kept = torch.isfinite(out)
        assert kept.tolist() == _naive_nucleus(row, p), "top_p_filter kept the wrong tokens"
        assert torch.equal(out[kept], row[kept]), "kept logits must be unchanged"
        probs = torch.softmax(row.double(), -1)
        assert probs[kept].sum() >= p - 1e-9 and probs[kept].sum() - probs[kept].min() < p, "not the smallest nucleus"
# p = 1 keeps everything; the most likely token survives any p
logits = torch.randn(5, 12)
before = logits.clone()
assert torch.equal(top_p_filter(logits, 1.0), logits)
assert torch.equal(torch.isfinite(top_p_filter(logits, 1e-6)), torch.nn.functional.one_hot(logits.argmax(-1), 12).bool())
assert torch.equal(logits, before), "the filter modified its input"
# a confident row keeps one token, a flat row keeps many
rows = torch.tensor([[10.0, 0.0, 0.0, 0.0, 0.0, 0.0], [0.1, 0.0, 0.05, 0.0, 0.1, 0.02]])
assert torch.isfinite(top_p_filter(rows, 0.9)).sum(-1).tolist() == [1, 6]
for bad in (0.0, -0.2, 1.5):
    course.expect_raises(ValueError, top_p_filter, rows, bad, what="top_p_filter with a p that is not valid")
### END HIDDEN TESTS

# %%
top_p = course.keep_going("top_p_filter", top_p_filter, reference_sampling.top_p_filter, check_top_p_filter)

# %% [markdown]
# `sample_next` chains the pieces: check the arguments, treat temperature 0 as greedy,
# divide by the temperature, filter, draw one token per row with `torch.multinomial`.
# The draw uses a `torch.Generator` when one is given: the same seed, the same text.

# %%
#| export minillm/sampling.py


def check_sampling_arguments(temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None) -> None:
    """``ValueError`` naming the argument unless temperature >= 0, top_k is None or a
    positive int, and top_p is None or in (0, 1]."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature >= 0:
        raise ValueError(f"temperature must be a number >= 0, got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be None or a positive int, got {top_k!r}")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
        raise ValueError(f"top_p must be None or a number in (0, 1], got {top_p!r}")


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw the next token of each row: logits (batch, vocab) → ids (batch,), int64.

    temperature 0 is greedy decoding (no filter changes the most likely token). Otherwise
    the logits are divided by the temperature, filtered by top-k and then top-p when
    given, and one token is drawn from their softmax with ``generator`` (default: torch's
    global generator).
    """
    _check_logits(logits)
    if logits.dim() != 2:
        raise ValueError(f"logits must have shape (batch, vocab), got {tuple(logits.shape)}")
    check_sampling_arguments(temperature, top_k, top_p)
    if temperature == 0:
        return greedy(logits)
    logits = apply_temperature(logits, temperature)
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    probs = torch.softmax(logits.to(compute_dtype(logits.dtype)), dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)

# %% [markdown]
# Top-k keeps a fixed number of candidates; top-p keeps as many as the model's confidence
# calls for. Over a stretch of the validation text, here is how many tokens a nucleus of
# $p = 0.9$ holds at each position, next to a fixed $k = 40$:

# %%
#| stable
with torch.no_grad():
    window = val_ids[200: 200 + trained.config.context_length][None]
    step_logits = trained(window)[0][0]
nucleus = torch.isfinite(top_p(step_logits, 0.9)).sum(-1)
labelled = {"A": 3, "B": 20, "C": 77, "D": 89, "E": 102}  # a line start, a line end, two open choices, a word's middle
fig, ax = plt.subplots(figsize=(9, 3.6))
ax.plot(nucleus, drawstyle="steps-mid", label="top-p 0.9: tokens kept")
ax.axhline(40, color="C1", linestyle="--", label="top-k 40")
for letter, position in labelled.items():
    ax.plot(position, int(nucleus[position]), "o", color="C3")
    ax.annotate(letter, (position, int(nucleus[position])), xytext=(4, 4), textcoords="offset points", color="C3",
                fontweight="bold")
ax.set_yscale("log")
ax.set_ylim(0.7, 4000)
ax.set_xlabel("position in a validation window")
ax.set_ylabel("candidate tokens (log scale)")
ax.set_title("The nucleus shrinks where the model is sure and grows where it is not")
ax.legend(loc="upper right", ncol=2)
plt.tight_layout()
plt.show()
print(f"nucleus size at p = 0.9: median {int(nucleus.median())}, smallest {int(nucleus.min())}, largest "
      f"{int(nucleus.max())}; wider than k = 40 at {int((nucleus > 40).sum())} of {len(nucleus)} positions")
for letter, position in labelled.items():
    read = tokenizer.decode(window[0, max(0, position - 3): position + 1].tolist())
    print(f"  {letter}: position {position:3d}, after {read!r:24s} nucleus {int(nucleus[position]):3d}; the text "
          f"goes on with {tokenizer.decode(window[0, position + 1: position + 2].tolist())!r}")

# %% [markdown]
# The nucleus is smallest where the continuation is nearly certain: the line break after
# a comma that ends a verse line (B) and the rest of a word, 'instru' → 'ct' (E), one
# token each. A fixed $k = 40$ would let 39 wrong candidates compete there. It is largest
# where a new word starts and almost any word could come, after *with a* (C) or *and*
# (D): nearly 390 tokens. At the start of a line (A) the model hesitates too, between
# about 90. And note what that means: for this small model the nucleus of $p = 0.9$ is
# usually *wider* than $k = 40$. Its median is 97 tokens, and it holds more than 40 at
# 93 of the 128 positions. A million-parameter model is unsure most of the time, its
# distributions are flat, and 90% of their mass needs many tokens. So at most positions
# top-p 0.9 keeps more of the tail than top-k 40 would, and it cuts harder only where the
# model is sure. What top-p buys is that adaptation to the model's confidence, not a
# narrower choice. That is why it is the default in most generation settings, often
# with a temperature slightly below 1, which sharpens the distribution before the
# nucleus is cut.
#
# ## Generating text
#
# `generate` repeats the step: run the model on the context, sample from the last
# position's logits, append. The context is cropped to its last `context_length` tokens,
# so generation can run past the model's window, forgetting the oldest tokens. Each step
# reruns the whole context; a KV cache removes that repetition (chapter 09 writes a fast
# one), and `generate(..., use_cache=True)` is ready for it: the prompt goes through once,
# then one token per step. Several prompts of different lengths go in one batch padded on
# the left, with `attention_mask` marking the real tokens: each row then gets the tokens
# it would get alone.

# %%
#| export minillm/generate.py
"""Autoregressive generation: run the model, sample a token, append it, repeat (chapter 07).

Without a cache, every step runs the model on the whole context again (its last
``context_length`` tokens) and uses only the last position's logits. With a KV cache the
prompt is run once and then each new token alone, its keys and values appended to the
cache; both ways give the same tokens. A batch of prompts of different lengths is padded
on the left, with an ``attention_mask`` (True for the real tokens); each row then gets
what it gets alone.

Past what a cache holds (the context, or a smaller ``max_len`` of the cache), the cache
decides: one whose ``rolling`` is true forgets its oldest position (``roll(1,
attention_mask=...)``, chapter 09's ``KVCache`` for relative positions); any other is
emptied (``reset()``) and refilled with the last half of the window in one pass.
"""
import torch
from tqdm.auto import tqdm

from minillm.attention import ConcatCache
from minillm.checks import boolean, eager_only, non_negative_int, positive_int
from minillm.model import check_attention_mask, check_token_batch
from minillm.sampling import check_sampling_arguments, sample_next


class ConcatModelCache:
    """The simplest model-wide KV cache: chapter 04's ``ConcatCache`` for each of ``n_layers`` blocks.

    ``length``: the positions it holds; ``layer(i)``: block i's cache; ``reset()`` empties
    it. What ``generate(..., use_cache=True)`` uses; chapter 09's ``KVCache`` preallocates
    instead of concatenating.
    """

    def __init__(self, n_layers: int):
        self.layers = [ConcatCache() for _ in range(positive_int("n_layers", n_layers))]

    def reset(self) -> None:
        self.layers = [ConcatCache() for _ in self.layers]

    @property
    def length(self) -> int:
        return 0 if self.layers[0].k is None else self.layers[0].k.shape[-2]

    def layer(self, index: int) -> ConcatCache:
        return self.layers[index]


@torch.no_grad()
def generate(model, ids: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
             top_p: float | None = None, kv_cache=None, use_cache: bool = False,
             attention_mask: torch.Tensor | None = None, generator: torch.Generator | None = None,
             progress: bool = False) -> torch.Tensor:
    """Extend ``ids`` (batch, seq) by ``max_new_tokens`` sampled tokens: → (batch, seq + max_new_tokens).

    model: ``forward(ids)`` returns ``(logits (batch, seq, vocab), loss)``, and
    ``model.config.context_length`` is its context. temperature, top_k, top_p: as in
    ``minillm.sampling.sample_next`` (temperature 0 is greedy). kv_cache: None, or an empty
    cache accepted by ``model.forward(ids, kv_cache=...)`` (chapter 09's ``KVCache``);
    use_cache: with no kv_cache, make a ``ConcatModelCache`` (needs
    ``model.config.n_layers``). A prompt longer than the cache holds (the context, or the
    cache's ``max_len``) is cropped to its last tokens; past it, the cache rolls or is
    refilled (see the module's docstring). A cache that can do neither must hold the prompt
    plus max_new_tokens minus 1.
    attention_mask: None, or a bool tensor of ids' shape, True for real tokens and False
    for the padding on the left of shorter prompts (passed to ``model.forward``, which
    then takes ``attention_mask=``); the new tokens are real.
    generator: a seeded ``torch.Generator`` makes the draws reproducible.
    The model runs in eval mode (no dropout) and is put back in its previous mode.
    """
    check_token_batch(ids)
    non_negative_int("max_new_tokens", max_new_tokens)
    boolean("use_cache", use_cache)
    check_sampling_arguments(temperature, top_k, top_p)
    if attention_mask is not None:
        check_attention_mask(attention_mask, tuple(ids.shape), "ids' shape")
        if eager_only() and not bool(attention_mask[:, -1].all()):
            raise ValueError("attention_mask must be True at the end of every row: pad the prompts on the left, "
                             "since each row is continued after its last token")
    context = model.config.context_length
    if kv_cache is None and use_cache:
        kv_cache = ConcatModelCache(model.config.n_layers)
    if kv_cache is not None:
        if int(kv_cache.length) != 0:
            raise ValueError(f"kv_cache must be empty, it holds {int(kv_cache.length)} positions")
        capacity = min(context, int(getattr(kv_cache, "max_len", context)))
        rolls = bool(getattr(kv_cache, "rolling", False))
        if not rolls and not callable(getattr(kv_cache, "reset", None)) and ids.shape[1] + max_new_tokens - 1 > capacity:
            raise ValueError(f"this kv_cache can neither roll nor reset, so the prompt ({ids.shape[1]} tokens) plus "
                             f"max_new_tokens ({max_new_tokens}) minus 1 must be <= what it holds ({capacity})")
    sample = dict(temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
    was_training = model.training
    model.eval()
    try:
        out, mask = ids, attention_mask
        for step in tqdm(range(max_new_tokens), desc="generating", disable=not progress):
            if kv_cache is None:
                inputs, extra = out[:, -context:], {} if mask is None else {"attention_mask": mask[:, -context:]}
            else:  # the prompt first, then the newest token alone; the cache holds the positions before them
                held = int(kv_cache.length)
                if step == 0:
                    inputs = out[:, -capacity:]
                elif held < capacity:
                    inputs = out[:, -1:]
                elif rolls:  # forget the oldest position
                    kv_cache.roll(1, attention_mask=None if mask is None else mask[:, -held - 1:-1])
                    inputs, held = out[:, -1:], held - 1
                else:  # start again from the last half of the window
                    kv_cache.reset()
                    inputs, held = out[:, -max(1, capacity // 2):], 0
                extra = {"kv_cache": kv_cache}
                if mask is not None:  # the mask covers the cached positions and the new ones
                    extra["attention_mask"] = mask[:, -(held + inputs.shape[1]):]
            logits, _ = model(inputs, **extra)
            next_ids = sample_next(logits[:, -1], **sample)
            out = torch.cat([out, next_ids[:, None].to(out.dtype)], dim=1)
            if mask is not None:
                mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
        return out
    finally:
        model.train(was_training)


def generate_text(model, tokenizer, prompt: str, max_new_tokens: int, **kwargs) -> str:
    """The prompt followed by ``max_new_tokens`` sampled tokens, decoded to text.

    tokenizer: ``encode(str) -> list[int]`` and ``decode(ids) -> str`` (a ``BPETokenizer``).
    kwargs: as ``generate``. The model's device is used for the ids.
    """
    if not isinstance(prompt, str) or not prompt:
        raise ValueError(f"prompt must be a non-empty str, got {prompt!r}")
    device = next(model.parameters()).device
    ids = torch.tensor([tokenizer.encode(prompt)], dtype=torch.long, device=device)
    return tokenizer.decode(generate(model, ids, max_new_tokens, **kwargs)[0].tolist())

# %% [markdown]
# The trained model, prompted with the tee's favourite opening, three ways. Greedy
# decoding, then sampling at temperature 0.8 with top-p 0.95 (the defaults of
# `python -m minillm generate`; its `--top-k 40` alone switches to top-k sampling, and
# giving both applies top-k, then top-p), then plain sampling at temperature 1.5:

# %%
from minillm import generate as reference_generate

for label, settings in (("greedy", dict(temperature=0)), ("temperature 0.8, top-p 0.95", dict(temperature=0.8, top_p=0.95)),
                        ("temperature 1.5", dict(temperature=1.5))):
    text = reference_generate.generate_text(trained, tokenizer, "ROMEO:", 80,
                                            generator=torch.Generator().manual_seed(7), **settings)
    print(f"--- {label} ---\n{text}\n")

# %% [markdown]
# Greedy decoding settles into a loop within a few lines ("I am a king, and I'll tell thee
# what thou / shall have thee dead", again and again), and it will never leave it: the same context always gives the same most likely token.
# Temperature 0.8 with a nucleus reads like Shakespeare at a distance: speaker names in
# capitals, verse-length lines, archaic words, grammar that holds for a few words at a
# time. At 1.5 the tail takes over and the words dissolve. (Rerun with another seed: the
# sampled texts change, the greedy one does not.)
#
# One question to think about (graded by your instructor):

# %% [markdown]
# #| written why_not_greedy points=2
# **Question.** The model is trained to maximize the probability of the true next token.
# Why, then, is always choosing the most probable token (greedy decoding) a poor way to
# generate text from it? And why does a nucleus (top-p) cut the tail better than a fixed
# top-k? Answer in four to six sentences.
#
# ### BEGIN SOLUTION
# *Model answer.* Training makes each next-token distribution match the data's; a text
# made of the most probable token at every step is not a typical text, because the
# probability of a whole sequence is a product, and the sequence of locally best choices
# neither maximizes it nor looks like real text: it is bland and, since the same context
# always gives the same choice, it falls into loops it cannot leave (as the greedy sample
# shows). Sampling reproduces the model's distribution, but the long tail of thousands of
# individually unlikely tokens together holds real mass, and one draw from it derails the
# continuation; truncating the tail removes those draws. A fixed $k$ ignores the shape of
# the distribution: where the model is confident (inside a word) $k$ tokens let wrong
# candidates in, and where it is uncertain (where a new word starts) it cuts off good ones.
# Top-p keeps a fixed share of the probability mass, so the number of candidates follows
# the model's confidence: one or two tokens in one place, hundreds in another.
#
# *Grading:* 1 point for why greedy fails (local choices are not typical text; repetition
# loops because decoding is deterministic); 1 point for the adaptive-candidate-set
# argument for top-p against top-k.
# ### END SOLUTION

# %% [markdown]
# ## A BERT-style contrast
#
# The tee's left sleeve draws an *encoder* layer: attention without a causal mask, so
# every token sees every other, on both sides. BERT (Devlin et al., 2018) stacks such
# layers and trains them as a **masked language model**: hide about 15% of the tokens
# behind a `[MASK]` token and predict each hidden token from everything around it. Our
# `GPT` becomes that model with one switch, `architecture="encoder"` (the blocks drop the
# causal mask), and one extra vocabulary entry for `[MASK]`; the loss counts only the
# hidden positions (the others get the target `-100`, which `summed_nll` and
# `F.cross_entropy` leave out).
#
# The encoder below is a twin of the small GPT trained in the Training section: the same
# shape and switches, the same batches in the same order, the same number of steps, the
# same optimizer and schedule, the same `train`. (That GPT got the extra vocabulary entry
# too, unused, so the two have exactly the same parameters.) Only the attention mask and
# the task differ, and the task is the `loss_fn` handed to `train`: it hides tokens, and
# logs which share of them it hid.
# That is why it is built as `GPT(architecture="encoder")`, pre-norm with RoPE, RMSNorm
# and SwiGLU, and not from the sleeve's `minillm.block.EncoderLayer` (chapter 06): that
# layer is post-norm with LayerNorm and a ReLU or GELU FFN, and has no positions of its
# own, so the comparison would change four things at once.

# %%
mask_id = len(tokenizer)  # the extra vocabulary entry: [MASK]


def mask_tokens(ids: torch.Tensor, fraction: float, generator: torch.Generator):
    """BERT's corruption, simplified: each token is hidden with probability ``fraction``.

    Returns (inputs, targets): inputs with the hidden tokens replaced by ``mask_id``, and
    targets holding the hidden tokens' ids and -100 everywhere else.
    """
    hidden = torch.rand(ids.shape, generator=generator) < fraction
    return ids.masked_fill(hidden, mask_id), ids.masked_fill(~hidden, -100)


masking = torch.Generator().manual_seed(2)


def masked_lm_loss(model, batch):
    """The masked language model's loss on a batch (x, y) of windows (y is not needed), and
    the share of tokens it hid."""
    inputs, targets = mask_tokens(batch[0], 0.15, masking)
    _, loss = model(inputs, targets)
    return loss, {"hidden": (targets != -100).float().mean().item()}


torch.manual_seed(0)
encoder = reference_model.GPT(reference_model.GPTConfig(vocab_size=len(tokenizer) + 1, architecture="encoder", **small))
encoder_batches = reference_batches.BatchSampler(train_tokens, batch_size=16, context=64)  # the GPT's batches
encoder_history = reference_train.train(encoder, encoder_batches, demo_config, loss_fn=masked_lm_loss).history
print(f"masked LM: {demo_config.steps} steps, {sum(encoder_history['hidden']) / demo_config.steps:.1%} of the tokens "
      f"hidden; loss on the hidden tokens {encoder_history['train_loss'][0]:.2f} → "
      f"{sum(encoder_history['train_loss'][-10:]) / 10:.2f} nats per token (mean of the last 10 batches)")

# %% [markdown]
# Now both predict the same hidden tokens of the validation text: every eighth position
# of 100 windows. The encoder gets each window with that one token masked (both sides
# visible), and again cut just after that token, so that the masked token is the last one
# and only the left side is there (what it would see if asked to continue a text); the
# GPT predicts it from the tokens before it, as always.

# %%
encoder.eval()
windows = val_ids[: 64 * 100].reshape(100, 64)
results = {"encoder, both sides visible": 0.0, "encoder, left side only": 0.0, "GPT (left side, always)": 0.0}
hidden_positions = range(8, 64, 8)
with torch.no_grad():
    gpt_logits = demo.eval()(windows)[0]
    for position in hidden_positions:
        target = windows[:, position]
        both, left = windows.clone(), windows[:, : position + 1].clone()  # left: the window cut after the target
        both[:, position] = mask_id
        left[:, -1] = mask_id
        results["encoder, both sides visible"] += F.cross_entropy(encoder(both)[0][:, position], target).item()
        results["encoder, left side only"] += F.cross_entropy(encoder(left)[0][:, -1], target).item()
        results["GPT (left side, always)"] += F.cross_entropy(gpt_logits[:, position - 1], target).item()
print(f"loss on {100 * len(hidden_positions)} hidden validation tokens, after {demo_config.steps} training steps each:")
for name, total in results.items():
    print(f"  {name:28s} {total / len(hidden_positions):.2f} nats per token")

# %% [markdown]
# (Full mode; after the 40 steps of quick mode neither model has learned much.) Two
# things show. The encoder predicts a hidden token better when it can see what follows,
# 5.52 nats per token against 6.12 with the left side only: it has learned to use the
# right side, which a GPT never sees. And yet the GPT, trained for as many steps on the
# same batches, predicts *better*, 4.62, from the left side alone than the encoder does
# from both: every position of every window was a training target for the GPT, but only
# the 15% the encoder hid were targets for it. Given only the left side, the situation of
# generating text, the encoder is far behind (6.12 against 4.62). Masked language models
# need much more training for the same quality (the ELECTRA paper, 2020, makes this its
# starting point), and what they are good at is *representing* a given text, not
# continuing it.
#
# What each model looks at, in its first layer (the attention weights of head 1 on one
# validation window):

# %%
with torch.no_grad():
    ids = windows[:1, :24]
    maps = [model.blocks[0].attn.attention_weights(model.blocks[0].norm1(model.token_embedding(ids)))[0, 0]
            for model in (demo, encoder)]
fig, axes = plt.subplots(1, 2, figsize=(9, 4.2))
for ax, weights, title in zip(axes, maps, ("GPT (causal): only the past", "encoder (BERT-style): both sides")):
    ax.imshow(weights, cmap="Blues")
    ax.set_title(title)
    ax.set_xlabel("key position (the token looked at)")
axes[0].set_ylabel("query position (the token looking)")
fig.suptitle("First-layer attention of the two models on the same 24 tokens")
plt.tight_layout()
plt.show()

# %% [markdown]
# The GPT's map is lower-triangular: a token never looks ahead, which is what lets one
# forward pass train every position at once, and what lets it generate. The encoder's
# head looks ahead as readily as back: its map has weight on both sides of the diagonal.
# That is why BERT-style models are the workhorses for understanding a given text
# (classification, retrieval, tagging), and GPT-style models for producing text.

# %% [markdown]
# #| written encoder_cannot_generate points=2
# **Question.** The encoder sees both sides of a hidden token, and uses them. Why can you
# not simply use it to generate text left to right, one token at a time, the way
# `generate` uses the GPT? Name what goes wrong, and what a GPT's training gets from its
# causal mask that the masked model's training does not (the measurement above is a
# hint). Answer in three to five sentences.
#
# ### BEGIN SOLUTION
# *Model answer.* The encoder was trained to fill a hidden token *given both sides*; when
# generating, the right side does not exist yet, so every step would present it with an
# input unlike its training (a prefix ending in the mask, nothing after it), where it
# predicts worst (6.12 nats per token above, against 5.52 with both sides and 4.62 for
# the GPT), and its predictions are not a proper left-to-right distribution: there is no
# factorization $p(x) = \prod_t p(x_t \mid x_{<t})$ to sample from. It would also have to rerun
# everything each step, because a new token changes the representation of every earlier
# one (no cache is possible). The GPT's causal mask makes each position's prediction
# depend only on its prefix, which is exactly the conditional that generation needs, and
# it lets one forward pass train all positions of a window at once (every token is a
# target), where the masked model learns from only the 15% it hid.
#
# *Grading:* 1 point for the mismatch between training (both sides visible) and
# generation (no right context; no valid left-to-right factorization); 1 point for what
# the causal mask buys (the prefix conditional, every position a training target at once,
# as the measurement shows, or cacheable keys and values).
# ### END SOLUTION

# %% [markdown]
# ## Tee check
#
# > **The shirt:** the back graphic ends in *output generation*: a linear projection to
# > logits, a softmax, and the next token, drawn as one more stage of the same pipeline.
#
# **What is right:** that is the model's last step: `Norm(h) @ E.T` gives the logits, a
# softmax gives the distribution, and a sampler picks the token, exactly the functions of
# this chapter.
#
# **What is loose:**
# - *One* stage, run once? During training the pipeline runs once per window and scores
#   every position at once. Generation runs the whole pipeline once **per token**, each time
#   on a longer context: it is sequential in a way training is not.
# - *Softmax → token* hides a choice the shirt does not show: greedy, temperature, top-k,
#   top-p. The same trained model writes loops or Shakespeare-like verse depending only
#   on that choice (the samples above), and greedy decoding needs no softmax at all.
#
# Measured on the shipped model: one forward pass that scores 128 positions at once,
# against generating 127 tokens one by one (without a cache, as this chapter does;
# chapter 09 adds one), and, to see where a step's time goes, a pass over a single
# position.

# %%
n = trained.config.context_length
with torch.no_grad():
    window = val_ids[:n][None]
    trained(window)  # warm up
    # the fastest of several runs (milliseconds): the least disturbed by a busy machine
    full = 1000 * course.best_seconds(lambda: trained(window), 20)
    single = 1000 * course.best_seconds(lambda: trained(window[:, :1]), 20)
    generation = 1000 * course.best_seconds(
        lambda: reference_generate.generate(trained, window[:, :1], n - 1, temperature=0), 1 if course.QUICK else 3)
per_token = generation / (n - 1)
print(f"one pass over {n} positions (training-style): {full:6.2f} ms")
print(f"one pass over 1 position:                   {single:6.2f} ms ({single / full:.0%} of the time, 1/{n} of the "
      f"arithmetic)")
print(f"generation, {n - 1} tokens one at a time:     {per_token:6.2f} ms per token ({per_token / full:.0%} of a "
      f"{n}-position pass), {generation:.0f} ms in all")
print(f"generating is {generation / full:.0f} times slower than scoring the same number of positions")

# %% [markdown]
# Producing the same number of tokens takes tens to hundreds of times longer than
# scoring them: each token needs its own pass, and the passes cannot overlap. Now look at
# the pass over a single position. It does 1/128 of the arithmetic of the full pass, yet it is nowhere near 128 times faster: at this size,
# every call to the model pays a fixed cost (Python, and the launch of a few hundred
# small tensor operations, each too small to keep a core busy) before the arithmetic that
# grows with the positions. A generation step, which needs only its last position's
# logits, costs more than half of a full pass for both reasons: without a cache it
# redoes the arithmetic of its whole context, 64 positions on average, and it pays the
# fixed cost once more. That makes chapter 09 an honest question. A KV cache turns
# every generation step into a one-position pass: it removes the repeated arithmetic over
# the context, but not the fixed cost per call, so on this model a step cannot get
# cheaper than the one-position pass above, and the cache saves much less than counting
# operations suggests. On a large model, where the arithmetic dominates, it saves what
# the count suggests. The sequential loop itself, one call per token, is what every
# inference optimization after it attacks.
#
# ## What `minillm` gained
#
# - `minillm.model`: `GPTConfig` (extends `ModelConfig`; the switches of chapters 02–06,
#   each a name in its registry, `d_ff` by the FFN's own rule, `ffn_options` for the FFN)
#   and `GPT` with `forward(ids, targets=None, kv_cache=None, attention_mask=None)` →
#   `(logits, loss)`, auxiliary losses of its components included; `count_parameters(config,
#   active=False, non_embedding=False)`, the model's own count. Chapter 00's
#   `count_parameters(config)` equals the built model's size for every switch setting (the
#   tests check all 192 combinations of positions, norm, placement, FFN, bias and tying,
#   and 9 more configurations).
# - `minillm.loss`: `summed_nll` (Exercise 1), `token_nll`, `nats_per_char`.
# - `minillm.optim`: `param_groups`, `build_optimizer`; `lr_schedule` (Exercise 2),
#   `build_scheduler`.
# - `minillm.batches`: `BatchSampler` (sharded by rank for data-parallel training).
# - `minillm.train`: `TrainConfig`, `train(model, batches, config, *, loss_fn=lm_loss,
#   evaluate=None, state=None, ...)` for any module, batches and loss, and `TrainState`,
#   which saves and resumes exactly; `held_out_loss`, `unwrap`, `save_model`, `load_model`.
# - `minillm.recipe`: the recipe of `make train` (`DEFAULT_RECIPE`, `recipe_config`,
#   `recipe_train_config`) and the shipped model's files (`pretrained_paths`,
#   `load_pretrained`); `minillm.curves.plot_history` draws a run's loss curves.
# - `minillm.sampling`: `greedy`, `apply_temperature`, `top_k_filter` (Exercise 3),
#   `top_p_filter` (Exercise 4), `sample_next`.
# - `minillm.generate`: `generate(model, ids, max_new_tokens, temperature=1.0, top_k=None,
#   top_p=None, kv_cache=None, use_cache=False, attention_mask=None)` (batches of prompts
#   padded on the left) and `generate_text`.
# - The command line, `python -m minillm train | generate | evaluate`, and the shipped
#   model in `data/`, which later chapters load with `minillm.recipe.load_pretrained()`.
#   (`minillm.convert.from_hf_gpt2` loads a Hugging Face GPT-2 into `GPT`; the tests
#   check the logits against `transformers`.)
#
# Chapter 08 asks how the loss falls with model size and data, chapter 09 adds the fast
# cache that `generate` is ready for, and chapters 10–13 speed up, sparsify, adapt and align
# this model.
#
# ## Further reading
#
# - Shannon, *Prediction and Entropy of Printed English* (1951): bits per character of English.
# - Vaswani et al., *Attention Is All You Need* (2017).
# - Loshchilov & Hutter, *SGDR: Stochastic Gradient Descent with Warm Restarts* (2017): cosine schedules.
# - Radford et al., *Improving Language Understanding by Generative Pre-Training* (2018): GPT.
# - Devlin et al., *BERT: Pre-training of Deep Bidirectional Transformers for Language Understanding* (2018).
# - Fan, Lewis & Dauphin, *Hierarchical Neural Story Generation* (2018): top-k sampling.
# - Loshchilov & Hutter, *Decoupled Weight Decay Regularization* (2019): AdamW.
# - Radford et al., *Language Models are Unsupervised Multitask Learners* (2019): GPT-2, its initialization and pre-norm.
# - Holtzman et al., *The Curious Case of Neural Text Degeneration* (2019): nucleus (top-p) sampling.
# - Zhang & Sennrich, *Root Mean Square Layer Normalization* (2019): RMSNorm.
# - Clark et al., *ELECTRA: Pre-training Text Encoders as Discriminators Rather Than Generators* (2020): why masked LMs learn slowly.
# - Shazeer, *GLU Variants Improve Transformer* (2020): SwiGLU.
# - Su et al., *RoFormer: Enhanced Transformer with Rotary Position Embedding* (2021): RoPE.
# - Karpathy, *nanoGPT* (2022): the small, readable GPT training code this chapter's loop resembles.
# - Touvron et al., *LLaMA: Open and Efficient Foundation Language Models* (2023): the recipe our default model copies.
