"""minillm.model: parameter counts, shapes, the loss, causality, the switches, registered parts, padding, bad input."""
import copy
import itertools
import math
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from minillm import config as config_module
from minillm import ffn as ffn_module
from minillm import model as model_module
from minillm.generate import ConcatModelCache
from minillm.markers import mark_residual_projection
from minillm.model import GPT, GPTConfig, count_parameters

SMALL = dict(vocab_size=61, context_length=16, d_model=24, n_layers=2, n_heads=4, d_ff=40)
POSITION_VARIANTS = ["learned", "sinusoidal", "rope", "alibi"]


def _ids(batch=2, seq=9, vocab=61, seed=0):
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _numel(model):
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------- parameter counts

SWITCHES = list(itertools.product(
    ["learned", "sinusoidal", "rope", "alibi"], ["layernorm", "rmsnorm"], ["pre", "post"], ["gelu", "relu", "swiglu"],
    [True, False], [True, False]))


@pytest.mark.parametrize("positions, norm, placement, ffn, bias, tied", SWITCHES)
def test_both_counts_equal_the_built_model(positions, norm, placement, ffn, bias, tied):
    config = GPTConfig(**SMALL, positions=positions, norm=norm, norm_placement=placement, ffn=ffn, bias=bias,
                       tie_embeddings=tied)
    built = _numel(GPT(config))
    assert count_parameters(config) == built, "the model's own count"
    assert config_module.count_parameters(config) == built, "chapter 00's closed-set formula"


@pytest.mark.parametrize("extra", [
    dict(n_kv_heads=1), dict(n_kv_heads=2, ffn="swiglu", bias=False), dict(final_norm=False),
    dict(embedding_norm=True), dict(embedding_norm=True, norm="rmsnorm", final_norm=False),
    dict(architecture="encoder", embedding_norm=True, norm_placement="post"), dict(ffn="gelu_tanh"),
    dict(scale_embeddings=True, dropout=0.3, attention_backend="math"), dict(fused_qkv=False, n_kv_heads=2),
    dict(d_ff=None, ffn="swiglu"), dict(d_ff=None, ffn="relu", tie_embeddings=False),
    dict(vocab_size=1000, context_length=256, d_model=128, n_layers=4, n_heads=8, d_ff=512),
])
def test_counts_equal_the_built_model_in_more_configurations(extra):
    config = GPTConfig(**{**SMALL, **extra})
    built = _numel(GPT(config))
    assert count_parameters(config) == config_module.count_parameters(config) == built


def test_gpt2_small_shape_has_124m_parameters():
    config = GPTConfig(ffn="gelu_tanh")  # ModelConfig's defaults are GPT-2 small's shape, d_ff 4 d_model
    with torch.device("meta"):
        model = GPT(config)
    assert config.d_ff == 3072
    assert _numel(model) == count_parameters(config) == config_module.count_parameters(config) == 124_439_808


@pytest.mark.parametrize("positions, tied", [("learned", True), ("learned", False), ("rope", True), ("sinusoidal", False)])
def test_non_embedding_count_leaves_out_the_tables_but_not_an_untied_head(positions, tied):
    config = GPTConfig(**SMALL, positions=positions, tie_embeddings=tied)
    model = GPT(config)
    tables = model.token_embedding.weight.numel()
    if positions == "learned":
        tables += model.position_embedding.weight.numel()
    assert count_parameters(config, non_embedding=True) == _numel(model) - tables
    if not tied:
        assert count_parameters(config, non_embedding=True) > _numel(model) - 2 * SMALL["vocab_size"] * SMALL["d_model"]
    # GPT-2 small without its embedding tables: the 85M of Kaplan et al.'s tables
    assert count_parameters(GPTConfig(ffn="gelu_tanh"), non_embedding=True) == 124_439_808 - 50257 * 768 - 1024 * 768


def test_count_parameters_refuses_other_configs_and_flags():
    with pytest.raises(TypeError, match="GPTConfig"):
        count_parameters(config_module.PRESETS["gpt2"])
    with pytest.raises(TypeError, match="active"):
        count_parameters(GPTConfig(**SMALL), active=1)
    with pytest.raises(TypeError, match="non_embedding"):
        count_parameters(GPTConfig(**SMALL), non_embedding="yes")


