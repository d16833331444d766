"""The mini-LLM: ``GPTConfig`` and ``GPT``, assembled from the earlier chapters (chapter 07).

Token ids (batch, seq) → token embeddings (chapter 02) + positions (chapter 03) → a stack
of Transformer blocks (attention, chapter 04; feed-forward network, chapter 05; norms
and residuals, chapter 06) → a final norm → a linear map to one logit per vocabulary
entry, (batch, seq, vocab). The config's switches select the variants the course taught;
``count_parameters(config)`` (chapter 00) equals the parameter count of ``GPT(config)``.

Hook for chapter 09: ``forward(ids, kv_cache=cache)`` takes a model-wide cache with a
``length`` (positions already cached) and ``layer(i)``, the ``KVCacheLike`` of block i.
"""
import math
from dataclasses import asdict, dataclass, fields
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from minillm.attention import KVCacheLike, get_attention_backend
from minillm.block import TransformerBlock
from minillm.config import ModelConfig
from minillm.embedding import TokenEmbedding
from minillm.ffn import FFN_REGISTRY
from minillm.norm import build_norm
from minillm.positional import LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding, alibi_bias

IGNORE_INDEX = -100  # a target equal to this is left out of the loss (as in F.cross_entropy)


@dataclass(frozen=True)
class GPTConfig(ModelConfig):
    """A ``ModelConfig`` (same fields, same meaning) plus what training and building need.

    architecture: "decoder" (causal, a GPT) or "encoder" (bidirectional, BERT-style; for
    the masked-LM contrast). ffn: a name in the FFN registry ("gelu", "relu", "swiglu").
    gelu_approximate: "none" or "tanh" (GPT-2's GELU) for ffn "gelu".
    dropout: on the embeddings, attention weights and both residual branches while
    training. attention_backend: a name in the attention-backend registry ("math", "sdpa").
    eps: the norms' epsilon. scale_embeddings: multiply token embeddings by sqrt(d_model)
    (the 2017 Transformer; off, as in GPT-2). rope_theta: RoPE's base. init_std: standard
    deviation of the initial weights (GPT-2's 0.02; residual output projections get
    init_std / sqrt(2 n_layers)).
    """

    dropout: float = 0.0
    attention_backend: str = "math"
    eps: float = 1e-5
    scale_embeddings: bool = False
    gelu_approximate: str = "none"
    rope_theta: float = 10000.0
    init_std: float = 0.02

    def __post_init__(self):
        super().__post_init__()
        if self.architecture not in ("decoder", "encoder"):
            raise ValueError(f"architecture must be 'decoder' or 'encoder' for a GPT, got {self.architecture!r}")
        if self.n_token_types or self.pooler:
            raise ValueError("n_token_types and pooler are BERT's extras; a GPT has neither "
                             f"(got n_token_types={self.n_token_types}, pooler={self.pooler})")
        if self.ffn not in FFN_REGISTRY:
            raise ValueError(f"ffn must be a registered FFN, one of {sorted(FFN_REGISTRY)}, got {self.ffn!r}")
        if self.gelu_approximate not in ("none", "tanh"):
            raise ValueError(f"gelu_approximate must be 'none' or 'tanh', got {self.gelu_approximate!r}")
        if self.gelu_approximate == "tanh" and self.ffn != "gelu":
            raise ValueError(f"gelu_approximate='tanh' needs ffn='gelu', got ffn={self.ffn!r}")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) or not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be a probability in [0, 1), got {self.dropout!r}")
        for name in ("eps", "init_std"):
            if not isinstance(getattr(self, name), (int, float)) or not getattr(self, name) > 0:
                raise ValueError(f"{name} must be a number > 0, got {getattr(self, name)!r}")
        if not isinstance(self.rope_theta, (int, float)) or not self.rope_theta > 1:
            raise ValueError(f"rope_theta must be a number > 1, got {self.rope_theta!r}")
        if self.positions == "sinusoidal" and self.d_model % 2:
            raise ValueError(f"sinusoidal positions need an even d_model, got {self.d_model}")
        if self.positions == "rope" and self.head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim (d_model // n_heads), got {self.head_dim}")
        if self.positions == "alibi" and self.architecture == "encoder":
            raise ValueError("ALiBi's bias as built here assumes causal attention: use another "
                             "positions choice with architecture='encoder'")
        get_attention_backend(self.attention_backend)

    @property
    def ffn_name(self) -> str:
        """The FFN registry entry the blocks are built from."""
        return "gelu_tanh" if self.gelu_approximate == "tanh" else self.ffn

    def to_dict(self) -> dict:
        """The fields as a plain dict (what checkpoints store)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "GPTConfig":
        """The config ``to_dict`` wrote; ``ValueError`` naming unknown keys."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown GPTConfig fields {unknown}")
        return cls(**values)


class ModelCacheLike(Protocol):
    """What ``GPT.forward(..., kv_cache=...)`` needs from a cache (chapter 09 builds one)."""

    length: int  # positions already cached, read once before a forward pass

    def layer(self, index: int) -> KVCacheLike:
        """The cache of block ``index``: ``update(k, v)`` appends and returns all keys and values."""
        ...


