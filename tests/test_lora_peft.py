"""minillm.lora against peft, an implementation the course did not write.

peft adapts whole ``nn.Linear`` modules, so it is given the model with separate q, k and v
projections (``lora.unfuse_qkv``), while ``apply_lora`` runs with its defaults on the
default, fused GPT: adapters on the q and v row blocks of one ``qkv`` weight. The same
factors in both must give the same logits, the same merged weights and the same number of
trainable parameters.
"""
import copy

import peft
import pytest
import torch

from minillm import lora
from minillm.model import GPT, GPTConfig

R, ALPHA = 4, 12.0


def models(n_kv_heads: int):
    """(ours, peft's, the base): the same float64 base, adapted by ``apply_lora``'s defaults
    and by peft, peft's factors drawn at random and ours set equal to them."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=53, context_length=16, d_model=48, n_layers=2, n_heads=6, n_kv_heads=n_kv_heads)
    ours = GPT(config).double().eval()
    base, theirs = copy.deepcopy(ours), lora.unfuse_qkv(ours)
    theirs = peft.inject_adapter_in_model(
        peft.LoraConfig(r=R, lora_alpha=ALPHA, target_modules=["q", "v"], lora_dropout=0.0), theirs)
    lora.apply_lora(ours, r=R, alpha=ALPHA)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for block_ours, block_theirs in zip(ours.blocks, theirs.blocks):
            fused, parts = block_ours.attn.qkv, [block_theirs.attn.q, block_theirs.attn.v]
            for part in parts:  # peft's B starts at zero, as ours does: draw both factors
                for factor in (part.lora_A["default"], part.lora_B["default"]):
                    factor.weight.copy_(0.2 * torch.randn(factor.weight.shape, generator=generator, dtype=torch.float64))
            fused.lora_A.copy_(torch.cat([part.lora_A["default"].weight for part in parts]))
            fused.lora_B.copy_(torch.cat([part.lora_B["default"].weight for part in parts]))
    return ours, theirs.eval(), base


@pytest.mark.parametrize("n_kv_heads", [6, 2], ids=["mha", "gqa"])
def test_default_adapters_on_a_fused_projection_equal_peft_on_separate_ones(n_kv_heads):
    ours, theirs, base = models(n_kv_heads)
    tokens = torch.randint(0, 53, (3, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got, want = ours(tokens)[0], theirs(tokens)[0]
        assert (got - base(tokens)[0]).abs().max() > 1e-2  # the adapters do move the logits
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n_kv_heads", [6, 2], ids=["mha", "gqa"])
def test_trainable_parameters_equal_peft_and_the_count_formula(n_kv_heads):
    ours, theirs, _ = models(n_kv_heads)
    peft_trainable = sum(p.numel() for name, p in theirs.named_parameters() if p.requires_grad and "lora_" in name)
    assert sum(p.numel() for p in theirs.parameters() if p.requires_grad) == peft_trainable
    assert lora.trainable_parameters(ours) == peft_trainable
    assert lora.lora_parameter_count(ours.config, R) == peft_trainable


def test_merged_weights_equal_peft_merged_weights():
    ours, theirs, _ = models(2)
    lora.merge_lora(ours)
    for block_ours, block_theirs in zip(ours.blocks, theirs.blocks):
        attention = block_theirs.attn
        for part in (attention.q, attention.v):
            part.merge()
        merged = torch.cat([attention.q.base_layer.weight, attention.k.weight, attention.v.base_layer.weight])
        torch.testing.assert_close(block_ours.attn.qkv.base.weight, merged, rtol=1e-12, atol=1e-12)