# ---------------------------------------------------------------- components registered by a test

@pytest.fixture
def ffns(monkeypatch):
    """A copy of the FFN registry in the place of the one the model and chapter 05 read, so
    that a test's entries do not outlive it."""
    registry = copy.deepcopy(ffn_module.FFNS)
    for module in (ffn_module, model_module):
        monkeypatch.setattr(module, "FFNS", registry)
    return registry


class GatedFFN(nn.Module):
    """An FFN no chapter lists: proj_out(relu(gate(x)) * up(x)) * scale. Its down-projection is
    called ``proj_out`` (not ``w2``) and marked as a residual projection where it is built."""

    def __init__(self, d_model, d_ff, bias=False, dropout=0.0, scale=1.0, mark=True):
        super().__init__()
        self.gate = nn.Linear(d_model, d_ff, bias=bias)
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.proj_out = nn.Linear(d_ff, d_model, bias=bias)
        if mark:
            mark_residual_projection(self.proj_out)
        self.scale = scale

    @classmethod
    def default_d_ff(cls, d_model, **options):
        return 3 * d_model

    def forward(self, x):
        return self.proj_out(F.relu(self.gate(x)) * self.up(x)) * self.scale


class PenalizedFFN(GatedFFN):
    """A GatedFFN with an auxiliary loss: weight times the mean square of its hidden activations."""

    def __init__(self, d_model, d_ff, weight=0.5, **kwargs):
        super().__init__(d_model, d_ff, **kwargs)
        self.weight = weight

    def forward(self, x):
        hidden = F.relu(self.gate(x)) * self.up(x)
        square = hidden.pow(2).mean()
        self.aux_loss = self.weight * square
        self.aux_losses = {"activation": square, "zero": torch.zeros(())}
        return self.proj_out(hidden) * self.scale


class ToyExperts(nn.Module):
    """n_experts FFNs and a router; each token is sent to top_k of them. Counts its active parameters."""

    def __init__(self, d_model, d_ff, bias=False, dropout=0.0, n_experts=4, top_k=1):
        super().__init__()
        self.router = nn.Linear(d_model, n_experts, bias=False)
        self.experts = nn.ModuleList(GatedFFN(d_model, d_ff, bias=bias) for _ in range(n_experts))
        self.top_k = top_k

    def active_parameter_count(self) -> int:
        per_expert = sum(p.numel() for p in self.experts[0].parameters())
        return self.router.weight.numel() + self.top_k * per_expert

    def forward(self, x):
        weights, chosen = self.router(x).softmax(-1).topk(self.top_k, dim=-1)
        outputs = torch.stack([expert(x) for expert in self.experts], dim=-2)  # (..., n_experts, d_model)
        picked = outputs.gather(-2, chosen[..., None].expand(*chosen.shape, x.shape[-1]))
        return (weights[..., None] * picked).sum(-2)


def test_a_registered_ffn_is_a_valid_config_with_its_own_width_and_options(ffns):
    with pytest.raises(ValueError, match="ffn must be one of"):
        GPTConfig(**{**SMALL, "ffn": "gated"})
    ffns.register("gated", GatedFFN)
    config = GPTConfig(**{**SMALL, "d_ff": None}, ffn="gated", ffn_options={"scale": 0.5})
    assert config.d_ff == 3 * SMALL["d_model"], "d_ff=None asks the FFN's own rule"
    model = GPT(config)
    assert all(type(block.ffn) is GatedFFN and block.ffn.scale == 0.5 for block in model.blocks)
    assert GPTConfig.from_dict(config.to_dict()) == config


def test_residual_projections_are_initialized_by_their_mark_not_their_name(ffns):
    ffns.register("gated", GatedFFN)
    ffns.register("gated-unmarked", GatedFFN, mark=False)
    shape = {**SMALL, "d_model": 64, "d_ff": 256, "n_layers": 8}
    marked = GPT(GPTConfig(**shape, ffn="gated")).blocks[0].ffn
    unmarked = GPT(GPTConfig(**shape, ffn="gated-unmarked")).blocks[0].ffn
    assert abs(marked.proj_out.weight.std().item() - 0.02 / 4) < 0.0005, "std / sqrt(2 n_layers) for the marked layer"
    assert abs(unmarked.proj_out.weight.std().item() - 0.02) < 0.002
    assert abs(marked.gate.weight.std().item() - 0.02) < 0.002


