"""minillm.attention against torch's attention (functional and nn.MultiheadAttention), naive
formulas and hand-computed values, the defining properties, the hooks, and bad input."""
import copy
import math
import sys

import pytest
import torch
import torch.nn.functional as F

from minillm import attention
from minillm.attention import (
    MultiHeadAttention,
    causal_mask,
    get_attention_backend,
    kv_cache_bytes,
    merge_heads,
    register_attention_backend,
    repeat_kv,
    scaled_dot_product_attention,
    softmax,
    split_heads,
)
from minillm.config import ModelConfig

BACKENDS = ("math", "sdpa")


def randn(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# ---------------------------------------------------------------- softmax

@pytest.mark.parametrize("dim", [0, 1, 2, -1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_softmax_matches_torch(dim, dtype):
    x = 8 * randn(3, 4, 5, dtype=dtype)
    got = softmax(x, dim=dim)
    assert got.dtype == dtype
    torch.testing.assert_close(got, torch.softmax(x, dim=dim))


def test_softmax_is_shift_invariant():
    x = randn(4, 6)
    shift = 123.0 * randn(4, 1, seed=1)
    torch.testing.assert_close(softmax(x + shift, dim=-1), softmax(x, dim=-1))


def test_softmax_does_not_overflow_where_the_naive_formula_does():
    x = torch.tensor([[1000.0, 999.0, 998.0], [-1000.0, -1001.0, -1002.0]])
    naive = x.exp() / x.exp().sum(-1, keepdim=True)
    assert not torch.isfinite(naive).all()  # the test can fail: the formula as written overflows
    got = softmax(x, dim=-1)
    expected_row = torch.tensor([1.0, math.exp(-1), math.exp(-2)]) / (1 + math.exp(-1) + math.exp(-2))
    torch.testing.assert_close(got, torch.stack([expected_row, expected_row]))


def test_softmax_gives_minus_infinity_zero_weight():
    got = softmax(torch.tensor([0.0, float("-inf"), 0.0]), dim=0)
    assert torch.equal(got, torch.tensor([0.5, 0.0, 0.5]))


# ---------------------------------------------------------------- causal mask

@pytest.mark.parametrize("q_len, k_len", [(1, 1), (5, 5), (3, 7), (1, 9)])
def test_causal_mask_matches_the_definition(q_len, k_len):
    expected = torch.tensor([[j <= i + k_len - q_len for j in range(k_len)] for i in range(q_len)])
    got = causal_mask(q_len, k_len=k_len) if k_len != q_len else causal_mask(q_len)
    assert got.dtype == torch.bool and torch.equal(got, expected)


@pytest.mark.parametrize("kwargs, word", [({"seq_len": 0}, "seq_len"), ({"seq_len": 4, "k_len": 3}, "k_len")])
def test_causal_mask_rejects_bad_sizes(kwargs, word):
    with pytest.raises(ValueError, match=word):
        causal_mask(**kwargs)


# ---------------------------------------------------------------- scaled dot-product attention

def qkv(batch=2, heads=3, q_len=5, k_len=7, d_k=8, d_v=6, dtype=torch.float64, seed=0):
    return (randn(batch, heads, q_len, d_k, seed=seed, dtype=dtype), randn(batch, heads, k_len, d_k, seed=seed + 1, dtype=dtype),
            randn(batch, heads, k_len, d_v, seed=seed + 2, dtype=dtype))


def test_attention_hand_computed_value():
    # one query, two keys: scores (1+1+1+1)/sqrt(4) = 2 and 0
    q = torch.ones(1, 4)
    k = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    v = torch.tensor([[10.0], [0.0]])
    out, weights = scaled_dot_product_attention(q, k, v, return_weights=True)
    p = math.exp(2) / (math.exp(2) + 1)
    torch.testing.assert_close(weights, torch.tensor([[p, 1 - p]]))
    torch.testing.assert_close(out, torch.tensor([[10 * p]]))


def test_attention_matches_torch_without_mask():
    q, k, v = qkv()
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v))


@pytest.mark.parametrize("mask_shape", [(2, 3, 5, 7), (5, 7), (2, 1, 1, 7), (7,)])
def test_attention_matches_torch_with_bool_masks(mask_shape):
    q, k, v = qkv()
    mask = torch.rand(*mask_shape, generator=torch.Generator().manual_seed(3)) < 0.5
    mask[..., 0] = True
    torch_mask = mask if mask.dim() > 1 else mask.expand(5, 7)  # torch wants at least (q_len, k_len)
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, mask=mask),
                               F.scaled_dot_product_attention(q, k, v, attn_mask=torch_mask))


def test_attention_matches_torch_with_float_mask():
    q, k, v = qkv()
    mask = randn(1, 3, 5, 7, seed=4).masked_fill(torch.rand(1, 3, 5, 7, generator=torch.Generator().manual_seed(5)) < 0.3,
                                                 float("-inf"))
    mask[..., 1] = 0.0
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, mask=mask),
                               F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


