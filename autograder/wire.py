"""Values across the sandbox's wall: JSON for structure, safetensors for tensors, never pickle.

A message is ``MAGIC``, the length of a JSON document, the document, and a safetensors blob
holding every tensor and array the document refers to. Decoding runs no code that the
sender chose: JSON and safetensors are plain data formats, dataclasses are rebuilt only
from classes the receiver already has, and exceptions only as built-in types.

This module is also sent, as source, into the learner's process (which cannot import the
grader), so it depends on nothing but the standard library, torch, numpy and safetensors.
"""
import base64
import collections
import dataclasses
import json
import math
import struct
import sys

MAGIC = b"MLW1"
MAX_DEPTH = 64
MAX_ITEMS = 1_000_000


class WireError(ValueError):
    """A value that cannot cross, or a message that is not well formed."""


def _torch():
    import torch
    return torch


def _numpy():
    import numpy
    return numpy


def _is_plain_iterator(value) -> bool:
    import types
    return isinstance(value, (types.GeneratorType, map, filter, zip, enumerate, reversed)) or (
        type(value).__name__.endswith("iterator") and hasattr(value, "__next__"))


def _is_namedtuple(value) -> bool:
    return isinstance(value, tuple) and hasattr(type(value), "_fields") and hasattr(value, "_asdict")


class Encoder:
    """Turns a value into (document, tensors).

    ``register(value)`` makes a handle (a dict with an ``id``) of a value that is not data;
    ``handle_of(value)`` returns the handle id of a value that stands for a remote object.
    """

    def __init__(self, register=None, handle_of=None):
        self.tensors = {}
        self.register = register
        self.handle_of = handle_of
        self.items = 0

    def encode(self, value, depth=0):
        self.items += 1
        if depth > MAX_DEPTH or self.items > MAX_ITEMS:
            raise WireError("the value is nested too deeply or holds too many items")
        if value is None or type(value) is bool or type(value) is str:
            return value
        if self.handle_of is not None:
            handle = self.handle_of(value)
            if handle is not None:
                return {"$": "handle", "id": int(handle)}
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            value = float(value)
            if math.isfinite(value):
                return value
            return {"$": "float", "v": repr(value)}
        if isinstance(value, complex):
            return {"$": "complex", "v": [self.encode(value.real), self.encode(value.imag)]}
        if isinstance(value, str):
            return str(value)
        if isinstance(value, (bytes, bytearray)):
            return {"$": "bytes", "v": base64.b64encode(bytes(value)).decode()}
        if "torch" in sys.modules:
            encoded = self._torch_value(value)
            if encoded is not None:
                return encoded
        if "numpy" in sys.modules:
            encoded = self._numpy_value(value, depth)
            if encoded is not None:
                return encoded
        if _is_namedtuple(value):
            return {"$": "namedtuple", "name": type(value).__name__, "fields": list(type(value)._fields),
                    "v": [self.encode(v, depth + 1) for v in value]}
        if isinstance(value, list):
            return [self.encode(v, depth + 1) for v in value]
        if isinstance(value, tuple):
            return {"$": "tuple", "v": [self.encode(v, depth + 1) for v in value]}
        if isinstance(value, (set, frozenset)):
            return {"$": type(value).__name__ if type(value) in (set, frozenset) else "set",
                    "v": [self.encode(v, depth + 1) for v in value]}
        if isinstance(value, dict):
            return {"$": "dict", "ordered": isinstance(value, collections.OrderedDict),
                    "k": [self.encode(k, depth + 1) for k in value.keys()],
                    "v": [self.encode(v, depth + 1) for v in value.values()]}
        if isinstance(value, slice):
            return {"$": "slice", "v": [self.encode(v, depth + 1) for v in (value.start, value.stop, value.step)]}
        if isinstance(value, range):
            return {"$": "range", "v": [value.start, value.stop, value.step]}
        if value is Ellipsis:
            return {"$": "ellipsis"}
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {"$": "dataclass", "name": type(value).__name__,
                    "fields": {f.name: self.encode(getattr(value, f.name), depth + 1)
                               for f in dataclasses.fields(value)}}
        if self.register is None and _is_plain_iterator(value):
            # A generator or iterator of data crosses as its items (it is consumed here).
            items = []
            for item in value:
                items.append(self.encode(item, depth + 1))
                if len(items) > MAX_ITEMS:
                    raise WireError("the iterator yields too many items")
            return {"$": "iter", "v": items}
        if self.register is not None:
            return {"$": "handle", **self.register(value)}
        raise WireError(f"a value of type {type(value).__name__} cannot be sent to the learner's code "
                        "(only tensors, arrays, numbers, strings, containers and dataclasses can)")

    def _store(self, tensor):
        key = str(len(self.tensors))
        self.tensors[key] = tensor
        return key

    def _torch_value(self, value):
        torch = _torch()
        if isinstance(value, torch.Tensor):
            tensor = value.detach()
            if tensor.layout != torch.strided:
                tensor = tensor.to_dense()
            if tensor.device.type == "meta":
                return {"$": "meta", "shape": list(tensor.shape), "dtype": str(tensor.dtype).split(".")[-1]}
            tensor = tensor.cpu()
            if type(tensor) is not torch.Tensor:
                tensor = tensor.as_subclass(torch.Tensor)
            entry = {"$": "tensor", "grad": bool(value.requires_grad)}
            if tensor.is_complex():
                tensor, entry["complex"] = torch.view_as_real(tensor), True
            entry["i"] = self._store(tensor.contiguous().clone())
            return entry
        if isinstance(value, torch.dtype):
            return {"$": "dtype", "v": str(value).split(".")[-1]}
        if isinstance(value, torch.device):
            return {"$": "device", "v": str(value)}
        if isinstance(value, torch.Size):
            return {"$": "size", "v": [int(v) for v in value]}
        return None

    def _numpy_value(self, value, depth):
        np = _numpy()
        if isinstance(value, np.ndarray):
            if value.dtype == object:
                return {"$": "ndarray-object", "shape": list(value.shape),
                        "v": [self.encode(v, depth + 1) for v in value.ravel().tolist()]}
            torch = _torch()
            return {"$": "ndarray", "i": self._store(torch.from_numpy(np.ascontiguousarray(value).copy()))}
        if isinstance(value, np.generic):
            return {"$": "npscalar", "dtype": str(value.dtype), "v": self.encode(value.item(), depth + 1)}
        if isinstance(value, np.dtype):
            return {"$": "npdtype", "v": str(value)}
        return None


