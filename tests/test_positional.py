"""minillm.positional against naive formulas, Hugging Face's Llama and BLOOM code, and the papers."""
import math
from types import SimpleNamespace

import pytest
import torch

from minillm.positional import (
    POSITIONS,
    ALiBi,
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    sinusoidal_encoding,
    sinusoidal_shift_matrix,
)


# --- sinusoidal encodings -------------------------------------------------------------

def naive_sinusoid(seq_len, d_model):
    """The sleeve's formula, entry by entry, in double precision."""
    return torch.tensor([
        [math.sin(pos / 10000 ** (j / d_model)) if j % 2 == 0 else math.cos(pos / 10000 ** ((j - 1) / d_model))
         for j in range(d_model)]
        for pos in range(seq_len)
    ], dtype=torch.float64)


@pytest.mark.parametrize("seq_len,d_model", [(1, 2), (17, 6), (64, 32), (300, 128)])
def test_sinusoid_matches_the_formula(seq_len, d_model):
    got = sinusoidal_encoding(seq_len, d_model, dtype=torch.float64)
    torch.testing.assert_close(got, naive_sinusoid(seq_len, d_model), atol=1e-12, rtol=1e-12)
    assert sinusoidal_encoding(seq_len, d_model).dtype == torch.float32


def test_sinusoid_matches_the_annotated_transformer():
    # the widely copied formulation with exp/log, written independently
    d_model, seq_len = 64, 100
    position = torch.arange(seq_len).unsqueeze(1).double()
    div_term = torch.exp(torch.arange(0, d_model, 2).double() * -(math.log(10000.0) / d_model))
    expected = torch.zeros(seq_len, d_model, dtype=torch.float64)
    expected[:, 0::2] = torch.sin(position * div_term)
    expected[:, 1::2] = torch.cos(position * div_term)
    torch.testing.assert_close(sinusoidal_encoding(seq_len, d_model, dtype=torch.float64), expected)


def test_sinusoid_is_bounded_with_constant_norm():
    pe = sinusoidal_encoding(5000, 64, dtype=torch.float64)
    assert pe.abs().max() <= 1.0
    torch.testing.assert_close(pe.norm(dim=1), torch.full((5000,), math.sqrt(32.0), dtype=torch.float64))


def test_a_shift_is_one_fixed_linear_map():
    # Fit the map PE(p) -> PE(p + k) by least squares on early positions, then check that the
    # same map works at positions far away: the map does not depend on p.
    d_model, k = 16, 7
    pe = sinusoidal_encoding(1200, d_model, dtype=torch.float64)
    fitted = torch.linalg.lstsq(pe[0:300], pe[k:300 + k]).solution  # rows: PE(p) @ fitted = PE(p+k)
    # (the slowest pairs barely turn in 300 positions, so the fit is only good to about 1e-7)
    torch.testing.assert_close(pe[800:1100] @ fitted, pe[800 + k:1100 + k], atol=1e-5, rtol=0)
    torch.testing.assert_close(fitted.T, sinusoidal_shift_matrix(k, d_model, dtype=torch.float64), atol=1e-5, rtol=0)


