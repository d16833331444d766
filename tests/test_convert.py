"""minillm.convert: a random-weight transformers GPT-2 (no download) gives the same logits in GPT."""
import pytest
import torch
import transformers

from minillm.config import count_parameters
from minillm.convert import from_hf_gpt2, gpt2_config


def _hf(**overrides):
    settings = dict(vocab_size=131, n_positions=40, n_embd=48, n_layer=3, n_head=4, bos_token_id=0, eos_token_id=0)
    config = transformers.GPT2Config(**{**settings, **overrides})
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # GPT-2 initializes norms to 1 and biases to 0: randomize them so they are tested too
        for name, parameter in model.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                parameter.add_(torch.randn_like(parameter) * 0.1)
    return model


@pytest.mark.parametrize("overrides", [{}, dict(n_inner=80), dict(activation_function="gelu", n_layer=1),
                                       dict(layer_norm_epsilon=1e-3, n_head=6)])
def test_logits_match_huggingface(overrides):
    hf = _hf(**overrides)
    ours = from_hf_gpt2(hf)
    ids = torch.randint(0, 131, (3, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(ids).logits
    got, _ = ours(ids)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in hf.parameters())
    assert count_parameters(ours.config) == sum(p.numel() for p in hf.parameters())


def test_loss_matches_huggingface():
    hf = _hf()
    ours = from_hf_gpt2(hf)
    ids = torch.randint(0, 131, (2, 17), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = hf(ids, labels=ids).loss  # Hugging Face shifts the labels itself
    _, loss = ours(ids[:, :-1], ids[:, 1:])
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-5)


def test_unsupported_variants_and_wrong_objects():
    with pytest.raises(ValueError, match="activation_function"):
        gpt2_config(transformers.GPT2Config(activation_function="silu"))
    with pytest.raises(ValueError, match="scale_attn_by_inverse_layer_idx"):
        gpt2_config(transformers.GPT2Config(scale_attn_by_inverse_layer_idx=True))
    with pytest.raises(TypeError, match="GPT2LMHeadModel"):
        from_hf_gpt2(torch.nn.Linear(2, 2))
