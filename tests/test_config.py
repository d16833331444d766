"""minillm.config: exact parameter counts, checked against models built by other libraries."""
import pytest
import torch

from minillm.config import PRESETS, ModelConfig, attention_parameters, count_parameters, ffn_parameters

transformers = pytest.importorskip("transformers")


def n_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() counts tied weights once


def gpt2_config(cfg: ModelConfig):
    return transformers.GPT2Config(
        vocab_size=cfg.vocab_size, n_positions=cfg.context_length, n_embd=cfg.d_model,
        n_layer=cfg.n_layers, n_head=cfg.n_heads, n_inner=cfg.d_ff,
    )


def built(name: str) -> torch.nn.Module:
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
        return transformers.GPT2LMHeadModel(gpt2_config(cfg))


@pytest.mark.parametrize("name", list(PRESETS))
def test_count_equals_built_model(name):
    assert count_parameters(PRESETS[name]) == n_parameters(built(name))


def test_gpt2_small_known_value():
    # The widely quoted exact count of GPT-2 small (the paper rounds it to "117M").
    assert count_parameters(PRESETS["gpt2"]) == 124_439_808


@pytest.mark.parametrize("kv_heads", [1, 2, 8])
def test_grouped_query_attention_matches_llama(kv_heads):
    config = ModelConfig(vocab_size=1000, d_model=256, n_layers=2, n_heads=8, n_kv_heads=kv_heads, d_ff=688,
                         positions="rope", norm="rmsnorm", ffn="swiglu", bias=False, tie_embeddings=False)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=1000, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
            num_attention_heads=8, num_key_value_heads=kv_heads))
    assert count_parameters(config) == n_parameters(model)


def test_attention_and_ffn_against_torch_modules():
    config = ModelConfig(d_model=64, n_heads=4, d_ff=256)
    assert attention_parameters(config) == n_parameters(torch.nn.MultiheadAttention(64, 4))
    ffn = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    assert ffn_parameters(config) == n_parameters(ffn)


def test_computed_positions_add_no_parameters():
    learned = ModelConfig(positions="learned")
    for positions in ("sinusoidal", "rope", "alibi"):
        other = ModelConfig(positions=positions)
        assert count_parameters(learned) - count_parameters(other) == learned.context_length * learned.d_model


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        ({"d_model": 100, "n_heads": 3}, "d_model"),
        ({"n_heads": 12, "n_kv_heads": 5}, "n_kv_heads"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"ffn": "tanh"}, "ffn"),
        ({"positions": "relative"}, "positions"),
        ({"architecture": "encoder-decoder"}, "n_decoder_layers"),
    ],
)
def test_bad_config_names_the_argument(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        ModelConfig(**kwargs)


def test_head_dim():
    assert ModelConfig(d_model=768, n_heads=12).head_dim == 64