@pytest.mark.parametrize("k,d_model", [(1, 2), (5, 10), (-3, 8), (250, 64)])
def test_shift_matrix_shifts_orthogonally(k, d_model):
    pe = naive_sinusoid(400, d_model)
    M = sinusoidal_shift_matrix(k, d_model, dtype=torch.float64)
    lo, hi = max(0, -k), min(400, 400 - k)
    torch.testing.assert_close(pe[lo:hi] @ M.T, pe[lo + k:hi + k], atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(M @ M.T, torch.eye(d_model, dtype=torch.float64), atol=1e-12, rtol=0)  # entries of at most 1
    M2 = sinusoidal_shift_matrix(2 * k, d_model, dtype=torch.float64)
    torch.testing.assert_close(M @ M, M2, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("args,name", [((4, 7), "d_model"), ((4, 0), "d_model"), ((0, 4), "seq_len"), ((2.5, 4), "seq_len")])
def test_sinusoid_refuses_bad_sizes(args, name):
    with pytest.raises(ValueError, match=name):
        sinusoidal_encoding(*args)


def test_shift_matrix_refuses_odd_width():
    with pytest.raises(ValueError, match="d_model"):
        sinusoidal_shift_matrix(1, 9)


def test_sinusoidal_layer_has_no_parameters_and_no_limit():
    layer = SinusoidalPositionalEncoding(12)
    assert list(layer.parameters()) == []
    positions = torch.tensor([0, 5, 3000, 7])
    torch.testing.assert_close(layer(positions), sinusoidal_encoding(3001, 12)[positions])
    with pytest.raises(ValueError, match="d_model"):
        SinusoidalPositionalEncoding(5)
    with pytest.raises(ValueError, match="positions"):
        layer(torch.tensor([-1]))
    with pytest.raises(TypeError, match="positions"):
        layer(torch.tensor([1.0]))


# --- learned positions ----------------------------------------------------------------

def test_learned_positions_are_rows_and_train_only_the_rows_used():
    torch.manual_seed(0)
    layer = LearnedPositionalEmbedding(10, 4)
    out = layer(torch.arange(3))
    torch.testing.assert_close(out, layer.weight[:3])
    out.sum().backward()
    assert torch.all(layer.weight.grad[:3] == 1) and torch.all(layer.weight.grad[3:] == 0)
    assert abs(LearnedPositionalEmbedding(4000, 64).weight.std().item() - 1 / 8) < 0.005


def test_learned_positions_refuse_positions_past_the_context():
    layer = LearnedPositionalEmbedding(8, 4)
    with pytest.raises(ValueError, match="max_len"):
        layer(torch.arange(9))
    with pytest.raises(TypeError, match="positions"):
        layer(torch.arange(3).float())
    with pytest.raises(ValueError, match="max_len"):
        LearnedPositionalEmbedding(0, 4)
    with pytest.raises(ValueError, match=">= 0"):  # a negative position is not "past the context"
        layer(torch.tensor([2, -1]))
    with pytest.raises(ValueError, match="init_std"):
        LearnedPositionalEmbedding(8, 4, init_std=0.0)
    assert LearnedPositionalEmbedding(8, 4, init_std=2.0).init_std == 2.0


# --- RoPE -----------------------------------------------------------------------------

def rope_complex(x, positions, theta=10000.0):
    """Interleaved RoPE as Meta's original Llama code computes it, with complex numbers."""
    d = x.shape[-1]
    freqs = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    rotation = torch.polar(torch.ones(len(positions), d // 2, dtype=torch.float64), positions.double()[:, None] * freqs)
    pairs = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(pairs * rotation).flatten(-2)


@pytest.mark.parametrize("shape,theta", [((2, 3, 5, 8), 10000.0), ((7, 4), 10000.0), ((1, 2, 9, 64), 500000.0)])
def test_interleaved_rope_matches_complex_rotation(shape, theta):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, dtype=torch.float64, generator=generator)
    positions = torch.randint(0, 4000, (shape[-2],), generator=generator)
    torch.testing.assert_close(apply_rope(x, positions, theta, interleaved=True), rope_complex(x, positions, theta))


@pytest.mark.parametrize("head_dim,theta", [(8, 10000.0), (64, 10000.0), (32, 500000.0)])
def test_split_half_rope_matches_hugging_face_llama(head_dim, theta):
    import transformers
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    n_heads, seq, batch = 2, 11, 3
    config = transformers.LlamaConfig(hidden_size=head_dim * n_heads, num_attention_heads=n_heads,
                                      max_position_embeddings=4096, rope_theta=theta)
    config.rope_parameters = {"rope_type": "default", "rope_theta": theta}
    rotary = LlamaRotaryEmbedding(config)
    generator = torch.Generator().manual_seed(head_dim)
    q = torch.randn(batch, n_heads, seq, head_dim, generator=generator)
    k = torch.randn(batch, n_heads, seq, head_dim, generator=generator)
    positions = torch.arange(seq) + 100
    cos, sin = rotary(q, positions[None].expand(batch, seq))
    expected_q, expected_k = apply_rotary_pos_emb(q, k, cos, sin)
    torch.testing.assert_close(apply_rope(q, positions, theta), expected_q, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(apply_rope(k, positions, theta), expected_k, atol=1e-4, rtol=1e-4)


def test_conventions_agree_up_to_a_permutation():
    x = torch.randn(2, 3, 6, 16, dtype=torch.float64)
    positions = torch.arange(6) * 13
    to_halves = torch.cat([torch.arange(0, 16, 2), torch.arange(1, 16, 2)])
    split = apply_rope(x[..., to_halves], positions)
    torch.testing.assert_close(split[..., to_halves.argsort()], apply_rope(x, positions, interleaved=True))
    # and the two are genuinely different functions of the same input
    assert not torch.allclose(apply_rope(x, positions), apply_rope(x, positions, interleaved=True))


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_scores_depend_only_on_relative_position(interleaved):
    generator = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 32, dtype=torch.float64, generator=generator)

    def score(m, n):
        rq = apply_rope(q[None], torch.tensor([m]), interleaved=interleaved)
        rk = apply_rope(k[None], torch.tensor([n]), interleaved=interleaved)
        return (rq * rk).sum().item()

    for m, n in [(0, 5), (17, 3), (100, 100)]:
        for shift in (1, 250, 3000):
            assert score(m + shift, n + shift) == pytest.approx(score(m, n), abs=1e-9)
    assert score(0, 0) == pytest.approx((q * k).sum().item(), abs=1e-12)
    assert score(0, 5) != pytest.approx(score(0, 6), abs=1e-3)  # the offset does matter


def test_rope_preserves_norms_dtype_and_position_zero():
    x = torch.randn(4, 9, 10)
    out = apply_rope(x, torch.arange(9))
    assert out.dtype == x.dtype and out.shape == x.shape
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(out[:, 0], x[:, 0])
    half = apply_rope(x.half(), torch.arange(9))
    assert half.dtype == torch.float16


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_leaves_its_input_alone(interleaved):
    x = torch.randn(2, 5, 8)
    before = x.clone()
    out = apply_rope(x, torch.arange(5) + 4, interleaved=interleaved)
    assert torch.equal(x, before) and out.data_ptr() != x.data_ptr()


def test_rope_theta_sets_the_frequencies():
    x = torch.randn(3, 6)
    positions = torch.tensor([1, 2, 7])
    # pair 1 of a width-6 head turns at theta**(-2/6) radians per position
    for theta in (50.0, 10000.0):
        angle = positions.double() * theta ** (-2 / 6)
        a, b = x[:, 1].double(), x[:, 4].double()
        out = apply_rope(x, positions, theta)
        torch.testing.assert_close(out[:, 1].double(), a * angle.cos() - b * angle.sin(), rtol=1.3e-6, atol=1e-5)
        torch.testing.assert_close(out[:, 4].double(), a * angle.sin() + b * angle.cos(), rtol=1.3e-6, atol=1e-5)


@pytest.mark.parametrize("x,positions", [
    (torch.randn(4, 5), torch.arange(4)),        # odd head_dim
    (torch.randn(4, 6), torch.arange(5)),        # positions do not match seq
    (torch.randn(6), torch.arange(1)),           # no seq axis
])
def test_rope_refuses_bad_shapes(x, positions):
    with pytest.raises(ValueError):
        apply_rope(x, positions)


def test_rotary_module_rotates_queries_and_keys():
    rotary = RotaryEmbedding(8, theta=100.0, interleaved=True)
    q, k = torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    positions = torch.arange(5) + 3
    rq, rk = rotary(q, k, positions)
    torch.testing.assert_close(rq, apply_rope(q, positions, 100.0, interleaved=True))
    torch.testing.assert_close(rk, apply_rope(k, positions, 100.0, interleaved=True))
    assert list(rotary.parameters()) == []
    with pytest.raises(ValueError, match="head_dim"):
        rotary.rotate(torch.randn(5, 6), positions)
    with pytest.raises(ValueError, match="head_dim"):
        RotaryEmbedding(7)
    with pytest.raises(ValueError, match="theta"):
        RotaryEmbedding(8, theta=1.0)


# --- ALiBi ----------------------------------------------------------------------------

def paper_slopes(n):
    """get_slopes from the code published with the ALiBi paper (ofirpress/attention_with_linear_biases)."""
    def get_slopes_power_of_2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        ratio = start
        return [start * ratio**i for i in range(n)]
    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return get_slopes_power_of_2(closest_power_of_2) + paper_slopes(2 * closest_power_of_2)[0::2][: n - closest_power_of_2]


def test_slopes_of_eight_heads_are_the_published_ones():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -h for h in range(1, 9)]))


