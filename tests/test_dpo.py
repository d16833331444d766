"""minillm.dpo: response log-probabilities, the DPO loss, the implicit reward, the KL estimate,
preference pairs sampled from a model, and training against a frozen reference."""
import math

import pytest
import torch
import torch.nn.functional as F

from minillm import dpo
from minillm.model import GPT, GPTConfig
from minillm.train import TrainConfig, TrainState, train

SMALL = dict(vocab_size=40, context_length=24, d_model=32, n_layers=2, n_heads=4, positions="rope", norm="rmsnorm",
             ffn="swiglu", bias=False)


def small_gpt(seed=0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(**SMALL)).eval()


class LetterTokenizer:
    """Token i is the letter chr(97 + i % 26) (enough for uses_target-like scorers in tests)."""

    def encode(self, text):
        return [ord(c) - 97 for c in text]

    def decode(self, ids):
        return "".join(chr(97 + i % 26) for i in ids)


def naive_logprobs(model, ids, mask):
    """Token by token, from a forward pass over each prefix: sum of log p(ids[t] | ids[:t]) where mask."""
    total = torch.zeros(ids.shape[0], dtype=torch.float64)
    for b in range(ids.shape[0]):
        for t in range(1, ids.shape[1]):
            if mask[b, t]:
                logits, _ = model(ids[b: b + 1, :t])
                total[b] += torch.log_softmax(logits[0, -1].double(), -1)[ids[b, t]]
    return total


# response_logprobs and sequence_logprobs


def test_sequence_logprobs_equals_the_sum_of_next_token_logprobs():
    model = small_gpt()
    ids = torch.randint(0, 40, (3, 10), generator=torch.Generator().manual_seed(1))
    mask = dpo.response_mask(3, 4, 10)
    with torch.no_grad():
        got = dpo.sequence_logprobs(model, ids, mask)
    torch.testing.assert_close(got.double(), naive_logprobs(model, ids, mask), atol=1e-4, rtol=1e-5)
    assert got.shape == (3,) and got.dtype == torch.float32


def test_sequence_logprobs_keeps_a_float64_model_in_float64():
    model = small_gpt().double()
    ids = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(3))
    mask = dpo.response_mask(2, 3, 9)
    with torch.no_grad():
        got = dpo.sequence_logprobs(model, ids, mask)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, naive_logprobs(model, ids, mask), atol=1e-10, rtol=1e-10)


def test_sequence_logprobs_matches_cross_entropy_with_ignored_targets():
    model = small_gpt()
    ids = torch.randint(0, 40, (4, 12), generator=torch.Generator().manual_seed(2))
    mask = torch.rand(4, 12, generator=torch.Generator().manual_seed(3)) < 0.5
    mask[:, 0] = False
    targets = torch.where(mask, ids, torch.full_like(ids, -100))[:, 1:]
    with torch.no_grad():
        logits, _ = model(ids)
        nll = F.cross_entropy(logits[:, :-1].transpose(1, 2), targets, reduction="none", ignore_index=-100)
        torch.testing.assert_close(dpo.sequence_logprobs(model, ids, mask), -nll.sum(1))


def test_prompt_and_padding_are_masked():
    """The prompt's own tokens and the padding after the response do not count; a response's
    score changes only through the tokens it conditions on."""
    model = small_gpt()
    prompt, response = [5, 9, 1, 30], [7, 7, 2]
    ids = torch.tensor([prompt + response + [0, 0, 0], prompt + response + [33, 12, 4]])  # two paddings
    mask = torch.tensor([[False] * 4 + [True] * 3 + [False] * 3] * 2)
    with torch.no_grad():
        padded = dpo.sequence_logprobs(model, ids, mask)
        alone = dpo.sequence_logprobs(model, torch.tensor([prompt + response]), mask[:1, :7])
        with_prompt = dpo.sequence_logprobs(model, ids[:1], torch.tensor([[False] + [True] * 6 + [False] * 3]))
    assert padded[0] == padded[1]  # other padding: the same score, bit for bit (causal attention)
    torch.testing.assert_close(padded[:1], alone)  # padding at all: the same score
    prompt_part = naive_logprobs(model, ids[:1], torch.tensor([[False] + [True] * 3 + [False] * 6]))
    torch.testing.assert_close(with_prompt.double(), padded[:1].double() + prompt_part, atol=1e-4, rtol=1e-5)
    assert (prompt_part < 0).all()  # so leaving the prompt in would have changed the sum


