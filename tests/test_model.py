"""minillm.model: chapter 00's parameter count, shapes, the loss, causality, the switches, bad input."""
import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from minillm.config import count_parameters
from minillm.model import GPT, GPTConfig

SMALL = dict(vocab_size=61, context_length=12, d_model=24, n_layers=2, n_heads=4, d_ff=40)


def _ids(batch=2, seq=9, vocab=61, seed=0):
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _numel(model):
    return sum(p.numel() for p in model.parameters())


SWITCHES = list(itertools.product(
    ["learned", "sinusoidal", "rope", "alibi"], ["layernorm", "rmsnorm"], ["pre", "post"], ["gelu", "relu", "swiglu"],
    [True, False], [True, False]))


@pytest.mark.parametrize("positions, norm, placement, ffn, bias, tied", SWITCHES)
def test_count_parameters_equals_the_built_model(positions, norm, placement, ffn, bias, tied):
    config = GPTConfig(**SMALL, positions=positions, norm=norm, norm_placement=placement, ffn=ffn, bias=bias,
                       tie_embeddings=tied)
    assert count_parameters(config) == _numel(GPT(config))


@pytest.mark.parametrize("extra", [
    dict(n_kv_heads=1), dict(n_kv_heads=2, ffn="swiglu", bias=False), dict(final_norm=False),
    dict(embedding_norm=True), dict(embedding_norm=True, norm="rmsnorm", final_norm=False),
    dict(architecture="encoder", embedding_norm=True, norm_placement="post"), dict(ffn="gelu_tanh"),
    dict(scale_embeddings=True, dropout=0.3, attention_backend="sdpa"),
    dict(vocab_size=1000, context_length=256, d_model=128, n_layers=4, n_heads=8, d_ff=512),
])
def test_count_parameters_more_configurations(extra):
    config = GPTConfig(**{**SMALL, **extra})
    assert count_parameters(config) == _numel(GPT(config))


def test_gpt2_small_shape_has_124m_parameters():
    config = GPTConfig(ffn="gelu_tanh")  # ModelConfig's defaults are GPT-2 small's shape
    with torch.device("meta"):
        model = GPT(config)
    assert _numel(model) == count_parameters(config) == 124_439_808


def test_logits_shape_and_loss_against_cross_entropy():
    model = GPT(GPTConfig(**SMALL))
    ids, targets = _ids(), _ids(seed=1)
    logits, loss = model(ids, targets)
    assert logits.shape == (2, 9, 61) and logits.dtype == torch.float32
    assert model(ids)[1] is None
    manual = -torch.log_softmax(logits, -1).gather(-1, targets[..., None]).mean()
    torch.testing.assert_close(loss, manual)
    assert abs(loss.item() - math.log(61)) < 0.1, "GPT-2's small initial weights start near the uniform loss"
    targets[0, :4] = -100
    _, masked = model(ids, targets)
    torch.testing.assert_close(masked, F.cross_entropy(logits[targets != -100], targets[targets != -100]))


@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "rope", "alibi"])
def test_decoder_is_causal_and_encoder_is_not(positions):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SMALL, positions=positions, init_std=0.2)).eval()
    ids = _ids()
    changed = ids.clone()
    changed[:, 5] = (changed[:, 5] + 1) % 61
    a, b = model(ids)[0], model(changed)[0]
    assert torch.equal(a[:, :5], b[:, :5]), "a later token changed an earlier position's logits"
    assert not torch.allclose(a[:, 5:], b[:, 5:])
    if positions != "alibi":
        encoder = GPT(GPTConfig(**SMALL, positions=positions, architecture="encoder", init_std=0.2)).eval()
        assert not torch.allclose(encoder(ids)[0][:, :5], encoder(changed)[0][:, :5])


def test_positions_matter_except_without_them():
    torch.manual_seed(0)
    ids = torch.tensor([[3, 4, 3, 4, 3, 4]])
    for positions in ["learned", "sinusoidal", "rope", "alibi"]:
        model = GPT(GPTConfig(**SMALL, positions=positions, init_std=0.3)).eval()
        logits = model(ids)[0]
        assert not torch.allclose(logits[0, 2], logits[0, 4], atol=1e-4), f"{positions}: position 2 and 4 look alike"