def test_auxiliary_losses_reach_the_loss_and_the_logs(ffns):
    ffns.register("penalized", PenalizedFFN)
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SMALL, ffn="penalized", ffn_options={"weight": 0.25}, init_std=0.2))
    ids, targets = _ids(), _ids(seed=1)
    logits, loss = model(ids, targets)
    squares = [block.ffn.aux_losses["activation"] for block in model.blocks]
    cross_entropy = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    torch.testing.assert_close(loss, cross_entropy + 0.25 * sum(squares))
    logged = model.last_aux_losses
    assert set(logged) == {"aux_loss", "activation", "zero"} and all(type(v) is float for v in logged.values())
    assert logged["activation"] == pytest.approx(sum(s.item() for s in squares))
    assert logged["aux_loss"] == pytest.approx(0.25 * logged["activation"])
    loss.backward()
    assert model.blocks[0].ffn.gate.weight.grad is not None
    plain = GPT(GPTConfig(**SMALL))
    plain(ids, targets)
    assert plain.last_aux_losses == {}
    assert model(ids)[1] is None, "without targets there is no loss, auxiliary or not"


def test_active_parameters_are_asked_of_the_module_that_knows_them(ffns):
    ffns.register("experts", ToyExperts)
    config = GPTConfig(**SMALL, ffn="experts", ffn_options={"n_experts": 4, "top_k": 2})
    model = GPT(config)
    assert count_parameters(config) == _numel(model)
    expert = sum(p.numel() for p in model.blocks[0].ffn.experts[0].parameters())
    assert count_parameters(config, active=True) == _numel(model) - config.n_layers * 2 * expert
    dense = GPTConfig(**SMALL)
    assert count_parameters(dense, active=True) == count_parameters(dense), "no module counts itself: all are active"