def dumps(value, register=None, handle_of=None) -> bytes:
    """One message holding ``value``."""
    encoder = Encoder(register, handle_of)
    document = json.dumps(encoder.encode(value), allow_nan=False).encode()
    blob = b""
    if encoder.tensors:
        from safetensors.torch import save
        blob = save(encoder.tensors)
    return MAGIC + struct.pack("<Q", len(document)) + document + blob


class Decoder:
    """Rebuilds a value from (document, tensors).

    ``make_handle(entry)`` turns a handle into an object; ``find_class(name)`` returns a
    dataclass the receiver knows by that name (or None).
    """

    def __init__(self, tensors, make_handle=None, find_class=None, rebuild_dataclass=None):
        self.tensors = tensors
        self.make_handle = make_handle
        self.find_class = find_class
        self.rebuild_dataclass = rebuild_dataclass
        self.items = 0

    def decode(self, node, depth=0):
        self.items += 1
        if depth > MAX_DEPTH or self.items > MAX_ITEMS:
            raise WireError("the message is nested too deeply or holds too many items")
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if isinstance(node, list):
            return [self.decode(v, depth + 1) for v in node]
        if not isinstance(node, dict) or not isinstance(node.get("$"), str):
            raise WireError("malformed message")
        kind = node["$"]
        value = node.get("v")
        if kind == "float":
            if value not in ("nan", "inf", "-inf"):
                raise WireError("malformed float")
            return float(value)
        if kind == "complex":
            return complex(float(self.decode(value[0])), float(self.decode(value[1])))
        if kind == "bytes":
            return base64.b64decode(str(value))
        if kind == "tuple":
            return tuple(self.decode(v, depth + 1) for v in self._list(value))
        if kind == "iter":
            return iter([self.decode(v, depth + 1) for v in self._list(value)])
        if kind in ("set", "frozenset"):
            items = [self.decode(v, depth + 1) for v in self._list(value)]
            return set(items) if kind == "set" else frozenset(items)
        if kind == "dict":
            keys = [self.decode(k, depth + 1) for k in self._list(node.get("k"))]
            values = [self.decode(v, depth + 1) for v in self._list(value)]
            if len(keys) != len(values):
                raise WireError("malformed dict")
            return (collections.OrderedDict if node.get("ordered") else dict)(zip(keys, values))
        if kind == "namedtuple":
            fields = [str(f) for f in self._list(node.get("fields"))]
            cls = collections.namedtuple(str(node.get("name", "namedtuple")), fields)
            return cls(*[self.decode(v, depth + 1) for v in self._list(value)])
        if kind == "slice":
            return slice(*[self.decode(v, depth + 1) for v in self._list(value)])
        if kind == "range":
            return range(*[int(v) for v in self._list(value)])
        if kind == "ellipsis":
            return Ellipsis
        if kind == "tensor":
            tensor = self._tensor(node.get("i"))
            torch = _torch()
            if node.get("complex"):
                tensor = torch.view_as_complex(tensor)
            if node.get("grad") and (tensor.is_floating_point() or tensor.is_complex()):
                tensor.requires_grad_(True)
            return tensor
        if kind == "meta":
            torch = _torch()
            return torch.empty([int(s) for s in self._list(node.get("shape"))], dtype=self._dtype(node.get("dtype")),
                               device="meta")
        if kind == "ndarray":
            return self._tensor(node.get("i")).numpy()
        if kind == "ndarray-object":
            np = _numpy()
            array = np.empty(len(self._list(value)), dtype=object)
            array[:] = [self.decode(v, depth + 1) for v in value]
            return array.reshape([int(s) for s in self._list(node.get("shape"))])
        if kind == "npscalar":
            np = _numpy()
            return np.dtype(str(node.get("dtype"))).type(self.decode(value, depth + 1))
        if kind == "npdtype":
            return _numpy().dtype(str(value))
        if kind == "dtype":
            return self._dtype(value)
        if kind == "device":
            return _torch().device(str(value))
        if kind == "size":
            return _torch().Size([int(v) for v in self._list(value)])
        if kind == "dataclass":
            name = str(node.get("name"))
            fields = node.get("fields")
            if not isinstance(fields, dict):
                raise WireError("malformed dataclass")
            values = {str(k): self.decode(v, depth + 1) for k, v in fields.items()}
            cls = self.find_class(name) if self.find_class else None
            if cls is None:
                raise WireError(f"a {name} cannot be rebuilt here: no dataclass of that name")
            return (self.rebuild_dataclass or _rebuild)(cls, values)
        if kind == "handle":
            if self.make_handle is None:
                raise WireError("a reference to an object cannot cross here")
            return self.make_handle(node)
        raise WireError(f"unknown kind of value {kind!r}")

    @staticmethod
    def _list(value):
        if not isinstance(value, list):
            raise WireError("malformed message")
        return value

    @staticmethod
    def _dtype(name):
        torch = _torch()
        dtype = getattr(torch, str(name), None)
        if not isinstance(dtype, torch.dtype):
            raise WireError(f"unknown dtype {name!r}")
        return dtype

    def _tensor(self, key):
        if not isinstance(key, str) or key not in self.tensors:
            raise WireError("a tensor is missing from the message")
        return self.tensors[key]


