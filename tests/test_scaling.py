"""minillm.scaling: FLOP accounting against torch's FlopCounterMode on the real model, and the
fits against data with a known answer (an exact power law, the Chinchilla law with noise)."""
import math
import warnings

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from minillm import scaling
from minillm.model import GPT, GPTConfig, count_parameters

SHAPES = [dict(d_model=64, n_layers=2, n_heads=4, d_ff=256),  # GPT-2 style: biases, LayerNorm, GELU, learned positions
          dict(d_model=96, n_layers=3, n_heads=6, n_kv_heads=2, positions="rope", norm="rmsnorm", ffn="swiglu",
               bias=False, d_ff=None),
          dict(d_model=48, n_layers=1, n_heads=3, d_ff=192, tie_embeddings=False)]


def _counted(config: GPTConfig, batch: int, seq: int) -> int:
    model = GPT(config)
    ids = torch.randint(0, config.vocab_size, (batch, seq))
    with FlopCounterMode(display=False) as counter:
        model(ids, ids)[1].backward()
    return counter.get_total_flops()


def _elementwise_parameters(config: GPTConfig) -> int:
    """Biases and norm gains: in N, but multiplied into no matrix product (FlopCounterMode counts only those)."""
    with torch.device("meta"):
        model = GPT(config)
    matrices = {id(p) for name, p in model.named_parameters() if p.dim() == 2}
    return sum(p.numel() for p in model.parameters() if id(p) not in matrices)


@pytest.mark.parametrize("shape", SHAPES, ids=["gpt2-style", "llama-style-gqa", "untied"])
def test_training_flops_match_flop_counter_mode_on_forward_and_backward(shape):
    # the "math" backend: its matrix products are what FlopCounterMode sees (it has no formula for
    # the CPU kernel behind F.scaled_dot_product_attention, so "sdpa" would hide the attention term)
    config = GPTConfig(vocab_size=300, context_length=32, attention_backend="math", **shape)
    batch, seq = 3, 32
    tokens = batch * seq
    counted = _counted(config, batch, seq)
    predicted = scaling.training_flops(config, tokens, seq)
    # exact once the parameters that only add or scale are left out of N: 6 FLOPs a token each
    assert predicted - 6 * tokens * _elementwise_parameters(config) == counted
    assert abs(predicted / counted - 1) < 0.02, "the stated tolerance: within 2% at these small widths"


def test_the_attention_term_is_what_the_context_adds():
    config = GPTConfig(vocab_size=300, context_length=64, attention_backend="math", **SHAPES[0])
    short, long = _counted(config, 2, 16), _counted(config, 1, 32)  # the same 32 tokens, windows of 16 and of 32
    assert long - short == scaling.attention_training_flops(config, 32, 32) - scaling.attention_training_flops(
        config, 32, 16)
    assert scaling.attention_training_flops(config, 10, 16) == 12 * 2 * 16 * 64 * 10


def test_n_is_the_non_embedding_count_plus_a_tied_head():
    tied = GPTConfig(vocab_size=300, context_length=32, **SHAPES[0])
    untied = GPTConfig(vocab_size=300, context_length=32, **{**SHAPES[0], "tie_embeddings": False})
    n_tied = count_parameters(tied, non_embedding=True) + 300 * 64
    assert scaling.training_flops_6nd(tied, 7) == 6 * n_tied * 7
    assert scaling.training_flops_6nd(untied, 7) == 6 * count_parameters(untied, non_embedding=True) * 7 == 6 * n_tied * 7


def test_inference_flops_per_token():
    config = GPTConfig(vocab_size=300, context_length=32, attention_backend="math", **SHAPES[0])
    model = GPT(config).eval()
    ids = torch.randint(0, 300, (1, 20))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(ids)
    # a forward of 20 tokens: token t attends over t + 1 positions in a cache, over all 20 in this dense pass
    dense = sum(scaling.inference_flops(config, 20) for _ in range(20))
    assert dense - 2 * 20 * _elementwise_parameters(config) == counter.get_total_flops()
    assert scaling.inference_flops(config, 32) - scaling.inference_flops(config, 1) == 4 * 2 * 31 * 64
    with pytest.raises(ValueError, match="context"):
        scaling.inference_flops(config, 33)


def test_tokens_for_compute_spends_the_budget():
    config = GPTConfig(vocab_size=300, context_length=32, **SHAPES[0])
    tokens = scaling.tokens_for_compute(config, 1e9)
    assert scaling.training_flops(config, tokens) <= 1e9 < scaling.training_flops(config, tokens + 1)
    for bad in (0, -1.0, "1e9", True):
        with pytest.raises(ValueError, match="compute"):
            scaling.tokens_for_compute(config, bad)


def test_bad_input_names_the_argument():
    config = GPTConfig(vocab_size=300, context_length=32, **SHAPES[0])
    with pytest.raises(ValueError, match="tokens"):
        scaling.training_flops(config, -1)
    with pytest.raises(ValueError, match="seq_len"):
        scaling.training_flops(config, 10, 64)
    with pytest.raises(TypeError, match="config"):
        scaling.training_flops({"d_model": 64}, 10)


