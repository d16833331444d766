"""minillm.moe: routing, dispatch with capacity, the auxiliary losses and the MoE layer, against
independent references (a per-token loop, the dense FFN, formulas written out here)."""
import math
from functools import partial

import pytest
import torch
import torch.nn.functional as F

from minillm.ffn import SwiGLU, build_ffn
from minillm.model import GPT, GPTConfig, count_parameters
from minillm.moe import (
    DISPATCHERS,
    MoEFeedForward,
    capacity_mask,
    combine,
    dispatch_plan,
    expert_capacity,
    load_balancing_loss,
    router_z_loss,
    routing_metrics,
    top_k_routing,
)
from minillm.train import TrainConfig, TrainState, load_model, save_model, train

SMALL = dict(vocab_size=50, context_length=16, d_model=16, n_layers=2, n_heads=2, positions="rope", norm="rmsnorm",
             bias=False)
OPTIONS = {"n_experts": 4, "top_k": 2, "capacity_factor": 1.25}


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _naive_moe(x, experts, weights, fns, capacity):
    """The formula one token and one choice at a time, each expert's queue walked in order:
    every first choice in token order, then every second choice, ..."""
    taken = [0] * len(fns)
    kept = torch.zeros(experts.shape, dtype=torch.bool)
    for j in range(experts.shape[1]):
        for t in range(experts.shape[0]):
            e = int(experts[t, j])
            if capacity is None or taken[e] < capacity:
                taken[e] += 1
                kept[t, j] = True
    y = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(experts.shape[1]):
            if kept[t, j]:
                y[t] += weights[t, j] * fns[int(experts[t, j])](x[t:t + 1])[0]
    return y, kept