def test_done_when_a_new_ffn_builds_trains_counts_and_round_trips(ffns, tmp_path):
    from minillm.train import load_model, save_model

    ffns.register("gated", GatedFFN)
    config = GPTConfig(**{**SMALL, "d_ff": None}, ffn="gated", ffn_options={"scale": 2.0}, init_std=0.1)
    torch.manual_seed(0)
    model = GPT(config)
    assert count_parameters(config) == _numel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = _ids(batch=4, seq=12, seed=3)
    losses = []
    for _ in range(15):
        _, loss = model(ids[:, :-1], ids[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 1.0, f"training a batch it sees every step should lower the loss, got {losses}"
    path = tmp_path / "gated.pt"
    save_model(path, model)
    loaded = load_model(path)
    assert loaded.config == config and loaded.config.ffn_options == {"scale": 2.0}
    model.eval()
    # bit equality: the checkpoint holds the very tensors, and the same kernels run on them
    torch.testing.assert_close(loaded(ids)[0], model(ids)[0], rtol=0, atol=0)


def test_a_later_chapters_ffn_is_named_where_it_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "minillm.moe", None)  # an installation without chapter 11
    with pytest.raises(ValueError, match="chapter 11"):
        GPTConfig(**SMALL, ffn="moe")


# ---------------------------------------------------------------- the config

def test_d_ff_defaults_to_the_ffns_rule_and_a_given_width_stays():
    assert GPTConfig(d_model=128, n_heads=4, ffn="swiglu").d_ff == 352, "the shipped model's shape"
    assert GPTConfig(d_model=128, n_heads=4).d_ff == GPTConfig(d_model=128, n_heads=4, ffn="relu").d_ff == 512
    assert GPTConfig(d_model=128, n_heads=4, d_ff=200).d_ff == 200
    assert GPTConfig(d_model=128, n_heads=4, ffn="swiglu") == GPTConfig(d_model=128, n_heads=4, ffn="swiglu", d_ff=352)


def test_defaults_are_the_fast_path():
    config = GPTConfig()
    assert config.attention_backend == "sdpa" and config.fused_qkv and config.ffn_options is None
    assert config.choices()["ffn"] == ffn_module.FFNS.names()
    assert config_module.ModelConfig().choices() is config_module.CHOICES, "chapter 00's lists stay its own"


@pytest.mark.parametrize("options, error", [
    ([("scale", 1.0)], TypeError), ({1: 2}, TypeError), ({"scale": object()}, TypeError),
    ({"scale": torch.ones(1)}, TypeError), ({"nested": {"deep": [1, (2, object())]}}, TypeError),
])
def test_ffn_options_must_be_a_dict_of_plain_data(options, error):
    with pytest.raises(error, match="ffn_options"):
        GPTConfig(**SMALL, ffn_options=options)


def test_ffn_options_are_copied_and_reach_the_ffn():
    options = {"nested": {"a": [1, 2]}}
    config = GPTConfig(**SMALL, ffn_options=options)
    options["nested"]["a"].append(3)
    assert config.ffn_options == {"nested": {"a": [1, 2]}}, "the config keeps its own copy"
    with pytest.raises(TypeError, match="nested"):
        GPT(GPTConfig(**SMALL, ffn_options={"nested": 1}))  # FeedForward has no such option


@pytest.mark.parametrize("extra, error, name", [
    (dict(architecture="encoder-decoder", n_decoder_layers=2), ValueError, "architecture"),
    (dict(ffn="swish"), ValueError, "ffn"), (dict(dropout=1.0), ValueError, "dropout"),
    (dict(attention_backend="nope"), ValueError, "attention_backend"), (dict(positions="nope"), ValueError, "positions"),
    (dict(norm="batchnorm"), ValueError, "norm"), (dict(n_token_types=2), ValueError, "n_token_types"),
    (dict(eps=0.0), ValueError, "eps"), (dict(d_model=30, n_heads=10, positions="rope"), ValueError, "RoPE"),
    (dict(d_model=27, n_heads=3, positions="sinusoidal"), ValueError, "sinusoidal"),
    (dict(positions="alibi", architecture="encoder"), ValueError, "ALiBi"), (dict(n_heads=5), ValueError, "n_heads"),
    (dict(d_ff=0), ValueError, "d_ff"), (dict(d_ff=None, d_model=0), ValueError, "d_model"),
    (dict(fused_qkv=1), TypeError, "fused_qkv"), (dict(scale_embeddings="no"), TypeError, "scale_embeddings"),
    (dict(rope_theta=1.0), ValueError, "rope_theta"),
])
def test_bad_config(extra, error, name):
    with pytest.raises(error, match=name):
        GPTConfig(**{**SMALL, **extra})


def test_config_round_trip_and_type_checks():
    config = GPTConfig(**SMALL, positions="rope", n_kv_heads=2, dropout=0.1, ffn_options={"activation": "relu"})
    assert GPTConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match="colour"):
        GPTConfig.from_dict({**config.to_dict(), "colour": "red"})
    with pytest.raises(TypeError, match="GPTConfig"):
        GPT(config.to_dict())


# ---------------------------------------------------------------- the model

def test_logits_shape_and_loss_against_cross_entropy():
    model = GPT(GPTConfig(**SMALL))
    ids, targets = _ids(), _ids(seed=1)
    logits, loss = model(ids, targets)
    assert logits.shape == (2, 9, 61) and logits.dtype == torch.float32
    assert model(ids)[1] is None
    manual = -torch.log_softmax(logits, -1).gather(-1, targets[..., None]).mean()
    torch.testing.assert_close(loss, manual)
    assert abs(loss.item() - math.log(61)) < 0.1, "GPT-2's small initial weights start near the uniform loss"
    targets[0, :4] = -100
    _, masked = model(ids, targets)
    torch.testing.assert_close(masked, F.cross_entropy(logits[targets != -100], targets[targets != -100]))


def _naive_mean_nll(logits, targets):
    """Mean of logsumexp(row) - row[target] over the kept targets, in the logits' dtype."""
    keep = targets != -100
    rows, kept = logits[keep], targets[keep]
    return (torch.logsumexp(rows, -1) - rows.gather(-1, kept[:, None]).squeeze(-1)).mean()


