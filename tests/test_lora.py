"""minillm.lora: the LoRA layer, targets by role, merging, adapter checkpoints, the pig latin task."""
import dataclasses
import math

import pytest
import torch
from torch import nn

from minillm import lora
from minillm.checkpoint import CheckpointError
from minillm.markers import is_residual_projection
from minillm.model import GPT, GPTConfig
from minillm.optim import build_optimizer, param_groups

SMALL = dict(vocab_size=61, context_length=16, d_model=32, n_layers=2, n_heads=4, positions="rope", norm="rmsnorm",
             ffn="swiglu", bias=False)


def small_gpt(seed=0, **overrides) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**SMALL, "fused_qkv": False, **overrides})).eval()


def ids(batch=2, seq=12, vocab=61, seed=1):
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


def trained_adapters(model: nn.Module, seed=5) -> nn.Module:
    """Give every adapter non-zero factors, as a fine-tune would."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in lora.lora_layers(model).values():
            layer.lora_B.copy_(0.1 * torch.randn(layer.lora_B.shape, generator=generator))
    return model


def test_layer_equals_its_base_at_init():
    torch.manual_seed(0)
    base = nn.Linear(7, 5)
    layer = lora.LoRALinear(base, r=3, alpha=6.0)
    x = torch.randn(4, 2, 7)
    assert torch.equal(layer(x), base(x))
    assert torch.count_nonzero(layer.lora_A) == layer.lora_A.numel()  # A random, B zero
    assert torch.count_nonzero(layer.lora_B) == 0
    assert layer.lora_A.shape == (3, 7) and layer.lora_B.shape == (5, 3)


def test_adapted_model_equals_base_at_init():
    model = small_gpt()
    x = ids()
    before = model(x)[0]
    lora.apply_lora(model, r=4, alpha=8.0, targets=("all",))
    assert torch.equal(model(x)[0], before)


def test_update_is_scaled_by_alpha_over_r():
    torch.manual_seed(0)
    base = nn.Linear(6, 4, dtype=torch.float64)
    x = torch.randn(3, 6, dtype=torch.float64)
    for r, alpha in [(1, 1.0), (4, 8.0), (16, 2.0)]:
        layer = lora.LoRALinear(base, r=r, alpha=alpha)
        with torch.no_grad():
            layer.lora_B.normal_()
        expected = (alpha / r) * x @ (layer.lora_B @ layer.lora_A).T  # the formula, with the product formed
        torch.testing.assert_close(layer(x) - base(x), expected)


def test_scale_catches_a_missing_one_over_r():
    """A rank-1 update written with rank r has B A = r b a; alpha / r makes it the rank-1 layer again.
    Without the 1/r the two would differ by the factor r."""
    x = torch.randn(5, 10, dtype=torch.float64)
    a, b = torch.randn(1, 10, dtype=torch.float64), torch.randn(7, 1, dtype=torch.float64)
    one = lora.lora_update(x, a, b, 3.0)
    for r in (2, 4, 8):
        torch.testing.assert_close(lora.lora_update(x, a.expand(r, 10), b.expand(7, r), 3.0), one)
    torch.testing.assert_close(one, 3.0 * x @ (b @ a).T)


def test_lora_update_errors():
    x, a, b = torch.randn(2, 6), torch.randn(2, 6), torch.randn(4, 2)
    with pytest.raises(ValueError, match="lora_B"):
        lora.lora_update(x, a, b[:, :1], 1.0)
    with pytest.raises(ValueError, match="x must"):
        lora.lora_update(x[:, :5], a, b, 1.0)
    with pytest.raises(ValueError, match="weight"):
        lora.merge_weight(torch.randn(4, 5), a, b, 1.0)


def test_base_is_frozen_and_only_adapters_train():
    model = small_gpt()
    base_state = {k: v.clone() for k, v in model.state_dict().items()}
    lora.apply_lora(model, r=2, alpha=4.0, targets=("q", "v", "w2"))
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(name.endswith((".lora_A", ".lora_B")) for name in trainable)
    optimizer = build_optimizer(model, lr=1e-2, weight_decay=0.1)
    model.train()
    for _ in range(3):
        x = ids(seed=2)
        _, loss = model(x, x)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = model.state_dict()
    for key, value in base_state.items():
        wrapped = key.replace(".q.", ".q.base.").replace(".v.", ".v.base.").replace(".w2.", ".w2.base.")
        assert torch.equal(after[wrapped], value), key
    assert any(torch.count_nonzero(layer.lora_B) for layer in lora.lora_layers(model).values())


def test_param_groups_decay_the_adapters_and_skip_the_frozen_base():
    model = lora.apply_lora(small_gpt(), r=2, alpha=4.0, targets=("q", "v"))
    decay, no_decay = param_groups(model, 0.1)
    adapters = {id(p) for layer in lora.lora_layers(model).values() for p in (layer.lora_A, layer.lora_B)}
    assert {id(p) for p in decay["params"]} == adapters and decay["weight_decay"] == 0.1
    assert no_decay["params"] == []


def test_merge_and_unmerge_are_exact():
    model = trained_adapters(lora.apply_lora(small_gpt(), r=4, alpha=8.0, targets=("all",)))
    x = ids()
    adapted = model(x)[0]
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    lora.merge_lora(model)
    torch.testing.assert_close(model(x)[0], adapted, atol=1e-5, rtol=1e-5)
    # merged means plain: a GPT without adapters, given the merged base weights, computes the same
    plain = small_gpt(seed=9)
    plain.load_state_dict({k.replace(".base.", "."): v for k, v in model.state_dict().items() if "lora_" not in k})
    torch.testing.assert_close(plain(x)[0], adapted, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="merged"):
        lora.merge_lora(model)
    lora.unmerge_lora(model)
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, weights[key], atol=1e-6, rtol=1.3e-6)
    torch.testing.assert_close(model(x)[0], adapted, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="not merged"):
        lora.unmerge_lora(model)
    with pytest.raises(ValueError, match="no LoRA"):
        lora.merge_lora(small_gpt())


def test_targets_by_role():
    model = small_gpt()
    names = lambda targets: sorted(name for name, _ in lora.lora_targets(model, targets))  # noqa: E731
    assert names(("q", "v")) == [f"blocks.{i}.attn.{p}" for i in range(2) for p in ("q", "v")]
    assert names("o") == ["blocks.0.attn.out", "blocks.1.attn.out"]
    assert names("ffn") == [f"blocks.{i}.ffn.{w}" for i in range(2) for w in ("w1", "w2", "w3")]
    assert len(names("all")) == 2 * 7 and names("attention") == names(("q", "k", "v", "o"))
    lora.apply_lora(model, r=2, alpha=2.0, targets=("k", "w1"))
    assert sorted(lora.lora_layers(model)) == ["blocks.0.attn.k", "blocks.0.ffn.w1", "blocks.1.attn.k", "blocks.1.ffn.w1"]
    assert isinstance(model.blocks[0].attn.q, nn.Linear) and not isinstance(model.blocks[0].attn.q, lora.LoRALinear)
    with pytest.raises(ValueError, match="once"):
        lora.apply_lora(model, r=2, alpha=2.0)


def test_target_errors():
    with pytest.raises(ValueError, match="'query'"):
        lora.lora_targets(small_gpt(), ("query",))
    with pytest.raises(ValueError, match="w3"):
        lora.lora_targets(small_gpt(ffn="gelu", d_ff=64), ("q", "w3"))
    with pytest.raises(ValueError, match="empty"):
        lora.lora_targets(small_gpt(), ())
    with pytest.raises(TypeError, match="targets"):
        lora.lora_targets(small_gpt(), 3)
    with pytest.raises(ValueError, match="r must"):
        lora.apply_lora(small_gpt(), r=0, alpha=1.0)


def test_defaults_adapt_the_q_and_v_rows_of_a_fused_projection():
    """A default GPT fuses Q/K/V; apply_lora's defaults adapt the q and v blocks of that Linear:
    W x + (alpha / r) B A x on the q rows and on the v rows, each with its own A and B, k untouched."""
    model = small_gpt(fused_qkv=True, n_kv_heads=2, bias=True)  # GQA: k and v are 16 wide, q 32
    base = model.blocks[0].attn.qkv
    lora.apply_lora(model, r=3, alpha=6.0)
    trained_adapters(model)
    layer = model.blocks[0].attn.qkv
    assert isinstance(layer, lora.FusedLoRALinear) and layer.rows == {"q": (0, 32), "v": (48, 64)}
    assert layer.lora_A.shape == (2 * 3, 32) and layer.lora_B.shape == (32 + 16, 3)
    x = torch.randn(2, 5, 32)
    A_q, A_v, B_q, B_v = layer.lora_A[:3], layer.lora_A[3:], layer.lora_B[:32], layer.lora_B[32:]
    plain = x @ base.weight.T + base.bias
    expected = torch.cat([plain[..., :32] + 2.0 * x @ (B_q @ A_q).T, plain[..., 32:48],
                          plain[..., 48:] + 2.0 * x @ (B_v @ A_v).T], dim=-1)
    torch.testing.assert_close(layer(x), expected)
    assert lora.trainable_parameters(model) == lora.lora_parameter_count(model.config, 3)
    overlapping = nn.Linear(4, 6)
    with pytest.raises(ValueError, match="rows"):
        lora.FusedLoRALinear(overlapping, 1, 1.0, rows={"q": (0, 4), "k": (3, 6)})
    assert overlapping.weight.requires_grad, "a refused FusedLoRALinear froze its base"


def test_a_fused_adapter_draws_its_a_once_as_nn_linear_draws_a_weight():
    """One draw of the stacked A (uniform, bound 1/sqrt(in_features)), the first after the seed: the
    same generator state gives the same adapter as a hand-made draw, and B starts at zero."""
    torch.manual_seed(3)
    layer = lora.FusedLoRALinear(nn.Linear(8, 12), 2, 1.0, rows={"q": (0, 4), "v": (8, 12)})
    torch.manual_seed(3)
    nn.Linear(8, 12)  # the base's own draws come first
    bound = 1 / math.sqrt(8)
    expected = torch.empty(4, 8).uniform_(-bound, bound)
    torch.testing.assert_close(layer.lora_A.detach(), expected, atol=1e-7, rtol=0)
    assert layer.lora_B.shape == (8, 2) and not layer.lora_B.any()


def test_fused_adapters_equal_the_same_adapters_on_the_unfused_model(tmp_path):
    fused = trained_adapters(lora.apply_lora(small_gpt(fused_qkv=True, n_kv_heads=2), r=2, alpha=4.0))
    unfused = lora.apply_lora(lora.unfuse_qkv(small_gpt(fused_qkv=True, n_kv_heads=2)), r=2, alpha=4.0)
    with torch.no_grad():
        for i, block in enumerate(fused.blocks):
            qkv, attention = block.attn.qkv, unfused.blocks[i].attn
            (_, _, A_q, B_q), (_, _, A_v, B_v) = qkv.blocks()
            attention.q.lora_A.copy_(A_q), attention.q.lora_B.copy_(B_q)
            attention.v.lora_A.copy_(A_v), attention.v.lora_B.copy_(B_v)
    x = ids()
    adapted = fused(x)[0]
    torch.testing.assert_close(adapted, unfused(x)[0], atol=1e-5, rtol=1e-5)
    bases = {name: layer.base.weight.clone() for name, layer in lora.lora_layers(fused).items()}
    lora.merge_lora(fused)
    torch.testing.assert_close(fused(x)[0], adapted, atol=1e-5, rtol=1e-5)
    lora.unmerge_lora(fused)
    assert all(torch.equal(layer.base.weight, bases[name]) for name, layer in lora.lora_layers(fused).items())
    path = tmp_path / "fused.pt"
    lora.save_lora(path, fused, ("q", "v"))
    restored = lora.load_lora(path, small_gpt(fused_qkv=True, n_kv_heads=2))
    torch.testing.assert_close(restored(x)[0], adapted, atol=0, rtol=0)
    with pytest.raises(CheckpointError, match="r=2"):
        lora.load_lora(path, lora.apply_lora(small_gpt(fused_qkv=True, n_kv_heads=2), r=2, alpha=4.0, targets="k"))


@pytest.mark.parametrize("overrides", [dict(), dict(n_kv_heads=2, bias=True, positions="learned")])
def test_unfuse_qkv_gives_the_same_logits(overrides):
    fused = small_gpt(fused_qkv=True, **overrides)
    x = ids()
    state = torch.get_rng_state()
    unfused = lora.unfuse_qkv(fused)
    assert torch.equal(torch.get_rng_state(), state)  # the global generator is untouched
    assert unfused.config == dataclasses.replace(fused.config, fused_qkv=False)
    attention = unfused.blocks[0].attn
    assert not attention.fused_qkv and attention.k.out_features == attention.n_kv_heads * attention.head_dim
    torch.testing.assert_close(unfused(x)[0], fused(x)[0], atol=1e-5, rtol=1e-5)
    assert not unfused.training
    with pytest.raises(ValueError, match="adapters"):
        lora.unfuse_qkv(lora.apply_lora(small_gpt(fused_qkv=True), 2, 2.0, "o"))


def test_residual_marks_survive_wrapping():
    model = lora.apply_lora(small_gpt(n_layers=8), r=2, alpha=2.0, targets=("all",))
    out = model.blocks[0].attn.out
    assert isinstance(out, lora.LoRALinear) and is_residual_projection(out.base)
    assert is_residual_projection(model.blocks[3].ffn.w2.base) and not is_residual_projection(model.blocks[3].ffn.w1.base)
    torch.manual_seed(3)
    model.reset_parameters()  # the model's init still finds the marked bases, and leaves the adapters alone
    residual = torch.cat([block.attn.out.base.weight.flatten() for block in model.blocks])
    plain = torch.cat([block.attn.q.base.weight.flatten() for block in model.blocks])
    assert abs(residual.std().item() - 0.02 / math.sqrt(2 * 8)) < 0.0008
    assert abs(plain.std().item() - 0.02) < 0.001
    assert all(torch.count_nonzero(layer.lora_B) == 0 for layer in lora.lora_layers(model).values())


def test_trainable_counts():
    for overrides, r, targets in [(dict(), 4, ("q", "v")), (dict(n_kv_heads=1), 3, ("k", "v", "o")),
                                  (dict(ffn="gelu", d_ff=48), 2, ("all",)), (dict(), 16, ("ffn",))]:
        model = small_gpt(**overrides)
        total = sum(p.numel() for p in model.parameters())
        lora.apply_lora(model, r, 1.0, targets)
        expected = lora.lora_parameter_count(model.config, r, targets)
        assert lora.trainable_parameters(model) == expected
        assert sum(p.numel() for p in model.parameters()) == total + expected
    config = GPTConfig(**SMALL)  # by hand: per block q, v are 32 -> 32, r (32 + 32) each
    assert lora.lora_parameter_count(config, 4, ("q", "v")) == 2 * 2 * 4 * 64
    d_ff = config.d_ff
    assert lora.lora_parameter_count(config, 1, ("w2",)) == 2 * (32 + d_ff)


def test_optimizer_state_bytes_counts_adams_moments():
    model = lora.apply_lora(small_gpt(), r=2, alpha=2.0)
    optimizer = build_optimizer(model, lr=1e-3)
    x = ids()
    model(x, x)[1].backward()
    optimizer.step()
    trainable = lora.trainable_parameters(model)
    tensors = len([p for p in model.parameters() if p.requires_grad])
    assert lora.optimizer_state_bytes(optimizer) == 2 * 4 * trainable + 4 * tensors  # two float32 moments, a step each


def test_fingerprint_names_the_base_weights():
    model = small_gpt()
    plain = lora.base_fingerprint(model)
    lora.apply_lora(model, 2, 2.0, ("all",))
    trained_adapters(model)
    assert lora.base_fingerprint(model) == plain  # adapters and the wrapping do not change it
    other = small_gpt()
    with torch.no_grad():
        other.blocks[1].ffn.w2.weight[0, 0] += 1e-6
    assert lora.base_fingerprint(other) != plain
    lora.merge_lora(model)
    with pytest.raises(ValueError, match="unmerge"):
        lora.base_fingerprint(model)


def test_checkpoint_holds_the_adapters_only_and_loads_onto_its_base(tmp_path):
    model = trained_adapters(lora.apply_lora(small_gpt(), r=4, alpha=8.0, targets=("q", "v", "o")))
    path = tmp_path / "adapters.pt"
    lora.save_lora(path, model, ("q", "v", "o"))
    saved = torch.load(path, weights_only=True)
    assert set(saved["adapters"]) == {f"{name}.{part}" for name in lora.lora_layers(model) for part in ("lora_A", "lora_B")}
    assert sum(t.numel() for t in saved["adapters"].values()) == lora.trainable_parameters(model)
    assert [k for k in saved if isinstance(saved[k], torch.Tensor)] == []
    assert saved["base_config"] == model.config.to_dict() and saved["lora"]["r"] == 4
    full = tmp_path / "full.pt"
    torch.save(model.state_dict(), full)
    assert path.stat().st_size < full.stat().st_size / 5
    fresh = lora.load_lora(path, small_gpt())  # a plain base, wrapped as the file says
    x = ids()
    # bit equality: the file holds the very adapter tensors, and the same kernels run on them
    torch.testing.assert_close(fresh(x)[0], model(x)[0], atol=0, rtol=0)
    again = lora.apply_lora(small_gpt(), r=4, alpha=8.0, targets=("q", "v", "o"))  # or one wrapped already
    torch.testing.assert_close(lora.load_lora(path, again)(x)[0], model(x)[0], atol=0, rtol=0)


def test_loading_onto_another_base_is_a_clear_error(tmp_path):
    model = trained_adapters(lora.apply_lora(small_gpt(), r=2, alpha=2.0))
    path = tmp_path / "adapters.pt"
    lora.save_lora(path, model, ("q", "v"))
    other_weights = small_gpt(seed=1)  # same config, another training run
    with pytest.raises(CheckpointError, match="another base model.*weights"):
        lora.load_lora(path, other_weights)
    assert not lora.lora_layers(other_weights)  # left as it was
    with pytest.raises(CheckpointError, match="another base model.*d_model"):
        lora.load_lora(path, small_gpt(d_model=64))
    with pytest.raises(CheckpointError, match="r=2"):
        lora.load_lora(path, lora.apply_lora(small_gpt(), r=3, alpha=2.0))
    torch.save({"config": {}, "model": {}}, tmp_path / "model.pt")
    with pytest.raises(CheckpointError, match="lacks"):
        lora.load_lora(tmp_path / "model.pt", small_gpt())
    with pytest.raises(ValueError, match="do not name"):
        lora.save_lora(path, model, ("q",))


def test_dropout_touches_the_update_only():
    torch.manual_seed(0)
    base = nn.Linear(8, 8)
    layer = lora.LoRALinear(base, r=2, alpha=2.0, dropout=0.5).train()
    x = torch.randn(4, 8)
    assert torch.equal(layer(x), base(x))  # B = 0: dropout on the update's input changes nothing
    with torch.no_grad():
        layer.lora_B.normal_()
    assert not torch.equal(layer(x), layer(x))  # training: random
    layer.eval()
    naive = x @ base.weight.T + base.bias + (2.0 / 2) * x @ (layer.lora_B @ layer.lora_A).T  # the formula, product formed
    torch.testing.assert_close(layer(x), naive)





def test_merge_then_unmerge_keeps_the_checkpoint_loadable_on_the_original_base(tmp_path):
    """Unmerge must restore the base bit for bit: the adapter file names its base by exact bytes."""
    original = small_gpt(0)
    model = trained_adapters(lora.apply_lora(small_gpt(0), r=4, alpha=8.0, targets=("all",)))
    bases = {name: layer.base.weight.clone() for name, layer in lora.lora_layers(model).items()}
    lora.unmerge_lora(lora.merge_lora(model))
    for name, layer in lora.lora_layers(model).items():
        assert torch.equal(layer.base.weight, bases[name]), name
    path = tmp_path / "adapters.pt"
    lora.save_lora(path, model, ("all",))
    restored = lora.load_lora(path, original)
    x = ids()
    torch.testing.assert_close(restored(x)[0], model(x)[0], atol=0, rtol=0)