def test_sequence_logprobs_keeps_the_graph():
    model = small_gpt().train()
    ids = torch.randint(0, 40, (2, 8), generator=torch.Generator().manual_seed(4))
    dpo.sequence_logprobs(model, ids, dpo.response_mask(2, 3, 8)).sum().backward()
    assert model.token_embedding.weight.grad is not None and model.token_embedding.weight.grad.abs().sum() > 0


def test_response_logprobs_is_stable_for_large_logits():
    logits = torch.randn(2, 5, 7, generator=torch.Generator().manual_seed(5)) * 1e4
    ids = torch.randint(0, 7, (2, 5), generator=torch.Generator().manual_seed(6))
    mask = dpo.response_mask(2, 1, 5)
    got = dpo.response_logprobs(logits, ids, mask)
    expected = torch.log_softmax(logits.double()[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1).sum(1)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-2)


def test_response_logprobs_of_an_empty_mask_is_zero_even_with_infinite_logits():
    logits = torch.zeros(1, 4, 3)
    logits[0, :, 2] = -math.inf  # token 2 impossible, but never scored
    ids = torch.tensor([[0, 2, 2, 1]])
    mask = torch.tensor([[False, False, False, True]])
    assert dpo.response_logprobs(logits, ids, mask).item() == pytest.approx(math.log(0.5))


@pytest.mark.parametrize("bad, args", [
    ("ids", (torch.zeros(2, 4, 5), torch.zeros(8, dtype=torch.long), torch.zeros(2, 4, dtype=torch.bool))),
    ("ids", (torch.zeros(2, 4, 5), torch.zeros(2, 4), torch.zeros(2, 4, dtype=torch.bool))),
    ("logits", (torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 4, dtype=torch.bool))),
    ("mask", (torch.zeros(2, 4, 5), torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 4))),
    ("mask", (torch.zeros(2, 4, 5), torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 3, dtype=torch.bool))),
    ("mask", (torch.zeros(2, 4, 5), torch.zeros(2, 4, dtype=torch.long), torch.ones(2, 4, dtype=torch.bool))),
])
def test_response_logprobs_errors(bad, args):
    with pytest.raises(ValueError, match=bad):
        dpo.response_logprobs(*args)


def test_sequence_logprobs_errors():
    model = small_gpt()
    with pytest.raises(TypeError, match="model"):
        dpo.sequence_logprobs(lambda ids: ids, torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask"):
        dpo.sequence_logprobs(model, torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="ids"):
        dpo.sequence_logprobs(model, torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.bool))


# the DPO loss, the implicit reward, the KL estimate


def test_dpo_loss_on_hand_computed_cases():
    # margin (pc - rc) - (pr - rr) = (-1 + 2) - (-3 + 2) = 2; beta 0.5: z = 1, loss log(1 + e^-1)
    one = dpo.dpo_loss(torch.tensor([-1.0]), torch.tensor([-3.0]), torch.tensor([-2.0]), torch.tensor([-2.0]), 0.5)
    assert one.item() == pytest.approx(math.log1p(math.exp(-1.0)), rel=1e-6)
    # two pairs, one ranked right by 4 nats, one wrong by 4; beta 0.25: z = +-1
    two = dpo.dpo_loss(torch.tensor([0.0, -4.0]), torch.tensor([-4.0, 0.0]), torch.zeros(2), torch.zeros(2), 0.25)
    assert two.item() == pytest.approx((math.log1p(math.exp(-1.0)) + math.log1p(math.exp(1.0))) / 2, rel=1e-6)
    assert two.dim() == 0