def test_fit_power_law_recovers_an_exact_law():
    n = np.logspace(4, 8, 7)
    fit = scaling.fit_power_law(n, 5.0 * n ** -0.3 + 1.5)
    assert fit.c_pinned
    assert fit.a == pytest.approx(5.0, rel=1e-6) and fit.alpha == pytest.approx(0.3, rel=1e-6)
    assert fit.c == pytest.approx(1.5, rel=1e-6)
    assert fit(1e9) == pytest.approx(5.0 * 1e9 ** -0.3 + 1.5, rel=1e-6)


def test_fit_power_law_uncertainty_covers_the_truth_under_noise():
    rng = np.random.default_rng(0)
    n = np.logspace(4, 8, 9)
    inside = 0
    for _ in range(40):
        loss = (4.0 * n ** -0.25 + 1.0) * (1 + 0.003 * rng.standard_normal(len(n)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", scaling.ScalingFitWarning)
            fit = scaling.fit_power_law(n, loss)
        assert fit.alpha_std > 0
        inside += abs(fit.alpha - 0.25) < 2 * fit.alpha_std
    assert inside >= 32, f"a 2-sigma interval should hold the true alpha about 95% of the time, held it {inside}/40"


def test_fit_power_law_warns_when_c_cannot_be_pinned():
    n = np.logspace(4, 6, 5)
    with pytest.warns(scaling.ScalingFitWarning, match="cannot pin down the offset c"):
        fit = scaling.fit_power_law(n, 3.0 * n ** -0.1)  # no floor at all: the best c is the bound, 0
    assert not fit.c_pinned
    with pytest.warns(scaling.ScalingFitWarning):
        assert math.isnan(scaling.fit_power_law(n[:3], 3.0 * n[:3] ** -0.1 + 1).alpha_std)  # 3 points, 3 unknowns
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fixed = scaling.fit_power_law(n, 3.0 * n ** -0.1, c=0.0)  # a given c: no warning
    assert fixed.alpha == pytest.approx(0.1, rel=1e-6) and fixed.c_std == 0 and fixed.c_pinned


def test_fit_power_law_refuses_bad_input():
    with pytest.raises(ValueError, match="same length"):
        scaling.fit_power_law([1e4, 1e5, 1e6, 1e7], [3.0, 2.0, 1.5])
    with pytest.raises(ValueError, match="loss"):
        scaling.fit_power_law([1e4, 1e5, 1e6], [3.0, -2.0, 1.0])
    with pytest.raises(ValueError, match="c must"):
        scaling.fit_power_law([1e4, 1e5, 1e6], [3.0, 2.0, 1.0], c=1.5)
    with pytest.raises(ValueError, match="two different sizes"):
        scaling.fit_power_law([1e4, 1e4, 1e4], [3.0, 2.0, 1.0])


# Hoffmann et al. (2022), approach 3: L(N, D) = E + A / N^alpha + B / D^beta
E, A, B, ALPHA, BETA = 1.69, 406.4, 410.7, 0.34, 0.28


def test_isoflop_fit_recovers_the_chinchilla_exponent():
    """Synthetic IsoFLOP data from the Chinchilla law, with 0.2% noise, 4 budgets x 7 sizes each:
    the fit recovers a = beta / (alpha + beta) = 0.452 within 0.02 (the stated tolerance)."""
    rng = np.random.default_rng(1)
    compute, n, loss = [], [], []
    for budget in (1e18, 1e19, 1e20, 1e21):
        optimum = (ALPHA * A / (BETA * B)) ** (1 / (ALPHA + BETA)) * (budget / 6) ** (BETA / (ALPHA + BETA))
        for factor in np.logspace(-1, 1, 7):
            size = optimum * factor
            compute.append(budget)
            n.append(size)
            loss.append((E + A / size ** ALPHA + B / (budget / (6 * size)) ** BETA) * (1 + 0.002 * rng.standard_normal()))
    fit = scaling.fit_isoflop(compute, n, loss)
    assert fit.exponent == pytest.approx(BETA / (ALPHA + BETA), abs=0.02)
    assert fit.exponent_std < 0.02
    assert len(fit.budgets) == 4 and fit.budgets == tuple(sorted(fit.budgets))
    assert fit(1e20) == pytest.approx(fit.n_opt[2], rel=0.1)


def test_isoflop_minimum_is_the_parabola_s_vertex_and_warns_outside():
    n = np.array([1e4, 1e5, 1e6, 1e7])
    assert scaling.isoflop_minimum(n, (np.log(n) - math.log(3e5)) ** 2 + 2) == pytest.approx(3e5, rel=1e-9)
    with pytest.warns(scaling.ScalingFitWarning, match="outside the sizes tried"):
        scaling.isoflop_minimum(n, (np.log(n) - math.log(1e8)) ** 2 + 2)
    with pytest.raises(ValueError, match="curve up"):
        scaling.isoflop_minimum(n, 100 - (np.log(n) - math.log(3e5)) ** 2)
    with pytest.raises(ValueError, match="two different budgets"):
        scaling.fit_isoflop([1e12] * 6, n.tolist() + [1e8, 1e9], [3, 2, 1, 2, 3, 4])