def test_attention_matches_torch_causal():
    q, k, v = qkv(q_len=9, k_len=9, dtype=torch.float32)
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, mask=causal_mask(9)),
                               F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_bias_is_added_to_the_scores():
    q, k, v = qkv()
    bias = -0.3 * (torch.arange(7) - torch.arange(5)[:, None]).abs().double()
    mask = causal_mask(5, k_len=7)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.masked_fill(~mask, float("-inf")))
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, mask=mask, bias=bias), expected)


def test_attention_weights_match_the_naive_formula():
    q, k, v = qkv(batch=1, heads=1, q_len=3, k_len=4, d_k=2, d_v=2)
    mask = torch.tensor([[True, False, True, True], [True, True, False, False], [False, True, True, True]])
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask, return_weights=True)
    for i in range(3):
        scores = [float(q[0, 0, i] @ k[0, 0, j]) / math.sqrt(2) if mask[i, j] else -math.inf for j in range(4)]
        top = max(scores)
        exps = [math.exp(s - top) for s in scores]
        for j in range(4):
            assert weights[0, 0, i, j].item() == pytest.approx(exps[j] / sum(exps), abs=1e-12)
    torch.testing.assert_close(out, weights @ v)


def test_fully_masked_query_gives_zeros_and_finite_gradients():
    q, k, v = (t.requires_grad_(True) for t in qkv())
    mask = torch.ones(5, 7, dtype=torch.bool)
    mask[2] = False
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask, return_weights=True)
    assert torch.isfinite(out).all() and (out[:, :, 2] == 0).all() and (weights[:, :, 2] == 0).all()
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    float_mask = torch.zeros(5, 7, dtype=torch.float64).masked_fill(~mask, float("-inf"))
    assert (scaled_dot_product_attention(q, k, v, mask=float_mask)[:, :, 2] == 0).all()


@pytest.mark.parametrize("shape", [(5, 6), (4, 3, 5, 7), (6, 7)])
def test_mask_of_wrong_shape_is_a_value_error(shape):
    q, k, v = qkv()
    with pytest.raises(ValueError, match="mask"):
        scaled_dot_product_attention(q, k, v, mask=torch.ones(*shape, dtype=torch.bool))
    with pytest.raises(ValueError, match="bias"):
        scaled_dot_product_attention(q, k, v, bias=torch.zeros(*shape, dtype=torch.float64))


def test_mask_of_wrong_dtype_is_a_type_error():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="mask"):
        scaled_dot_product_attention(q, k, v, mask=torch.ones(5, 7, dtype=torch.long))


# ---------------------------------------------------------------- heads

def test_split_heads_gives_each_head_its_block_of_features():
    x = randn(2, 5, 36)[..., 12:24]  # a non-contiguous slice, as from a fused projection
    assert not x.is_contiguous()
    heads = split_heads(x, 3)
    assert heads.shape == (2, 3, 5, 4)
    for h in range(3):
        torch.testing.assert_close(heads[:, h], x[..., 4 * h:4 * h + 4])


def test_merge_heads_inverts_split_heads():
    x = randn(3, 4, 24)
    torch.testing.assert_close(merge_heads(split_heads(x, 6)), x)
    y = randn(2, 4, 3, 5)
    torch.testing.assert_close(merge_heads(y), torch.cat(list(y.unbind(1)), dim=-1))


def test_split_heads_rejects_indivisible_width():
    with pytest.raises(ValueError, match="n_heads"):
        split_heads(torch.zeros(1, 2, 10), 4)


def test_repeat_kv_groups_consecutive_heads():
    x = randn(2, 3, 4, 5)
    torch.testing.assert_close(repeat_kv(x, 4), x.repeat_interleave(4, dim=1))
    assert repeat_kv(x, 1) is x
    with pytest.raises(ValueError, match="n_rep"):
        repeat_kv(x, 0)


# ---------------------------------------------------------------- MultiHeadAttention

def copied_from_torch(d_model=32, n_heads=4, bias=True, seed=0, **kwargs):
    """A torch.nn.MultiheadAttention and our module with its weights copied across."""
    torch.manual_seed(seed)
    theirs = torch.nn.MultiheadAttention(d_model, n_heads, bias=bias, batch_first=True).eval()
    ours = MultiHeadAttention(d_model, n_heads, bias=bias, **kwargs).eval()
    with torch.no_grad():
        ours.qkv.weight.copy_(theirs.in_proj_weight)
        ours.out.weight.copy_(theirs.out_proj.weight)
        if bias:
            ours.qkv.bias.copy_(theirs.in_proj_bias)
            ours.out.bias.copy_(theirs.out_proj.bias)
    return ours, theirs


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bias", [True, False])
def test_mha_matches_torch_multihead_attention(backend, bias):
    ours, theirs = copied_from_torch(bias=bias, backend=backend)
    x = randn(3, 7, 32, dtype=torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x, x, x, need_weights=False)[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_mha_causal_and_padding_masks_match_torch(backend):
    ours, theirs = copied_from_torch(backend=backend, causal=True)
    x = randn(2, 6, 32, dtype=torch.float32)
    padding = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])  # sequence 1 has two padding tokens
    with torch.no_grad():
        expected, _ = theirs(x, x, x, attn_mask=~causal_mask(6), key_padding_mask=~padding, need_weights=False)
        torch.testing.assert_close(ours(x, mask=padding[:, None, None, :]), expected)
        plain = MultiHeadAttention(32, 4, backend=backend).eval()
        plain.load_state_dict(ours.state_dict())
        torch.testing.assert_close(plain(x, mask=causal_mask(6)), theirs(x, x, x, attn_mask=~causal_mask(6), need_weights=False)[0])