def _rebuild(cls, values):
    """A dataclass instance from field values, without running any of its code."""
    names = [f.name for f in dataclasses.fields(cls)]
    if set(values) != set(names):
        raise WireError(f"a {cls.__name__} needs the fields {names}, got {sorted(values)}")
    instance = object.__new__(cls)
    for name in names:
        object.__setattr__(instance, name, values[name])
    return instance


def loads(data: bytes, make_handle=None, find_class=None, rebuild_dataclass=None):
    """The value of one message (see :func:`dumps`)."""
    if not isinstance(data, (bytes, bytearray)) or data[:4] != MAGIC or len(data) < 12:
        raise WireError("not a message of the grader's format")
    (length,) = struct.unpack("<Q", bytes(data[4:12]))
    if length > len(data) - 12:
        raise WireError("truncated message")
    try:
        document = json.loads(bytes(data[12:12 + length]).decode())
    except (ValueError, RecursionError) as error:
        raise WireError(f"malformed message: {error}") from None
    blob = bytes(data[12 + length:])
    tensors = {}
    if blob:
        from safetensors.torch import load
        try:
            tensors = load(blob)
        except Exception as error:
            raise WireError(f"malformed tensors: {error}") from None
    try:
        return Decoder(tensors, make_handle, find_class, rebuild_dataclass).decode(document)
    except RecursionError:
        raise WireError("the message is nested too deeply") from None
