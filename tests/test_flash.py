"""minillm.flash against naive attention, autograd and torch's softmax; its memory measured
as live tensor bytes; the "flash" backend in the model, with and without a KV cache."""
import dataclasses
import math
import subprocess
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from minillm import flash
from minillm.attention import get_attention_backend
from minillm.generate import ConcatModelCache, generate
from minillm.model import GPT, GPTConfig
from minillm.batches import BatchSampler
from minillm.train import TrainConfig, train
from tests.test_attention import contract_reference


# Two computations of one softmax round differently (and differently with torch's thread count):
# a bound relative to the values, a few ulps of the dtype, and an absolute floor for tiny probabilities.
CLOSE = {torch.float64: dict(atol=1e-12, rtol=1e-12), torch.float32: dict(atol=1e-6, rtol=1.3e-6)}


def randn(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def naive_attention(q, k, v, causal=False):
    """softmax(q k^T / sqrt(d)) v and the log-sum-exp, written out, the triangle aligned to the last queries."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        q_len, k_len = scores.shape[-2:]
        allowed = torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len)
        scores = scores.masked_fill(~allowed, -math.inf)
    return torch.softmax(scores, -1) @ v, torch.logsumexp(scores, -1)


# ---------------------------------------------------------------- online softmax

@pytest.mark.parametrize("block", [1, 3, 8, 64, 1000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_online_softmax_equals_softmax(block, dtype):
    x = 8 * randn(3, 4, 37, dtype=dtype)
    got = flash.online_softmax(x, block)
    assert got.dtype == dtype
    torch.testing.assert_close(got, torch.softmax(x, -1), **CLOSE[dtype])


def test_online_softmax_rising_logits_rescale_every_block():
    x = torch.linspace(-100, 900, 50, dtype=torch.float64)[None]  # the maximum grows in every block
    torch.testing.assert_close(flash.online_softmax(x, 4), torch.softmax(x, -1), atol=1e-14, rtol=1e-13)


def test_online_softmax_minus_inf_rows_give_zeros_never_nan():
    x = randn(4, 20)
    x[0, :9] = -math.inf  # two whole blocks of -inf before the first finite score
    x[1, ::2] = -math.inf
    x[2] = -math.inf  # a row of -inf: zeros, as a fully masked query in attention
    got = flash.online_softmax(x, 4)
    assert torch.isfinite(got).all()
    assert (got[2] == 0).all() and (got[0, :9] == 0).all() and (got[1, ::2] == 0).all()
    torch.testing.assert_close(got, torch.softmax(x, -1).nan_to_num(0.0), atol=1e-14, rtol=1e-13)


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_online_softmax_refuses_bad_block_size(bad):
    with pytest.raises(ValueError, match="block_size"):
        flash.online_softmax(randn(2, 5), bad)


# ---------------------------------------------------------------- tiles

def test_tile_updates_stream_to_attention_and_its_log_sum_exp():
    scores, v = 5 * randn(2, 3, 6, 23), randn(2, 1, 23, 4, seed=1)  # v broadcast over the heads
    m = torch.full((2, 3, 6, 1), -math.inf, dtype=torch.float64)
    l, acc = torch.zeros_like(m), torch.zeros(2, 3, 6, 4, dtype=torch.float64)
    for start in range(0, 23, 5):
        m, l, acc = flash.tile_update(m, l, acc, scores[..., start:start + 5], v[..., start:start + 5, :])
    torch.testing.assert_close(acc / l, torch.softmax(scores, -1) @ v, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close((m + l.log()).squeeze(-1), torch.logsumexp(scores, -1), atol=1e-12, rtol=1e-12)


def test_tile_update_keeps_queries_without_a_finite_score_at_zero():
    m = torch.full((1, 2, 1), -math.inf)
    l, acc = torch.zeros(1, 2, 1), torch.zeros(1, 2, 3)
    m, l, acc = flash.tile_update(m, l, acc, torch.full((1, 2, 4), -math.inf), torch.ones(1, 4, 3))
    assert torch.isneginf(m).all() and (l == 0).all() and (acc == 0).all()


def brute_force_visibility(q0, q1, k0, k1, offset):
    seen = [[j <= i + offset for j in range(k0, k1)] for i in range(q0, q1)]
    return "full" if all(map(all, seen)) else "skip" if not any(map(any, seen)) else "partial"


def test_tile_visibility_matches_brute_force():
    g = torch.Generator().manual_seed(0)
    for _ in range(500):
        q0, k0, q_size, k_size, offset = (torch.randint(lo, hi, (), generator=g).item()
                                          for lo, hi in ((0, 30), (0, 30), (1, 12), (1, 12), (0, 15)))
        assert flash.tile_visibility(q0, q0 + q_size, k0, k0 + k_size, offset) == \
            brute_force_visibility(q0, q0 + q_size, k0, k0 + k_size, offset)
    with pytest.raises(ValueError, match="q_stop"):
        flash.tile_visibility(3, 3, 0, 4, 0)
    with pytest.raises(ValueError, match="k_stop"):
        flash.tile_visibility(0, 4, 5, 2, 0)


# ---------------------------------------------------------------- exactness

SHAPES = [  # (q shape, k shape), leading dimensions broadcasting: MHA, GQA as (batch, kv, rep), q_len != k_len
    ((2, 3, 37, 16), (2, 3, 37, 16)),
    ((2, 2, 3, 29, 8), (2, 2, 1, 29, 8)),
    ((1, 4, 13, 8), (1, 4, 50, 8)),
    ((1, 2, 1, 16), (1, 2, 33, 16)),
    ((3, 65, 32), (3, 65, 32)),
]


@pytest.mark.parametrize("shapes", SHAPES, ids=["mha-odd", "gqa", "q<k", "one-query", "no-heads"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
@pytest.mark.parametrize("blocks", [(16, 16), (7, 5), (64, 64)])
def test_flash_attention_is_exact_to_naive_attention(shapes, causal, dtype, tol, blocks):
    shape_q, shape_k = shapes
    q, k, v = randn(*shape_q, dtype=dtype), randn(*shape_k, seed=1, dtype=dtype), randn(*shape_k, seed=2, dtype=dtype)
    out, lse = flash.tiled_attention_forward(q, k, v, causal=causal, block_q=blocks[0], block_k=blocks[1])
    expected, expected_lse = naive_attention(q, k, v, causal)
    assert out.dtype == dtype and out.shape == expected.shape
    torch.testing.assert_close(out, expected, atol=tol, rtol=tol)
    torch.testing.assert_close(lse, expected_lse, atol=tol, rtol=tol)
    torch.testing.assert_close(flash.flash_attention(q, k, v, causal=causal, block_q=blocks[0], block_k=blocks[1]),
                               expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs_keep_their_dtype(dtype):
    q, k, v = (randn(1, 2, 40, 16, seed=s, dtype=torch.float32) for s in range(3))
    got = flash.flash_attention(q.to(dtype), k.to(dtype), v.to(dtype), causal=True)
    assert got.dtype == dtype
    expected = naive_attention(*(t.to(dtype).double() for t in (q, k, v)), causal=True)[0]
    # rounded once to the half dtype: about one ulp near the outputs' scale (|out| < 1 here)
    torch.testing.assert_close(got.double(), expected, atol=1e-2, rtol=0)


def test_large_scores_stay_finite():
    q, k, v = 40 * randn(1, 1, 30, 8), 40 * randn(1, 1, 30, 8, seed=1), randn(1, 1, 30, 8, seed=2)
    out = flash.flash_attention(q, k, v, causal=True, block_q=8, block_k=8)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, naive_attention(q, k, v, True)[0], atol=1e-10, rtol=1e-10)


# ---------------------------------------------------------------- gradients

@pytest.mark.parametrize("shapes", SHAPES[:4], ids=["mha-odd", "gqa", "q<k", "one-query"])
@pytest.mark.parametrize("causal", [False, True])
def test_gradients_equal_autograd_through_naive_attention(shapes, causal):
    shape_q, shape_k = shapes
    leaves = [randn(*shape, seed=s).requires_grad_() for s, shape in enumerate((shape_q, shape_k, shape_k))]
    out = flash.flash_attention(*leaves, causal=causal, block_q=8, block_k=6)
    upstream = randn(*out.shape, seed=9)
    got = torch.autograd.grad(out, leaves, upstream)
    expected = torch.autograd.grad(naive_attention(*leaves, causal)[0], leaves, upstream)
    for name, a, b in zip("qkv", got, expected):
        assert a.shape == b.shape, name
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10, msg=f"d{name}")


def test_gradcheck_float64():
    q = randn(1, 2, 3, 7, 4).requires_grad_()
    k, v = randn(1, 2, 1, 9, 4, seed=1).requires_grad_(), randn(1, 2, 1, 9, 4, seed=2).requires_grad_()
    for causal in (False, True):
        assert torch.autograd.gradcheck(lambda q, k, v: flash.flash_attention(q, k, v, causal=causal, block_q=3, block_k=4),
                                        (q, k, v))


def test_score_grad_is_autograds_gradient_at_the_scores():
    scores = randn(2, 6, 6).requires_grad_()
    v, do = randn(2, 6, 3, seed=1), randn(2, 6, 3, seed=2)
    p = torch.softmax(scores, -1)
    o = p @ v
    (o * do).sum().backward()
    row_term = (do * o.detach()).sum(-1)
    torch.testing.assert_close(flash.score_grad(p.detach(), do @ v.transpose(-2, -1), row_term), scores.grad,
                               atol=1e-12, rtol=1e-12)


class RowSums(TorchDispatchMode):
    """Counts the sums over the last dimension of tensors whose last dimension has ``width`` entries."""

    def __init__(self, width: int):
        super().__init__()
        self.width, self.count = width, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.sum.dim_IntList and args[0].shape[-1] == self.width:
            self.count += list(args[1]) in ([-1], [args[0].dim() - 1])
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("causal", [False, True])
def test_backward_computes_the_row_term_once_not_once_per_tile(causal):
    """FlashAttention-2's D = rowsum(dO * O): one sum over the head dimension (5, no block's
    size) per block of queries, before the loops, whatever the number of tiles (here 4 x 5,
    and 4 x 1): 13 queries in blocks of 4 are 4 sums."""
    q, k, v = randn(2, 13, 5), randn(2, 13, 5, seed=1), randn(2, 13, 5, seed=2)
    out, lse = flash.tiled_attention_forward(q, k, v, causal=causal, block_q=4, block_k=3)
    d_out = randn(2, 13, 5, seed=3)
    for block_k in (13, 3):
        with RowSums(width=5) as sums:
            grads = flash.tiled_attention_backward(q, k, v, out, lse, d_out, causal=causal, block_q=4, block_k=block_k)
        assert sums.count == 4
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = torch.autograd.grad(naive_attention(*leaves, causal)[0], leaves, d_out)
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want, **CLOSE[torch.float64])


# ---------------------------------------------------------------- memory

def test_live_tensor_bytes_counts_allocations_not_inputs_or_views():
    x = torch.zeros(1000)  # an input from before: not counted, nor are its views
    with flash.LiveTensorBytes() as counter:
        x.view(10, 100).t()
        y = torch.ones(2000)  # 8,000 bytes while alive
        del y
        z = torch.ones(500)  # 2,000 bytes, alive at the end
    assert counter.peak == 8000
    assert counter.live == 2000
    assert z.numel() == 500


def test_naive_attention_memory_grows_quadratically():
    peaks = []
    for n in (256, 512):
        q, k, v = randn(3, 1, 1, n, 32, dtype=torch.float32).unbind(0)
        peaks.append(flash.peak_tensor_bytes(get_attention_backend("math"), q, k, v, causal=True))
    assert peaks[0] >= 4 * 256 * 256  # at least one N x N float32 matrix
    assert peaks[1] / peaks[0] > 3.5


@pytest.mark.parametrize("with_backward", [False, True], ids=["forward", "forward+backward"])
def test_flash_attention_memory_grows_linearly(with_backward):
    def run(q, k, v):
        if with_backward:
            q, k, v = (t.requires_grad_() for t in (q, k, v))
        out = flash.flash_attention(q, k, v, causal=True, block_q=64, block_k=64)
        if with_backward:
            out.sum().backward()

    peaks = {}
    for n in (256, 1024):
        q, k, v = randn(3, 1, 1, n, 32, dtype=torch.float32).unbind(0)
        peaks[n] = flash.peak_tensor_bytes(run, q.clone(), k.clone(), v.clone())
    assert peaks[1024] / peaks[256] < 4.5  # 4 times the tokens: linear (plus a tile's constant), not 16
    assert peaks[1024] < 4 * 1024 * 1024 / 4  # far less than one N x N float32 matrix


# ---------------------------------------------------------------- the backend

@pytest.mark.parametrize("n_heads, n_kv_heads", [(4, 4), (4, 2), (4, 1)], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("q_len, k_len", [(5, 5), (2, 7), (1, 6), (70, 70)])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_backend_follows_the_contract(n_heads, n_kv_heads, q_len, k_len, causal):
    fn = get_attention_backend("flash")
    assert fn is flash.flash_backend
    q = randn(2, n_heads, q_len, 8, seed=20)
    k, v = randn(2, n_kv_heads, k_len, 8, seed=21), randn(2, n_kv_heads, k_len, 8, seed=22)
    out = fn(q, k, v, causal=causal)
    assert out.shape == q.shape
    torch.testing.assert_close(out, contract_reference(q, k, v, None, causal), atol=1e-10, rtol=1e-10)


def test_flash_backend_refuses_what_it_cannot_compute():
    fn = flash.flash_backend
    q, k, v = randn(1, 4, 3, 8), randn(1, 2, 3, 8, seed=1), randn(1, 2, 3, 8, seed=2)
    with pytest.raises(ValueError, match="takes no mask"):
        fn(q, k, v, mask=torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="takes no mask"):
        fn(q, k, v, mask=torch.zeros(3, 3))  # an ALiBi-style float bias
    with pytest.raises(ValueError, match="dropout_p"):
        fn(q, k, v, dropout_p=0.1)
    with pytest.raises(ValueError, match="3 heads, which must divide the 4 query heads"):
        fn(q, randn(1, 3, 3, 8), randn(1, 3, 3, 8))


@pytest.mark.parametrize("backend", ["flash", "triton"])
def test_the_refusal_of_masks_and_dropout_names_the_argument_and_the_backend(backend):
    with pytest.raises(ValueError, match=f"^the {backend} backend takes no mask"):
        flash.refuse_mask_and_dropout(backend, torch.zeros(3, 3), 0.0)
    with pytest.raises(ValueError, match=f"^the {backend} backend has no attention dropout \\(dropout_p must be 0.0"):
        flash.refuse_mask_and_dropout(backend, None, 0.1)
    assert flash.refuse_mask_and_dropout(backend, None, 0.0) is None


@pytest.mark.parametrize("bad, error, match", [
    ({"q": "nope"}, TypeError, "q must be a torch.Tensor"),
    ({"k": torch.zeros(1, 5, 4, dtype=torch.float64)}, ValueError, "k must be"),
    ({"v": torch.zeros(1, 6, 8)}, ValueError, "dtype"),
    ({"q": torch.zeros(2, 5, 8, dtype=torch.float64), "k": torch.zeros(3, 5, 8, dtype=torch.float64),
      "v": torch.zeros(3, 5, 8, dtype=torch.float64)}, ValueError, "broadcast"),
    ({"q": torch.zeros(5, 8, dtype=torch.int64)}, ValueError, "floating"),
    ({"block_q": 0}, ValueError, "block_q"),
    ({"block_k": 1.5}, ValueError, "block_k"),
    ({"causal": 1}, TypeError, "causal"),
])
def test_flash_attention_refuses_bad_input(bad, error, match):
    args = {"q": randn(1, 5, 8), "k": randn(1, 6, 8), "v": randn(1, 6, 8)} | bad
    with pytest.raises(error, match=match):
        flash.flash_attention(**args)


def small_config(**changes):
    return dataclasses.replace(GPTConfig(vocab_size=64, context_length=48, d_model=32, n_layers=2, n_heads=4,
                                         n_kv_heads=2, attention_backend="math"), **changes)


def test_model_gives_the_same_logits_with_and_without_a_kv_cache():
    torch.manual_seed(0)
    math_model = GPT(small_config()).eval()
    flash_model = GPT(small_config(attention_backend="flash")).eval()
    flash_model.load_state_dict(math_model.state_dict())
    ids = torch.randint(0, 64, (2, 30))
    with torch.no_grad():
        torch.testing.assert_close(flash_model(ids)[0], math_model(ids)[0], rtol=1.3e-6, atol=1e-5)
        # 20 positions cached, then 10 new queries over 30 keys (q_len < k_len): the queries are the last 10
        logits = {}
        for name, model in (("math", math_model), ("flash", flash_model)):
            cache = ConcatModelCache(2)
            model(ids[:, :20], kv_cache=cache)
            logits[name] = model(ids[:, 20:], kv_cache=cache)[0]
        torch.testing.assert_close(logits["flash"], logits["math"], rtol=1.3e-6, atol=1e-5)
        torch.testing.assert_close(logits["flash"], math_model(ids)[0][:, 20:], rtol=1.3e-6, atol=1e-5)
    prompt = ids[:1, :8]
    assert torch.equal(generate(flash_model, prompt, 12, temperature=0.0, use_cache=True),
                       generate(math_model, prompt, 12, temperature=0.0, use_cache=True))


def test_model_trains_the_same_curve_on_flash_and_math():
    curves = {}
    corpus = torch.randint(0, 64, (5000,), generator=torch.Generator().manual_seed(1))
    for backend in ("math", "flash"):
        torch.manual_seed(0)
        model = GPT(small_config(attention_backend=backend))
        state = train(model, BatchSampler(corpus, batch_size=4, context=48, seed=2),
                      TrainConfig(steps=8, lr=3e-3, warmup_steps=2), progress=False)
        curves[backend] = torch.tensor(state.history["train_loss"])
    assert curves["math"][-1] < curves["math"][0]
    torch.testing.assert_close(curves["flash"], curves["math"], atol=1e-4, rtol=1e-5)


def test_importing_minillm_and_flash_never_imports_triton():
    code = "import sys, minillm, minillm.flash, minillm.model; assert 'triton' not in sys.modules, 'triton imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