def test_attention_weights_match_torch_per_head_weights():
    ours, theirs = copied_from_torch(causal=True)
    x = randn(2, 5, 32, dtype=torch.float32)
    with torch.no_grad():
        _, expected = theirs(x, x, x, attn_mask=~causal_mask(5), need_weights=True, average_attn_weights=False)
        torch.testing.assert_close(ours.attention_weights(x), expected)


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("backend", BACKENDS)
def test_gqa_matches_torch_sdpa_with_enable_gqa(n_kv_heads, backend):
    torch.manual_seed(1)
    layer = MultiHeadAttention(32, 8, n_kv_heads=n_kv_heads, causal=True, backend=backend).double()
    x = randn(2, 6, 32)
    head_dim = 4
    q, k, v = (x @ layer.qkv.weight.T + layer.qkv.bias).split([32, n_kv_heads * head_dim, n_kv_heads * head_dim], dim=-1)
    q = q.view(2, 6, 8, head_dim).transpose(1, 2)
    k = k.view(2, 6, n_kv_heads, head_dim).transpose(1, 2)
    v = v.view(2, 6, n_kv_heads, head_dim).transpose(1, 2)
    heads = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    expected = layer.out(heads.transpose(1, 2).reshape(2, 6, 32))
    torch.testing.assert_close(layer(x), expected)


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("bias", [True, False])
def test_separate_projections_equal_the_fused_one(n_kv_heads, bias):
    torch.manual_seed(11)
    fused = MultiHeadAttention(32, 4, n_kv_heads=n_kv_heads, bias=bias, causal=True).double()
    split = MultiHeadAttention(32, 4, n_kv_heads=n_kv_heads, bias=bias, causal=True, fused_qkv=False).double()
    assert not hasattr(split, "qkv") and (split.q.out_features, split.k.out_features) == (32, 8 * n_kv_heads)
    assert sum(p.numel() for p in split.parameters()) == sum(p.numel() for p in fused.parameters())
    rows = [32, 8 * n_kv_heads, 8 * n_kv_heads]  # [W_Q; W_K; W_V]
    with torch.no_grad():
        for linear, weight in zip((split.q, split.k, split.v), fused.qkv.weight.split(rows)):
            linear.weight.copy_(weight)
        if bias:
            for linear, b in zip((split.q, split.k, split.v), fused.qkv.bias.split(rows)):
                linear.bias.copy_(b)
        split.out.load_state_dict(fused.out.state_dict())
    x = randn(2, 6, 32)
    torch.testing.assert_close(split(x), fused(x))
    torch.testing.assert_close(split.attention_weights(x), fused.attention_weights(x))


def test_only_the_output_projection_is_marked_as_residual():
    from minillm.markers import is_residual_projection

    for fused_qkv in (True, False):
        layer = MultiHeadAttention(16, 4, fused_qkv=fused_qkv)
        assert [name for name, m in layer.named_modules() if is_residual_projection(m)] == ["out"]


def test_gqa_parameter_count_shrinks_with_kv_heads():
    from minillm.config import attention_parameters

    for n_kv in (8, 4, 1):
        layer = MultiHeadAttention(64, 8, n_kv_heads=n_kv)
        assert sum(p.numel() for p in layer.parameters()) == attention_parameters(ModelConfig(d_model=64, n_heads=8, n_kv_heads=n_kv))