class GPT(nn.Module):
    """A decoder-only Transformer language model built from ``minillm``'s components.

    Submodules: ``token_embedding`` (a ``TokenEmbedding``; its weight is the output head
    when ``tie_embeddings``), ``position_embedding`` (learned or sinusoidal positions;
    None for RoPE and ALiBi, which act inside attention), ``embedding_norm`` (or None),
    ``blocks`` (a ModuleList of ``TransformerBlock``), ``final_norm`` (or None) and
    ``lm_head`` (a bias-free Linear, or None when tied).
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
        self.config = c = config
        self.token_embedding = TokenEmbedding(c.vocab_size, c.d_model, scale=c.scale_embeddings, init_std=c.init_std)
        self.position_embedding = None
        if c.positions == "learned":
            self.position_embedding = LearnedPositionalEmbedding(c.context_length, c.d_model, init_std=c.init_std)
        elif c.positions == "sinusoidal":
            self.position_embedding = SinusoidalPositionalEncoding(c.d_model)
        self.rotary = RotaryEmbedding(c.head_dim, theta=c.rope_theta) if c.positions == "rope" else None
        self.embedding_norm = build_norm(c.norm, c.d_model, eps=c.eps, bias=c.bias) if c.embedding_norm else None
        self.dropout = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(c.d_model, c.n_heads, c.d_ff, n_kv_heads=c.n_kv_heads, norm=c.norm,
                             norm_placement=c.norm_placement, ffn=c.ffn_name, bias=c.bias, dropout=c.dropout,
                             attention_backend=c.attention_backend,
                             rotary=None if self.rotary is None else self.rotary.rotate, eps=c.eps,
                             causal=c.architecture == "decoder")
            for _ in range(c.n_layers)
        )
        self.final_norm = build_norm(c.norm, c.d_model, eps=c.eps, bias=c.bias) if c.final_norm else None
        self.lm_head = None if c.tie_embeddings else nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2's initialization: weights N(0, init_std²), residual output projections
        N(0, init_std² / (2 n_layers)), biases 0, norms 1 (their own initialization)."""
        std = self.config.init_std
        residual_std = std / math.sqrt(2 * self.config.n_layers)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                residual = name.endswith(("attn.out", "ffn.w2"))
                nn.init.normal_(module.weight, mean=0.0, std=residual_std if residual else std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        nn.init.normal_(self.token_embedding.weight, mean=0.0, std=std)
        if isinstance(self.position_embedding, LearnedPositionalEmbedding):
            nn.init.normal_(self.position_embedding.weight, mean=0.0, std=std)

    def extra_repr(self) -> str:
        c = self.config
        return (f"{c.positions} positions, {c.norm_placement}-{c.norm}, ffn={c.ffn_name}, "
                f"{'tied' if c.tie_embeddings else 'untied'} embeddings, {c.architecture}")

    def forward(self, ids: torch.Tensor, targets: torch.Tensor | None = None,
                kv_cache: ModelCacheLike | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ids: (batch, seq) integer token ids. Returns (logits, loss).

        logits: (batch, seq, vocab_size); position t scores the token that follows ids[:, t].
        loss: None without targets; else the mean cross-entropy (nats per token) of
        targets (batch, seq), leaving out targets equal to -100.
        kv_cache: None, or a cache holding the keys and values of the ``kv_cache.length``
        positions before ids (chapter 09); the new ones are appended.
        A sequence longer than the context (cached positions included) is a ``ValueError``.
        """
        if not isinstance(ids, torch.Tensor) or ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise TypeError(f"ids must be an integer tensor, got {getattr(ids, 'dtype', type(ids).__name__)}")
        if ids.dim() != 2 or ids.shape[1] == 0:
            raise ValueError(f"ids must have shape (batch, seq) with seq >= 1, got {tuple(ids.shape)}")
        c = self.config
        seq = ids.shape[1]
        start = 0 if kv_cache is None else int(kv_cache.length)
        if start + seq > c.context_length:
            cached = f" after {start} cached positions" if start else ""
            raise ValueError(f"ids holds {seq} positions{cached}, more than the context length "
                             f"{c.context_length}: crop the input to its last {c.context_length - start} tokens")
        positions = torch.arange(start, start + seq, device=ids.device)
        x = self.token_embedding(ids)
        if self.position_embedding is not None:
            x = x + self.position_embedding(positions).to(x.dtype)
        if self.embedding_norm is not None:
            x = self.embedding_norm(x)
        x = self.dropout(x)
        mask = None
        if c.positions == "alibi":
            mask = alibi_bias(c.n_heads, seq, start + seq, device=ids.device).to(x.dtype)
        for index, block in enumerate(self.blocks):
            layer_cache = None if kv_cache is None else kv_cache.layer(index)
            x = block(x, mask=mask, positions=positions, kv_cache=layer_cache)
        if self.final_norm is not None:
            x = self.final_norm(x)
        logits = self.token_embedding.logits(x) if self.lm_head is None else self.lm_head(x)
        if targets is None:
            return logits, None
        if not isinstance(targets, torch.Tensor) or targets.shape != ids.shape:
            raise ValueError(f"targets must be a tensor of ids' shape {tuple(ids.shape)}, "
                             f"got {getattr(targets, 'shape', type(targets).__name__)}")
        loss = F.cross_entropy(logits.reshape(-1, c.vocab_size).float(), targets.reshape(-1).long(),
                               ignore_index=IGNORE_INDEX)
        return logits, loss
