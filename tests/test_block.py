"""minillm.block: the chain rule through residual stacks, the sleeve's EncoderLayer and the
TransformerBlock, against torch's layers, GPT-2's and Llama's blocks, and a functional reference."""
import itertools

import pytest
import torch
import torch.nn.functional as F

from minillm.attention import ConcatCache, MultiHeadAttention
from minillm.block import EncoderLayer, TransformerBlock, input_gradients
from minillm.config import ModelConfig, block_parameters
from minillm.ffn import FeedForward, SwiGLU
from minillm.norm import LayerNorm, RMSNorm


def n_parameters(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def randomize(module: torch.nn.Module, seed: int, scale: float = 0.4) -> None:
    """Every parameter random, the norms' scales around 1, so that mixing up parameters shows."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(scale * torch.randn(p.shape, generator=generator, dtype=p.dtype))
            if name.startswith("norm") and name.endswith("weight"):
                p.add_(1.0)


# ---------------------------------------------------------------- input_gradients

@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("depth,width", [(1, 3), (6, 4), (12, 8)])
def test_input_gradients_match_autograd(depth, width, residual):
    g = torch.Generator().manual_seed(depth * 10 + width)
    layers = [(torch.randn(width, width, generator=g, dtype=torch.float64), torch.randn(width, generator=g, dtype=torch.float64))
              for _ in range(depth)]
    hs = [torch.randn(width, generator=g, dtype=torch.float64, requires_grad=True)]
    jacobians = []
    for W, b in layers:
        def f(v, W=W, b=b):
            return torch.tanh(W @ v + b)
        jacobians.append(torch.autograd.functional.jacobian(f, hs[-1].detach()))
        out = hs[-1] + f(hs[-1]) if residual else f(hs[-1])
        out.retain_grad()
        hs.append(out)
    grad_output = torch.randn(width, generator=g, dtype=torch.float64)
    (hs[-1] * grad_output).sum().backward()
    expected = torch.stack([h.grad for h in hs[:-1]])
    got = input_gradients(torch.stack(jacobians), grad_output, residual=residual)
    torch.testing.assert_close(got, expected, atol=1e-10, rtol=1e-10)


def test_input_gradients_hand_computed():
    jacobians = torch.tensor([[[0.5, 1.0], [0.0, 2.0]], [[1.0, -1.0], [0.5, 0.0]], [[0.0, 0.5], [-1.0, 1.0]]],
                             dtype=torch.float64)
    g = torch.tensor([1.0, 2.0], dtype=torch.float64)
    # J3^T g = (-2, 2.5); J2^T (-2, 2.5) = (-0.75, 2); J1^T (-0.75, 2) = (-0.375, 3.25)
    torch.testing.assert_close(input_gradients(jacobians, g),
                               torch.tensor([[-0.375, 3.25], [-0.75, 2.0], [-2.0, 2.5]], dtype=torch.float64))
    # with the identity: g + J^T g at every layer
    torch.testing.assert_close(input_gradients(jacobians, g, residual=True),
                               torch.tensor([[0.375, 16.75], [0.25, 5.5], [-1.0, 4.5]], dtype=torch.float64))


def test_input_gradients_identity_path():
    g = torch.randn(5)
    torch.testing.assert_close(input_gradients(torch.zeros(7, 5, 5), g, residual=True), g.expand(7, 5))
    torch.testing.assert_close(input_gradients(torch.zeros(7, 5, 5), g), torch.zeros(7, 5))
    # shrinking Jacobians: the plain gradient vanishes geometrically, the residual one does not
    halves = 0.5 * torch.eye(5).expand(20, 5, 5)
    plain = input_gradients(halves, g).norm(dim=-1)
    torch.testing.assert_close(plain[0], g.norm() * 0.5**20)
    assert (input_gradients(halves, g, residual=True).norm(dim=-1) >= g.norm()).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_input_gradients_keep_the_dtype_and_leave_the_arguments_alone(dtype):
    jacobians = torch.randn(4, 3, 3, generator=torch.Generator().manual_seed(5), dtype=dtype)
    grad_output = torch.randn(3, generator=torch.Generator().manual_seed(6), dtype=dtype)
    kept = jacobians.clone(), grad_output.clone()
    for residual in (False, True):
        assert input_gradients(jacobians, grad_output, residual=residual).dtype == dtype
    assert torch.equal(jacobians, kept[0]) and torch.equal(grad_output, kept[1])


def test_input_gradients_reject_bad_shapes():
    with pytest.raises(ValueError, match="jacobians must be a tensor of shape \\(L, d, d\\)"):
        input_gradients(torch.zeros(3, 4, 5), torch.zeros(4))
    with pytest.raises(ValueError, match="grad_output must have shape \\(4,\\)"):
        input_gradients(torch.zeros(3, 4, 4), torch.zeros(5))


# ---------------------------------------------------------------- the sleeve's EncoderLayer

def _copy_into_torch_layer(ours: EncoderLayer, theirs: torch.nn.TransformerEncoderLayer) -> None:
    with torch.no_grad():
        theirs.self_attn.in_proj_weight.copy_(ours.attn.qkv.weight)
        theirs.self_attn.in_proj_bias.copy_(ours.attn.qkv.bias)
        theirs.self_attn.out_proj.load_state_dict(ours.attn.out.state_dict())
        theirs.linear1.load_state_dict(ours.ffn.w1.state_dict())
        theirs.linear2.load_state_dict(ours.ffn.w2.state_dict())
        theirs.norm1.load_state_dict(ours.norm1.state_dict())
        theirs.norm2.load_state_dict(ours.norm2.state_dict())


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_layer_matches_torch_transformer_encoder_layer(activation):
    torch.manual_seed(0)
    ours = EncoderLayer(32, 4, 96, activation=activation, eps=1e-6)
    randomize(ours, seed=1)
    theirs = torch.nn.TransformerEncoderLayer(32, 4, 96, dropout=0.0, activation=activation, layer_norm_eps=1e-6,
                                              batch_first=True, norm_first=False)
    _copy_into_torch_layer(ours, theirs)
    x = torch.randn(3, 7, 32)
    # train mode with dropout 0: torch's slow path, every position computed
    theirs.train()
    torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-5)
    padding = torch.zeros(3, 7, dtype=torch.bool)
    padding[1, 5:] = padding[2, 2:] = True
    got = ours(x, mask=~padding[:, None, None, :])
    expected = theirs(x, src_key_padding_mask=padding)
    torch.testing.assert_close(got[~padding], expected[~padding], atol=1e-5, rtol=1e-5)
    assert n_parameters(ours) == n_parameters(theirs)


def test_encoder_layer_is_post_norm_bidirectional_and_counted():
    layer = EncoderLayer(24, 3, 64)
    assert isinstance(layer.attn, MultiHeadAttention) and not layer.attn.causal
    assert isinstance(layer.norm1, LayerNorm) and isinstance(layer.norm2, LayerNorm)
    assert isinstance(layer.ffn, FeedForward) and layer.ffn.activation_name == "relu"
    config = ModelConfig(d_model=24, n_heads=3, d_ff=64, ffn="relu", architecture="encoder", norm_placement="post")
    assert n_parameters(layer) == block_parameters(config)
    randomize(layer, seed=2)
    x = torch.randn(2, 6, 24)
    out = layer(x)
    # post-norm: every output row is the output of norm2 (mean 0, variance 1 before its affine map)
    normalized = (out - layer.norm2.bias) / layer.norm2.weight
    torch.testing.assert_close(normalized.mean(-1), torch.zeros(2, 6), atol=1e-5, rtol=0)
    # bidirectional: changing the last token moves the first position's output
    changed = x.clone()
    changed[:, -1] += 1.0
    assert not torch.allclose(layer(changed)[:, 0], out[:, 0], atol=1e-4)


def test_encoder_layer_rejects_other_activations():
    with pytest.raises(ValueError, match=r"activation must be one of \('relu', 'gelu'\)"):
        EncoderLayer(16, 2, 32, activation="swiglu")


# ---------------------------------------------------------------- TransformerBlock

def reference_block(sd, x, *, n_heads, n_kv_heads, placement, norm, ffn, causal, mask=None, eps=1e-5):
    """The block written from its state dict with torch's functional ops only."""
    batch, seq, d = x.shape
    hd = d // n_heads

    def nrm(prefix, h):
        if norm == "layernorm":
            return F.layer_norm(h, (d,), sd[prefix + ".weight"], sd.get(prefix + ".bias"), eps)
        return F.rms_norm(h, (d,), sd[prefix + ".weight"], eps)

    def lin(prefix, h):
        return F.linear(h, sd[prefix + ".weight"], sd.get(prefix + ".bias"))

    def attn(h):
        q, k, v = lin("attn.qkv", h).split([d, n_kv_heads * hd, n_kv_heads * hd], dim=-1)
        q = q.reshape(batch, seq, n_heads, hd).transpose(1, 2)
        k, v = (t.reshape(batch, seq, n_kv_heads, hd).transpose(1, 2).repeat_interleave(n_heads // n_kv_heads, dim=1)
                for t in (k, v))
        allowed = torch.ones(seq, seq, dtype=torch.bool)
        if causal:
            allowed = allowed.tril()
        if mask is not None:
            allowed = allowed & mask
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        return lin("attn.out", o.transpose(1, 2).reshape(batch, seq, d))

    def feed_forward(h):
        if ffn == "swiglu":
            return lin("ffn.w2", F.silu(lin("ffn.w1", h)) * lin("ffn.w3", h))
        act = {"gelu": F.gelu, "relu": F.relu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}[ffn]
        return lin("ffn.w2", act(lin("ffn.w1", h)))

    if placement == "pre":
        h = x + attn(nrm("norm1", x))
        return h + feed_forward(nrm("norm2", h))
    h = nrm("norm1", x + attn(x))
    return nrm("norm2", h + feed_forward(h))


VARIANTS = [
    dict(placement="pre", norm="layernorm", ffn="gelu", bias=True, n_kv_heads=4, causal=True),
    dict(placement="post", norm="layernorm", ffn="relu", bias=True, n_kv_heads=4, causal=False),
    dict(placement="pre", norm="rmsnorm", ffn="swiglu", bias=False, n_kv_heads=2, causal=True),
    dict(placement="post", norm="rmsnorm", ffn="gelu_tanh", bias=False, n_kv_heads=1, causal=True),
    dict(placement="pre", norm="layernorm", ffn="swiglu", bias=True, n_kv_heads=1, causal=False),
]


@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: "-".join(str(x) for x in v.values()))
def test_block_matches_functional_reference(v):
    torch.manual_seed(3)
    block = TransformerBlock(16, 4, 40, n_kv_heads=v["n_kv_heads"], norm=v["norm"], norm_placement=v["placement"],
                             ffn=v["ffn"], bias=v["bias"], causal=v["causal"]).eval()
    randomize(block, seed=4)
    x = torch.randn(3, 6, 16)
    sd = block.state_dict()
    expected = reference_block(sd, x, n_heads=4, n_kv_heads=v["n_kv_heads"], placement=v["placement"], norm=v["norm"],
                               ffn=v["ffn"], causal=v["causal"])
    torch.testing.assert_close(block(x), expected, atol=1e-5, rtol=1e-5)
    # the extra mask reaches the attention
    keep = torch.tensor([[True] * 6, [True] * 4 + [False] * 2, [True] * 2 + [False] * 4])[:, None, None, :]
    expected = reference_block(sd, x, n_heads=4, n_kv_heads=v["n_kv_heads"], placement=v["placement"], norm=v["norm"],
                               ffn=v["ffn"], causal=v["causal"], mask=keep)
    torch.testing.assert_close(block(x, mask=keep), expected, atol=1e-5, rtol=1e-5)


def test_block_submodules_and_defaults():
    block = TransformerBlock(32, 4, 128)
    assert [name for name, _ in block.named_children()][:4] == ["norm1", "attn", "norm2", "ffn"]
    assert isinstance(block.attn, MultiHeadAttention) and block.attn.causal and block.attn.backend == "math"
    assert isinstance(block.norm1, LayerNorm) and isinstance(block.norm2, LayerNorm) and block.norm1 is not block.norm2
    assert isinstance(block.ffn, FeedForward) and block.ffn.activation_name == "gelu"
    assert block.norm_placement == "pre"
    llama = TransformerBlock(32, 4, 96, n_kv_heads=2, norm="rmsnorm", ffn="swiglu", bias=False, eps=1e-6)
    assert isinstance(llama.norm1, RMSNorm) and llama.norm1.eps == 1e-6
    assert isinstance(llama.ffn, SwiGLU) and llama.ffn.w1.bias is None
    assert llama.attn.n_kv_heads == 2 and llama.attn.qkv.bias is None
    split = TransformerBlock(32, 4, 96, n_kv_heads=2, fused_qkv=False)
    assert not split.attn.fused_qkv and not hasattr(split.attn, "qkv") and split.attn.k.out_features == 16


@pytest.mark.parametrize(
    "norm,placement,ffn,bias,n_kv",
    [c for c in itertools.product(["layernorm", "rmsnorm"], ["pre", "post"], ["gelu", "relu", "swiglu"], [True, False], [8, 2])],
)
def test_block_parameters_equal_config_count(norm, placement, ffn, bias, n_kv):
    config = ModelConfig(d_model=64, n_heads=8, n_kv_heads=n_kv, d_ff=176, norm=norm, norm_placement=placement, ffn=ffn,
                         bias=bias)
    with torch.device("meta"):
        block = TransformerBlock(config.d_model, config.n_heads, config.d_ff, n_kv_heads=config.n_kv_heads, norm=config.norm,
                                 norm_placement=config.norm_placement, ffn=config.ffn, bias=config.bias)
    assert n_parameters(block) == block_parameters(config)


def test_block_parameters_of_famous_layers():
    from minillm.config import PRESETS

    for name in ("gpt2", "gpt2-xl", "llama-7b"):
        cfg = PRESETS[name]
        with torch.device("meta"):
            block = TransformerBlock(cfg.d_model, cfg.n_heads, cfg.d_ff, n_kv_heads=cfg.n_kv_heads, norm=cfg.norm,
                                     norm_placement=cfg.norm_placement, ffn=cfg.ffn, bias=cfg.bias)
        assert n_parameters(block) == block_parameters(cfg), name


@pytest.mark.parametrize("placement", ["pre", "post"])
def test_block_is_causal(placement):
    torch.manual_seed(5)
    block = TransformerBlock(24, 3, 48, norm_placement=placement).eval()
    randomize(block, seed=6)
    x = torch.randn(2, 8, 24)
    changed = x.clone()
    changed[:, 5] += 2.0
    before, after = block(x), block(changed)
    torch.testing.assert_close(after[:, :5], before[:, :5], rtol=1.3e-6, atol=1e-5)
    assert not torch.allclose(after[:, 5:], before[:, 5:], atol=1e-3)


def rotate_half_rope(theta: float = 10000.0):
    """A rotary callable in the split-half (Llama / Hugging Face) pairing, written for the tests."""
    def rotary(x, positions):
        hd = x.shape[-1]
        inv = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        angles = positions.to(torch.float64)[:, None] * inv[None]
        cos, sin = torch.cat([angles, angles], -1).cos().to(x.dtype), torch.cat([angles, angles], -1).sin().to(x.dtype)
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin
    return rotary


@pytest.mark.parametrize("rotary", [None, rotate_half_rope()])
def test_block_with_kv_cache_equals_one_pass(rotary):
    torch.manual_seed(7)
    block = TransformerBlock(32, 4, 64, n_kv_heads=2, rotary=rotary).eval()
    randomize(block, seed=8)
    x = torch.randn(2, 10, 32)
    with torch.no_grad():
        full = block(x)
        cache = ConcatCache()
        parts = [block(x[:, :4], kv_cache=cache, positions=torch.arange(4))]
        parts += [block(x[:, t:t + 1], kv_cache=cache, positions=torch.tensor([t])) for t in range(4, 10)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=1e-5)


def test_block_passes_positions_to_the_rotary_module():
    seen = []

    def rotary(x, positions):
        seen.append(positions.tolist())
        return x

    block = TransformerBlock(16, 2, 32, rotary=rotary)
    block(torch.randn(1, 3, 16), positions=torch.tensor([5, 6, 7]))
    assert seen == [[5, 6, 7], [5, 6, 7]]  # queries and keys


def test_block_backends_agree_and_gradients_reach_every_parameter():
    torch.manual_seed(9)
    math_block = TransformerBlock(32, 4, 64, attention_backend="math")
    sdpa_block = TransformerBlock(32, 4, 64, attention_backend="sdpa")
    randomize(math_block, seed=10)
    sdpa_block.load_state_dict(math_block.state_dict())
    x = torch.randn(2, 7, 32)
    torch.testing.assert_close(sdpa_block(x), math_block(x), atol=1e-5, rtol=1e-5)
    math_block(x).pow(2).mean().backward()
    for name, p in math_block.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_block_dropout_acts_only_in_training():
    torch.manual_seed(11)
    block = TransformerBlock(32, 4, 64, dropout=0.5)
    x = torch.randn(2, 6, 32)
    block.train()
    assert not torch.allclose(block(x), block(x))
    block.eval()
    torch.testing.assert_close(block(x), block(x))
    no_dropout = TransformerBlock(32, 4, 64, dropout=0.0).eval()
    no_dropout.load_state_dict(block.state_dict())
    torch.testing.assert_close(block(x), no_dropout(x))


@pytest.mark.parametrize("placement", ["pre", "post"])
def test_block_dropout_acts_on_the_attention_output_before_the_add(placement):
    # only the block's own dropout left on: the attention's dropout and the FFN's are off
    torch.manual_seed(12)
    block = TransformerBlock(16, 2, 32, norm_placement=placement, dropout=0.5)
    randomize(block, seed=13)
    block.attn.dropout = 0.0
    block.ffn.dropout.p = 0.0
    block.train()
    x = torch.randn(3, 6, 16)
    torch.manual_seed(14)
    got = block(x)
    torch.manual_seed(14)  # the same dropout mask, drawn by hand
    kept = torch.nn.functional.dropout(torch.ones(3, 6, 16), 0.5)
    if placement == "pre":
        h = x + kept * block.attn(block.norm1(x))
        expected = h + block.ffn(block.norm2(h))
    else:
        h = block.norm1(x + kept * block.attn(x))
        expected = block.norm2(h + block.ffn(h))
    torch.testing.assert_close(got, expected)


def test_block_keeps_dtype_and_leaves_its_input_alone():
    block = TransformerBlock(16, 2, 32).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    before = x.clone()
    out = block(x)
    assert out.dtype == torch.float64 and out.shape == x.shape
    assert torch.equal(x, before)


def test_block_rejects_bad_input():
    with pytest.raises(ValueError, match="norm_placement must be one of \\('pre', 'post'\\), got 'middle'"):
        TransformerBlock(32, 4, 64, norm_placement="middle")
    with pytest.raises(ValueError, match="unknown norm 'batchnorm'"):
        TransformerBlock(32, 4, 64, norm="batchnorm")
    with pytest.raises(ValueError, match="unknown FFN 'swish'"):
        TransformerBlock(32, 4, 64, ffn="swish")
    with pytest.raises(ValueError, match="divisible by n_heads"):
        TransformerBlock(30, 4, 64)
    with pytest.raises(ValueError, match="n_kv_heads"):
        TransformerBlock(32, 4, 64, n_kv_heads=3)
    with pytest.raises(TypeError, match="fused_qkv must be True or False"):
        TransformerBlock(32, 4, 64, fused_qkv=1)
    bidirectional = TransformerBlock(32, 4, 64, causal=False)
    with pytest.raises(ValueError, match="mask of shape \\(3, 3\\) does not broadcast"):
        bidirectional(torch.randn(2, 5, 32), mask=torch.ones(3, 3, dtype=torch.bool))


# ---------------------------------------------------------------- parity with real models

def test_pre_norm_block_is_gpt2_block():
    import transformers
    config = transformers.GPT2Config(n_embd=48, n_layer=2, n_head=4, n_positions=16, vocab_size=50, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0, activation_function="gelu_new",
                                     layer_norm_epsilon=1e-5)
    torch.manual_seed(12)
    model = transformers.GPT2Model(config).eval()
    randomize(model.h[0], seed=13, scale=0.3)
    hf = model.h[0]
    ours = TransformerBlock(48, 4, 192, ffn="gelu_tanh").eval()
    with torch.no_grad():  # GPT-2's Conv1D stores (in, out): transpose
        ours.norm1.load_state_dict(hf.ln_1.state_dict())
        ours.attn.qkv.weight.copy_(hf.attn.c_attn.weight.T)
        ours.attn.qkv.bias.copy_(hf.attn.c_attn.bias)
        ours.attn.out.weight.copy_(hf.attn.c_proj.weight.T)
        ours.attn.out.bias.copy_(hf.attn.c_proj.bias)
        ours.norm2.load_state_dict(hf.ln_2.state_dict())
        ours.ffn.w1.weight.copy_(hf.mlp.c_fc.weight.T)
        ours.ffn.w1.bias.copy_(hf.mlp.c_fc.bias)
        ours.ffn.w2.weight.copy_(hf.mlp.c_proj.weight.T)
        ours.ffn.w2.bias.copy_(hf.mlp.c_proj.bias)
        ids = torch.randint(50, (2, 9))
        hidden = model(ids, output_hidden_states=True).hidden_states
        torch.testing.assert_close(ours(hidden[0]), hidden[1], atol=1e-5, rtol=1e-5)
        post = TransformerBlock(48, 4, 192, ffn="gelu_tanh", norm_placement="post").eval()
        post.load_state_dict(ours.state_dict())
        assert not torch.allclose(post(hidden[0]), hidden[1], atol=1e-2)  # GPT-2 is not post-norm


def test_llama_style_block_is_llama_decoder_layer():
    import transformers
    config = transformers.LlamaConfig(vocab_size=50, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=32,
                                      rms_norm_eps=1e-6, rope_theta=10000.0, attention_bias=False, mlp_bias=False)
    config._attn_implementation = "eager"
    torch.manual_seed(14)
    model = transformers.LlamaModel(config).eval()
    randomize(model.layers[0], seed=15, scale=0.2)
    hf = model.layers[0]
    ours = TransformerBlock(64, 8, 160, n_kv_heads=2, norm="rmsnorm", ffn="swiglu", bias=False, eps=1e-6,
                            rotary=rotate_half_rope(10000.0)).eval()
    with torch.no_grad():
        a = hf.self_attn
        ours.attn.qkv.weight.copy_(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
        ours.attn.out.weight.copy_(a.o_proj.weight)
        ours.norm1.weight.copy_(hf.input_layernorm.weight)
        ours.norm2.weight.copy_(hf.post_attention_layernorm.weight)
        ours.ffn.w1.weight.copy_(hf.mlp.gate_proj.weight)
        ours.ffn.w3.weight.copy_(hf.mlp.up_proj.weight)
        ours.ffn.w2.weight.copy_(hf.mlp.down_proj.weight)
        ids = torch.randint(50, (2, 11))
        hidden = model(ids, output_hidden_states=True).hidden_states
        torch.testing.assert_close(ours(hidden[0]), hidden[1], atol=1e-5, rtol=1e-5)


def test_block_accepts_the_course_rotary_embedding():
    from minillm import positional
    torch.manual_seed(16)
    ours = TransformerBlock(32, 4, 64, rotary=positional.RotaryEmbedding(8).rotate).eval()
    by_hand = TransformerBlock(32, 4, 64, rotary=rotate_half_rope(10000.0)).eval()
    randomize(ours, seed=17)
    by_hand.load_state_dict(ours.state_dict())
    x = torch.randn(2, 7, 32)
    torch.testing.assert_close(ours(x), by_hand(x), atol=1e-5, rtol=1e-5)
    shifted = torch.arange(3, 10)
    torch.testing.assert_close(ours(x, positions=shifted), by_hand(x, positions=shifted), atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- compiled, in one graph

@pytest.mark.parametrize("attention_backend", ["math", "sdpa"])
@pytest.mark.parametrize("ffn", ["gelu", "swiglu"])
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("norm_placement", ["pre", "post"])
def test_block_compiles_without_graph_breaks(norm_placement, norm, ffn, attention_backend):
    """No check reads a tensor's values and nothing leaves the graph inside a block, so
    torch.compile sees each block whole (chapters 08-10 time compiled models)."""
    torch._dynamo.reset()
    block = TransformerBlock(16, 4, 32, n_kv_heads=2, norm=norm, norm_placement=norm_placement, ffn=ffn,
                             attention_backend=attention_backend)
    x = torch.randn(2, 5, 16)
    for mask in (None, torch.tensor([True, True, False, True, True])[None, None, None, :]):
        explanation = torch._dynamo.explain(block)(x, mask=mask)
        assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation.break_reasons
    torch._dynamo.reset()