def test_dpo_loss_is_ln2_when_the_policy_is_the_reference():
    generator = torch.Generator().manual_seed(7)
    chosen, rejected = torch.randn(50, generator=generator) * 30, torch.randn(50, generator=generator) * 30
    for beta in (0.01, 0.1, 1.0, 10.0):
        assert dpo.dpo_loss(chosen, rejected, chosen, rejected, beta).item() == pytest.approx(math.log(2), abs=1e-7)


def test_dpo_loss_starts_at_ln2_on_a_real_model_and_its_frozen_copy():
    model = small_gpt()
    reference = dpo.frozen_reference(model)
    batch = {"chosen": torch.randint(0, 40, (4, 10)), "rejected": torch.randint(0, 40, (4, 10)),
             "mask": dpo.response_mask(4, 5, 10)}
    loss, logged = dpo.dpo_objective(reference, 0.1)(model.train(), batch)
    assert loss.item() == pytest.approx(math.log(2), abs=1e-6)
    assert logged["reward_margin"].item() == pytest.approx(0.0, abs=1e-6)


def test_dpo_loss_is_stable_for_large_margins():
    zero = torch.zeros(4)
    margins = torch.tensor([-1e4, -300.0, 300.0, 1e4])
    loss = dpo.dpo_loss(margins, zero, zero, zero, 1.0)
    assert torch.isfinite(loss) and loss.item() == pytest.approx((1e4 + 300.0) / 4, rel=1e-6)
    margins.requires_grad_(True)
    dpo.dpo_loss(margins, zero, zero, zero, 1.0).backward()
    torch.testing.assert_close(margins.grad, torch.tensor([-0.25, -0.25, 0.0, 0.0]))


def test_dpo_loss_gradient_is_sigmoid_of_minus_z():
    pc = torch.tensor([-3.0, -8.0], requires_grad=True)
    pr = torch.tensor([-5.0, -2.0], requires_grad=True)
    rc, rr, beta = torch.tensor([-4.0, -7.0]), torch.tensor([-4.0, -3.0]), 0.7
    dpo.dpo_loss(pc, pr, rc, rr, beta).backward()
    z = beta * ((pc - rc) - (pr - rr)).detach()
    torch.testing.assert_close(pc.grad, -beta * torch.sigmoid(-z) / 2)
    torch.testing.assert_close(pr.grad, beta * torch.sigmoid(-z) / 2)


@pytest.mark.parametrize("beta", [0, -1.0, float("inf"), float("nan"), True, "0.1"])
def test_dpo_loss_rejects_bad_beta(beta):
    with pytest.raises(ValueError, match="beta"):
        dpo.dpo_loss(torch.zeros(2), torch.zeros(2), torch.zeros(2), torch.zeros(2), beta)


@pytest.mark.parametrize("position, name", [(1, "policy_rejected"), (2, "ref_chosen"), (3, "ref_rejected")])
def test_dpo_loss_rejects_mismatched_shapes(position, name):
    args = [torch.zeros(3) for _ in range(4)]
    args[position] = torch.zeros(2)
    with pytest.raises(ValueError, match=name):
        dpo.dpo_loss(*args, 0.1)


def test_implicit_reward_and_that_the_loss_is_a_function_of_its_margin():
    pc, pr, rc, rr = torch.tensor([-10.0]), torch.tensor([-12.0]), torch.tensor([-11.0]), torch.tensor([-10.0])
    chosen, rejected = dpo.implicit_reward(pc, rc, 0.5), dpo.implicit_reward(pr, rr, 0.5)
    assert chosen.item() == 0.5 and rejected.item() == -1.0
    loss = dpo.dpo_loss(pc, pr, rc, rr, 0.5)
    assert loss.item() == pytest.approx(-F.logsigmoid(chosen - rejected).item())
    with pytest.raises(ValueError, match="beta"):
        dpo.implicit_reward(pc, rc, 0.0)
    with pytest.raises(ValueError, match="ref_logps"):
        dpo.implicit_reward(pc, torch.zeros(2), 0.1)