def test_backends_agree_in_value_and_gradient():
    torch.manual_seed(2)
    math_layer = MultiHeadAttention(32, 8, n_kv_heads=2, causal=True, backend="math").double()
    sdpa_layer = MultiHeadAttention(32, 8, n_kv_heads=2, causal=True, backend="sdpa").double()
    sdpa_layer.load_state_dict(math_layer.state_dict())
    x = randn(2, 7, 32)
    mask = randn(7, 7, seed=3)  # an additive bias-like float mask, on top of the causal mask
    out_math, out_sdpa = math_layer(x, mask=mask), sdpa_layer(x, mask=mask)
    torch.testing.assert_close(out_math, out_sdpa)
    out_math.square().sum().backward()
    out_sdpa.square().sum().backward()
    torch.testing.assert_close(math_layer.qkv.weight.grad, sdpa_layer.qkv.weight.grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dropout_only_in_training(backend):
    torch.manual_seed(3)
    layer = MultiHeadAttention(16, 2, dropout=0.5, backend=backend)
    x = randn(2, 5, 16, dtype=torch.float32)
    layer.eval()
    torch.testing.assert_close(layer(x), layer(x))
    layer.train()
    assert not torch.allclose(layer(x), layer.eval()(x))


@pytest.mark.parametrize("kwargs, word", [
    ({"d_model": 30, "n_heads": 4}, "n_heads"),
    ({"d_model": 32, "n_heads": 8, "n_kv_heads": 3}, "n_kv_heads"),
    ({"d_model": 32, "n_heads": 4, "n_kv_heads": 0}, "n_kv_heads"),
    ({"d_model": 32, "n_heads": 4, "dropout": 1.0}, "dropout"),
    ({"d_model": 32, "n_heads": 4, "backend": "nope"}, "math"),
])
def test_mha_rejects_bad_configuration(kwargs, word):
    with pytest.raises(ValueError, match=word):
        MultiHeadAttention(**kwargs)


def test_mha_rejects_bad_input():
    layer = MultiHeadAttention(16, 4)
    with pytest.raises(ValueError, match="mask"):
        layer(torch.zeros(2, 5, 16), mask=torch.ones(5, 6, dtype=torch.bool))
    with pytest.raises(TypeError, match="rotary"):
        MultiHeadAttention(16, 4, rotary=3)
    for name in ("bias", "causal", "fused_qkv"):
        with pytest.raises(TypeError, match=name):
            MultiHeadAttention(16, 4, **{name: 1})


def test_positions_may_be_one_row_per_sequence():
    """(batch, seq) positions reach the rotary callable as given: a left-padded row, shifted
    by its padding, attends as it would alone at positions 0, 1, ..."""
    torch.manual_seed(12)
    layer = MultiHeadAttention(32, 4, causal=True, rotary=batched_rope).double().eval()
    x = randn(2, 6, 32)
    positions = torch.tensor([[0, 1, 2, 3, 4, 5], [0, 0, 0, 1, 2, 3]])  # row 1: 2 padding tokens, then 4 real ones
    keep = torch.tensor([[True] * 6, [False, False, True, True, True, True]])[:, None, None, :]
    out = layer(x, mask=keep, positions=positions)
    torch.testing.assert_close(out[1, 2:], layer(x[1:, 2:])[0])
    torch.testing.assert_close(out[0], layer(x[:1])[0])


# ---------------------------------------------------------------- hooks: KV cache, rotary, backends

class CheckedCache(attention.ConcatCache):
    """The package's concatenating cache, checking the shapes the layer gives it."""

    def __init__(self, n_kv_heads, head_dim):
        super().__init__()
        self.n_kv_heads, self.head_dim = n_kv_heads, head_dim

    def update(self, k, v):
        assert k.shape[1:] == (self.n_kv_heads, k.shape[2], self.head_dim) and v.shape == k.shape
        return super().update(k, v)



@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [True, False])
def test_cached_incremental_decoding_equals_full_recomputation(n_kv_heads, backend, causal):
    torch.manual_seed(4)
    layer = MultiHeadAttention(32, 4, n_kv_heads=n_kv_heads, causal=causal, backend=backend).double().eval()
    x = randn(2, 10, 32)
    cache = CheckedCache(n_kv_heads, 8)
    chunks = [(0, 4), (4, 5), (5, 8), (8, 9), (9, 10)]  # a prompt, then single tokens and a chunk
    pieces = [layer(x[:, a:b], kv_cache=cache) for a, b in chunks]
    if causal:
        torch.testing.assert_close(torch.cat(pieces, dim=1), layer(x))
    else:  # without a causal mask, each chunk sees what is cached so far: the last chunk equals the full pass
        torch.testing.assert_close(pieces[-1], layer(x)[:, 9:])
    assert cache.k.shape == (2, n_kv_heads, 10, 8)


def test_cache_with_a_padding_mask_over_all_keys():
    torch.manual_seed(5)
    layer = MultiHeadAttention(16, 2, causal=True).double().eval()
    x = randn(1, 6, 16)
    keep = torch.tensor([True, False, True, True, True, True])  # key 1 is padding
    cache = CheckedCache(2, 8)
    layer(x[:, :5], mask=keep[:5], kv_cache=cache)
    last = layer(x[:, 5:], mask=keep, kv_cache=cache)
    torch.testing.assert_close(last, layer(x, mask=keep)[:, 5:])


def rope(x, positions, theta=10000.0):
    """Rotary embedding written out in the test (split-half pairing)."""
    half = x.shape[-1] // 2
    freqs = theta ** (-torch.arange(half, dtype=torch.float64) / half)
    angles = positions.double()[:, None] * freqs[None, :]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def batched_rope(x, positions):
    """``rope`` with one row of positions per sequence: x (batch, heads, seq, d), positions (batch, seq)."""
    if positions.dim() == 1:
        return rope(x, positions)
    return torch.stack([rope(row[None], p)[0] for row, p in zip(x, positions)])


