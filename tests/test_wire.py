"""The wire between the learner's process and the judge: data only, never code."""
import collections
import dataclasses
import math
import struct

import numpy as np
import pytest
import torch

from autograder import wire


@dataclasses.dataclass(frozen=True)
class Config:
    width: int = 4
    name: str = "x"

    def __post_init__(self):
        if self.width > 100:
            raise ValueError("too wide")


def roundtrip(value, **kwargs):
    return wire.loads(wire.dumps(value), **kwargs)


@pytest.mark.parametrize("value", [
    None, True, 0, -3, 2**80, 1.5, float("inf"), "text", b"\x00\xff", [1, [2, 3]], (1, "a"), {1, 2},
    frozenset({"a"}), {"a": 1, (1, 2): [3]}, collections.OrderedDict(b=1, a=2), slice(1, None, 2), range(3, 9),
    Ellipsis, 1 + 2j, torch.float16, torch.device("cpu"), torch.Size([2, 3]), np.float32(1.5), np.int64(7),
])
def test_plain_values_cross_unchanged(value):
    back = roundtrip(value)
    assert back == value and type(back) is type(value)


def test_nan_crosses():
    assert math.isnan(roundtrip(float("nan")))


@pytest.mark.parametrize("tensor", [
    torch.randn(3, 4), torch.arange(6).reshape(2, 3).t(), torch.tensor([True, False]), torch.zeros(0, 5),
    torch.randn(2, 2, dtype=torch.complex64), torch.randn(3).to(torch.bfloat16), torch.tensor(3.5),
])
def test_tensors_cross_as_plain_tensors(tensor):
    back = roundtrip(tensor)
    assert type(back) is torch.Tensor and back.dtype == tensor.dtype and back.shape == tensor.shape
    assert torch.equal(back, tensor)


def test_tensor_subclasses_and_parameters_arrive_as_plain_tensors():
    class Marked(torch.Tensor):
        pass

    value = {"p": torch.nn.Parameter(torch.ones(2)), "m": torch.ones(2).as_subclass(Marked)}
    back = roundtrip(value)
    assert type(back["p"]) is torch.Tensor and back["p"].requires_grad
    assert type(back["m"]) is torch.Tensor


def test_arrays_meta_tensors_and_iterators():
    array = np.arange(12, dtype=np.int16).reshape(3, 4)
    back = roundtrip(array)
    assert isinstance(back, np.ndarray) and back.dtype == np.int16 and (back == array).all()
    meta = roundtrip(torch.empty(5, 7, device="meta"))
    assert meta.device.type == "meta" and meta.shape == (5, 7)
    iterator = roundtrip(x * 2 for x in range(3))
    assert iter(iterator) is iterator and list(iterator) == [0, 2, 4]


def test_dataclasses_are_rebuilt_from_the_receivers_class_without_running_its_code():
    document = wire.dumps(Config(width=4))[12:].replace(b'"width": 4', b'"width": 999')
    bad = wire.MAGIC + struct.pack("<Q", len(document)) + document
    back = wire.loads(bad, find_class={"Config": Config}.get)
    assert isinstance(back, Config) and back.width == 999, "no __post_init__ ran"
    with pytest.raises(wire.WireError, match="no dataclass of that name"):
        wire.loads(wire.dumps(Config()), find_class=lambda name: None)


def test_namedtuples_cross_as_namedtuples():
    point = collections.namedtuple("Point", "x y")(1, 2)
    back = roundtrip(point)
    assert back == (1, 2) and back.x == 1 and type(back).__name__ == "Point"


def test_objects_that_are_not_data_do_not_cross_without_a_handle_table():
    with pytest.raises(wire.WireError, match="cannot be sent"):
        wire.dumps(torch.nn.Linear(2, 2))
    handles = {}
    message = wire.dumps([torch.nn.Linear(2, 2)], register=lambda v: handles.setdefault("h", {"id": 1}))
    back = wire.loads(message, make_handle=lambda entry: ("handle", entry["id"]))
    assert back == [("handle", 1)]
    with pytest.raises(wire.WireError, match="cannot cross"):
        wire.loads(message)


@pytest.mark.parametrize("message", [
    b"",
    b"pickle\x80\x04",
    wire.MAGIC + struct.pack("<Q", 10**9) + b"{}",
    wire.MAGIC + struct.pack("<Q", 2) + b"{]",
    wire.MAGIC + struct.pack("<Q", 9) + b'{"$": 1}',
    wire.MAGIC + struct.pack("<Q", 22) + b'{"$": "tensor", "i": 0}',
    wire.MAGIC + struct.pack("<Q", 27) + b'{"$": "dtype", "v": "Tensor"}',
    wire.MAGIC + struct.pack("<Q", 34) + b'{"$": "float", "v": "__import__"}',
    wire.MAGIC + struct.pack("<Q", 2) + b"{}" + b"not safetensors",
])
def test_malformed_messages_are_refused(message):
    with pytest.raises(wire.WireError):
        wire.loads(message)


def test_deep_nesting_is_refused_both_ways():
    deep = []
    for _ in range(200):
        deep = [deep]
    with pytest.raises(wire.WireError, match="nested"):
        wire.dumps(deep)
    document = b"[" * 5000 + b"]" * 5000
    with pytest.raises(wire.WireError):
        wire.loads(wire.MAGIC + struct.pack("<Q", len(document)) + document)


def _in_place_verdict(function, *args, **kwargs):
    """What the learner's side of a call says about ``function(*args, **kwargs)``."""
    from autograder import server

    namespace = {"f": function}
    handler = server.Server(wire, namespace, "", "")
    try:
        handler.dispatch({"op": "call", "name": "f", "args": list(args), "kwargs": kwargs})
    except server.InPlaceModification as error:
        return str(error)
    return "unchanged"


@pytest.mark.parametrize("function, args, kwargs, where", [
    (lambda x: x.mul_(2), (torch.ones(3),), {}, "argument 1"),
    (lambda x, y: x + y.add_(1), (torch.ones(2), torch.ones(2)), {}, "argument 2"),
    (lambda ids: ids.append(3) or ids, ([1, 2],), {}, "argument 1"),
    (lambda counts: counts.pop((1, 2)), ({(1, 2): 3, (2, 3): 1},), {}, "argument 1"),
    (lambda words: words[0].__setitem__(0, 9), ([[1, 2], [3]],), {}, "argument 1"),
    (lambda a: a.fill(0), (np.arange(3.0),), {}, "argument 1"),
    (lambda s: s.add(4), ({1, 2},), {}, "argument 1"),
    (lambda x, mask=None: mask.fill_(False), (torch.ones(2),), {"mask": torch.ones(2, dtype=torch.bool)}, "argument mask="),
])
def test_a_call_that_changes_an_argument_in_place_is_refused(function, args, kwargs, where):
    assert f"changed its {where} in place" in _in_place_verdict(function, *args, **kwargs)


@pytest.mark.parametrize("function, args", [
    (lambda x: x * 2, (torch.tensor([float("nan"), 1.0]),)),
    (lambda ids: ids + [3], ([1, 2],)),
    (lambda counts: dict(counts, extra=1), ({"a": 1},)),
    (lambda a: a.sum(), (np.array([np.nan, 1.0]),)),
    (lambda n, text: text * n, (3, "ab")),
])
def test_a_call_that_leaves_its_arguments_alone_passes(function, args):
    assert _in_place_verdict(function, *args) == "unchanged"
