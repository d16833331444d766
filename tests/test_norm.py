"""minillm.norm: LayerNorm and RMSNorm, as formulas and modules, against independent references."""
import math
import statistics

import pytest
import torch
import torch.nn.functional as F

from minillm.config import ModelConfig, norm_parameters
from minillm.norm import NORMS, LayerNorm, RMSNorm, build_norm, layer_norm, rms_norm


def n_parameters(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# ---------------------------------------------------------------- the formulas

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 4, 16), (1, 1, 1, 33)])
def test_layer_norm_matches_torch(shape, dtype):
    d = shape[-1]
    x = 3 * _randn(*shape, seed=1, dtype=dtype) + 2
    w, b = _randn(d, seed=2, dtype=dtype), _randn(d, seed=3, dtype=dtype)
    atol = 1e-5 if dtype == torch.float32 else 1e-12
    for weight, bias in ((w, b), (w, None), (None, b), (None, None)):
        got = layer_norm(x, weight, bias, eps=1e-4)
        assert got.dtype == dtype and got.shape == x.shape
        torch.testing.assert_close(got, F.layer_norm(x, (d,), weight, bias, eps=1e-4), atol=atol, rtol=1e-5)


def test_layer_norm_matches_scalar_formula():
    # statistics.pvariance is the biased variance, computed in Python floats: no shared code with torch
    rows = [[1.0, 2.0, 4.0, 9.0], [3.5, -1.0, 0.25, 2.0], [5.0, 5.0, 5.0, 5.0]]
    eps = 1e-5
    expected = [[(v - statistics.fmean(r)) / math.sqrt(statistics.pvariance(r) + eps) for v in r] for r in rows]
    got = layer_norm(torch.tensor(rows, dtype=torch.float64), eps=eps)
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), atol=1e-12, rtol=1e-12)


def test_layer_norm_uses_biased_variance_and_eps_inside_the_root():
    x = torch.tensor([[3.001, 2.999, 3.002, 2.998]], dtype=torch.float64)
    centered = x - x.mean()
    biased = centered / torch.sqrt(centered.pow(2).mean() + 1e-5)
    unbiased = centered / torch.sqrt(x.var(correction=1) + 1e-5)
    eps_outside = centered / (centered.pow(2).mean().sqrt() + 1e-5)
    got = layer_norm(x)
    torch.testing.assert_close(got, biased)
    assert not torch.allclose(got, unbiased, atol=1e-3) and not torch.allclose(got, eps_outside, atol=1e-3)


def test_layer_norm_properties():
    x = _randn(5, 6, 32, seed=4, dtype=torch.float64)
    y = layer_norm(x, eps=0.0)
    torch.testing.assert_close(y.mean(-1), torch.zeros(5, 6, dtype=torch.float64), atol=1e-12, rtol=0)
    torch.testing.assert_close(y.var(-1, correction=0), torch.ones(5, 6, dtype=torch.float64))
    a = torch.rand(5, 6, 1, dtype=torch.float64) + 0.5
    c = 10 * torch.randn(5, 6, 1, dtype=torch.float64)
    torch.testing.assert_close(layer_norm(a * x + c, eps=0.0), y)
    # positions are independent: normalizing one position alone gives the same row
    torch.testing.assert_close(layer_norm(x[2:3, 4:5], eps=0.0), y[2:3, 4:5])


def test_layer_norm_constant_row_gives_the_shift():
    x = torch.full((2, 8), 7.0)
    b = torch.arange(8.0)
    torch.testing.assert_close(layer_norm(x, torch.ones(8), b), b.expand(2, 8))