def test_rotary_hook_gets_queries_and_keys_with_positions():
    calls = []

    def spy(x, positions):
        calls.append((tuple(x.shape), positions.tolist()))
        return x

    layer = MultiHeadAttention(32, 8, n_kv_heads=2, rotary=spy)
    layer(torch.zeros(3, 5, 32))
    assert calls == [((3, 8, 5, 4), [0, 1, 2, 3, 4]), ((3, 2, 5, 4), [0, 1, 2, 3, 4])]
    calls.clear()
    layer(torch.zeros(3, 2, 32), positions=torch.tensor([7, 8]))
    assert [p for _, p in calls] == [[7, 8], [7, 8]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_rotary_makes_attention_depend_on_relative_positions_only(backend):
    torch.manual_seed(6)
    layer = MultiHeadAttention(32, 4, causal=True, rotary=rope, backend=backend).double().eval()
    x = randn(2, 6, 32)
    at_zero = layer(x)
    torch.testing.assert_close(layer(x, positions=torch.arange(100, 106)), at_zero)
    no_rotary = MultiHeadAttention(32, 4, causal=True, backend=backend).double().eval()
    no_rotary.load_state_dict(layer.state_dict())
    assert not torch.allclose(no_rotary(x), at_zero)  # the hook really changes the function


def test_rotary_with_cache_needs_positions_and_then_equals_full():
    torch.manual_seed(7)
    layer = MultiHeadAttention(32, 4, n_kv_heads=2, causal=True, rotary=rope).double().eval()
    x = randn(1, 7, 32)
    cache = CheckedCache(2, 8)
    first = layer(x[:, :4], positions=torch.arange(4), kv_cache=cache)
    with pytest.raises(ValueError, match="positions"):
        layer(x[:, 4:5], kv_cache=cache)
    rest = [layer(x[:, t:t + 1], positions=torch.tensor([t]), kv_cache=cache) for t in range(4, 7)]
    torch.testing.assert_close(torch.cat([first, *rest], dim=1), layer(x))


def test_rotary_from_chapter_03_plugs_in():
    from minillm import positional
    torch.manual_seed(8)
    layer = MultiHeadAttention(32, 4, causal=True, rotary=lambda x, p: positional.apply_rope(x, p, 10000.0)).double()
    x = randn(2, 6, 32)
    torch.testing.assert_close(layer(x, positions=torch.arange(50, 56)), layer(x))
    module = MultiHeadAttention(32, 4, causal=True, rotary=positional.RotaryEmbedding(8)).double()
    module.load_state_dict(layer.state_dict())
    torch.testing.assert_close(module(x), layer(x), msg="the RotaryEmbedding module rotates like apply_rope")


@pytest.fixture
def backends(monkeypatch):
    """A copy of the registry in the module's place, so that a test's entries do not outlive it."""
    registry = copy.deepcopy(attention.ATTENTION_BACKENDS)
    monkeypatch.setattr(attention, "ATTENTION_BACKENDS", registry)
    return registry


def test_backend_registry(backends):
    assert get_attention_backend("math") is attention.math_attention
    assert get_attention_backend("sdpa") is attention.sdpa_attention
    with pytest.raises(ValueError, match="unknown attention backend 'nope'; known: flash, math, sdpa, triton"):
        get_attention_backend("nope")
    calls = []

    def counting(q, k, v, mask=None, causal=False, dropout_p=0.0):
        calls.append((tuple(q.shape), tuple(k.shape), causal))
        return attention.math_attention(q, k, v, mask=mask, causal=causal, dropout_p=dropout_p)

    register_attention_backend("counting", counting)
    torch.manual_seed(9)
    layer = MultiHeadAttention(16, 4, n_kv_heads=2, causal=True, backend="counting")
    x = randn(2, 3, 16, dtype=torch.float32)
    out = layer(x)
    assert calls == [((2, 4, 3, 4), (2, 2, 3, 4), True)]  # the backend gets the 2 K/V heads un-repeated
    layer.backend = "math"
    torch.testing.assert_close(out, layer(x))
    register_attention_backend("counting", counting)  # the same entry again changes nothing
    with pytest.raises(ValueError, match="attention backend 'counting' is already registered.*replace=True"):
        register_attention_backend("counting", attention.sdpa_attention)
    register_attention_backend("counting", attention.sdpa_attention, replace=True)
    assert get_attention_backend("counting") is attention.sdpa_attention
    with pytest.raises(ValueError, match="attention backend 'math' is already registered"):
        register_attention_backend("math", counting)  # no silent replacement of a built-in
    with pytest.raises(TypeError, match="callable"):
        register_attention_backend("broken", 3)
    with pytest.raises(ValueError, match="name"):
        register_attention_backend("", counting)


def test_backends_are_looked_up_in_the_module_at_every_call(monkeypatch):
    """The built-ins are forward references: what stands at minillm.attention.math_attention
    when a layer runs (a learner's, in a student bundle) is what it calls."""
    calls = []

    def mine(q, k, v, mask=None, causal=False, dropout_p=0.0):
        calls.append(causal)
        return torch.zeros_like(q)

    layer = MultiHeadAttention(16, 4, causal=True, bias=False)
    monkeypatch.setattr(attention, "math_attention", mine)
    assert torch.equal(layer(torch.randn(2, 3, 16)), torch.zeros(2, 3, 16)) and calls == [True]


def test_the_math_backend_runs_the_chapters_exercises(monkeypatch):
    """In a student bundle the learner's answers stand in the module: "math" must call them
    (repeat_kv and softmax always, scaled_dot_product_attention whenever a mask is given)."""
    calls = []
    for name in ("repeat_kv", "softmax", "scaled_dot_product_attention"):
        real = getattr(attention, name)
        monkeypatch.setattr(attention, name, lambda *a, _real=real, _name=name, **kw: calls.append(_name) or _real(*a, **kw))
    q, k, v = randn(1, 4, 3, 8), randn(1, 2, 3, 8, seed=1), randn(1, 2, 3, 8, seed=2)
    attention.math_attention(q, k, v, causal=True)
    assert calls == ["repeat_kv", "repeat_kv", "softmax"]
    calls.clear()
    attention.math_attention(q, k, v, mask=torch.ones(3, dtype=torch.bool), causal=True)
    assert calls[:3] == ["repeat_kv", "repeat_kv", "scaled_dot_product_attention"]


@pytest.mark.parametrize("name, module", [("flash", "minillm.flash"), ("triton", "minillm.flash_triton")])
def test_chapter_10_backends_are_declared_and_name_their_chapter_where_missing(monkeypatch, name, module):
    assert name in attention.ATTENTION_BACKENDS
    monkeypatch.setitem(sys.modules, module, None)  # an installation without chapter 10
    message = rf"attention backend '{name}' comes from chapter 10_flash_attention \({module}\)"
    with pytest.raises(ValueError, match=message):
        get_attention_backend(name)
    with pytest.raises(ValueError, match=message):
        MultiHeadAttention(16, 4, backend=name)


def test_sdpa_backend_zeroes_fully_masked_queries_with_cached_offset():
    q, k, v = qkv(q_len=2, k_len=5)
    mask = torch.ones(2, 5, dtype=torch.bool)
    mask[1] = False
    for backend in BACKENDS:
        out = get_attention_backend(backend)(q, k, v, mask=mask, causal=True)
        assert torch.isfinite(out).all() and (out[:, :, 1] == 0).all()
        expected = F.scaled_dot_product_attention(q[:, :, :1], k[:, :, :4], v[:, :, :4])  # query 0 sees keys 0..3
        torch.testing.assert_close(out[:, :, :1], expected)


# ---------------------------------------------------------------- the backend contract

def contract_reference(q, k, v, mask=None, causal=False):
    """What every backend must compute, written from the contract with torch's math: K/V head
    h // (n_heads / n_kv_heads) for query head h, the causal triangle aligned to the last
    queries, and zeros for a query that may see no key."""
    n_rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)
    q_len, k_len = q.shape[-2], k.shape[-2]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else scores + mask
    if causal:
        allowed = torch.tensor([[j <= i + k_len - q_len for j in range(k_len)] for i in range(q_len)])
        scores = scores.masked_fill(~allowed, -math.inf)
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return weights @ v


