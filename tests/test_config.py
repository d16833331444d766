"""minillm.config: exact parameter counts, checked against models built by other libraries."""
from dataclasses import dataclass, replace

import pytest
import torch

from minillm.config import (
    CHOICES, PRESETS, PUBLISHED, GPT2_SIZES, ModelConfig, attention_parameters, block_parameters, count_parameters,
    ffn_parameters, norm_parameters,
)


@pytest.fixture(scope="module")
def transformers():
    import transformers

    return transformers


def n_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() counts tied weights once


def linears(shapes, bias: bool) -> int:
    """Parameters of torch.nn.Linear(i, o) for each (i, o), on the meta device."""
    return sum(n_parameters(torch.nn.Linear(i, o, bias=bias, device="meta")) for i, o in shapes)


def built(name: str, transformers) -> torch.nn.Module:
    """The preset's model, built on the meta device by an independent implementation."""
    cfg = PRESETS[name]
    with torch.device("meta"):
        if name == "transformer-base":
            shared_embedding = torch.nn.Embedding(cfg.vocab_size, cfg.d_model)
            core = torch.nn.Transformer(cfg.d_model, cfg.n_heads, cfg.n_layers, cfg.n_decoder_layers,
                                        cfg.d_ff, batch_first=True)
            return torch.nn.ModuleList([shared_embedding, core])
        if name == "gpt1":
            return transformers.OpenAIGPTLMHeadModel(transformers.OpenAIGPTConfig(
                vocab_size=cfg.vocab_size, n_positions=cfg.context_length))
        if name == "bert-base":
            return transformers.BertModel(transformers.BertConfig(vocab_size=cfg.vocab_size))
        if name == "llama-7b":
            return transformers.LlamaForCausalLM(transformers.LlamaConfig(
                vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
                num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                max_position_embeddings=cfg.context_length))
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=cfg.vocab_size, n_positions=cfg.context_length, n_embd=cfg.d_model,
            n_layer=cfg.n_layers, n_head=cfg.n_heads, n_inner=cfg.d_ff))


@pytest.mark.parametrize("name", list(PRESETS))
def test_count_equals_built_model(name, transformers):
    assert count_parameters(PRESETS[name]) == n_parameters(built(name, transformers))


def test_gpt2_small_known_value():
    # The widely quoted exact count of GPT-2 small (the paper rounds it to "117M").
    assert count_parameters(PRESETS["gpt2"]) == 124_439_808


def test_published_gpt2_sizes_are_counts_with_gpt1_vocabulary():
    # The chapter's explanation of GPT-2's published sizes: counted with GPT-1's vocabulary,
    # every size rounds to the published figure, while the real vocabulary never does.
    for name in GPT2_SIZES:
        published = PUBLISHED[name][1]
        old_vocabulary = replace(PRESETS[name], vocab_size=PRESETS["gpt1"].vocab_size)
        assert round(count_parameters(old_vocabulary) / 1e6) == published / 1e6, name
        assert round(count_parameters(PRESETS[name]) / 1e6) != published / 1e6, name


def test_every_preset_has_a_published_figure():
    assert set(PUBLISHED) == set(PRESETS)
    for name, (year, figure) in PUBLISHED.items():
        assert 2017 <= year <= 2023 and 0.9 < count_parameters(PRESETS[name]) / figure < 1.1, name


@pytest.mark.parametrize("kv_heads", [1, 2, 8])
def test_grouped_query_attention_matches_llama(kv_heads, transformers):
    config = ModelConfig(vocab_size=1000, d_model=256, n_layers=2, n_heads=8, n_kv_heads=kv_heads, d_ff=688,
                         positions="rope", norm="rmsnorm", ffn="swiglu", bias=False, tie_embeddings=False)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=1000, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
            num_attention_heads=8, num_key_value_heads=kv_heads))
    assert count_parameters(config) == n_parameters(model)


def test_bert_style_model_matches_transformers(transformers):
    config = ModelConfig(vocab_size=1000, context_length=128, d_model=64, n_layers=2, n_heads=4, d_ff=256,
                         architecture="encoder", norm_placement="post", final_norm=False, embedding_norm=True,
                         n_token_types=2, pooler=True)
    with torch.device("meta"):
        model = transformers.BertModel(transformers.BertConfig(
            vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256,
            max_position_embeddings=128, type_vocab_size=2))
    assert count_parameters(config) == n_parameters(model) == 176_576  # the chapter's visible test uses this value


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("d, h, kv", [(64, 4, 4), (96, 6, 2), (128, 8, 1)])
def test_attention_parameters_against_linear_layers(d, h, kv, bias):
    config = ModelConfig(d_model=d, n_heads=h, n_kv_heads=kv, d_ff=4 * d, bias=bias)
    kv_width = kv * d // h
    assert attention_parameters(config) == linears([(d, d), (d, kv_width), (d, kv_width), (d, d)], bias)
    if kv == h:
        assert attention_parameters(config) == n_parameters(torch.nn.MultiheadAttention(d, h, bias=bias, device="meta"))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("ffn", ["gelu", "gelu_tanh", "relu", "swiglu"])
