"""minillm.generate: the sampling loop, context cropping, the cache path, reproducibility, bad input."""
from types import SimpleNamespace

import pytest
import torch

from minillm.attention import ConcatCache
from minillm.generate import ConcatModelCache, generate, generate_text

from minillm.model import GPT, GPTConfig


class BigramModel(torch.nn.Module):
    """Logits depend only on the last token: row ``table[token]``. Checks the context it gets."""

    def __init__(self, vocab=7, context=5, seed=0):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(seed)) * 3)
        self.config = SimpleNamespace(context_length=context)
        self.seen_lengths = []

    def forward(self, ids, targets=None):
        assert ids.shape[1] <= self.config.context_length, "generate fed more than the context"
        self.seen_lengths.append(ids.shape[1])
        return self.table[ids], None


class ListCache:
    """The simplest model-wide KV cache: per layer, the package's ``ConcatCache``."""

    def __init__(self, n_layers):
        self.layers = [ConcatCache() for _ in range(n_layers)]

    @property
    def length(self):
        return 0 if self.layers[0].k is None else self.layers[0].k.shape[-2]

    def layer(self, index):
        return self.layers[index]


def _gpt(positions="learned", context=24, **kw):
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=37, context_length=context, d_model=32, n_layers=2, n_heads=4, d_ff=64,
                       positions=positions, init_std=0.2, **kw)
    return GPT(config)


def test_greedy_generation_follows_the_argmax_chain():
    model = BigramModel()
    out = generate(model, torch.tensor([[3], [5]]), 6, temperature=0)
    assert out.shape == (2, 7)
    for row in out.tolist():
        for a, b in zip(row, row[1:]):
            assert b == int(model.table[a].argmax())


def test_context_is_cropped_to_the_last_tokens():
    model = BigramModel(context=5)
    prompt = torch.tensor([[1, 2, 3, 4]])
    out = generate(model, prompt, 6, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out[:, :4], prompt)
    assert model.seen_lengths == [4, 5, 5, 5, 5, 5]


def test_seeded_generation_is_reproducible_and_restores_the_mode():
    model = _gpt(dropout=0.2)
    model.train()
    prompt = torch.tensor([[1, 2, 3]])
    a = generate(model, prompt, 10, top_k=10, top_p=0.95, generator=torch.Generator().manual_seed(4))
    b = generate(model, prompt, 10, top_k=10, top_p=0.95, generator=torch.Generator().manual_seed(4))
    assert torch.equal(a, b), "dropout must be off while generating, and the seed must fix the draws"
    assert model.training, "generate must put the model back in training mode"
    assert torch.equal(generate(model, prompt, 0), prompt)


@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "rope", "alibi"])
def test_cache_gives_the_same_logits_and_tokens_as_recomputing(positions):
    model = _gpt(positions, n_kv_heads=2).eval()
    ids = torch.randint(0, 37, (2, 15), generator=torch.Generator().manual_seed(1))
    full, _ = model(ids)
    cache = ListCache(2)
    first, _ = model(ids[:, :9], kv_cache=cache)
    steps = [model(ids[:, t: t + 1], kv_cache=cache)[0] for t in range(9, 15)]
    torch.testing.assert_close(torch.cat([first] + steps, dim=1), full, atol=1e-5, rtol=1e-5)
    prompt = ids[:, :4]
    plain = generate(model, prompt, 12, temperature=0)
    cached = generate(model, prompt, 12, temperature=0, kv_cache=ListCache(2))
    assert torch.equal(plain, cached)


def test_cache_length_limits():
    model = _gpt(context=8)
    prompt = torch.zeros(1, 3, dtype=torch.long)
    assert generate(model, prompt, 6, kv_cache=ListCache(2)).shape == (1, 9)  # the last token is never fed
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, prompt, 7, kv_cache=ListCache(2))
    assert generate(model, prompt, 20).shape == (1, 23)  # without a cache the context slides
    used = ListCache(2)
    model(prompt, kv_cache=used)
    with pytest.raises(ValueError, match="kv_cache"):
        generate(model, prompt, 2, kv_cache=used)


