"""minillm.sampling against naive per-row formulas, its defining properties, and bad input."""
import math

import pytest
import torch

from minillm import sampling


def _logits(rows=4, vocab=11, seed=0, dtype=torch.float32):
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed), dtype=dtype) * 2


def _naive_top_k(row: list[float], k: int) -> list[bool]:
    """Kept flags: a value is kept when fewer than k values are strictly larger."""
    return [sum(other > value for other in row) < k for value in row]


def _naive_top_p(row: list[float], p: float) -> list[bool]:
    """Kept flags: walk the tokens from most to least likely, keep until the mass reaches p."""
    exps = [math.exp(v - max(row)) for v in row]
    probs = [e / sum(exps) for e in exps]
    order = sorted(range(len(row)), key=lambda i: -probs[i])
    kept, mass = [False] * len(row), 0.0
    for i in order:
        if mass >= p:
            break
        kept[i] = True
        mass += probs[i]
    return kept


def test_greedy_is_argmax_and_ties_go_to_the_smallest_id():
    logits = _logits()
    assert torch.equal(sampling.greedy(logits), torch.tensor([max(range(11), key=lambda j: row[j]) for row in logits.tolist()]))
    assert sampling.greedy(torch.tensor([[1.0, 3.0, 3.0, 0.0]])).item() == 1


def test_temperature_divides_the_logits():
    logits = _logits(seed=1)
    for t in (0.5, 1.0, 2.0):
        got = torch.softmax(sampling.apply_temperature(logits, t), dim=-1)
        expected = torch.tensor([[math.exp(v / t) / sum(math.exp(w / t) for w in row) for v in row] for row in logits.tolist()])
        torch.testing.assert_close(got, expected)
    entropy = [float(-(torch.softmax(sampling.apply_temperature(logits, t), -1) * torch.log_softmax(
        sampling.apply_temperature(logits, t), -1)).sum()) for t in (0.25, 1.0, 4.0)]
    assert entropy[0] < entropy[1] < entropy[2], "a higher temperature must flatten the distribution"


@pytest.mark.parametrize("k", [1, 2, 5, 10])
def test_top_k_keeps_exactly_the_k_largest(k):
    logits = _logits(rows=6, vocab=13, seed=k)
    got = sampling.top_k_filter(logits, k)
    for row, out in zip(logits.tolist(), got):
        kept = _naive_top_k(row, k)
        assert sum(kept) == k
        assert [not math.isinf(v) for v in out.tolist()] == kept
        assert [v for v, keep in zip(out.tolist(), kept) if keep] == [v for v, keep in zip(row, kept) if keep]
        assert all(v == float("-inf") for v, keep in zip(out.tolist(), kept) if not keep)


def test_top_k_edge_cases():
    logits = _logits()
    assert torch.equal(sampling.top_k_filter(logits, 11), logits)
    assert torch.equal(sampling.top_k_filter(logits, 500), logits)
    tied = torch.tensor([[2.0, 1.0, 1.0, 0.0]])
    assert torch.isfinite(sampling.top_k_filter(tied, 2)).tolist() == [[True, True, True, False]]  # ties kept
    batched = _logits(rows=6).reshape(2, 3, 11)
    assert torch.equal(sampling.top_k_filter(batched, 3), sampling.top_k_filter(batched.reshape(6, 11), 3).reshape(2, 3, 11))
    half = sampling.top_k_filter(_logits().to(torch.bfloat16), 3)
    assert half.dtype == torch.bfloat16 and torch.isfinite(half).sum(-1).tolist() == [3, 3, 3, 3]


@pytest.mark.parametrize("p", [0.05, 0.3, 0.5, 0.9, 0.999])
def test_top_p_matches_a_naive_walk_and_is_the_smallest_prefix(p):
    logits = _logits(rows=8, vocab=17, seed=int(p * 1000))
    got = sampling.top_p_filter(logits, p)
    probs = torch.softmax(logits, dim=-1)
    for row, out, prob in zip(logits.tolist(), got, probs):
        kept = torch.isfinite(out)
        assert kept.tolist() == _naive_top_p(row, p)
        assert torch.equal(out[kept], torch.tensor(row)[kept])
        mass = prob[kept].sum()
        assert mass >= p - 1e-6, "the kept tokens must hold at least p"
        assert mass - prob[kept].min() < p, "dropping the least likely kept token must fall below p"
        assert (~kept).sum() == 0 or prob[kept].min() >= prob[~kept].max(), "the kept tokens must be the most likely"


@pytest.mark.parametrize("name, arg", [("top_k_filter", 3), ("top_p_filter", 0.5), ("apply_temperature", 0.7)])
def test_filters_leave_their_input_alone(name, arg):
    logits = _logits(rows=5, vocab=9, seed=11)
    before = logits.clone()
    out = getattr(sampling, name)(logits, arg)
    assert torch.equal(logits, before), "the filter modified its input"
    assert not torch.equal(out, before), "the case must change something, or this test cannot fail"


def test_top_p_edge_cases():
    logits = _logits()
    assert torch.equal(sampling.top_p_filter(logits, 1.0), logits)
    tiny = sampling.top_p_filter(logits, 1e-9)
    assert torch.equal(torch.isfinite(tiny).sum(-1), torch.ones(4, dtype=torch.long))
    assert torch.equal(tiny.argmax(-1), logits.argmax(-1))
    # p exactly reached by the first two tokens: the third is not needed
    exact = torch.log(torch.tensor([[0.5, 0.25, 0.125, 0.125]], dtype=torch.float64))
    assert torch.isfinite(sampling.top_p_filter(exact, 0.75)).tolist() == [[True, True, False, False]]
    assert torch.isfinite(sampling.top_p_filter(exact, 0.76)).tolist() == [[True, True, True, False]]


