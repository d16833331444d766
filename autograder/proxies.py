"""The judge's stand-ins for what lives in the learner's process.

A name the learner's answers define is bound, in the judge, to its value when it is data,
or to a proxy that forwards each use (a call, an attribute, ``len``, iteration, indexing)
to the learner's process through :class:`autograder.remote.Remote`. A name the answers do
not define is bound to :class:`Missing`, whose every use fails with the reason.
"""
from __future__ import annotations

from .failures import StudentError, Unavailable

class Missing:
    """A name the learner's notebook does not define: any use fails with a clear reason."""

    def __init__(self, name: str):
        object.__setattr__(self, "_name", name)

    def _fail(self, *args, **kwargs):
        raise StudentError(f"{self._name} is not defined in your notebook (its answer cell did not define it)")

    __call__ = _fail

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        self._fail()

    def __repr__(self):
        return f"<{self._name}: not defined in your notebook>"


def _local_only(attr: str) -> bool:
    return (attr.startswith("__") and attr.endswith("__")) or attr.startswith("_repr_") or attr.startswith("_ipython")


class RemoteObject:
    """An object that lives in the learner's process; the judge holds a reference."""

    def __init__(self, remote, entry: dict, label: str | None = None):
        object.__setattr__(self, "_remote", remote)
        object.__setattr__(self, "_id", int(entry["id"]))
        object.__setattr__(self, "_type", str(entry.get("type", "object"))[:100])
        object.__setattr__(self, "_label", label or f"{str(entry.get('type', 'object'))[:100]} object")

    def __getattr__(self, attr):
        if _local_only(attr):
            raise AttributeError(attr)
        try:
            return self._remote.request("getattr", handle=self._id, attr=attr, label=f"{self._label}.{attr}")
        except StudentError as error:
            if isinstance(error, AttributeError):
                raise AttributeError(str(error)) from None
            raise

    def __setattr__(self, attr, value):
        self._remote.request("setattr", handle=self._id, attr=attr, value=value, label=f"{self._label}.{attr}")

    def __call__(self, *args, **kwargs):
        value = self._remote.request("call", handle=self._id, args=list(args), kwargs=kwargs, label=self._label)
        return value

    def _learner_pids(self) -> list[int] | None:
        """The processes that run this object's calls, for ``course_runtime.memory``: the
        learner's sandbox (None when the grader cannot tell them apart)."""
        return self._remote.learner_pids()

    def _call_counting_steps(self, *args, **kwargs) -> tuple[int, object]:
        """``(lines, result)`` of a call, its Python lines counted where it runs, in the
        learner's process (``course_runtime.opcount.python_steps`` there). The count is the
        learner's process's word: it can catch a loop, not a learner who hides one."""
        reply = self._remote.request("steps", handle=self._id, args=list(args), kwargs=kwargs, label=self._label)
        steps = reply.get("steps") if isinstance(reply, dict) else None
        if type(steps) is not int or steps < 0:
            raise StudentError(f"the lines that {self._label} ran could not be counted in your notebook's process")
        return steps, reply.get("value")

    def __len__(self):
        return self._remote.request("len", handle=self._id, label=f"len({self._label})")

    def __iter__(self):
        return iter(self._remote.request("iter", handle=self._id, label=f"iterating {self._label}"))

    def __getitem__(self, key):
        return self._remote.request("getitem", handle=self._id, key=key, label=f"{self._label}[...]")

    def __repr__(self):
        try:
            return str(self._remote.request("repr", handle=self._id, label=f"repr({self._label})"))[:2000]
        except StudentError:
            return f"<{self._label}>"


class RemoteClass(RemoteObject):
    """A class the learner defined: calling it builds an instance in the learner's process."""

    def __call__(self, *args, **kwargs):
        value = self._remote.request("call", handle=self._id, args=list(args), kwargs=kwargs, label=self._label)
        if isinstance(value, RemoteObject):
            object.__setattr__(value, "_label", f"{self._label} instance")
        return value

    def __instancecheck__(self, instance):
        return isinstance(instance, RemoteObject) and instance._type == self._type

    def __repr__(self):
        return f"<your class {self._label}>"



def handle_of(value):
    """The learner's-process id of a proxy sent back in a call (None for data)."""
    return value._id if isinstance(value, RemoteObject) else None


def proxy_for(remote, entry: dict, label: str | None = None):
    """A proxy for the object ``entry`` describes in the learner's process."""
    if entry.get("is_class"):
        return RemoteClass(remote, entry, label or str(entry.get("type")))
    return RemoteObject(remote, entry, label)


# The checks' namespace: a dataclass that comes back from the learner's process is rebuilt
# only as the class of that name the checks themselves define.
_namespace: dict = {}


def use_namespace(namespace: dict) -> None:
    """Rebuild returned dataclasses from the classes of ``namespace`` (the checks' own)."""
    global _namespace
    _namespace = namespace


def find_dataclass(name: str):
    import dataclasses

    cls = _namespace.get(name)
    return cls if isinstance(cls, type) and dataclasses.is_dataclass(cls) and not isinstance(cls, RemoteObject) else None


def bind_answers(remote, names: list[str], namespace: dict) -> dict:
    """Bind each answer name in ``namespace``; what the learner's process said about each."""
    described = {}
    if not names:
        return described
    try:
        info = remote.request("describe", names=names, label="your answers")
    except StudentError as error:
        for name in names:
            namespace[name] = Unreachable(name, str(error))
            described[name] = {"kind": "unreachable", "detail": str(error)}
        return described
    for name in names:
        entry = info.get(name) if isinstance(info, dict) else None
        if not isinstance(entry, dict) or entry.get("kind") == "missing":
            namespace[name] = Missing(name)
            described[name] = {"kind": "missing"}
            continue
        kind = entry.get("kind")
        value = entry.get("value")
        if isinstance(value, RemoteObject):
            object.__setattr__(value, "_label", name)
        namespace[name] = value
        described[name] = {"kind": kind, "module": str(entry.get("module", ""))[:200],
                           "file": str(entry.get("file", ""))[:500]}
    return described


class Unreachable(Missing):
    def __init__(self, name: str, reason: str):
        super().__init__(name)
        object.__setattr__(self, "_reason", reason)

    def _fail(self, *args, **kwargs):
        raise Unavailable(self._reason)

    __call__ = _fail
