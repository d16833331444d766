"""The checks behind the visible tests. A failure says what was expected, what came back,
where the first mismatch is, and, when the wrong answer matches a known mistake, names that
mistake. ``expect_raises`` checks that bad input gets its error.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from .diagnosis import CheckFailed, unanswered

def describe(value) -> str:
    """A short description of a value: shape and dtype for tensors."""
    if isinstance(value, torch.Tensor):
        return f"tensor of shape {tuple(value.shape)}, dtype {value.dtype}"
    return f"{type(value).__name__} {value!r}"[:120]


def _first_mismatch(got: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float) -> str:
    bad = ~torch.isclose(got, expected, atol=atol, rtol=rtol, equal_nan=False)
    index = tuple(int(i) for i in bad.nonzero()[0])
    diff = (got - expected).abs().max().item()
    return (
        f"first mismatch at index {index}: expected {expected[index].item():.6g}, "
        f"got {got[index].item():.6g}; largest difference {diff:.3g}"
    )


def close(got, expected: torch.Tensor, atol: float = 1e-5, rtol: float = 1e-4) -> bool:
    """True when ``got`` is a tensor of ``expected``'s shape and values (NaN never matches)."""
    return (
        isinstance(got, torch.Tensor)
        and got.shape == expected.shape
        and bool(torch.allclose(got.detach().to(expected.dtype), expected, atol=atol, rtol=rtol))
    )


def expect_close(
    got,
    expected: torch.Tensor,
    name: str,
    *,
    atol: float = 1e-5,
    rtol: float = 1e-4,
    mistakes: Mapping[str, torch.Tensor] | None = None,
    hint: str | None = None,
) -> None:
    """Fail with a diagnosis unless ``got`` matches ``expected`` (a tensor).

    ``mistakes`` maps a description of a known mistake to the output that mistake would
    produce; when ``got`` matches one, the message names it.
    """
    if not isinstance(got, torch.Tensor):
        raise CheckFailed(f"{name}: expected a tensor, got {describe(got)}", f"{name}: not a tensor")
    if got.shape != expected.shape:
        raise CheckFailed(
            f"{name}: expected shape {tuple(expected.shape)}, got {tuple(got.shape)}"
            + (f". Hint: {hint}" if hint else ""), f"{name}: wrong shape"
        )
    if close(got, expected, atol, rtol):
        return
    for mistake, wrong in (mistakes or {}).items():
        if wrong.shape == expected.shape and close(got, wrong, atol, rtol):
            message = f"{name}: your result matches a known mistake: {mistake}"
            raise CheckFailed(message, message)
    got = got.detach().to(expected.dtype)
    message = f"{name}: values differ; " + (
        "got NaN or inf" if not torch.isfinite(got).all() else _first_mismatch(got, expected, atol, rtol)
    )
    raise CheckFailed(message + (f". Hint: {hint}" if hint else ""),
                      f"{name}: " + ("NaN or inf" if message.endswith("got NaN or inf") else "values differ"))


def expect_equal(got, expected, name: str, *, mistakes: Mapping[str, object] | None = None, hint: str | None = None) -> None:
    """Fail unless ``got == expected`` for plain values (ints, strings, tuples).

    ``mistakes`` maps a description of a known mistake to the value it would produce.
    """
    if got == expected and isinstance(got, bool) == isinstance(expected, bool):
        return
    for mistake, wrong in (mistakes or {}).items():
        if got == wrong:
            raise CheckFailed(f"{name}: expected {expected!r}, got {got!r}, which matches a known mistake: {mistake}",
                              f"{name}: your result matches a known mistake: {mistake}")
    raise CheckFailed(
        f"{name}: expected {expected!r}, got {describe(got)}" + (f". Hint: {hint}" if hint else ""),
        f"{name}: " + ("values differ" if type(got) is type(expected) else f"expected a {type(expected).__name__}")
    )


def _call_text(call: Callable, args: tuple, kwargs: dict) -> str:
    shown = [describe(a) if isinstance(a, torch.Tensor) else repr(a)[:60] for a in args]
    shown += [f"{k}={describe(v) if isinstance(v, torch.Tensor) else repr(v)[:60]}" for k, v in kwargs.items()]
    return f"{getattr(call, '__name__', None) or repr(call)[:60]}({', '.join(shown)})"


def expect_raises(
    error: type[BaseException] | tuple[type[BaseException], ...],
    call: Callable,
    *args: Any,
    what: str | None = None,
    match: str | None = None,
    mistakes: Mapping[str, type[BaseException]] | None = None,
    hint: str | None = None,
    **kwargs: Any,
) -> None:
    """Fail unless ``call(*args, **kwargs)`` raises ``error`` (an exception class or a tuple of them).

    ``what`` names the call in the message (default: the function's name and its arguments).
    ``match``: text the error's message must contain, such as the name of the bad argument
    (a plain substring, not a regular expression). An exception of another type propagates
    unchanged, as from a plain call, unless it is an instance of a type in ``mistakes``
    (a description of a known mistake → the exception type that mistake raises): then the
    failure names that mistake. ``NotImplementedError`` (an unanswered exercise's stub) always
    propagates unchanged, never as a mistake.
    """
    def label() -> str:  # built only on failure: naming a grader's proxy of the call may cost a round trip
        return what or _call_text(call, args, kwargs)

    def brief() -> str:  # the label without the arguments' values
        return what or str(getattr(call, "__name__", None) or "the call")[:60]

    wanted = error if isinstance(error, tuple) else (error,)
    expected = " or ".join(e.__name__ for e in wanted)
    suffix = f". Hint: {hint}" if hint else ""
    try:
        result = call(*args, **kwargs)
    except wanted as raised:
        if match is not None and match not in str(raised):
            raise CheckFailed(
                f"{label()} raised {type(raised).__name__} as it should, but its message does not name "
                f"{match!r}: {str(raised)[:200]}" + suffix,
                f"{brief()} raised {type(raised).__name__} as it should, but its message does not name {match!r}"
            ) from raised
        return
    except Exception as other:
        if unanswered(other):  # a stub, not a known mistake (NotImplementedError is a RuntimeError)
            raise
        for mistake, kind in (mistakes or {}).items():
            if isinstance(other, kind):
                raise CheckFailed(
                    f"{label()} must raise {expected}, got {type(other).__name__} ({str(other)[:80]}), "
                    f"which matches a known mistake: {mistake}" + suffix,
                    f"{brief()} must raise {expected}, got {type(other).__name__}, which matches a known mistake: "
                    f"{mistake}"
                ) from other
        raise
    raise CheckFailed(f"{label()} must raise {expected}, but it returned {describe(result)}" + suffix,
                      f"{brief()} must raise {expected}, but it returned a value")
