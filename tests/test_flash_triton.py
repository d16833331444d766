"""minillm.flash_triton against naive attention, on small shapes (N 40-150, head_dim 16-128,
the launcher's blocks of 16 and the GPU's of 128 x 64 and 128 x 32): run by Triton's interpreter on CPU tensors when
TRITON_INTERPRET=1 (the root conftest.py sets it for every test run), compiled for a CUDA
GPU otherwise (``TRITON_INTERPRET=0 pytest tests/test_flash_triton.py`` on a GPU machine),
where bfloat16 is tested too: the interpreter's tl.dot has no bfloat16."""
import math
import os

import pytest
import torch

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
if not INTERPRET and not torch.cuda.is_available():
    pytest.skip("no CUDA GPU, and TRITON_INTERPRET is off: the kernel has nowhere to run", allow_module_level=True)
pytest.importorskip("triton", reason="Triton is installed on Linux only (x86_64 and aarch64), where torch requires it")

from minillm import flash_triton  # noqa: E402
from minillm.attention import get_attention_backend  # noqa: E402

DEVICE = "cpu" if INTERPRET else "cuda"


def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(DEVICE)


def naive_attention(q, k, v, causal=False):
    """In float64 on the CPU, the K/V heads repeated for their query heads; (out, lse)."""
    q, k, v = (t.double().cpu() for t in (q, k, v))
    k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        q_len, k_len = scores.shape[-2:]
        scores = scores.masked_fill(~torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len), -math.inf)
    return torch.softmax(scores, -1) @ v, torch.logsumexp(scores, -1)


CASES = [  # (batch, n_heads, n_kv_heads, q_len, k_len, head_dim)
    (1, 2, 2, 64, 64, 16),
    (1, 2, 1, 100, 100, 32),  # ragged: 100 = 6 blocks of 16 and 4; GQA
    (2, 2, 2, 40, 72, 16),  # q_len < k_len (the queries are the last 40)
]
DTYPES = [(torch.float32, 1e-5), (torch.float16, 2e-3)] + ([] if INTERPRET else [(torch.bfloat16, 2e-2)])


@pytest.mark.parametrize("case", CASES, ids=["square", "ragged-gqa", "q<k"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype, tol", DTYPES, ids=[str(d).split(".")[-1] for d, _ in DTYPES])
def test_triton_forward_is_exact_to_naive_attention(case, causal, dtype, tol):
    batch, n_heads, n_kv_heads, q_len, k_len, d = case
    q = randn(batch, n_heads, q_len, d, dtype=dtype)
    k, v = randn(batch, n_kv_heads, k_len, d, seed=1, dtype=dtype), randn(batch, n_kv_heads, k_len, d, seed=2, dtype=dtype)
    out, lse = flash_triton.triton_attention_forward(q, k, v, causal=causal)
    expected, expected_lse = naive_attention(q, k, v, causal)
    assert out.dtype == dtype and out.shape == q.shape and lse.shape == q.shape[:-1]
    torch.testing.assert_close(out.double().cpu(), expected, atol=tol, rtol=tol)
    torch.testing.assert_close(lse.double().cpu(), expected_lse, atol=tol, rtol=tol)


@pytest.mark.parametrize("head_dim", [64, 128], ids=["d64-128x64", "d128-128x32"])
@pytest.mark.parametrize("causal", [False, True])
def test_the_gpu_tiles_are_exact_to_naive_attention(head_dim, causal):
    """The tiles a GPU launch uses (``gpu_launch_options``: 128 queries by 64 or 32 keys), at the
    smallest shapes that give each a second, ragged block: 130 queries (128 + 2) over 150 keys
    (64 + 64 + 22, or 4 blocks of 32 and 22), two query heads sharing one K/V head."""
    options = flash_triton.gpu_launch_options(head_dim)
    assert (options["block_m"], options["block_n"]) == ((128, 64) if head_dim == 64 else (128, 32))
    q = randn(1, 2, 130, head_dim)
    k, v = randn(1, 1, 150, head_dim, seed=1), randn(1, 1, 150, head_dim, seed=2)
    out, lse = flash_triton.triton_attention_forward(q, k, v, causal=causal, **options)
    expected, expected_lse = naive_attention(q, k, v, causal)
    torch.testing.assert_close(out.double().cpu(), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double().cpu(), expected_lse, atol=1e-5, rtol=1e-5)


def test_gradients_through_the_pytorch_recomputing_backward():
    q = randn(1, 4, 48, 16).requires_grad_()
    k, v = randn(1, 2, 64, 16, seed=1).requires_grad_(), randn(1, 2, 64, 16, seed=2).requires_grad_()
    out = flash_triton.triton_flash_attention(q, k, v, causal=True)
    upstream = randn(*out.shape, seed=3)
    got = torch.autograd.grad(out, (q, k, v), upstream)
    leaves = [t.detach().double().cpu().requires_grad_() for t in (q, k, v)]
    expected = torch.autograd.grad(naive_attention(*leaves, causal=True)[0], leaves, upstream.double().cpu())
    for name, a, b in zip("qkv", got, expected):
        assert a.shape == b.shape and a.dtype == torch.float32, name
        torch.testing.assert_close(a.double().cpu(), b, atol=1e-4, rtol=1e-4, msg=f"d{name}")


def test_triton_backend_follows_the_contract_and_refuses_what_it_cannot_do():
    fn = get_attention_backend("triton")
    assert fn is flash_triton.triton_backend
    q, k, v = randn(2, 4, 16, 16), randn(2, 2, 16, 16, seed=1), randn(2, 2, 16, 16, seed=2)
    torch.testing.assert_close(fn(q, k, v, causal=True).double().cpu(), naive_attention(q, k, v, True)[0], rtol=1.3e-6, atol=1e-5)
    with pytest.raises(ValueError, match="takes no mask"):
        fn(q, k, v, mask=torch.ones(16, 16, dtype=torch.bool, device=DEVICE))
    with pytest.raises(ValueError, match="dropout_p"):
        fn(q, k, v, dropout_p=0.1)
    with pytest.raises(ValueError, match="head_dim a power of two"):
        fn(randn(1, 2, 16, 24), randn(1, 2, 16, 24), randn(1, 2, 16, 24))
    with pytest.raises(ValueError, match="must divide the 4 query heads"):
        fn(q, randn(2, 3, 16, 16), randn(2, 3, 16, 16))
    with pytest.raises(ValueError, match="at least as many keys as queries"):
        fn(q, k[:, :, :8], v[:, :, :8], causal=True)
