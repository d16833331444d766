"""Autoregressive generation: run the model, sample a token, append it, repeat (chapter 07).

Without a cache, every step runs the model on the whole context again (its last
``context_length`` tokens) and uses only the last position's logits. With a KV cache
(chapter 09) the prompt is run once and then each new token alone, its keys and values
appended to the cache; both ways give the same tokens.
"""
import torch
from tqdm.auto import tqdm

from minillm.sampling import check_sampling_arguments, sample_next


def _check_ids(ids) -> None:
    if not isinstance(ids, torch.Tensor) or ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise TypeError(f"ids must be an integer tensor, got {getattr(ids, 'dtype', type(ids).__name__)}")
    if ids.dim() != 2 or ids.shape[1] == 0:
        raise ValueError(f"ids must have shape (batch, seq) with seq >= 1, got {tuple(ids.shape)}")


@torch.no_grad()
def generate(model, ids: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
             top_p: float | None = None, kv_cache=None, generator: torch.Generator | None = None,
             progress: bool = False) -> torch.Tensor:
    """Extend ``ids`` (batch, seq) by ``max_new_tokens`` sampled tokens: → (batch, seq + max_new_tokens).

    model: ``forward(ids)`` returns ``(logits (batch, seq, vocab), loss)``, and
    ``model.config.context_length`` is its context. temperature, top_k, top_p: as in
    ``minillm.sampling.sample_next`` (temperature 0 is greedy). kv_cache: None (recompute
    the context every step) or an empty cache accepted by ``model.forward(ids,
    kv_cache=...)`` (chapter 09); with a cache, prompt plus new tokens must fit in the
    context. generator: a seeded ``torch.Generator`` makes the draws reproducible.
    The model runs in eval mode (no dropout) and is put back in its previous mode.
    """
    _check_ids(ids)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative int, got {max_new_tokens!r}")
    check_sampling_arguments(temperature, top_k, top_p)
    context = model.config.context_length
    if kv_cache is not None:
        if int(kv_cache.length) != 0:
            raise ValueError(f"kv_cache must be empty, it holds {int(kv_cache.length)} positions")
        if ids.shape[1] + max_new_tokens - 1 > context:
            raise ValueError(f"with a kv_cache the context cannot slide: the prompt ({ids.shape[1]} tokens) "
                             f"plus max_new_tokens ({max_new_tokens}) minus 1 must be <= the context ({context})")
    sample = dict(temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
    was_training = model.training
    model.eval()
    try:
        out = ids
        logits = None
        for step in tqdm(range(max_new_tokens), desc="generating", disable=not progress):
            if kv_cache is None:
                logits, _ = model(out[:, -context:])
            elif step == 0:
                logits, _ = model(out, kv_cache=kv_cache)
            else:
                logits, _ = model(out[:, -1:], kv_cache=kv_cache)
            next_ids = sample_next(logits[:, -1], **sample)
            out = torch.cat([out, next_ids[:, None].to(out.dtype)], dim=1)
        return out
    finally:
        model.train(was_training)


def generate_text(model, tokenizer, prompt: str, max_new_tokens: int, **kwargs) -> str:
    """The prompt followed by ``max_new_tokens`` sampled tokens, decoded to text.

    tokenizer: ``encode(str) -> list[int]`` and ``decode(ids) -> str`` (a ``BPETokenizer``).
    kwargs: as ``generate``. The model's device is used for the ids.
    """
    if not isinstance(prompt, str) or not prompt:
        raise ValueError(f"prompt must be a non-empty str, got {prompt!r}")
    device = next(model.parameters()).device
    ids = torch.tensor([tokenizer.encode(prompt)], dtype=torch.long, device=device)
    return tokenizer.decode(generate(model, ids, max_new_tokens, **kwargs)[0].tolist())