def test_a_float64_models_loss_stays_float64():
    model = GPT(GPTConfig(**SMALL, init_std=0.5)).double()
    ids, targets = _ids(), _ids(seed=1)
    targets[1, 3:] = -100
    logits, loss = model(ids, targets)
    assert loss.dtype == torch.float64, "promote, never downcast: a float64 model's loss is float64"
    torch.testing.assert_close(loss, _naive_mean_nll(logits, targets), rtol=1e-13, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_models_loss_is_computed_in_float32(dtype):
    model = GPT(GPTConfig(**SMALL, init_std=0.5)).to(dtype)
    ids, targets = _ids(), _ids(seed=1)
    logits, loss = model(ids, targets)
    assert logits.dtype == dtype and loss.dtype == torch.float32
    torch.testing.assert_close(loss, _naive_mean_nll(logits.float(), targets))


@pytest.mark.parametrize("positions", POSITION_VARIANTS)
def test_decoder_is_causal_and_encoder_is_not(positions):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SMALL, positions=positions, init_std=0.2)).eval()
    ids = _ids()
    changed = ids.clone()
    changed[:, 5] = (changed[:, 5] + 1) % 61
    a, b = model(ids)[0], model(changed)[0]
    torch.testing.assert_close(a[:, :5], b[:, :5], rtol=1.3e-6, atol=1e-5, msg="a later token changed an earlier position")
    assert not torch.allclose(a[:, 5:], b[:, 5:])
    if positions != "alibi":
        encoder = GPT(GPTConfig(**SMALL, positions=positions, architecture="encoder", init_std=0.2)).eval()
        assert not torch.allclose(encoder(ids)[0][:, :5], encoder(changed)[0][:, :5])


def test_positions_matter_except_without_them():
    torch.manual_seed(0)
    ids = torch.tensor([[3, 4, 3, 4, 3, 4]])
    for positions in POSITION_VARIANTS:
        model = GPT(GPTConfig(**SMALL, positions=positions, init_std=0.3)).eval()
        logits = model(ids)[0]
        assert not torch.allclose(logits[0, 2], logits[0, 4], atol=1e-4), f"{positions}: position 2 and 4 look alike"


def test_the_position_layer_sits_under_the_name_of_its_role():
    for positions, role in (("learned", "position_embedding"), ("sinusoidal", "position_embedding"),
                            ("rope", "rotary"), ("alibi", "score_bias")):
        model = GPT(GPTConfig(**SMALL, positions=positions))
        layers = {name: getattr(model, name) for name in ("position_embedding", "rotary", "score_bias")}
        assert [name for name, layer in layers.items() if layer is not None] == [role]


def test_tied_head_shares_the_embedding_and_untied_does_not():
    tied = GPT(GPTConfig(**SMALL))
    assert tied.lm_head is None
    logits, loss = tied(_ids(), _ids(seed=2))
    loss.backward()
    assert tied.token_embedding.weight.grad is not None
    untied = GPT(GPTConfig(**SMALL, tie_embeddings=False))
    assert untied.lm_head.weight.shape == (61, 24) and untied.lm_head.weight is not untied.token_embedding.weight


@pytest.mark.parametrize("fused_qkv", [True, False])
def test_initialization_follows_gpt2(fused_qkv):
    config = GPTConfig(**{**SMALL, "d_model": 64, "d_ff": 256, "n_layers": 8}, init_std=0.02, fused_qkv=fused_qkv)
    model = GPT(config)
    block = model.blocks[0]
    first = block.attn.qkv if fused_qkv else block.attn.q
    assert abs(first.weight.std().item() - 0.02) < 0.002
    assert abs(block.attn.out.weight.std().item() - 0.02 / 4) < 0.0005, "residual projections get std / sqrt(2 n_layers)"
    assert abs(block.ffn.w2.weight.std().item() - 0.02 / 4) < 0.0005
    assert abs(model.position_embedding.weight.std().item() - 0.02) < 0.002
    assert torch.equal(first.bias, torch.zeros_like(first.bias))


def _copy_of(model, **changes):
    other = GPT(GPTConfig(**{**model.config.to_dict(), **changes}))
    other.load_state_dict(model.state_dict())
    return other


