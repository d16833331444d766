"""Output generation: from the last position's logits to the next token (chapter 07).

Every function takes ``logits`` of shape ``(..., vocab)``, the scores a model gives each
token of the vocabulary, and works on the last axis. The filters return logits of the
same shape in which the tokens they rule out are ``-inf``, so that a softmax gives them
probability 0. ``sample_next`` chains them in the order Hugging Face's ``generate`` uses:
temperature, then top-k, then top-p, then one draw per row. Drawing with a seeded
``torch.Generator`` (or after ``torch.manual_seed``) makes samples reproducible.
"""
import torch


def _check_logits(logits) -> None:
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if not logits.is_floating_point():
        raise TypeError(f"logits must be a floating tensor, got dtype {logits.dtype}")
    if logits.dim() == 0 or logits.shape[-1] == 0:
        raise ValueError(f"logits must have shape (..., vocab) with vocab >= 1, got {tuple(logits.shape)}")


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """The most likely token of each row: logits (..., vocab) → ids (...,), int64.

    Ties go to the smallest id (``torch.argmax``'s rule).
    """
    _check_logits(logits)
    return logits.argmax(dim=-1)


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / temperature, shape (..., vocab). Below 1 sharpens the distribution, above 1 flattens it.

    temperature must be > 0; the limit 0 is greedy decoding, which ``sample_next`` handles.
    """
    _check_logits(logits)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
        raise ValueError(f"temperature must be a number > 0, got {temperature!r}")
    return logits / temperature


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits of each row, set the others to -inf: (..., vocab) → (..., vocab).

    A logit equal to the k-th largest is kept too, so a tie at the boundary can keep more
    than k tokens. k >= vocab keeps everything. k must be a positive int.
    """
    _check_logits(logits)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    if k >= logits.shape[-1]:
        return logits
    kth_largest = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth_largest, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filter (Holtzman et al., 2019): keep the smallest set of most likely tokens
    whose probabilities sum to at least p; set the others to -inf. (..., vocab) → (..., vocab).

    Tokens are taken in order of decreasing probability; a token is kept when the tokens
    before it hold less than p. The most likely token is always kept. p must be in (0, 1];
    p = 1 keeps everything.
    """
    _check_logits(logits)
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p <= 1.0:
        raise ValueError(f"p must be a number in (0, 1], got {p!r}")
    if p == 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits.float(), dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    remove_sorted = mass_before >= p
    remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


def check_sampling_arguments(temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None) -> None:
    """``ValueError`` naming the argument unless temperature >= 0, top_k is None or a
    positive int, and top_p is None or in (0, 1]."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature >= 0:
        raise ValueError(f"temperature must be a number >= 0, got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be None or a positive int, got {top_k!r}")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
        raise ValueError(f"top_p must be None or a number in (0, 1], got {top_p!r}")


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw the next token of each row: logits (batch, vocab) → ids (batch,), int64.

    temperature 0 is greedy decoding (no filter changes the most likely token). Otherwise
    the logits are divided by the temperature, filtered by top-k and then top-p when
    given, and one token is drawn from their softmax with ``generator`` (default: torch's
    global generator).
    """
    _check_logits(logits)
    if logits.dim() != 2:
        raise ValueError(f"logits must have shape (batch, vocab), got {tuple(logits.shape)}")
    check_sampling_arguments(temperature, top_k, top_p)
    if temperature == 0:
        return greedy(logits)
    logits = apply_temperature(logits, temperature)
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    probs = torch.softmax(logits.float(), dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)