def test_layer_norm_large_offset_is_stable():
    # float32 near 1000: mean(x^2) - mean^2 would lose the variance (errors of about 0.1)
    x = 1e3 + _randn(3, 64, seed=5)
    torch.testing.assert_close(layer_norm(x), F.layer_norm(x, (64,)), atol=2e-3, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rms_norm_matches_formula_and_torch(dtype):
    x = 2 * _randn(4, 3, 12, seed=6, dtype=dtype) + 1
    w = _randn(12, seed=7, dtype=dtype)
    rows = x.reshape(-1, 12).tolist()
    by_hand = torch.tensor([[v / math.sqrt(sum(u * u for u in r) / 12 + 1e-5) for v in r] for r in rows], dtype=dtype)
    atol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(rms_norm(x, eps=1e-5), by_hand.reshape(x.shape), atol=atol, rtol=1e-5)
    got = rms_norm(x, w, eps=1e-5)
    assert got.dtype == dtype
    torch.testing.assert_close(got, F.rms_norm(x, (12,), w, eps=1e-5), atol=atol, rtol=1e-5)


def test_rms_norm_properties():
    x = _randn(3, 7, 24, seed=8, dtype=torch.float64)
    y = rms_norm(x, eps=0.0)
    torch.testing.assert_close(y.pow(2).mean(-1), torch.ones(3, 7, dtype=torch.float64))
    torch.testing.assert_close(rms_norm(0.01 * x, eps=0.0), y)  # scale-invariant...
    assert not torch.allclose(rms_norm(x + 3.0, eps=0.0), y, atol=1e-2)  # ...but not shift-invariant
    torch.testing.assert_close(rms_norm(torch.zeros(2, 5)), torch.zeros(2, 5))  # eps keeps zeros finite


def test_formulas_leave_their_arguments_alone():
    x, w, b = _randn(3, 8, seed=14), _randn(8, seed=15), _randn(8, seed=16)
    kept = [t.clone() for t in (x, w, b)]
    layer_norm(x, w, b)
    rms_norm(x, w)
    for before, after in zip(kept, (x, w, b)):
        assert torch.equal(before, after)


def test_formulas_reject_bad_input():
    x = torch.randn(2, 4)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        layer_norm([[1.0, 2.0]])
    with pytest.raises(ValueError, match="weight must have shape \\(4,\\)"):
        layer_norm(x, torch.ones(5))
    with pytest.raises(ValueError, match="bias must have shape \\(4,\\)"):
        layer_norm(x, None, torch.ones(4, 1))
    with pytest.raises(TypeError, match="weight must be None or a torch.Tensor"):
        rms_norm(x, [1.0] * 4)
    with pytest.raises(ValueError, match="at least one dimension"):
        rms_norm(torch.tensor(3.0))


# ---------------------------------------------------------------- the modules

@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_module_matches_torch_both_ways(bias):
    theirs = torch.nn.LayerNorm(48, eps=1e-6, bias=bias)
    with torch.no_grad():
        theirs.weight.normal_()
        if bias:
            theirs.bias.normal_()
    ours = LayerNorm(48, eps=1e-6, bias=bias)
    ours.load_state_dict(theirs.state_dict())
    x = 3 * _randn(2, 9, 48, seed=9) - 1
    torch.testing.assert_close(ours(x), theirs(x))
    # and back: our state dict loads into torch's module
    fresh = torch.nn.LayerNorm(48, eps=1e-6, bias=bias)
    fresh.load_state_dict(ours.state_dict())
    torch.testing.assert_close(fresh(x), ours(x))
    assert n_parameters(ours) == n_parameters(theirs) == (96 if bias else 48)
    assert (ours.bias is None) == (not bias)


def test_layernorm_module_gradients_match_torch():
    theirs, ours = torch.nn.LayerNorm(16), LayerNorm(16)
    with torch.no_grad():
        theirs.weight.uniform_(0.5, 1.5)
        theirs.bias.normal_()
    ours.load_state_dict(theirs.state_dict())
    x = _randn(4, 16, seed=10)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    (theirs(x1) * torch.arange(16.0)).sum().backward()
    (ours(x2) * torch.arange(16.0)).sum().backward()
    torch.testing.assert_close(x2.grad, x1.grad)
    torch.testing.assert_close(ours.weight.grad, theirs.weight.grad)
    torch.testing.assert_close(ours.bias.grad, theirs.bias.grad)


def test_rmsnorm_module_matches_torch():
    theirs = torch.nn.RMSNorm(40, eps=1e-5)
    with torch.no_grad():
        theirs.weight.normal_()
    ours = RMSNorm(40, eps=1e-5)
    ours.load_state_dict(theirs.state_dict())
    x = _randn(3, 5, 40, seed=11)
    torch.testing.assert_close(ours(x), theirs(x))
    torch.testing.assert_close(ours(x), rms_norm(x, ours.weight, eps=1e-5))
    assert n_parameters(ours) == 40


@pytest.mark.parametrize("eps", [0.0, 0.5])
def test_modules_use_their_eps(eps):
    # a row of small variance, where eps = 0.5 changes the output by a large factor
    x = 0.1 * _randn(2, 16, seed=17)
    torch.testing.assert_close(LayerNorm(16, eps=eps)(x), F.layer_norm(x, (16,), eps=eps))
    torch.testing.assert_close(RMSNorm(16, eps=eps)(x), F.rms_norm(x, (16,), eps=eps))
    torch.testing.assert_close(build_norm("layernorm", 16, eps=eps)(x), F.layer_norm(x, (16,), eps=eps))


def test_modules_start_as_identity_maps_of_the_normalized_input():
    x = _randn(2, 3, 8, seed=12)
    torch.testing.assert_close(LayerNorm(8)(x), F.layer_norm(x, (8,)))
    torch.testing.assert_close(RMSNorm(8)(x), F.rms_norm(x, (8,), eps=1e-5))


def test_modules_work_in_bfloat16():
    x = _randn(2, 6, 32, seed=13)
    for module in (LayerNorm(32), RMSNorm(32)):
        reference = module(x)
        low = module.to(torch.bfloat16)(x.to(torch.bfloat16))
        assert low.dtype == torch.bfloat16
        torch.testing.assert_close(low.float(), reference, atol=3e-2, rtol=3e-2)


# ---------------------------------------------------------------- build_norm and the counts

@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("d_model", [64, 768])
def test_build_norm_parameters_match_config(norm, bias, d_model):
    config = ModelConfig(d_model=d_model, n_heads=4, d_ff=4 * d_model, norm=norm, bias=bias)
    module = build_norm(norm, d_model, bias=bias)
    assert type(module) is {"layernorm": LayerNorm, "rmsnorm": RMSNorm}[norm]
    assert n_parameters(module) == norm_parameters(config)


def test_build_norm_passes_eps_and_knows_every_config_choice():
    from minillm.config import CHOICES

    assert set(NORMS.names()) == set(CHOICES["norm"])
    assert build_norm("layernorm", 8, eps=1e-3).eps == 1e-3
    assert build_norm("rmsnorm", 8, eps=1e-6).eps == 1e-6


def test_build_norm_rejects_unknown_names_listing_the_known_ones():
    with pytest.raises(ValueError, match="unknown norm 'batchnorm'; known: layernorm, rmsnorm"):
        build_norm("batchnorm", 16)


def test_build_norm_goes_through_the_registry(monkeypatch):
    """The built-ins are forward references: the class standing at minillm.norm.RMSNorm now
    (a learner's, in a student bundle) is what build_norm builds; a registered norm builds too."""
    import copy

    from minillm import norm as norm_module

    class Mine(RMSNorm):
        pass

    monkeypatch.setattr(norm_module, "RMSNorm", Mine)
    assert type(build_norm("rmsnorm", 8)) is Mine
    registry = copy.deepcopy(norm_module.NORMS)
    monkeypatch.setattr(norm_module, "NORMS", registry)
    seen = []
    registry.register("scaled", lambda d_model, eps, bias: seen.append((d_model, eps, bias)) or torch.nn.Identity())
    assert isinstance(build_norm("scaled", 8, eps=1e-3, bias=False), torch.nn.Identity)
    assert seen == [(8, 1e-3, False)]
    with pytest.raises(ValueError, match="norm 'layernorm' is already registered"):
        registry.register("layernorm", RMSNorm)


@pytest.mark.parametrize("cls", [LayerNorm, RMSNorm])
def test_modules_reject_bad_arguments(cls):
    for d_model in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="d_model must be an int >= 1"):
            cls(d_model)
    for eps in (-1e-6, float("nan"), float("inf"), "small"):
        with pytest.raises(ValueError, match=r"eps must be a number in \[0.0, inf\)"):
            cls(8, eps=eps)
    with pytest.raises(TypeError, match="bias must be True or False"):
        cls(8, bias="yes")