def _routing(tokens, n_experts, k, seed, skew=3.0, dtype=torch.float64):
    g = _gen(seed)
    logits = torch.randn(tokens, n_experts, generator=g, dtype=dtype)
    logits[: tokens // 2, 0] += skew  # a busy expert, so that a capacity bites
    return top_k_routing(logits, k)


# ---------------------------------------------------------------- routing

@pytest.mark.parametrize("k", [1, 2, 3, 8])
def test_top_k_weights_are_the_largest_probabilities_renormalized(k):
    logits = 2 * torch.randn(64, 8, generator=_gen(k), dtype=torch.float64)
    weights, experts = top_k_routing(logits, k)
    probs = torch.softmax(logits, -1)
    torch.testing.assert_close(weights.sum(-1), torch.ones(64, dtype=torch.float64), atol=1e-12, rtol=0)  # values of 1: absolute is relative
    # the chosen experts are the k most probable ones, in decreasing order
    ranked = probs.argsort(-1, descending=True)[:, :k]
    assert torch.equal(experts, ranked)
    chosen = probs.gather(-1, experts)
    torch.testing.assert_close(weights, chosen / chosen.sum(-1, keepdim=True))
    raw, _ = top_k_routing(logits, k, normalize=False)
    torch.testing.assert_close(raw, chosen)


def test_switch_top_1_keeps_the_raw_probability_and_renormalized_top_1_is_one():
    logits = torch.randn(10, 4, generator=_gen(1))
    raw, _ = top_k_routing(logits, 1, normalize=False)
    torch.testing.assert_close(raw[:, 0], torch.softmax(logits, -1).amax(-1))
    assert torch.equal(top_k_routing(logits, 1)[0], torch.ones(10, 1))


def test_routing_is_stable_for_large_logits():
    weights, experts = top_k_routing(torch.tensor([[1000.0, 999.0, -1000.0]]), 2)
    torch.testing.assert_close(weights, torch.tensor([[1 / (1 + math.exp(-1)), 1 / (1 + math.e)]]))
    assert experts.tolist() == [[0, 1]]


@pytest.mark.parametrize("args", [(torch.randn(3, 4), 0), (torch.randn(3, 4), 5), (torch.randn(3, 4), 1.0),
                                  (torch.randn(2, 3, 4), 1), (torch.randn(3, 4), True)])
def test_routing_refuses_bad_input(args):
    with pytest.raises(ValueError, match="top_k|logits"):
        top_k_routing(*args)


# ---------------------------------------------------------------- losses

@pytest.mark.parametrize("n_experts, k", [(2, 1), (8, 2), (6, 3), (16, 4)])
def test_balance_loss_is_one_at_perfect_balance_and_n_at_collapse(n_experts, k):
    tokens = 5 * n_experts
    uniform = torch.full((tokens, n_experts), 1 / n_experts, dtype=torch.float64)
    balanced = torch.stack([torch.arange(t, t + k) % n_experts for t in range(tokens)])
    assert load_balancing_loss(uniform, balanced, n_experts).item() == pytest.approx(1.0, abs=1e-12)
    collapsed = F.one_hot(torch.zeros(tokens, dtype=torch.long), n_experts).double()
    assert load_balancing_loss(collapsed, torch.zeros(tokens, 1, dtype=torch.long), n_experts).item() == pytest.approx(n_experts)


def test_balance_loss_against_its_formula_and_its_gradient():
    probs = torch.softmax(torch.randn(40, 8, generator=_gen(2), dtype=torch.float64), -1).requires_grad_(True)
    _, experts = top_k_routing(torch.log(probs.detach()), 2)
    f = torch.tensor([(experts == i).sum().item() / experts.numel() for i in range(8)], dtype=torch.float64)
    loss = load_balancing_loss(probs, experts, 8)
    torch.testing.assert_close(loss, 8 * (f * probs.mean(0)).sum())
    loss.backward()  # f has no gradient: d loss / d p[t, i] = N f_i / T
    torch.testing.assert_close(probs.grad, (8 * f / 40).expand(40, 8))


@pytest.mark.parametrize("experts", [torch.tensor([[0], [8]]), torch.tensor([[-1], [0]]), torch.zeros(3, 1, dtype=torch.long)])
def test_balance_loss_refuses_bad_experts(experts):
    with pytest.raises(ValueError, match="experts"):
        load_balancing_loss(torch.full((2, 8), 1 / 8), experts, 8)


def test_z_loss_is_the_mean_squared_logsumexp_and_stable():
    logits = torch.randn(30, 8, generator=_gen(3), dtype=torch.float64)
    expected = sum(math.log(sum(math.exp(v) for v in row)) ** 2 for row in logits.tolist()) / 30
    assert router_z_loss(logits).item() == pytest.approx(expected, rel=1e-12)
    big = torch.tensor([[3000.0, 2999.0]])
    assert router_z_loss(big).item() == pytest.approx((3000 + math.log1p(math.exp(-1))) ** 2, rel=1e-6)


# ---------------------------------------------------------------- dispatch

def _experts(n, d, seed, dtype=torch.float64):
    g = _gen(seed)
    mats = [torch.randn(d, d, generator=g, dtype=dtype) / math.sqrt(d) for _ in range(n)]
    return [lambda rows, m=m: F.silu(rows @ m) for m in mats]


def test_capacity_is_the_even_share_times_the_factor_rounded_up():
    assert expert_capacity(1024, 8, 2, 1.25) == 320
    assert expert_capacity(10, 4, 1, 1.0) == 3  # ceil(2.5)
    assert expert_capacity(1, 64, 1, 1.0) == 1
    with pytest.raises(ValueError, match="capacity_factor"):
        expert_capacity(10, 4, 1, 0.0)


@pytest.mark.parametrize("dispatcher", sorted(DISPATCHERS))
@pytest.mark.parametrize("tokens, n, k, factor", [(40, 4, 2, None), (40, 4, 2, 1.0), (33, 8, 1, 1.25), (30, 6, 3, 0.5),
                                                  (64, 8, 2, 2.0), (7, 3, 3, None)])
def test_dispatch_equals_a_per_token_loop_with_and_without_dropping(dispatcher, tokens, n, k, factor):
    x = torch.randn(tokens, 5, generator=_gen(tokens), dtype=torch.float64)
    weights, experts = _routing(tokens, n, k, seed=n + k)
    fns = _experts(n, 5, seed=k)
    capacity = None if factor is None else expert_capacity(tokens, n, k, factor)
    expected, expected_kept = _naive_moe(x, experts, weights, fns, capacity)
    y, kept = DISPATCHERS[dispatcher](x, experts, weights, fns, capacity)
    assert torch.equal(kept, expected_kept)
    torch.testing.assert_close(y, expected, atol=1e-12, rtol=1e-12)
    if factor is not None and factor < 2:
        assert not kept.all()  # the case really drops something


def test_the_plan_sorts_by_expert_in_queue_order_and_counts_what_is_kept():
    _, experts = _routing(50, 5, 2, seed=4)
    rows, slots, counts = dispatch_plan(experts, 5, capacity=12)
    chosen = experts[rows, slots]
    assert torch.equal(chosen, chosen.sort(stable=True).values)  # sorted by expert
    assert counts.tolist() == torch.bincount(chosen, minlength=5).tolist() and counts.max() <= 12
    queue = slots * 50 + rows  # the assignment's place in the choice-major queue
    for e in range(5):
        mine = queue[chosen == e]
        assert torch.equal(mine, mine.sort().values)  # each expert's assignments keep queue order
    assert torch.equal(capacity_mask(experts, 5, 12), torch.zeros_like(experts, dtype=torch.bool).index_put_(
        (rows, slots), torch.tensor(True)))


def test_combine_adds_up_a_tokens_choices_and_leaves_dropped_tokens_zero():
    outputs = torch.arange(8.0).reshape(4, 2)
    y = combine(outputs, torch.tensor([0, 2, 0, 2]), torch.tensor([0, 0, 1, 1]), torch.tensor([[0.5, 0.5]] * 3), 3)
    assert torch.equal(y, torch.tensor([[2.0, 3.0], [0.0, 0.0], [4.0, 5.0]]))  # token 0: (0, 1) and (4, 5), halved


def test_an_expert_with_no_tokens_is_not_called():
    calls = []

    def fn(e):
        return lambda rows: calls.append(e) or rows * (e + 1)

    experts = torch.tensor([[2], [2], [0]])
    for dispatcher in DISPATCHERS.values():
        calls.clear()
        dispatcher(torch.ones(3, 2), experts, torch.ones(3, 1), [fn(e) for e in range(4)], None)
        assert sorted(calls) == [0, 2]


# ---------------------------------------------------------------- the layer

@pytest.mark.parametrize("expert", ["swiglu", "gelu"])
def test_one_expert_top_1_without_capacity_is_the_dense_ffn_exactly(expert):
    layer = MoEFeedForward(16, 24, n_experts=1, top_k=1, capacity_factor=None, expert=expert)
    dense = build_ffn(expert, 16, 24, bias=False)
    dense.load_state_dict(layer.experts[0].state_dict())
    x = torch.randn(3, 5, 16, generator=_gen(5))
    assert torch.equal(layer(x), dense(x))
    layer.eval()
    assert torch.equal(layer(x), dense(x))


def test_the_layer_is_the_formula_per_token_with_its_own_experts():
    torch.manual_seed(0)
    layer = MoEFeedForward(8, 12, n_experts=4, top_k=2, capacity_factor=1.0).double()
    x = torch.randn(2, 10, 8, dtype=torch.float64)
    tokens = x.reshape(-1, 8)
    weights, experts = top_k_routing(tokens @ layer.router.weight.T, 2)
    expected, kept = _naive_moe(tokens, experts, weights, list(layer.experts), expert_capacity(20, 4, 2, 1.0))
    torch.testing.assert_close(layer(x), expected.reshape(2, 10, 8), atol=1e-12, rtol=1e-12)
    assert layer.last_stats["dropped"].item() == pytest.approx(1 - kept.double().mean().item())


def test_sorted_and_masked_layers_agree_in_values_and_gradients():
    torch.manual_seed(1)
    a = MoEFeedForward(8, 12, n_experts=4, top_k=2, dispatch="sorted").double()
    b = MoEFeedForward(8, 12, n_experts=4, top_k=2, dispatch="masked").double()
    b.load_state_dict(a.state_dict())
    x = torch.randn(4, 9, 8, dtype=torch.float64)
    ya, yb = a(x), b(x)
    torch.testing.assert_close(ya, yb, atol=1e-12, rtol=1e-12)
    (ya.square().sum() + a.aux_loss).backward()
    (yb.square().sum() + b.aux_loss).backward()
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, atol=1e-10, rtol=1e-10, msg=name)