def test_ffn_parameters_against_linear_layers(ffn, bias):
    d, d_ff = 48, 136
    config = ModelConfig(d_model=d, n_heads=4, d_ff=d_ff, ffn=ffn, bias=bias)
    shapes = [(d, d_ff), (d_ff, d)] + ([(d, d_ff)] if ffn == "swiglu" else [])
    assert ffn_parameters(config) == linears(shapes, bias)


@pytest.mark.parametrize("norm, bias, module", [
    ("layernorm", True, lambda d: torch.nn.LayerNorm(d)),
    ("layernorm", False, lambda d: torch.nn.LayerNorm(d, bias=False)),
    ("rmsnorm", True, lambda d: torch.nn.RMSNorm(d)),
    ("rmsnorm", False, lambda d: torch.nn.RMSNorm(d)),
])
def test_norm_parameters_against_torch(norm, bias, module):
    assert norm_parameters(ModelConfig(d_model=40, n_heads=4, norm=norm, bias=bias)) == n_parameters(module(40))


def test_block_parameters_against_torch_layers():
    config = ModelConfig(d_model=64, n_heads=4, d_ff=200, ffn="relu")
    with torch.device("meta"):
        encoder_layer = torch.nn.TransformerEncoderLayer(64, 4, 200)
        decoder_layer = torch.nn.TransformerDecoderLayer(64, 4, 200)  # self-attention, cross-attention, 3 norms
    assert block_parameters(config) == n_parameters(encoder_layer)
    assert block_parameters(config, cross_attention=True) == n_parameters(decoder_layer)


def test_counts_are_ints():
    for config in PRESETS.values():
        for count in (attention_parameters(config), ffn_parameters(config), block_parameters(config),
                      count_parameters(config)):
            assert type(count) is int


def test_computed_positions_add_no_parameters():
    learned = ModelConfig(positions="learned")
    for positions in ("sinusoidal", "rope", "alibi"):
        other = ModelConfig(positions=positions)
        assert count_parameters(learned) - count_parameters(other) == learned.context_length * learned.d_model


def test_optional_parts_add_what_the_table_says():
    d, vocab = 64, 1000
    base = ModelConfig(vocab_size=vocab, d_model=d, n_heads=4, d_ff=128, final_norm=False)
    assert count_parameters(replace(base, tie_embeddings=False)) - count_parameters(base) == vocab * d
    assert count_parameters(replace(base, pooler=True)) - count_parameters(base) == d * d + d
    assert count_parameters(replace(base, n_token_types=3)) - count_parameters(base) == 3 * d
    assert count_parameters(replace(base, embedding_norm=True)) - count_parameters(base) == 2 * d
    assert count_parameters(replace(base, final_norm=True)) - count_parameters(base) == 2 * d
    encoder_decoder = replace(base, architecture="encoder-decoder", n_decoder_layers=3, final_norm=True)
    assert count_parameters(encoder_decoder) - count_parameters(replace(base, final_norm=True)) == (
        3 * block_parameters(base, cross_attention=True) + 2 * d)  # the decoder stack and its final norm


@pytest.mark.parametrize(
    "kwargs, error, argument",
    [
        ({"d_model": 100, "n_heads": 3}, ValueError, "d_model"),
        ({"n_heads": 12, "n_kv_heads": 5}, ValueError, "n_kv_heads"),
        ({"n_heads": 12, "n_kv_heads": 0}, ValueError, "n_kv_heads"),
        ({"vocab_size": 0}, ValueError, "vocab_size"),
        ({"vocab_size": True}, ValueError, "vocab_size"),
        ({"d_ff": 3072.0}, ValueError, "d_ff"),
        ({"ffn": "tanh"}, ValueError, "ffn"),
        ({"positions": "relative"}, ValueError, "positions"),
        ({"norm_placement": "middle"}, ValueError, "norm_placement"),
        ({"architecture": "encoder-decoder"}, ValueError, "n_decoder_layers"),
        ({"n_decoder_layers": 2}, ValueError, "n_decoder_layers"),
        ({"n_decoder_layers": -1}, ValueError, "n_decoder_layers"),
        ({"n_token_types": -2}, ValueError, "n_token_types"),
        ({"bias": "no"}, TypeError, "bias"),
        ({"tie_embeddings": 0}, TypeError, "tie_embeddings"),
    ],
)
def test_bad_config_names_the_argument(kwargs, error, argument):
    with pytest.raises(error, match=argument):
        ModelConfig(**kwargs)


def test_head_dim_and_kv_default():
    config = ModelConfig(d_model=768, n_heads=12)
    assert config.head_dim == 64 and config.n_kv_heads == 12


def test_the_closed_sets_stay_chapter_00s_and_a_subclass_may_open_them():
    # ModelConfig knows only its CHOICES ("moe" is chapter 11's); the choices() hook lets a
    # subclass (chapter 07's GPTConfig) answer with the names registered for its components.
    with pytest.raises(ValueError, match="ffn must be one of"):
        ModelConfig(ffn="moe")
    assert ModelConfig().choices() == CHOICES

    @dataclass(frozen=True)
    class Open(ModelConfig):
        def choices(self):
            return {**CHOICES, "ffn": CHOICES["ffn"] + ("moe",)}

    assert Open(ffn="moe").ffn == "moe"
    with pytest.raises(ValueError, match="ffn must be one of"):
        Open(ffn="tanh")