def test_slopes_of_non_powers_of_two_follow_the_papers_rule():
    # 6 heads: the 4 slopes of 4 heads, then every other slope of 8 heads (1/2, 1/8)
    torch.testing.assert_close(alibi_slopes(6), torch.tensor([1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8]))
    # 12 heads: the 8 slopes of 8 heads, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5 from 16 heads
    expected = [2.0 ** -h for h in range(1, 9)] + [2 ** -0.5, 2 ** -1.5, 2 ** -2.5, 2 ** -3.5]
    torch.testing.assert_close(alibi_slopes(12), torch.tensor(expected))


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 16, 24, 40, 64, 96])
def test_slopes_match_the_papers_code(n):
    torch.testing.assert_close(alibi_slopes(n), torch.tensor(paper_slopes(n), dtype=torch.float32))


@pytest.mark.parametrize("n", [4, 6, 12, 16, 20])
def test_slopes_match_hugging_face_bloom(n):
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    alibi = build_alibi_tensor(torch.ones(1, 3), n, torch.float32)  # (heads, 1, seq): slope * key position
    torch.testing.assert_close(alibi_slopes(n), alibi[:, 0, 1])


def naive_alibi(n_heads, q_len, k_len):
    slopes = paper_slopes(n_heads)
    return torch.tensor([[[-slopes[h] * ((k_len - q_len + i) - j) for j in range(k_len)] for i in range(q_len)]
                         for h in range(n_heads)])