def test_the_router_gets_gradients_from_the_output_and_from_each_auxiliary_loss():
    torch.manual_seed(2)
    x = torch.randn(2, 8, 16)
    for coefs, source in [(dict(balance_coef=0.0, z_coef=0.0), "output"), (dict(balance_coef=1.0, z_coef=0.0), "aux"),
                          (dict(balance_coef=0.0, z_coef=1.0), "aux")]:
        layer = MoEFeedForward(16, 24, n_experts=4, top_k=2, **coefs)
        y = layer(x)
        (y.sum() if source == "output" else layer.aux_loss).backward()
        assert layer.router.weight.grad is not None and layer.router.weight.grad.abs().sum() > 0, coefs


def test_dropped_tokens_get_zero_and_pass_the_block_unchanged():
    torch.manual_seed(3)
    layer = MoEFeedForward(8, 12, n_experts=2, top_k=1, capacity_factor=0.25)
    with torch.no_grad():  # every token prefers expert 0, which has ceil(0.25 * 16 / 2) = 2 slots
        layer.router.weight.zero_()
        layer.router.weight[0, 0] = 10.0
    x = torch.randn(16, 8)
    x[:, 0] = x[:, 0].abs() + 1
    y = layer(x)
    assert torch.count_nonzero(y.abs().sum(-1)).item() == 2
    assert layer.last_stats["dropped"].item() == pytest.approx(14 / 16)
    assert layer.last_stats["kept"].tolist() == [2, 0]