def test_use_cache_makes_a_cache_and_changes_no_token():
    model = _gpt("rope").eval()
    prompt = torch.randint(0, 37, (2, 5), generator=torch.Generator().manual_seed(2))
    assert torch.equal(generate(model, prompt, 10, temperature=0, use_cache=True), generate(model, prompt, 10, temperature=0))
    longer = generate(model, prompt, 21, temperature=0, use_cache=True)  # past the context the cache is refilled
    assert longer.shape == (2, 26) and torch.equal(longer[:, :15], generate(model, prompt, 10, temperature=0))
    cache = ConcatModelCache(2)
    assert cache.length == 0
    generate(model, prompt, 3, kv_cache=cache)
    assert cache.length == 7 and cache.layer(1).k.shape == (2, 4, 7, 8)


def _left_padded(prompts, pad=36):
    length = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), length), pad)
    mask = torch.zeros(len(prompts), length, dtype=torch.bool)
    for b, prompt in enumerate(prompts):
        ids[b, length - len(prompt):] = torch.tensor(prompt)
        mask[b, length - len(prompt):] = True
    return ids, mask


@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "rope", "alibi"])
@pytest.mark.parametrize("use_cache", [False, True])
def test_batched_generation_equals_generating_each_prompt_alone(positions, use_cache):
    model = _gpt(positions, context=16, n_kv_heads=2).double()  # float64: no near-ties in the argmax
    prompts = [[3, 1, 4, 1, 5, 9], [2, 7], [1, 8, 2, 8]]
    ids, mask = _left_padded(prompts)
    new = 10 if use_cache else 14  # without a cache the longest row slides past the context
    out = generate(model, ids, new, temperature=0, use_cache=use_cache, attention_mask=mask)
    for b, prompt in enumerate(prompts):
        alone = generate(model, torch.tensor([prompt]), new, temperature=0, use_cache=use_cache)
        assert torch.equal(out[b, -new:], alone[0, -new:]), f"row {b} ({positions}) differs from the prompt alone"
    assert torch.equal(out[:, :ids.shape[1]], ids)


@pytest.mark.parametrize("mask, error", [
    (torch.ones(1, 3), TypeError), (torch.ones(1, 2, dtype=torch.bool), ValueError),
    (torch.tensor([[True, True, False]]), ValueError),
])
def test_bad_attention_mask_names_it(mask, error):
    with pytest.raises(error, match="attention_mask"):
        generate(_gpt(), torch.tensor([[1, 2, 3]]), 2, attention_mask=mask)


def test_generate_text_round_trips_the_prompt():
    from minillm.tokenizer import BPETokenizer

    tokenizer = BPETokenizer.train("to be or not to be, that is the question " * 20, 270)
    model = GPT(GPTConfig(vocab_size=len(tokenizer), context_length=16, d_model=16, n_layers=1, n_heads=2, d_ff=32))
    text = generate_text(model, tokenizer, "to be", 5, generator=torch.Generator().manual_seed(0))
    assert text.startswith("to be") and len(tokenizer.encode(text)) >= len(tokenizer.encode("to be"))


@pytest.mark.parametrize("args, kwargs, error, name", [
    ((torch.tensor([[1.0, 2.0]]), 3), {}, TypeError, "ids"),
    ((torch.tensor([1, 2]), 3), {}, ValueError, "ids"),
    ((torch.tensor([[1, 2]]), -1), {}, ValueError, "max_new_tokens"),
    ((torch.tensor([[1, 2]]), 2), {"temperature": -1.0}, ValueError, "temperature"),
    ((torch.tensor([[1, 2]]), 2), {"top_k": 0}, ValueError, "top_k"),
    ((torch.tensor([[1, 2]]), 0), {"top_p": 2.0}, ValueError, "top_p"),
    ((torch.tensor([[1, 2]]), 2), {"use_cache": 1}, TypeError, "use_cache"),
])
def test_bad_input_names_the_argument(args, kwargs, error, name):
    with pytest.raises(error, match=name):
        generate(BigramModel(), *args, **kwargs)
    with pytest.raises(ValueError, match="prompt"):
        generate_text(BigramModel(), None, "", 3)