def contract_masks(batch, n_heads, q_len, k_len, seed):
    g = torch.Generator().manual_seed(seed)
    keys = torch.rand(batch, 1, 1, k_len, generator=g) < 0.7
    keys[..., -1] = True  # the last key is never padding, so every causal query sees a key
    bias = torch.randn(n_heads, q_len, k_len, generator=g, dtype=torch.float64)
    full = torch.rand(batch, n_heads, q_len, k_len, generator=g) < 0.6
    full[:, :, 0] = False  # a fully masked query in every head
    return {"none": None, "key padding (batch, 1, 1, k_len)": keys, "float bias (n_heads, q_len, k_len)": bias,
            "bool (batch, n_heads, q_len, k_len)": full, "(k_len,)": keys[0, 0, 0]}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n_heads, n_kv_heads", [(4, 4), (4, 2), (4, 1)], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("q_len, k_len", [(5, 5), (2, 7), (1, 6)])
@pytest.mark.parametrize("causal", [False, True])
def test_backends_follow_the_contract(backend, n_heads, n_kv_heads, q_len, k_len, causal):
    fn = get_attention_backend(backend)
    q = randn(2, n_heads, q_len, 8, seed=20)
    k, v = randn(2, n_kv_heads, k_len, 8, seed=21), randn(2, n_kv_heads, k_len, 8, seed=22)
    for label, mask in contract_masks(2, n_heads, q_len, k_len, seed=23).items():
        out = fn(q, k, v, mask=mask, causal=causal)
        assert out.shape == q.shape, label
        torch.testing.assert_close(out, contract_reference(q, k, v, mask, causal), msg=label)


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("q_len, k_len", [(6, 6), (3, 6)])
def test_math_and_sdpa_give_equal_outputs_and_gradients(n_kv_heads, q_len, k_len):
    masks = contract_masks(2, 4, q_len, k_len, seed=24)
    for causal in (False, True):
        for label, mask in masks.items():
            results = []
            for backend in BACKENDS:
                q = randn(2, 4, q_len, 8, seed=25).requires_grad_()
                k, v = (randn(2, n_kv_heads, k_len, 8, seed=s).requires_grad_() for s in (26, 27))
                out = get_attention_backend(backend)(q, k, v, mask=mask, causal=causal)
                (out * randn(*out.shape, seed=28)).sum().backward()
                results.append((out, q.grad, k.grad, v.grad))
            for a, b, name in zip(*results, ("output", "q.grad", "k.grad", "v.grad")):
                assert torch.isfinite(b).all(), f"{name} {label} causal={causal}"
                torch.testing.assert_close(a, b, msg=f"{name} with mask {label}, causal={causal}")