def test_top_p_decides_a_float64_boundary_in_float64():
    # p a hair (1e-9) above or below the most likely token's float64 probability: float32 rounds that
    # probability by up to about 1e-7, so a filter that downcasts keeps or drops the second token wrongly
    for x in (-0.3, -1.2, -1.4, -2.9, -3.3, -0.6, -1.5, -2.8):
        logits = torch.tensor([[0.0, x, x - 1.0]], dtype=torch.float64)
        exps = [math.exp(v) for v in logits[0].tolist()]
        first = exps[0] / sum(exps)
        for p, n_kept in ((first + 1e-9, 2), (first - 1e-9, 1)):
            expected = _naive_top_p(logits[0].tolist(), p)
            assert sum(expected) == n_kept
            got = sampling.top_p_filter(logits, p)
            assert got.dtype == torch.float64
            assert torch.isfinite(got[0]).tolist() == expected, f"top_p_filter at p = {p!r} (logits {x})"


def test_sample_next_draws_from_the_float64_softmax_of_float64_logits(monkeypatch):
    drawn_from = []
    multinomial = torch.multinomial

    def spy(probs, *args, **kwargs):
        drawn_from.append(probs)
        return multinomial(probs, *args, **kwargs)

    monkeypatch.setattr(torch, "multinomial", spy)
    logits = _logits(rows=3, vocab=9, dtype=torch.float64)
    sampling.sample_next(logits, temperature=0.7, generator=torch.Generator().manual_seed(0))
    naive = [[math.exp(v / 0.7) / sum(math.exp(u / 0.7) for u in row) for v in row] for row in logits.tolist()]
    assert drawn_from[-1].dtype == torch.float64, "promote, never downcast: float64 logits are sampled in float64"
    torch.testing.assert_close(drawn_from[-1], torch.tensor(naive, dtype=torch.float64), rtol=1e-13, atol=0)
    sampling.sample_next(logits.to(torch.bfloat16), generator=torch.Generator().manual_seed(0))
    assert drawn_from[-1].dtype == torch.float32, "half-precision logits are sampled in float32"


def test_sampling_is_reproducible_when_seeded():
    logits = _logits(rows=5, vocab=30)
    draws = [sampling.sample_next(logits, 1.3, top_k=10, top_p=0.9, generator=torch.Generator().manual_seed(7))
             for _ in range(2)]
    assert torch.equal(draws[0], draws[1])
    torch.manual_seed(3)
    a = sampling.sample_next(logits)
    torch.manual_seed(3)
    assert torch.equal(a, sampling.sample_next(logits))
    many = [sampling.sample_next(logits, generator=torch.Generator().manual_seed(s)) for s in range(20)]
    assert len({tuple(m.tolist()) for m in many}) > 1, "different seeds should give different samples"


def test_greedy_limits():
    logits = _logits(rows=16, vocab=50)
    gen = torch.Generator().manual_seed(0)
    assert torch.equal(sampling.sample_next(logits, temperature=0), logits.argmax(-1))
    assert torch.equal(sampling.sample_next(logits, top_k=1, generator=gen), logits.argmax(-1))
    assert torch.equal(sampling.sample_next(logits, temperature=1e-4, generator=gen), logits.argmax(-1))
    assert torch.equal(sampling.sample_next(logits, top_p=1e-6, generator=gen), logits.argmax(-1))


def test_sample_frequencies_follow_the_filtered_softmax():
    logits = torch.tensor([[1.0, 0.5, 0.0, -0.5, -1.0, -3.0]]).repeat(20000, 1)
    gen = torch.Generator().manual_seed(1)
    ids = sampling.sample_next(logits, temperature=0.8, top_k=4, generator=gen)
    freq = torch.bincount(ids, minlength=6).double() / len(ids)
    expected = torch.softmax(torch.tensor([1.0, 0.5, 0.0, -0.5]) / 0.8, -1).double()
    assert freq[4:].sum() == 0, "a token removed by top-k was sampled"
    # a frequency's sampling error is absolute: sd <= 0.0035 at n = 20000, so 0.015 is over 4 sd
    torch.testing.assert_close(freq[:4], expected, atol=0.015, rtol=0)
    ids = sampling.sample_next(logits, top_p=0.6, generator=gen)
    assert set(ids.unique().tolist()) == {0, 1}, "top-p 0.6 keeps exactly the two most likely tokens here"


@pytest.mark.parametrize("kwargs, name", [
    ({"temperature": -0.1}, "temperature"), ({"temperature": "hot"}, "temperature"),
    ({"top_k": 0}, "top_k"), ({"top_k": 2.5}, "top_k"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
])
def test_bad_sampling_arguments_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        sampling.sample_next(_logits(), **kwargs)


def test_bad_filter_input():
    with pytest.raises(ValueError, match="k"):
        sampling.top_k_filter(_logits(), 0)
    with pytest.raises(ValueError, match="p"):
        sampling.top_p_filter(_logits(), -1)
    with pytest.raises(TypeError, match="logits"):
        sampling.top_k_filter(torch.tensor([[1, 2, 3]]), 1)
    with pytest.raises(TypeError, match="logits"):
        sampling.greedy([[0.1, 0.2]])
    with pytest.raises(ValueError, match="temperature"):
        sampling.apply_temperature(_logits(), 0)
    with pytest.raises(ValueError, match="logits"):
        sampling.sample_next(_logits()[0])