def test_tied_head_shares_the_embedding_and_untied_does_not():
    tied = GPT(GPTConfig(**SMALL))
    assert tied.lm_head is None
    logits, loss = tied(_ids(), _ids(seed=2))
    loss.backward()
    assert tied.token_embedding.weight.grad is not None
    untied = GPT(GPTConfig(**SMALL, tie_embeddings=False))
    assert untied.lm_head.weight.shape == (61, 24) and untied.lm_head.weight is not untied.token_embedding.weight


def test_initialization_follows_gpt2():
    config = GPTConfig(**{**SMALL, "d_model": 64, "d_ff": 256, "n_layers": 8}, init_std=0.02)
    model = GPT(config)
    block = model.blocks[0]
    assert abs(block.attn.qkv.weight.std().item() - 0.02) < 0.002
    assert abs(block.attn.out.weight.std().item() - 0.02 / 4) < 0.0005, "residual projections get std / sqrt(2 n_layers)"
    assert abs(block.ffn.w2.weight.std().item() - 0.02 / 4) < 0.0005
    assert torch.equal(block.attn.qkv.bias, torch.zeros_like(block.attn.qkv.bias))


def test_dropout_only_in_training_and_sdpa_matches_math():
    ids = _ids()
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SMALL, dropout=0.5))
    model.eval()
    assert torch.equal(model(ids)[0], model(ids)[0])
    model.train()
    assert not torch.equal(model(ids)[0], model(ids)[0])
    torch.manual_seed(1)
    math_model = GPT(GPTConfig(**SMALL, positions="alibi", attention_backend="math")).eval()
    sdpa_model = GPT(GPTConfig(**SMALL, positions="alibi", attention_backend="sdpa")).eval()
    sdpa_model.load_state_dict(math_model.state_dict())
    torch.testing.assert_close(sdpa_model(ids)[0], math_model(ids)[0], atol=1e-5, rtol=1e-5)


def test_scale_embeddings_multiplies_by_sqrt_d_model():
    torch.manual_seed(0)
    plain = GPT(GPTConfig(**SMALL))
    scaled = GPT(GPTConfig(**SMALL, scale_embeddings=True))
    ids = _ids(batch=1, seq=3)
    torch.testing.assert_close(scaled.token_embedding(ids), scaled.token_embedding.weight[ids] * math.sqrt(24))
    torch.testing.assert_close(plain.token_embedding(ids), plain.token_embedding.weight[ids])


def test_context_length_is_enforced():
    model = GPT(GPTConfig(**SMALL))
    assert model(_ids(seq=12))[0].shape == (2, 12, 61)
    with pytest.raises(ValueError, match="context"):
        model(_ids(seq=13))


@pytest.mark.parametrize("ids, targets, error, name", [
    (torch.rand(2, 3), None, TypeError, "ids"),
    (torch.tensor([1, 2, 3]), None, ValueError, "ids"),
    (torch.zeros(2, 0, dtype=torch.long), None, ValueError, "ids"),
    (torch.tensor([[1, 61]]), None, ValueError, "ids"),
    (torch.tensor([[1, 2]]), torch.tensor([1, 2]), ValueError, "targets"),
])
def test_bad_input(ids, targets, error, name):
    with pytest.raises(error, match=name):
        GPT(GPTConfig(**SMALL))(ids, targets)


@pytest.mark.parametrize("extra, name", [
    (dict(architecture="encoder-decoder", n_decoder_layers=2), "architecture"),
    (dict(ffn="moe"), "ffn"), (dict(dropout=1.0), "dropout"), (dict(attention_backend="nope"), "backend"),
    (dict(n_token_types=2), "n_token_types"), (dict(eps=0.0), "eps"), (dict(d_model=30, n_heads=10), "RoPE"),
    (dict(positions="alibi", architecture="encoder"), "ALiBi"), (dict(n_heads=5), "n_heads"),
])
def test_bad_config(extra, name):
    values = {**SMALL, **extra}
    if name == "RoPE":
        values["positions"] = "rope"
    with pytest.raises(ValueError, match=name):
        GPTConfig(**values)


def test_config_round_trip_and_type_checks():
    config = GPTConfig(**SMALL, positions="rope", n_kv_heads=2, dropout=0.1)
    assert GPTConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match="colour"):
        GPTConfig.from_dict({**config.to_dict(), "colour": "red"})
    with pytest.raises(TypeError, match="GPTConfig"):
        GPT(config.to_dict())