def test_kl_estimate_against_an_exact_kl():
    """Two categorical distributions over 5 'responses': the estimate from samples of p converges
    to the exact KL(p || q), within a few standard errors."""
    p = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05], dtype=torch.float64)
    q = torch.tensor([0.2, 0.2, 0.2, 0.2, 0.2], dtype=torch.float64)
    exact = (p * (p / q).log()).sum().item()
    draws = torch.multinomial(p, 20_000, replacement=True, generator=torch.Generator().manual_seed(8))
    kl, error = dpo.kl_estimate(p.log()[draws], q.log()[draws])
    assert abs(kl - exact) < 4 * error and 0 < error < 0.01
    assert dpo.kl_estimate(q.log()[draws], q.log()[draws]) == (0.0, 0.0)


def test_kl_estimate_values_and_errors():
    kl, error = dpo.kl_estimate(torch.tensor([-1.0, -3.0, -2.0]), torch.tensor([-2.0, -2.0, -4.0]))
    ratios = [1.0, -1.0, 2.0]
    mean = sum(ratios) / 3
    assert kl == pytest.approx(mean)
    assert error == pytest.approx(math.sqrt(sum((r - mean) ** 2 for r in ratios) / 2 / 3))
    with pytest.raises(ValueError, match="policy_logps"):
        dpo.kl_estimate(torch.zeros(1), torch.zeros(1))
    with pytest.raises(ValueError, match="ref_logps"):
        dpo.kl_estimate(torch.zeros(3), torch.zeros(2))


# the pairs


def test_preference_pairs_rank_the_samples_of_one_prompt():
    tokenizer = LetterTokenizer()
    model = small_gpt()
    prompts = torch.randint(0, 26, (6, 4), generator=torch.Generator().manual_seed(9))

    def score(text):
        return "a" in text

    pairs = dpo.preference_pairs(model, tokenizer, prompts, samples=6, new_tokens=5,
                                 generator=torch.Generator().manual_seed(10), score=score)
    assert len(pairs) > 0 and pairs.chosen.shape == pairs.rejected.shape == pairs.mask.shape == (len(pairs), 9)
    for chosen, rejected, index in zip(pairs.chosen, pairs.rejected, pairs.prompt):
        assert torch.equal(chosen[:4], prompts[index]) and torch.equal(rejected[:4], prompts[index])
        assert score(tokenizer.decode(chosen[4:].tolist())) and not score(tokenizer.decode(rejected[4:].tolist()))
    assert pairs.mask[:, :4].sum() == 0 and pairs.mask[:, 4:].all()
    again = dpo.preference_pairs(model, tokenizer, prompts, samples=6, new_tokens=5,
                                 generator=torch.Generator().manual_seed(10), score=score)
    assert torch.equal(again.chosen, pairs.chosen)  # a seeded generator: the same pairs
    out = dpo.sample_responses(model, prompts, 5, 6, torch.Generator().manual_seed(10))
    flags = [score(tokenizer.decode(row[4:].tolist())) for row in out]
    assert pairs.attribute_rate == sum(flags) / len(flags)
    expected = sum(min(sum(flags[i * 6:(i + 1) * 6]), 6 - sum(flags[i * 6:(i + 1) * 6])) for i in range(6))
    assert len(pairs) == expected
    with pytest.raises(ValueError, match="no prompt"):
        dpo.preference_pairs(model, tokenizer, prompts, 2, 3, score=lambda text: False)


def test_sample_responses_keeps_prompts_and_order():
    model = small_gpt()
    prompts = torch.randint(0, 40, (3, 5), generator=torch.Generator().manual_seed(11))
    out = dpo.sample_responses(model, prompts, 4, samples=2, generator=torch.Generator().manual_seed(0), batch_size=4)
    assert out.shape == (6, 9)
    assert torch.equal(out[:, :5], prompts.repeat_interleave(2, 0))
    whole = dpo.sample_responses(model, prompts, 4, samples=2, generator=torch.Generator().manual_seed(0), batch_size=6)
    assert whole.shape == out.shape