@pytest.mark.parametrize("positions", POSITION_VARIANTS)
@pytest.mark.parametrize("extra", [{}, dict(n_kv_heads=2), dict(n_kv_heads=1, fused_qkv=False)])
def test_sdpa_equals_math_on_a_gpt_values_and_gradients(positions, extra):
    torch.manual_seed(1)
    math_model = GPT(GPTConfig(**SMALL, positions=positions, attention_backend="math", init_std=0.2, **extra))
    sdpa_model = _copy_of(math_model, attention_backend="sdpa")
    ids, targets = _ids(), _ids(seed=1)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[0, :3] = False
    for kwargs in ({}, {"attention_mask": mask}):
        outputs = []
        for model in (math_model, sdpa_model):
            model.zero_grad()
            logits, loss = model(ids, targets, **kwargs)
            loss.backward()
            outputs.append((logits, [p.grad for p in model.parameters()]))
        torch.testing.assert_close(outputs[1][0], outputs[0][0], atol=1e-5, rtol=1e-5)
        for a, b in zip(outputs[1][1], outputs[0][1]):
            assert torch.isfinite(a).all(), "a fully padded query must not make the gradients NaN"
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_dropout_only_in_training():
    ids = _ids()
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SMALL, dropout=0.5))
    model.eval()
    assert torch.equal(model(ids)[0], model(ids)[0])
    model.train()
    assert not torch.equal(model(ids)[0], model(ids)[0])


def test_scale_embeddings_multiplies_by_sqrt_d_model():
    torch.manual_seed(0)
    plain = GPT(GPTConfig(**SMALL))
    scaled = GPT(GPTConfig(**SMALL, scale_embeddings=True))
    ids = _ids(batch=1, seq=3)
    torch.testing.assert_close(scaled.token_embedding(ids), scaled.token_embedding.weight[ids] * math.sqrt(24))
    torch.testing.assert_close(plain.token_embedding(ids), plain.token_embedding.weight[ids])


# ---------------------------------------------------------------- padding

def _padded_batch(rows, seed=5):
    """Left-pad the rows to one length with random ids (which must not matter), and their mask."""
    length = max(len(row) for row in rows)
    garbage = torch.randint(0, 61, (len(rows), length), generator=torch.Generator().manual_seed(seed))
    ids, mask = garbage.clone(), torch.zeros(len(rows), length, dtype=torch.bool)
    for b, row in enumerate(rows):
        ids[b, length - len(row):] = row
        mask[b, length - len(row):] = True
    return ids, mask


ROWS = [_ids(batch=1, seq=9, seed=10)[0], _ids(batch=1, seq=5, seed=11)[0], _ids(batch=1, seq=1, seed=12)[0]]


@pytest.mark.parametrize("backend", ["sdpa", "math"])
@pytest.mark.parametrize("positions", POSITION_VARIANTS)
def test_a_left_padded_row_gets_the_logits_it_gets_alone(positions, backend):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SMALL, positions=positions, attention_backend=backend, n_kv_heads=2, init_std=0.2)).eval()
    ids, mask = _padded_batch(ROWS)
    alone = [model(row[None])[0][0] for row in ROWS]
    with torch.no_grad():
        batched = model(ids, attention_mask=mask)[0]
        cache = ConcatModelCache(SMALL["n_layers"])
        steps = [model(ids[:, :6], kv_cache=cache, attention_mask=mask[:, :6])[0]]
        for t in range(6, ids.shape[1]):
            steps.append(model(ids[:, t:t + 1], kv_cache=cache, attention_mask=mask[:, :t + 1])[0])
        cached = torch.cat(steps, dim=1)
    for b, row in enumerate(ROWS):
        for name, logits in (("without a cache", batched), ("with a cache", cached)):
            torch.testing.assert_close(logits[b, -len(row):], alone[b].detach(), atol=1e-5, rtol=1e-5,
                                       msg=f"row {b} {name}")
        assert torch.isfinite(batched).all() and torch.isfinite(cached).all()