@pytest.mark.parametrize("n_heads,q_len,k_len", [(1, 1, 1), (4, 5, 5), (6, 3, 8), (12, 1, 20)])
def test_alibi_bias_matches_the_formula(n_heads, q_len, k_len):
    got = alibi_bias(n_heads, q_len, k_len)
    assert got.shape == (n_heads, q_len, k_len) and got.dtype == torch.float32
    torch.testing.assert_close(got, naive_alibi(n_heads, q_len, k_len))


def test_alibi_decode_rows_equal_the_last_rows_of_the_full_bias():
    full = alibi_bias(8, 12, 12)
    torch.testing.assert_close(alibi_bias(8, 1, 12), full[:, -1:])
    torch.testing.assert_close(alibi_bias(8, 4, 12), full[:, -4:])


def test_alibi_attention_equals_bloom_after_the_causal_mask():
    # BLOOM adds slope * key_position instead; the two differ by a constant per query row,
    # which the softmax ignores, so the causal attention weights agree.
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    n_heads, seq = 6, 9
    scores = torch.randn(n_heads, seq, seq)
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    ours = torch.softmax((scores + alibi_bias(n_heads, seq, seq)).masked_fill(~causal, float("-inf")), dim=-1)
    bloom_bias = build_alibi_tensor(torch.ones(1, seq), n_heads, torch.float32)  # (heads, 1, seq)
    theirs = torch.softmax((scores + bloom_bias).masked_fill(~causal, float("-inf")), dim=-1)
    torch.testing.assert_close(ours, theirs)


@pytest.mark.parametrize("args,name", [((0, 2, 2), "n_heads"), ((4, 0, 2), "q_len"), ((4, 3, 2), "q_len"), ((4, 2, 0), "k_len")])
def test_alibi_refuses_bad_sizes(args, name):
    with pytest.raises(ValueError, match=name):
        alibi_bias(*args)
    if name == "n_heads":
        for bad in (0, 2.5, True):
            with pytest.raises(ValueError, match="n_heads"):
                alibi_slopes(bad)


# --- per-row positions and the registry ------------------------------------------------

ROWS = torch.tensor([[0, 0, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5], [0, 0, 0, 0, 0, 7]])  # (batch, seq), as a left-padded batch gives


@pytest.mark.parametrize("layer", [LearnedPositionalEmbedding(10, 6), SinusoidalPositionalEncoding(6)])
def test_embedding_layers_take_a_row_of_positions_per_sequence(layer):
    got = layer(ROWS)
    assert got.shape == (3, 6, 6)
    for row in range(3):
        torch.testing.assert_close(got[row], layer(ROWS[row]))
    with pytest.raises(ValueError, match="positions"):
        layer(ROWS[None])


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_rotates_each_sequence_by_its_own_positions(interleaved):
    rotary = RotaryEmbedding(8, theta=500.0, interleaved=interleaved)
    x = torch.randn(3, 2, 6, 8, dtype=torch.float64)
    got = rotary.rotate(x, ROWS)
    expected = torch.stack([apply_rope(x[b], ROWS[b], 500.0, interleaved) for b in range(3)])
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(rotary.rotate(x, ROWS[1].expand(3, 6)), rotary.rotate(x, ROWS[1]))
    for bad in (ROWS[:2], ROWS[:, :5]):
        with pytest.raises(ValueError, match="positions"):
            rotary.rotate(x, bad)