def test_evaluation_is_dropless_by_default_and_its_factor_is_a_switch():
    torch.manual_seed(4)
    layer = MoEFeedForward(8, 12, n_experts=4, top_k=1, capacity_factor=0.5)
    x = torch.randn(64, 8)
    layer(x)
    assert layer.last_stats["dropped"] > 0
    layer.eval()
    assert layer.capacity(64) is None
    layer(x)
    assert layer.last_stats["dropped"].item() == 0
    layer.eval_capacity_factor = 0.5
    assert layer.capacity(64) == 8
    layer(x)
    assert layer.last_stats["dropped"] > 0


def test_jitter_is_noise_in_training_only():
    torch.manual_seed(5)
    layer = MoEFeedForward(8, 12, n_experts=4, top_k=2, jitter=0.5, capacity_factor=None)
    x = torch.randn(32, 8)
    layer.eval()
    assert torch.equal(layer(x), layer(x))
    layer.train()
    torch.manual_seed(0)
    first = layer(x)
    assert not torch.equal(first, layer(x))
    torch.manual_seed(0)
    assert torch.equal(first, layer(x))


def test_aux_losses_are_weighted_and_stats_unweighted():
    """Against the papers' formulas written out token by token in float64: Switch's
    N * sum_i f_i P_i (f over the k * T assignments) and ST-MoE's mean squared log-sum-exp."""
    torch.manual_seed(6)
    n_experts, top_k, tokens = 4, 2, 40
    layer = MoEFeedForward(8, 12, n_experts=n_experts, top_k=top_k, balance_coef=0.01, z_coef=1e-3)
    x = torch.randn(tokens, 8)
    layer(x)
    logits = (x.double() @ layer.router.weight.double().T).tolist()
    counts, mean_prob, z, entropy = [0] * n_experts, [0.0] * n_experts, 0.0, 0.0
    for row in logits:
        lse = math.log(sum(math.exp(v) for v in row))
        probs = [math.exp(v - lse) for v in row]
        for e in sorted(range(n_experts), key=lambda i: -probs[i])[:top_k]:
            counts[e] += 1
        for e in range(n_experts):
            mean_prob[e] += probs[e] / tokens
        z += lse ** 2 / tokens
        entropy -= sum(p * math.log(p) for p in probs) / tokens
    balance = n_experts * sum(c / (top_k * tokens) * p for c, p in zip(counts, mean_prob))
    approx = partial(pytest.approx, rel=1e-5)
    assert layer.aux_losses["moe_balance"].item() == approx(0.01 * balance)
    assert layer.aux_losses["moe_z"].item() == approx(1e-3 * z)
    assert layer.aux_loss.item() == approx(0.01 * balance + 1e-3 * z)
    assert layer.last_stats["balance"].item() == approx(balance) and layer.last_stats["z"].item() == approx(z)
    assert layer.last_stats["entropy"].item() == approx(entropy)
    assert layer.last_stats["assigned"].tolist() == counts