def test_kv_groups_counts_the_query_heads_per_kv_head_and_names_k_and_v():
    q = randn(2, 6, 3, 4)
    assert [attention.kv_groups(q, randn(2, n, 5, 4)) for n in (1, 2, 3, 6)] == [6, 3, 2, 1]
    with pytest.raises(ValueError, match="^k and v have 4 heads, which must divide the 6 query heads"):
        attention.kv_groups(q, randn(2, 4, 5, 4))


@pytest.mark.parametrize("backend", BACKENDS)
def test_backends_refuse_what_they_cannot_compute(backend):
    fn = get_attention_backend(backend)
    q, k, v = randn(1, 4, 3, 8), randn(1, 3, 3, 8, seed=1), randn(1, 3, 3, 8, seed=2)
    with pytest.raises(ValueError, match="3 heads, which must divide the 4 query heads"):
        fn(q, k, v)
    with pytest.raises(ValueError, match="mask"):
        fn(q, k[:, :2], v[:, :2], mask=torch.ones(3, 4, dtype=torch.bool))


@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_dropout_drops_weights_in_training_only(backend):
    fn = get_attention_backend(backend)
    q, k, v = randn(2, 4, 6, 8), randn(2, 2, 6, 8, seed=1), randn(2, 2, 6, 8, seed=2)
    torch.manual_seed(0)
    dropped = fn(q, k, v, causal=True, dropout_p=0.5)
    assert not torch.allclose(dropped, fn(q, k, v, causal=True))
    torch.testing.assert_close(fn(q, k, v, causal=True, dropout_p=0.0), contract_reference(q, k, v, causal=True))


def test_sdpa_builds_no_mask_for_plain_causal_attention(monkeypatch):
    """The fast path: causal attention over as many keys as queries reaches torch's kernel
    with is_causal=True and no mask tensor; with the K/V heads shared only when they differ."""
    seen = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, enable_gqa=False, **kwargs):
        seen.append((attn_mask is None, is_causal, enable_gqa, k.shape[1]))
        return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, enable_gqa=enable_gqa)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", spy)
    for n_kv_heads in (4, 2):
        MultiHeadAttention(16, 4, n_kv_heads=n_kv_heads, causal=True, backend="sdpa")(torch.randn(2, 5, 16))
    assert seen == [(True, True, False, 4), (True, True, True, 2)]


@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_sdpa_gives_zeros_for_fully_masked_queries_on_every_device(device, dtype):
    """The "sdpa" backend leaves fully masked queries to torch's kernels: they must give zeros."""
    q = torch.randn(2, 4, 5, 16, device=device, dtype=dtype)
    k, v = (torch.randn(2, 2, 5, 16, device=device, dtype=dtype) for _ in range(2))
    keep = torch.ones(2, 1, 5, 5, dtype=torch.bool, device=device)
    keep[:, :, 3] = False
    for mask in (keep, torch.zeros(5, 5, device=device, dtype=dtype).masked_fill(~keep[0, 0], float("-inf"))):
        out = get_attention_backend("sdpa")(q, k, v, mask=mask, causal=True)
        assert torch.isfinite(out).all() and (out[:, :, 3] == 0).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the GPU path is checked when one is present")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_backends_agree_on_gpu(dtype):
    torch.manual_seed(10)
    layer = MultiHeadAttention(128, 8, n_kv_heads=2, causal=True).to("cuda", dtype).eval()
    x = torch.randn(4, 64, 128, device="cuda", dtype=dtype)
    with torch.no_grad():
        reference = layer(x)
        layer.backend = "sdpa"
        torch.testing.assert_close(layer(x), reference, atol=2e-2, rtol=2e-2)
        cache = CheckedCache(2, 16)
        pieces = [layer(x[:, :60], kv_cache=cache)] + [layer(x[:, t:t + 1], kv_cache=cache) for t in range(60, 64)]
        torch.testing.assert_close(torch.cat(pieces, dim=1), reference, atol=2e-2, rtol=2e-2)