def test_prompt_windows_and_response_mask():
    tokenizer = LetterTokenizer()
    windows = dpo.prompt_windows(tokenizer, "abcdefghijkl", 3, 2)
    assert windows.tolist() == [[0, 1], [4, 5], [8, 9]]
    with pytest.raises(ValueError, match="too few"):
        dpo.prompt_windows(tokenizer, "abc", 2, 2)
    assert dpo.response_mask(2, 3, 5).tolist() == [[False, False, False, True, True]] * 2
    with pytest.raises(ValueError, match="length"):
        dpo.response_mask(1, 5, 5)


def test_pair_batches_cover_each_epoch_and_resume():
    n = 10
    pairs = dpo.PreferencePairs(torch.arange(n)[:, None].repeat(1, 3), -torch.arange(n)[:, None].repeat(1, 3),
                                dpo.response_mask(n, 1, 3), torch.arange(n), 0.1)
    batches = dpo.PairBatches(pairs, 3, seed=1)
    first_epoch = torch.cat([next(batches)["chosen"][:, 0] for _ in range(3)])
    assert len(set(first_epoch.tolist())) == 9  # no pair twice within an epoch; the tenth waits
    state = batches.state_dict()
    ahead = [next(batches)["chosen"] for _ in range(4)]
    resumed = dpo.PairBatches(pairs, 3, seed=1)
    resumed.load_state_dict(state)
    assert all(torch.equal(a, next(resumed)["chosen"]) for a in ahead)
    batch = next(batches)
    assert torch.equal(batch["rejected"], -batch["chosen"]) and batch["mask"].shape == (3, 3)
    with pytest.raises(ValueError, match="batch_size"):
        dpo.PairBatches(pairs, 11)


# training against a frozen reference


def synthetic_pairs(n=24, prompt=4, response=6, seed=12) -> dpo.PreferencePairs:
    """Chosen responses are runs of token 1, rejected ones runs of token 2, after random prompts."""
    generator = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, 40, (n, prompt), generator=generator)
    chosen = torch.cat([prompts, torch.full((n, response), 1)], dim=1)
    rejected = torch.cat([prompts, torch.full((n, response), 2)], dim=1)
    return dpo.PreferencePairs(chosen, rejected, dpo.response_mask(n, prompt, prompt + response), torch.arange(n), 0.5)


def test_dpo_training_through_train_moves_the_margin_and_leaves_the_reference():
    model = small_gpt()
    reference = dpo.frozen_reference(model)
    kept = {name: value.clone() for name, value in reference.state_dict().items()}
    pairs = synthetic_pairs()
    before = dpo.pair_metrics(model, reference, pairs, 0.1)
    assert before["loss"] == pytest.approx(math.log(2), abs=1e-6) and before["logratio_margin"] == 0.0
    config = TrainConfig(steps=12, lr=3e-3, warmup_steps=1, eval_every=12, checkpoint_every=12)
    state = train(model, dpo.PairBatches(pairs, 8), config, loss_fn=dpo.dpo_objective(reference, 0.1), progress=False)
    after = dpo.pair_metrics(model, reference, pairs, 0.1)
    assert after["loss"] < 0.5 * math.log(2) and after["reward_accuracy"] == 1.0
    assert after["reward_margin"] == pytest.approx(0.1 * after["logratio_margin"])
    assert state.history["train_loss"][0] == pytest.approx(math.log(2), abs=1e-6)
    for name in ("chosen_logp", "rejected_logp", "reward_margin", "reward_accuracy"):
        assert len(state.history[name]) == 12
    assert all(torch.equal(kept[name], value) for name, value in reference.state_dict().items())
    assert not reference.training and not any(p.requires_grad for p in reference.parameters())


def test_dpo_objective_scores_the_reference_without_gradients_in_eval_mode():
    model = small_gpt()
    reference = dpo.frozen_reference(model).train()
    reference.requires_grad_(True)
    objective = dpo.dpo_objective(reference, 0.2)
    assert not reference.training  # put in eval mode
    batch = {key: getattr(synthetic_pairs(4), key) for key in ("chosen", "rejected", "mask")}
    loss, _ = objective(model.train(), batch)
    loss.backward()
    assert all(p.grad is None for p in reference.parameters())
    with pytest.raises(ValueError, match="reference itself"):
        objective(reference, batch)
    with pytest.raises(ValueError, match="beta"):
        dpo.dpo_objective(reference, 0)