@pytest.mark.parametrize("positions", POSITION_VARIANTS)
def test_padding_anywhere_counts_no_position(positions):
    # With slots left out in the middle, counting real tokens differs from counting slots:
    # RoPE and ALiBi, which see only offsets, then need the per-row positions as much as the tables do.
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SMALL, positions=positions, init_std=0.2)).eval()
    row = ROWS[0]
    holes = torch.tensor([True, True, False, True, False, False, True, True, True, True, True, True, True])
    ids = torch.randint(0, 61, (1, len(holes)), generator=torch.Generator().manual_seed(9))
    ids[0, holes.nonzero().flatten()[:len(row)]] = row
    holes[holes.nonzero().flatten()[len(row):]] = False
    with torch.no_grad():
        logits = model(ids, attention_mask=holes[None])[0][0, holes]
        torch.testing.assert_close(logits, model(row[None])[0][0], atol=1e-5, rtol=1e-5)


def test_an_all_true_mask_changes_nothing():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SMALL, positions="rope", init_std=0.2)).eval()
    ids = _ids()
    torch.testing.assert_close(model(ids, attention_mask=torch.ones(2, 9, dtype=torch.bool))[0], model(ids)[0],
                               rtol=1.3e-6, atol=1e-5)


# ---------------------------------------------------------------- compiling

@pytest.mark.parametrize("positions", ["learned", "rope", "alibi"])
def test_dynamo_traces_the_model_in_one_graph(positions):
    torch._dynamo.reset()
    model = GPT(GPTConfig(**{**SMALL, "d_ff": None}, positions=positions))  # GPTConfig's defaults, a small shape
    ids = _ids()
    explained = torch._dynamo.explain(model)(ids, ids)
    assert explained.graph_break_count == 0, [str(reason.reason) for reason in explained.break_reasons]
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[0, :2] = False
    assert torch._dynamo.explain(model)(ids, ids, attention_mask=mask).graph_break_count == 0
    torch._dynamo.reset()


# ---------------------------------------------------------------- bad input

def test_context_length_is_enforced():
    model = GPT(GPTConfig(**SMALL))
    assert model(_ids(seq=16))[0].shape == (2, 16, 61)
    with pytest.raises(ValueError, match="context"):
        model(_ids(seq=17))
    cache = ConcatModelCache(2)
    model(_ids(seq=14), kv_cache=cache)
    with pytest.raises(ValueError, match="after 14 cached positions"):
        model(_ids(seq=3), kv_cache=cache)


@pytest.mark.parametrize("ids, targets, error, name", [
    (torch.rand(2, 3), None, TypeError, "ids"),
    (torch.tensor([1, 2, 3]), None, ValueError, "ids"),
    (torch.zeros(2, 0, dtype=torch.long), None, ValueError, "ids"),
    (torch.tensor([[1, 61]]), None, ValueError, "ids"),
    (torch.tensor([[-1, 2]]), None, ValueError, "ids"),
    (torch.tensor([[1, 2]]), torch.tensor([1, 2]), ValueError, "targets"),
    (torch.tensor([[1, 2]]), torch.tensor([[1.0, 2.0]]), TypeError, "targets"),
])
def test_bad_input(ids, targets, error, name):
    with pytest.raises(error, match=name):
        GPT(GPTConfig(**SMALL))(ids, targets)


@pytest.mark.parametrize("mask, error", [
    (torch.ones(2, 9), TypeError), (torch.ones(2, 8, dtype=torch.bool), ValueError),
    (torch.ones(1, 9, dtype=torch.bool), ValueError), ([[True] * 9] * 2, TypeError),
])
def test_bad_attention_mask(mask, error):
    with pytest.raises(error, match="attention_mask"):
        GPT(GPTConfig(**SMALL))(_ids(), attention_mask=mask)


def test_bad_cache():
    with pytest.raises(TypeError, match="kv_cache"):
        GPT(GPTConfig(**SMALL))(_ids(), kv_cache=object())


def test_the_command_lines_choices_are_the_registries_names(ffns):
    from minillm.__main__ import _parser
    from minillm.norm import NORMS
    from minillm.positional import POSITIONS

    ffns.register("gated", GatedFFN)
    for flag, registry in (("--ffn", ffns), ("--norm", NORMS), ("--positions", POSITIONS)):
        for name in registry.names():
            assert getattr(_parser().parse_args(["train", flag, name]), flag[2:]) == name
        with pytest.raises(SystemExit):
            _parser().parse_args(["train", flag, "nope"])
