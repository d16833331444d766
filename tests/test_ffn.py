"""minillm.ffn: activations, FeedForward, SwiGLU, counts and the registry, against independent references."""
import copy
import math
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from minillm import ffn as ffn_module
from minillm.config import CHOICES, ModelConfig, ffn_parameters
from minillm.ffn import (
    FeedForward,
    SwiGLU,
    available_ffns,
    build_ffn,
    default_d_ff,
    ffn_flops,
    gelu,
    gelu_tanh,
    register_ffn,
    swiglu,
    swiglu_hidden_size,
)


def n_parameters(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# ---------------------------------------------------------------- activations

def _phi(v: float) -> float:
    return 0.5 * (1.0 + math.erf(v / math.sqrt(2.0)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gelu_matches_torch_exact(dtype):
    x = 4 * torch.randn(3, 7, 5, generator=torch.Generator().manual_seed(0), dtype=dtype)
    got = gelu(x)
    assert got.dtype == dtype and got.shape == x.shape
    torch.testing.assert_close(got, F.gelu(x, approximate="none"), atol=1e-6, rtol=1e-6)


def test_gelu_matches_scalar_formula():
    # math.erf, one value at a time: a reference that shares no code with torch
    values = [-5.0, -2.7, -0.75, -1e-3, 0.0, 0.3, 1.0, 2.7, 6.0]
    expected = torch.tensor([v * _phi(v) for v in values], dtype=torch.float64)
    torch.testing.assert_close(gelu(torch.tensor(values, dtype=torch.float64)), expected, atol=1e-14, rtol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gelu_tanh_matches_torch_tanh(dtype):
    x = 4 * torch.randn(4, 9, generator=torch.Generator().manual_seed(1), dtype=dtype)
    got = gelu_tanh(x)
    assert got.dtype == dtype and got.shape == x.shape
    torch.testing.assert_close(got, F.gelu(x, approximate="tanh"), atol=1e-6, rtol=1e-6)


def test_gelu_tanh_known_values():
    # hand-evaluated: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
    for v in (-3.0, -0.5, 1.0, 2.0):
        inner = math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)
        expected = 0.5 * v * (1 + math.tanh(inner))
        assert gelu_tanh(torch.tensor(v, dtype=torch.float64)).item() == pytest.approx(expected, abs=1e-14)


def test_the_two_gelus_differ_by_at_most_5e_4_and_are_not_equal():
    x = torch.linspace(-8, 8, 16001, dtype=torch.float64)
    gap = (gelu(x) - gelu_tanh(x)).abs()
    assert 4.7e-4 < gap.max().item() < 4.8e-4
    assert abs(abs(x[gap.argmax()].item()) - 2.70) < 0.02


@pytest.mark.parametrize("fn", [gelu, gelu_tanh])
def test_gelu_symmetry_and_limits(fn):
    x = torch.linspace(-6, 6, 601, dtype=torch.float64)
    torch.testing.assert_close(fn(x) - fn(-x), x, atol=1e-12, rtol=1e-12)  # Phi(x) + Phi(-x) = 1
    big = torch.tensor([-1e4, -50.0, 50.0, 1e4])
    torch.testing.assert_close(fn(big), torch.tensor([0.0, 0.0, 50.0, 1e4]))


@pytest.mark.parametrize("fn", [gelu, gelu_tanh])
def test_activations_leave_their_input_alone(fn):
    x = torch.randn(5, 7, generator=torch.Generator().manual_seed(2))
    before = x.clone()
    fn(x)
    assert torch.equal(x, before)


def test_gelu_minimum():
    x = torch.linspace(-3, 0, 30001, dtype=torch.float64)
    y = gelu(x)
    assert y.min().item() == pytest.approx(-0.169971, abs=1e-6)
    assert x[y.argmin()].item() == pytest.approx(-0.7518, abs=2e-4)


# ---------------------------------------------------------------- FeedForward

def _naive_ffn(x, module: FeedForward, act):
    h = act(x @ module.w1.weight.T + (module.w1.bias if module.w1.bias is not None else 0))
    return h @ module.w2.weight.T + (module.w2.bias if module.w2.bias is not None else 0)


@pytest.mark.parametrize("activation, act", [("relu", lambda t: t.clamp(min=0)), ("gelu", gelu), ("gelu_tanh", gelu_tanh)])
@pytest.mark.parametrize("bias", [True, False])
def test_feedforward_matches_naive_formula(activation, act, bias):
    torch.manual_seed(0)
    module = FeedForward(12, 40, activation=activation, bias=bias).double()
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(module(x), _naive_ffn(x, module, act), atol=1e-12, rtol=1e-10)


def test_feedforward_matches_gpt2_mlp():
    import transformers
    from transformers.models.gpt2.modeling_gpt2 import GPT2MLP

    config = transformers.GPT2Config(n_embd=32, n_inner=128, activation_function="gelu_new", resid_pdrop=0.0)
    torch.manual_seed(0)
    theirs = GPT2MLP(128, config).eval()
    ours = FeedForward(32, 128, activation="gelu_tanh")
    with torch.no_grad():  # Conv1D stores its weight (in, out): the transpose of ours
        ours.w1.weight.copy_(theirs.c_fc.weight.T)
        ours.w1.bias.copy_(theirs.c_fc.bias)
        ours.w2.weight.copy_(theirs.c_proj.weight.T)
        ours.w2.bias.copy_(theirs.c_proj.bias)
        x = torch.randn(3, 7, 32)
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-5)
        # and the exact GELU is measurably not GPT-2's activation
        exact = FeedForward(32, 128, activation="gelu")
        exact.load_state_dict(ours.state_dict())
        assert not torch.allclose(exact(x), theirs(x), atol=1e-7, rtol=0)


def test_feedforward_accepts_a_callable_activation():
    torch.manual_seed(0)
    ours = FeedForward(8, 16, activation=gelu)
    builtin = FeedForward(8, 16, activation="gelu")
    builtin.load_state_dict(ours.state_dict())
    x = torch.randn(4, 8)
    torch.testing.assert_close(ours(x), builtin(x))
    assert "gelu" in repr(ours)


@pytest.mark.parametrize("ffn, bias", [("gelu", True), ("relu", False), ("gelu", False)])
def test_feedforward_parameters_equal_config_count(ffn, bias):
    config = ModelConfig(d_model=96, n_heads=4, d_ff=384, ffn=ffn, bias=bias)
    assert n_parameters(FeedForward(96, 384, activation=ffn, bias=bias)) == ffn_parameters(config)


def test_feedforward_is_position_wise_and_shape_preserving():
    torch.manual_seed(0)
    module = FeedForward(16, 64)
    x = torch.randn(3, 6, 16)
    with torch.no_grad():
        y = module(x)
        assert y.shape == x.shape
        torch.testing.assert_close(y[:, 4], module(x[:, 4]))
        torch.testing.assert_close(module(x[0, 2]), y[0, 2])  # a single vector works too
        x2 = x.clone()
        x2[:, 2] += 1.0  # changing one position changes that position's output only
        changed = (module(x2) - y).abs().amax(dim=(0, 2)) > 0
        assert changed.tolist() == [False, False, True, False, False, False]


@pytest.mark.parametrize("cls", [FeedForward, SwiGLU])
def test_dropout_only_in_training(cls):
    torch.manual_seed(0)
    module = cls(16, 64, dropout=0.5)
    x = torch.randn(200, 16)
    module.train()
    zeros = (module(x) == 0).float().mean().item()
    assert 0.4 < zeros < 0.6
    module.eval()
    assert (module(x) == 0).float().mean().item() < 0.01


@pytest.mark.parametrize("kwargs, argument", [
    ({"d_model": 0, "d_ff": 8}, "d_model"), ({"d_model": 8, "d_ff": -1}, "d_ff"),
    ({"d_model": 8.0, "d_ff": 8}, "d_model"), ({"d_model": True, "d_ff": 8}, "d_model"),
    ({"d_model": 8, "d_ff": 8, "dropout": 1.0}, "dropout"), ({"d_model": 8, "d_ff": 8, "activation": "swish"}, "activation"),
])
def test_feedforward_bad_arguments(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        FeedForward(**kwargs)


def test_feedforward_unknown_activation_lists_the_known_ones():
    with pytest.raises(ValueError, match="gelu_tanh"):
        FeedForward(8, 32, activation="tanh")
    with pytest.raises(TypeError, match="activation"):
        FeedForward(8, 32, activation=3)


@pytest.mark.parametrize("module", [FeedForward(8, 32), SwiGLU(8, 24), build_ffn("gelu_tanh", 8, 32)])
def test_the_down_projection_is_marked_as_the_residual_projection(module):
    from minillm.markers import is_residual_projection

    marked = [name for name, sub in module.named_modules() if is_residual_projection(sub)]
    assert marked == ["w2"]


# ---------------------------------------------------------------- SwiGLU

@pytest.mark.parametrize("bias", [False, True])
def test_swiglu_module_matches_naive_formula(bias):
    torch.manual_seed(0)
    module = SwiGLU(10, 28, bias=bias).double()
    x = torch.randn(2, 3, 10, dtype=torch.float64)

    def linear(layer, v):
        return v @ layer.weight.T + (layer.bias if bias else 0)

    a, b = linear(module.w1, x), linear(module.w3, x)
    expected = linear(module.w2, a / (1 + torch.exp(-a)) * b)  # SiLU written out
    with torch.no_grad():
        torch.testing.assert_close(module(x), expected, atol=1e-12, rtol=1e-10)
        assert (module.w1.bias is not None) == bias


def test_swiglu_function_leaves_its_inputs_alone():
    g = torch.Generator().manual_seed(3)
    args = (torch.randn(3, 4, generator=g), torch.randn(6, 4, generator=g), torch.randn(4, 6, generator=g),
            torch.randn(6, 4, generator=g))
    before = [a.clone() for a in args]
    swiglu(*args)
    assert all(torch.equal(a, b) for a, b in zip(args, before))


def test_swiglu_matches_llama_mlp():
    import transformers
    from transformers.models.llama.modeling_llama import LlamaMLP

    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=88, hidden_act="silu")
    torch.manual_seed(0)
    theirs = LlamaMLP(config)
    ours = SwiGLU(32, 88)
    with torch.no_grad():
        ours.w1.weight.copy_(theirs.gate_proj.weight)
        ours.w3.weight.copy_(theirs.up_proj.weight)
        ours.w2.weight.copy_(theirs.down_proj.weight)
        x = torch.randn(2, 5, 32)
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(swiglu(x, theirs.gate_proj.weight, theirs.down_proj.weight, theirs.up_proj.weight),
                                   theirs(x), atol=1e-5, rtol=1e-5)


def test_swiglu_function_equals_module_and_is_gated():
    torch.manual_seed(1)
    module = SwiGLU(6, 16)
    x = torch.randn(4, 6)
    w1, w2, w3 = module.w1.weight.detach(), module.w2.weight.detach(), module.w3.weight.detach()
    with torch.no_grad():
        torch.testing.assert_close(swiglu(x, w1, w2, w3), module(x))
    base = swiglu(x, w1, w2, w3)
    torch.testing.assert_close(swiglu(x, w1, w2, 2 * w3), 2 * base)  # linear in the value
    assert not torch.allclose(swiglu(x, 2 * w1, w2, w3), 2 * base)  # not in the gate
    assert torch.equal(swiglu(x, w1, w2, torch.zeros_like(w3)), torch.zeros_like(base))


def test_swiglu_function_bad_shapes():
    x, w1, w2, w3 = torch.randn(2, 4), torch.randn(6, 4), torch.randn(4, 6), torch.randn(6, 4)
    with pytest.raises(ValueError, match="w3"):
        swiglu(x, w1, w2, torch.randn(5, 4))
    with pytest.raises(ValueError, match="w2"):
        swiglu(x, w1, torch.randn(6, 4), w3)
    with pytest.raises(ValueError, match="x must have shape"):
        swiglu(torch.randn(2, 5), w1, w2, w3)


@pytest.mark.parametrize("bias", [False, True])
def test_swiglu_parameters_equal_config_count(bias):
    config = ModelConfig(d_model=64, n_heads=4, d_ff=176, ffn="swiglu", bias=bias)
    assert n_parameters(SwiGLU(64, 176, bias=bias)) == ffn_parameters(config)


def test_swiglu_bad_arguments():
    for kwargs, argument in [({"d_model": 0, "d_ff": 8}, "d_model"), ({"d_model": 8, "d_ff": 0}, "d_ff"),
                             ({"d_model": 8, "d_ff": 8, "dropout": -0.1}, "dropout")]:
        with pytest.raises(ValueError, match=argument):
            SwiGLU(**kwargs)


# ---------------------------------------------------------------- the 2/3 rule

@pytest.mark.parametrize("args, published", [
    ((4096,), 11008),  # LLaMA-7B
    ((5120,), 13824),  # LLaMA-13B
    ((6656,), 17920),  # LLaMA-33B
    ((8192,), 22016),  # LLaMA-65B
    ((4096, 1024, 1.3), 14336),  # Llama 3 8B
    ((8192, 4096, 1.3), 28672),  # Llama 2 70B, Llama 3 70B
])
def test_swiglu_hidden_size_llama_family(args, published):
    assert swiglu_hidden_size(*args) == published


@pytest.mark.parametrize("args, expected", [
    # multiple_of=1 shows each truncation: int(8 d / 3), then int(multiplier * that)
    ((100, 1), 266),  # 266.67, truncated, not rounded
    ((100, 1, 1.3), 345),  # int(1.3 * 266) = int(345.8); int(8 * 100 * 1.3 / 3) would be 346
    ((256, 1, 1.3), 886),
    ((96, 1, 1.2), 307),  # int(8 * 96 / 3) = 256, int(1.2 * 256) = int(307.2)
    ((96, 4, 1.2), 308),
])
def test_swiglu_hidden_size_truncates_each_step_as_llama_does(args, expected):
    got = swiglu_hidden_size(*args)
    assert type(got) is int and got == expected


def test_swiglu_hidden_size_matches_published_llama_configs():
    import transformers
    # LlamaConfig's default is LLaMA-7B's shape
    config = transformers.LlamaConfig()
    assert swiglu_hidden_size(config.hidden_size) == config.intermediate_size


@pytest.mark.parametrize("d_model", [1, 2, 3, 64, 100, 128, 768, 1000])
@pytest.mark.parametrize("multiple_of", [1, 8, 64, 256])
def test_swiglu_hidden_size_is_the_smallest_multiple_above_two_thirds(d_model, multiple_of):
    got = swiglu_hidden_size(d_model, multiple_of=multiple_of)
    assert type(got) is int and got % multiple_of == 0
    exact = (8 * d_model) // 3
    assert exact <= got < exact + multiple_of
    # parameters within one multiple of the 4x GELU network's 8 d^2
    assert 0 <= 3 * d_model * got - 3 * d_model * exact < 3 * d_model * multiple_of


@pytest.mark.parametrize("kwargs, argument", [
    ({"d_model": 0}, "d_model"), ({"d_model": 64, "multiple_of": 0}, "multiple_of"),
    ({"d_model": 64, "ffn_dim_multiplier": 0.0}, "ffn_dim_multiplier"),
    ({"d_model": 64, "ffn_dim_multiplier": "1.3"}, "ffn_dim_multiplier"),
])
def test_swiglu_hidden_size_bad_arguments(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        swiglu_hidden_size(**kwargs)


# ---------------------------------------------------------------- FLOPs

def _counted_flops(module, lead, d_model, training):
    x = torch.randn(*lead, d_model, requires_grad=training)
    with FlopCounterMode(display=False) as counter:
        y = module(x)
        if training:
            y.sum().backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("ffn", ["gelu", "relu", "gelu_tanh", "swiglu"])
@pytest.mark.parametrize("training", [False, True])
def test_ffn_flops_match_torch_flop_counter(ffn, training):
    torch.manual_seed(0)
    module = build_ffn(ffn, 24, 72)
    lead = (3, 5)
    got = ffn_flops(24, 72, ffn, n_tokens=15, training=training)
    assert type(got) is int and got == _counted_flops(module, lead, 24, training)


@pytest.mark.parametrize("ffn", ["gelu", "swiglu"])
def test_forward_flops_are_twice_the_weights(ffn):
    config = ModelConfig(d_model=256, n_heads=4, d_ff=688, ffn=ffn, bias=False)
    assert ffn_flops(256, 688, ffn) == 2 * ffn_parameters(config)


def test_ffn_flops_bad_arguments():
    with pytest.raises(ValueError, match="ffn"):
        ffn_flops(8, 16, "moe")
    with pytest.raises(ValueError, match="n_tokens"):
        ffn_flops(8, 16, n_tokens=-1)
    with pytest.raises(ValueError, match="d_ff"):
        ffn_flops(8, 0)


# ---------------------------------------------------------------- the registry

def test_registry_builds_each_variant():
    assert set(available_ffns()) >= {"gelu", "relu", "gelu_tanh", "swiglu"}
    x = torch.randn(2, 3, 16)
    for name, expected in [("gelu", F.gelu), ("relu", F.relu), ("gelu_tanh", lambda t: F.gelu(t, approximate="tanh"))]:
        module = build_ffn(name, 16, 48, bias=False, dropout=0.0)
        assert isinstance(module, FeedForward) and module.activation_name == name and module.w1.bias is None
        with torch.no_grad():
            torch.testing.assert_close(module(x), module.w2(expected(module.w1(x))))
    module = build_ffn("swiglu", 16, 40)
    assert isinstance(module, SwiGLU) and module.d_ff == 40 and module.w1.bias is None


def test_every_config_ffn_choice_is_registered():
    for name in CHOICES["ffn"]:
        config = ModelConfig(d_model=32, n_heads=4, d_ff=96, ffn=name)
        assert n_parameters(build_ffn(name, 32, 96, bias=config.bias)) == ffn_parameters(config)


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown FFN 'swish'; known: gelu, gelu_tanh, moe, relu, swiglu"):
        build_ffn("swish", 8, 32)


def test_moe_is_declared_and_its_lookup_names_chapter_11_where_it_is_missing(monkeypatch):
    assert "moe" in available_ffns()
    monkeypatch.setitem(sys.modules, "minillm.moe", None)  # an installation without chapter 11
    with pytest.raises(ValueError, match=r"FFN 'moe' comes from chapter 11_mixture_of_experts \(minillm.moe\)"):
        build_ffn("moe", 8, 32)


@pytest.mark.parametrize("d_model, d_ff, argument", [(0, 8, "d_model"), (8, 0, "d_ff"), (8, 2.5, "d_ff")])
def test_build_ffn_bad_sizes(d_model, d_ff, argument):
    with pytest.raises(ValueError, match=argument):
        build_ffn("swiglu", d_model, d_ff)


@pytest.fixture
def ffns(monkeypatch):
    """A copy of the registry in the module's place, so that a test's entries do not outlive it."""
    registry = copy.deepcopy(ffn_module.FFNS)
    monkeypatch.setattr(ffn_module, "FFNS", registry)
    return registry


class Doubling(torch.nn.Module):
    def __init__(self, d_model, d_ff, scale=2.0):
        super().__init__()
        self.d_model, self.d_ff, self.scale = d_model, d_ff, scale

    def forward(self, x):
        return self.scale * x


def test_register_a_new_ffn_without_patching(ffns):
    register_ffn("doubling", Doubling)
    module = build_ffn("doubling", 4, 8, scale=3.0)
    assert (module.d_model, module.d_ff, module.scale) == (4, 8, 3.0)
    assert "doubling" in available_ffns()
    register_ffn("doubling", Doubling)  # the same entry again changes nothing
    with pytest.raises(ValueError, match="FFN 'doubling' is already registered.*replace=True"):
        register_ffn("doubling", FeedForward)
    register_ffn("doubling", FeedForward, replace=True)
    assert isinstance(build_ffn("doubling", 4, 8), FeedForward)
    register_ffn("tripling", Doubling, scale=3.0)  # options bound to the entry
    assert build_ffn("tripling", 4, 8).scale == 3.0


def test_builtin_names_cannot_be_replaced_by_accident(ffns):
    with pytest.raises(ValueError, match="FFN 'gelu' is already registered"):
        register_ffn("gelu", SwiGLU)
    assert isinstance(build_ffn("gelu", 4, 8), FeedForward)


def test_register_bad_arguments(ffns):
    with pytest.raises(TypeError, match="callable"):
        register_ffn("broken", 3)
    with pytest.raises(ValueError, match="module:attribute"):
        register_ffn("broken", "not a reference")
    with pytest.raises(ValueError, match="name"):
        register_ffn("", FeedForward)
    assert "broken" not in available_ffns()


def test_builtins_are_looked_up_in_the_module_when_built(monkeypatch):
    """The entries are forward references: whatever class stands at minillm.ffn.SwiGLU now
    (a learner's answer, installed by a student bundle) is what build_ffn builds."""

    class MySwiGLU(SwiGLU):
        pass

    class MyFeedForward(FeedForward):
        pass

    monkeypatch.setattr(ffn_module, "SwiGLU", MySwiGLU)
    assert type(build_ffn("swiglu", 8, 16)) is MySwiGLU
    monkeypatch.setattr(ffn_module, "FeedForward", MyFeedForward)
    relu = build_ffn("relu", 8, 16)
    assert type(relu) is MyFeedForward and relu.activation_name == "relu"  # with the entry's options


# ---------------------------------------------------------------- the width rule

@pytest.mark.parametrize("name, d_model, expected", [
    ("gelu", 128, 512), ("relu", 64, 256), ("gelu_tanh", 768, 3072),  # 4 d_model
    ("swiglu", 128, 352),  # the shipped model: 2/3 of 512 is 341.3, rounded up to a multiple of 32
    ("swiglu", 96, 256), ("swiglu", 768, 2048), ("swiglu", 4096, 10944),
])
def test_default_d_ff_is_each_ffns_own_rule(name, d_model, expected):
    assert default_d_ff(name, d_model) == expected
    if name == "swiglu":  # the rule, independently: the smallest multiple of 32 at or above int(8 d / 3)
        assert expected % 32 == 0 and expected - 32 < int(8 * d_model / 3) <= expected


def test_default_d_ff_asks_a_registered_class_and_passes_its_options(ffns):
    class Wide(Doubling):
        @classmethod
        def default_d_ff(cls, d_model, scale=2.0, **options):
            return int(scale * d_model)

    register_ffn("wide", Wide)
    register_ffn("wide3", Wide, scale=3.0)
    register_ffn("plain", Doubling)
    assert default_d_ff("wide", 10) == 20
    assert default_d_ff("wide", 10, scale=5.0) == 50  # ffn_options reach the rule
    assert default_d_ff("wide3", 10) == 30  # and so do the entry's own
    assert default_d_ff("plain", 10) == 40  # no rule: 4 d_model
    with pytest.raises(ValueError, match="d_model"):
        default_d_ff("gelu", 0)
    with pytest.raises(ValueError, match="unknown FFN"):
        default_d_ff("swish", 8)