def test_sft_objective_is_the_mean_nll_of_the_chosen_response_tokens():
    model = small_gpt()
    pairs = synthetic_pairs(5)
    batch = {key: getattr(pairs, key) for key in ("chosen", "rejected", "mask")}
    loss, logged = dpo.sft_objective(model, batch)
    targets = torch.where(pairs.mask, pairs.chosen, torch.full_like(pairs.chosen, -100))[:, 1:]
    _, expected = model(pairs.chosen[:, :-1], targets)  # the model's own mean cross-entropy over kept targets
    torch.testing.assert_close(loss, expected)
    assert logged["chosen_logp"].item() == pytest.approx(-expected.item() * 6, rel=1e-5)


def exact_kl(policy, reference, prompts, vocab) -> float:
    """KL(policy || reference) of 2-token responses, mean over the prompts, by enumerating all
    vocab² responses: the chain rule, KL(y1) + E_y1[KL(y2 | y1)], in float64."""
    total = 0.0
    with torch.no_grad():
        for prompt in prompts:
            firsts = torch.cat([prompt.repeat(vocab, 1), torch.arange(vocab)[:, None]], dim=1)  # (vocab, len + 1)
            p1, q1 = (torch.log_softmax(m(prompt[None])[0][0, -1].double(), -1) for m in (policy, reference))
            p2, q2 = (torch.log_softmax(m(firsts)[0][:, -1].double(), -1) for m in (policy, reference))
            total += float((p1.exp() * (p1 - q1)).sum() + (p1.exp() * (p2.exp() * (p2 - q2)).sum(-1)).sum())
    return total / len(prompts)


def test_evaluate_policy_estimates_the_exact_kl_of_another_policy():
    reference, policy = small_gpt(), small_gpt()
    with torch.no_grad():
        policy.final_norm.weight.mul_(4.0)  # sharper logits: a policy far from the reference
    prompts = torch.randint(0, SMALL["vocab_size"], (4, 3), generator=torch.Generator().manual_seed(13))
    exact = exact_kl(policy, reference, prompts, SMALL["vocab_size"])
    measured = dpo.evaluate_policy(policy, dpo.frozen_reference(reference), LetterTokenizer(), prompts, 2, samples=1024,
                                   generator=torch.Generator().manual_seed(0), score=lambda text: "b" in text)
    assert exact > 0.1
    assert abs(measured["kl"] - exact) < 4 * measured["kl_stderr"] < 0.2 * exact
    p = measured["attribute_rate"]
    assert measured["attribute_stderr"] == pytest.approx(math.sqrt(p * (1 - p) / 4096))
    same = dpo.evaluate_policy(reference, dpo.frozen_reference(reference), LetterTokenizer(), prompts, 2, samples=2,
                               generator=torch.Generator().manual_seed(0))
    assert same["kl"] == 0.0 and same["kl_stderr"] == 0.0  # the reference against its copy


def test_train_state_resumes_a_dpo_run_exactly(tmp_path):
    pairs = synthetic_pairs()
    config = TrainConfig(steps=6, lr=1e-3, warmup_steps=1, eval_every=6, checkpoint_every=3)
    model = small_gpt()
    objective = dpo.dpo_objective(dpo.frozen_reference(model), 0.1)
    whole = train(model, dpo.PairBatches(pairs, 8), config, loss_fn=objective, progress=False)
    interrupted = small_gpt()
    path = tmp_path / "dpo.pt"
    train(interrupted, dpo.PairBatches(pairs, 8), config, loss_fn=objective, checkpoint_path=path, stop_after=3,
          progress=False)
    resumed_model = small_gpt(seed=99)
    state = TrainState.load(path, resumed_model, config)
    resumed = train(resumed_model, dpo.PairBatches(pairs, 8), config, loss_fn=objective, state=state, progress=False)
    assert resumed.history["train_loss"] == whole.history["train_loss"]
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), resumed_model.state_dict().values()))