@pytest.mark.parametrize("n_heads,q_len,k_len", [(1, 1, 1), (4, 5, 5), (6, 3, 8), (12, 1, 20)])
def test_alibi_layer_equals_alibi_bias_on_the_positions_it_assumes(n_heads, q_len, k_len):
    layer = ALiBi(n_heads)
    got = layer(torch.arange(k_len - q_len, k_len), torch.arange(k_len))
    torch.testing.assert_close(got, naive_alibi(n_heads, q_len, k_len))
    assert list(layer.parameters()) == [] and layer.state_dict() == {}


def test_alibi_layer_per_row_matches_bloom_with_its_padding_mask():
    # BLOOM builds its bias from the padding mask (positions = cumsum(mask) - 1); it adds
    # slope * key_position, which differs from ours by a constant per query row, so the
    # softmax weights over the real, earlier keys agree.
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    n_heads, seq = 6, 7
    # left padding, none, and holes (where counting real tokens differs from counting slots)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1], [1, 0, 0, 1, 1, 0, 1]], dtype=torch.bool)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    ours = ALiBi(n_heads)(positions, positions)
    assert ours.shape == (3, n_heads, seq, seq)
    bloom = build_alibi_tensor(mask.long(), n_heads, torch.float32).reshape(3, n_heads, 1, seq)
    scores = torch.randn(3, n_heads, seq, seq)
    allowed = torch.ones(seq, seq, dtype=torch.bool).tril() & mask[:, None, None, :]
    for b, row in enumerate(mask):
        real = row.nonzero().flatten()
        weights = [torch.softmax((scores + bias).masked_fill(~allowed, float("-inf"))[b][:, real][:, :, real], dim=-1)
                   for bias in (ours, bloom)]
        torch.testing.assert_close(*weights)


def test_alibi_layer_refuses_mismatched_positions():
    layer = ALiBi(4)
    with pytest.raises(ValueError, match="q_positions"):
        layer(torch.arange(3), ROWS)
    with pytest.raises(TypeError, match="positions"):
        layer(torch.arange(3.0), torch.arange(3))


def _config(**kw):
    values = dict(context_length=16, d_model=12, n_heads=3, head_dim=4, init_std=0.02, rope_theta=100.0,
                  architecture="decoder")
    return SimpleNamespace(**{**values, **kw})


def test_positions_registry_names_each_layer_with_its_role():
    assert POSITIONS.names() == ("alibi", "learned", "rope", "sinusoidal")
    expected = {"learned": (LearnedPositionalEmbedding, "embedding"), "sinusoidal": (SinusoidalPositionalEncoding, "embedding"),
                "rope": (RotaryEmbedding, "rotary"), "alibi": (ALiBi, "bias")}
    for name, (layer_class, role) in expected.items():
        assert POSITIONS.get(name) is layer_class and layer_class.role == role
        assert isinstance(layer_class.from_config(_config()), layer_class)
    learned = LearnedPositionalEmbedding.from_config(_config())
    assert learned.weight.shape == (16, 12) and learned.init_std == 0.02
    assert SinusoidalPositionalEncoding.from_config(_config()).table.shape == (16, 12)
    assert RotaryEmbedding.from_config(_config()).theta == 100.0 and ALiBi.from_config(_config()).n_heads == 3
    with pytest.raises(ValueError, match="unknown position encoding 'nope'"):
        POSITIONS.get("nope")


@pytest.mark.parametrize("name, overrides, message", [
    ("sinusoidal", dict(d_model=9), "even d_model"), ("rope", dict(head_dim=5), "RoPE"),
    ("alibi", dict(architecture="encoder"), "ALiBi"),
])
def test_from_config_refuses_what_the_layer_cannot_serve(name, overrides, message):
    with pytest.raises(ValueError, match=message):
        POSITIONS.get(name).from_config(_config(**overrides))
