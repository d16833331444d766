"""The course map: chapters, where each sits on the tee, and the Tech Band index.

Infrastructure (no chapter teaches it). The README's course map and chapter 00's index
are printed from here, and a test checks that the index is complete.
"""
from __future__ import annotations

from typing import NamedTuple


class Chapter(NamedTuple):
    slug: str
    title: str
    tee: str  # where the chapter sits on the tee
    modules: tuple[str, ...]  # what it adds to minillm
    minutes: int  # reading plus exercises


class TechBandTerm(NamedTuple):
    term: str  # as printed on the Tech Band
    slug: str  # the chapter that teaches it
    section: str  # the heading of the section, in that chapter
    symbol: str  # where it lives in minillm


CHAPTERS = (
    Chapter("00_history", "From recurrence to attention: a short history", "the whole shirt: the map", ("minillm.config", "minillm.history"), 90),
    Chapter("01_tokenization", "Byte-level BPE tokenization", "right sleeve: \"Code is art...\" → token ids", ("minillm.tokenizer",), 90),
    Chapter("02_embeddings", "Token embeddings", "right sleeve: ids → embeddings", ("minillm.embedding",), 60),
    Chapter("03_positional_encoding", "Positional encodings: sinusoidal, learned, RoPE, ALiBi", "right sleeve: + sinusoidal encodings", ("minillm.positional",), 90),
    Chapter("04_attention", "Attention: scaled dot-product, multi-head, GQA", "left sleeve: MHA; Tech Band core", ("minillm.attention",), 120),
    Chapter("05_feed_forward", "The feed-forward network: GELU and SwiGLU", "left sleeve: Dense → GELU → Dense", ("minillm.ffn",), 60),
    Chapter("06_normalization", "Normalization and residuals", "left sleeve: Add & Norm", ("minillm.norm", "minillm.block"), 75),
    Chapter("07_mini_llm", "The mini-LLM: assemble, train, sample", "back graphic, end to end", ("minillm.model", "minillm.loss", "minillm.optim", "minillm.batches", "minillm.train", "minillm.train_state", "minillm.recipe", "minillm.sampling", "minillm.generate", "minillm.convert"), 120),
    Chapter("08_scaling", "Scaling laws and data-parallel training", "back graphic: bigger", ("minillm.scaling",), 75),
    Chapter("09_kv_cache", "The KV cache", "Tech Band: KV Cache", ("minillm.kvcache",), 60),
    Chapter("10_flash_attention", "FlashAttention: tiling and online softmax", "Tech Band: FlashAttention", ("minillm.flash",), 90),
    Chapter("11_mixture_of_experts", "Mixture of experts", "Tech Band: MoE", ("minillm.moe",), 75),
    Chapter("12_lora", "LoRA: low-rank adaptation", "Tech Band: LoRA", ("minillm.lora",), 60),
    Chapter("13_dpo", "DPO: preference alignment", "Tech Band: DPO", ("minillm.dpo",), 75),
)

TECH_BAND = (
    TechBandTerm("BPE", "01_tokenization", "Byte-level BPE", "minillm.tokenizer.BPETokenizer"),
    TechBandTerm("Pos-Encoding", "03_positional_encoding", "Sinusoidal encodings", "minillm.positional.sinusoidal_encoding"),
    TechBandTerm("RoPE", "03_positional_encoding", "RoPE", "minillm.positional.apply_rope"),
    TechBandTerm("ALiBi", "03_positional_encoding", "ALiBi", "minillm.positional.alibi_bias"),
    TechBandTerm("Softmax", "04_attention", "A stable softmax", "minillm.attention.softmax"),
    TechBandTerm("Q,K,V", "04_attention", "Queries, keys and values", "minillm.attention.MultiHeadAttention"),
    TechBandTerm("Self-Attention", "04_attention", "Self-attention", "minillm.attention.scaled_dot_product_attention"),
    TechBandTerm("Scaled Dot-Product", "04_attention", "Why divide by the square root of d_k", "minillm.attention.scaled_dot_product_attention"),
    TechBandTerm("MHA", "04_attention", "Multi-head attention", "minillm.attention.MultiHeadAttention"),
    TechBandTerm("GQA", "04_attention", "Grouped-query attention", "minillm.attention.MultiHeadAttention"),
    TechBandTerm("FFN", "05_feed_forward", "The position-wise feed-forward network", "minillm.ffn.FeedForward"),
    TechBandTerm("SwiGLU", "05_feed_forward", "SwiGLU", "minillm.ffn.SwiGLU"),
    TechBandTerm("LayerNorm", "06_normalization", "LayerNorm", "minillm.norm.LayerNorm"),
    TechBandTerm("RMSNorm", "06_normalization", "RMSNorm", "minillm.norm.RMSNorm"),
    TechBandTerm("Residual", "06_normalization", "Residual connections", "minillm.block.TransformerBlock"),
    TechBandTerm("KV Cache", "09_kv_cache", "The KV cache", "minillm.kvcache.KVCache"),
    TechBandTerm("FlashAttention", "10_flash_attention", "Online softmax", "minillm.flash.flash_attention"),
    TechBandTerm("MoE", "11_mixture_of_experts", "Routing tokens to experts", "minillm.moe.MoEFeedForward"),
    TechBandTerm("LoRA", "12_lora", "Low-rank adapters", "minillm.lora.LoRALinear"),
    TechBandTerm("DPO", "13_dpo", "The DPO loss", "minillm.dpo.dpo_loss"),
)


def chapter(slug: str) -> Chapter:
    """The chapter with this slug; ``ValueError`` when there is none."""
    for entry in CHAPTERS:
        if entry.slug == slug:
            return entry
    raise ValueError(f"unknown chapter slug {slug!r}; known: {[c.slug for c in CHAPTERS]}")