# ---------------------------------------------------------------- KV-cache memory

def test_kv_cache_bytes_known_values():
    gpt2 = ModelConfig()  # 12 layers, 12 heads of 64
    assert kv_cache_bytes(gpt2, 1, 1024) == 2 * 12 * 1024 * 768 * 2 == 37_748_736
    llama2_70b = ModelConfig(d_model=8192, n_layers=80, n_heads=64, n_kv_heads=8, d_ff=28672)
    assert kv_cache_bytes(llama2_70b, 1, 4096) == 1_342_177_280  # 1.25 GiB in 16-bit
    assert kv_cache_bytes(ModelConfig(d_model=8192, n_layers=80, n_heads=64, d_ff=28672), 1, 4096) == 8 * 1_342_177_280
    assert kv_cache_bytes(llama2_70b, 3, 100, bytes_per_element=4) == 3 * 100 * 2 * 80 * 8 * 128 * 4


def test_kv_cache_bytes_equals_a_real_cache():
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64)
    layers = [MultiHeadAttention(32, 4, n_kv_heads=2, causal=True) for _ in range(cfg.n_layers)]
    caches = [CheckedCache(2, 8) for _ in layers]
    x = torch.randn(3, 11, 32)
    for layer, cache in zip(layers, caches):
        layer(x, kv_cache=cache)
    stored = sum(c.k.nbytes + c.v.nbytes for c in caches)
    assert kv_cache_bytes(cfg, 3, 11, bytes_per_element=4) == stored


def test_kv_cache_bytes_rejects_negative_sizes():
    with pytest.raises(ValueError, match="seq_len"):
        kv_cache_bytes(ModelConfig(), 1, -5)


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_causal_attention_checks_the_mask_shape_before_combining(backend):
    from minillm.attention import MultiHeadAttention

    attention = MultiHeadAttention(16, 4, causal=True, backend=backend)
    with pytest.raises(ValueError, match="mask"):
        attention(torch.randn(2, 5, 16), mask=torch.ones(3, 4, dtype=torch.bool))


# ---------------------------------------------------------------- inputs are left alone; masks in every backend

def test_functions_leave_their_inputs_unchanged():
    q, k, v = qkv()
    mask = torch.rand(5, 7, generator=torch.Generator().manual_seed(11)) < 0.6
    mask[1] = False  # a fully blocked query too
    bias = randn(3, 5, 7, seed=12)
    float_mask = torch.zeros(5, 7, dtype=torch.float64).masked_fill(~mask, float("-inf"))
    x = randn(2, 5, 12, seed=13)
    heads = randn(2, 3, 5, 4, seed=14)
    inputs = (q, k, v, mask, bias, float_mask, x, heads)
    before = [t.clone() for t in inputs]
    softmax(x, dim=-1)
    scaled_dot_product_attention(q, k, v, mask=mask, bias=bias, return_weights=True)
    scaled_dot_product_attention(q, k, v, mask=float_mask)
    split_heads(x, 3)
    merge_heads(heads)
    repeat_kv(heads, 2)
    for name, (after, original) in zip("q k v mask bias float_mask x heads".split(), zip(inputs, before)):
        assert torch.equal(after, original), f"{name} was changed in place"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [False, True])
def test_every_backend_checks_the_mask(backend, causal):
    layer = MultiHeadAttention(16, 4, causal=causal, backend=backend)
    x = torch.randn(2, 5, 16)
    with pytest.raises(ValueError, match="mask"):
        layer(x, mask=torch.ones(5, 6, dtype=torch.bool))
    with pytest.raises(TypeError, match="mask"):
        layer(x, mask=torch.ones(5, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="mask"):
        get_attention_backend(backend)(*qkv(), mask=torch.ones(5, 6, dtype=torch.bool), causal=causal)


@pytest.mark.parametrize("causal", [False, True])
def test_backends_agree_on_key_masks_and_float64_biases_for_a_float32_layer(causal):
    torch.manual_seed(13)
    layer = MultiHeadAttention(16, 4, causal=causal).eval()
    x = torch.randn(2, 5, 16)
    keep = torch.tensor([True, False, True, True, True])  # a (k_len,) key mask
    bias = -0.5 * (torch.arange(5) - torch.arange(5)[:, None]).abs().double()  # float64, the layer is float32
    with torch.no_grad():
        for mask in (keep, bias):
            expected = layer(x, mask=mask)
            assert expected.dtype == torch.float32 and torch.isfinite(expected).all()
            layer.backend = "sdpa"
            torch.testing.assert_close(layer(x, mask=mask), expected)
            layer.backend = "math"
        weights = layer.attention_weights(x, mask=keep)
        assert (weights[..., 1] == 0).all()
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 5))