@pytest.mark.parametrize("extra, error, name", [
    (dict(top_k=5), ValueError, "top_k"), (dict(n_experts=0), ValueError, "n_experts"),
    (dict(capacity_factor=0.0), ValueError, "capacity_factor"), (dict(eval_capacity_factor=-1.0), ValueError, "eval_capacity_factor"),
    (dict(expert="moe"), ValueError, "expert"), (dict(expert="swish"), ValueError, "expert"),
    (dict(expert_options=[1]), TypeError, "expert_options"), (dict(dispatch="loop"), ValueError, "dispatch"),
    (dict(jitter=1.0), ValueError, "jitter"), (dict(balance_coef=-0.1), ValueError, "balance_coef"),
    (dict(normalize_weights=1), TypeError, "normalize_weights"),
])
def test_bad_arguments_are_named(extra, error, name):
    with pytest.raises(error, match=name):
        MoEFeedForward(8, 16, **{"n_experts": 4, "top_k": 2, **extra})


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="d_model=8"):
        MoEFeedForward(8, 16)(torch.randn(3, 7))


# ---------------------------------------------------------------- in the model

def test_count_parameters_total_and_active_are_exact():
    config = GPTConfig(**SMALL, ffn="moe", d_ff=20, ffn_options={"n_experts": 6, "top_k": 2})
    model = GPT(config)
    total = sum(p.numel() for p in model.parameters())
    assert count_parameters(config) == total
    per_expert = 3 * 16 * 20  # SwiGLU without biases
    assert count_parameters(config, active=True) == total - SMALL["n_layers"] * (6 - 2) * per_expert
    # the same count read off the built layers: router plus top_k experts
    layer = model.blocks[0].ffn
    assert layer.active_parameter_count() == 6 * 16 + 2 * sum(p.numel() for p in layer.experts[0].parameters())
    dense = GPTConfig(**SMALL, ffn="swiglu", d_ff=40)
    assert count_parameters(config, active=True) - count_parameters(dense) == SMALL["n_layers"] * 6 * 16  # routers


def test_each_expert_defaults_to_the_dense_width():
    assert GPTConfig(**SMALL, ffn="moe").d_ff == GPTConfig(**SMALL, ffn="swiglu").d_ff
    assert GPTConfig(**SMALL, ffn="moe", ffn_options={"expert": "gelu"}).d_ff == 4 * SMALL["d_model"]
    assert isinstance(GPT(GPTConfig(**SMALL, ffn="moe")).blocks[0].ffn.experts[0], SwiGLU)


def test_a_moe_gpt_builds_trains_logs_and_round_trips(tmp_path):
    torch.manual_seed(7)
    config = GPTConfig(**SMALL, ffn="moe", ffn_options={**OPTIONS, "expert": "gelu"})
    model = GPT(config)
    ids = torch.randint(0, 50, (4, 16))
    _, loss = model(ids, ids)
    logits, _ = model(ids)
    parts = model.last_aux_losses
    assert set(parts) == {"moe_balance", "moe_z", "aux_loss"}
    ce = F.cross_entropy(logits.reshape(-1, 50), ids.reshape(-1))
    assert loss.item() == pytest.approx(ce.item() + parts["aux_loss"], abs=1e-6)
    assert parts["aux_loss"] == pytest.approx(parts["moe_balance"] + parts["moe_z"], rel=1e-6)
    assert set(routing_metrics(model)) >= {f"moe{i}/{n}" for i in range(2) for n in ("dropped", "entropy", "share3")}

    train_config = TrainConfig(steps=2, warmup_steps=0, eval_every=2, checkpoint_every=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state = train(model, iter([(ids, ids)] * 2), train_config, progress=False)
    assert state.history["moe_balance"] and state.history["moe_z"]  # logged apart, one entry a step
    assert not torch.equal(before["blocks.0.ffn.router.weight"], model.state_dict()["blocks.0.ffn.router.weight"])

    path = tmp_path / "moe.pt"
    save_model(path, model)
    loaded = load_model(path)
    assert loaded.config == config
    model.eval()
    assert torch.equal(loaded(ids)[0], model(ids)[0])
    state.save(tmp_path / "run.pt", model, train_config)
    TrainState.load(tmp_path / "run.pt", GPT(config), train_config)
