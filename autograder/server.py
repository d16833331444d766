"""The learner's side of a call: runs inside the learner's kernel, in the sandbox.

The judge asks for a call by writing a request file and executing
``__grader_serve__("<id>")`` in the learner's kernel; the answer is written to a reply
file. Everything here runs in the learner's process, which the learner controls: nothing
it sends back is trusted beyond being data (see ``wire``). This file is sent as source,
together with ``wire.py``; it must not import the grader.
"""
import os
import sys
import traceback

MAX_MESSAGE = 4000
MAX_ITEMS_ITERATED = 100_000


def _safe_str(value, limit=MAX_MESSAGE):
    try:
        text = str(value)
    except BaseException:
        text = f"<{type(value).__name__} that cannot be printed>"
    return text[:limit]


class InPlaceModification(Exception):
    """A learner's function changed an argument it was given (a tensor, array, list, dict or set)."""


def _copy(value):
    """A copy of an argument deep enough to tell afterwards whether it was changed."""
    torch, numpy = sys.modules.get("torch"), sys.modules.get("numpy")
    if torch is not None and isinstance(value, torch.Tensor):
        return value.detach().clone()
    if numpy is not None and isinstance(value, numpy.ndarray):
        return value.copy()
    if isinstance(value, (list, tuple)):
        return type(value)(_copy(item) for item in value) if type(value) in (list, tuple) else value
    if type(value) is dict:
        return {key: _copy(item) for key, item in value.items()}
    if type(value) is set:
        return set(value)
    return value  # numbers and strings cannot change; other objects are not compared


def _unchanged(value, before) -> bool:
    torch, numpy = sys.modules.get("torch"), sys.modules.get("numpy")
    if torch is not None and isinstance(before, torch.Tensor):
        if value.shape != before.shape or value.dtype != before.dtype:
            return False
        if torch.equal(value, before):
            return True
        same = value == before
        if value.is_floating_point() or value.is_complex():
            same |= value.isnan() & before.isnan()
        return bool(same.all())
    if numpy is not None and isinstance(before, numpy.ndarray):
        return value.shape == before.shape and value.dtype == before.dtype and bool(
            numpy.array_equal(value, before, equal_nan=before.dtype.kind in "fc"))
    if type(before) in (list, tuple):
        return len(value) == len(before) and all(_unchanged(a, b) for a, b in zip(value, before))
    if type(before) is dict:
        return list(value) == list(before) and all(_unchanged(value[key], before[key]) for key in before)
    if type(before) is set:
        return value == before
    if type(before) in (int, float, complex, str, bytes, bool, type(None)):
        return type(value) is type(before) and (value == before or value != value and before != before)
    return True  # other objects are not compared


def _arguments(args, kwargs):
    """(description, argument) for every argument of a call."""
    return ([(f"its argument {index + 1}", value) for index, value in enumerate(args)]
            + [(f"its argument {name}=", value) for name, value in kwargs.items()])


class Server:
    def __init__(self, wire, namespace, req_dir, rep_dir):
        self.wire, self.ns, self.req, self.rep = wire, namespace, req_dir, rep_dir
        self.handles = {}

    # ----------------------------------------------------------------- handles
    def register(self, value):
        handle = len(self.handles) + 1
        self.handles[handle] = value
        return {"id": handle, "type": type(value).__name__ if not isinstance(value, type) else value.__name__,
                "callable": callable(value), "is_class": isinstance(value, type)}

    def resolve(self, entry):
        handle = entry.get("id")
        if handle not in self.handles:
            raise LookupError(f"unknown object reference {handle!r}")
        return self.handles[handle]

    def find_class(self, name):
        import dataclasses
        cls = self.ns.get(name)
        return cls if isinstance(cls, type) and dataclasses.is_dataclass(cls) else None

    @staticmethod
    def construct(cls, values):
        try:
            return cls(**values)
        except TypeError:
            instance = object.__new__(cls)
            for name, value in values.items():
                object.__setattr__(instance, name, value)
            return instance

    # ----------------------------------------------------------------- requests
    def target(self, request):
        if "name" in request:
            name = request["name"]
            if name not in self.ns:
                raise NameError(f"name {name!r} is not defined in your notebook")
            return self.ns[name]
        return self.resolve({"id": request.get("handle")})

    def describe(self, name):
        if name not in self.ns:
            return {"kind": "missing"}
        value = self.ns[name]
        info = {"module": _safe_str(getattr(value, "__module__", ""), 200)}
        code = getattr(value, "__code__", None) or getattr(getattr(value, "__init__", None), "__code__", None)
        if code is not None:
            info["file"] = _safe_str(code.co_filename, 500)
        if isinstance(value, type):
            return {"kind": "class", "value": value, **info}
        if callable(value):
            return {"kind": "callable", "value": value, **info}
        try:
            self.wire.Encoder().encode(value)
        except Exception:
            return {"kind": "object", "value": value, **info}
        return {"kind": "data", "value": value}

    def dispatch(self, request):
        op = request.get("op")
        if op == "describe":
            return {name: self.describe(name) for name in request["names"]}
        return self.run(op, self.target(request), request)

    def run(self, op, target, request):
        if op in ("call", "steps"):
            args, kwargs = request.get("args", []), request.get("kwargs", {})
            kept = [(where, argument, _copy(argument)) for where, argument in _arguments(args, kwargs)]
            if op == "steps":  # the Python lines the call runs in the learner's code, for a check that it is vectorised
                from course_runtime.opcount import python_steps
                steps, value = python_steps(target, *args, **kwargs)
            else:
                value = target(*args, **kwargs)
            changed = [where for where, argument, before in kept if not _unchanged(argument, before)]
            if changed:
                raise InPlaceModification(
                    f"it changed {', '.join(changed)} in place; the function must leave its inputs "
                    f"unchanged and return new values (copy or clone first, or build a new list, "
                    f"dict or tensor)")
            return {"steps": steps, "value": value} if op == "steps" else value
        if op == "getattr":
            return getattr(target, request["attr"])
        if op == "setattr":
            setattr(target, request["attr"], request["value"])
            return None
        if op == "iter":
            items = []
            for item in target:
                items.append(item)
                if len(items) > MAX_ITEMS_ITERATED:
                    raise ValueError(f"more than {MAX_ITEMS_ITERATED} items")
            return items
        if op == "len":
            return len(target)
        if op == "getitem":
            return target[request["key"]]
        if op == "repr":
            return _safe_str(repr(target))
        raise ValueError(f"unknown operation {op!r}")

    def serve(self, call_id):
        if not call_id.isalnum():
            return
        try:
            with open(os.path.join(self.req, call_id), "rb") as stream:
                data = stream.read()
            request = self.wire.loads(data, make_handle=self.resolve, find_class=self.find_class,
                                      rebuild_dataclass=self.construct)
            value = self.dispatch(request)
            reply = self.wire.dumps({"ok": True, "value": value}, register=self.register)
        except BaseException as error:  # the learner's code may raise anything, even SystemExit
            frames = []
            for frame in traceback.extract_tb(error.__traceback__)[1:][-3:]:
                if frame.filename == __file__ or "<grader" in frame.filename:
                    continue
                frames.append({"name": frame.name, "line": frame.lineno, "code": _safe_str(frame.line, 300)})
            reply = self.wire.dumps({"ok": False, "type": type(error).__name__, "message": _safe_str(error),
                                     "frames": frames})
        temporary = os.path.join(self.rep, "." + call_id)
        try:
            with open(temporary, "wb") as stream:
                stream.write(reply)
        except OSError as error:  # too large for the sandbox's file size limit, most likely
            reply = self.wire.dumps({"ok": False, "type": "ValueError", "frames": [],
                                     "message": f"the value returned could not be sent to the grader "
                                                f"({len(reply):,} bytes: {_safe_str(error, 200)})"})
            with open(temporary, "wb") as stream:
                stream.write(reply)
        os.replace(temporary, os.path.join(self.rep, call_id))


BOOT = """
def __grader_boot(wire_source, server_source, req_dir, rep_dir):
    import sys, types
    wire = types.ModuleType("_grader_wire")
    exec(compile(wire_source, "<grader wire>", "exec"), wire.__dict__)
    server = {"__name__": "_grader_server", "__file__": "<grader server>"}
    exec(compile(server_source, "<grader server>", "exec"), server)
    shell = get_ipython()
    shell.user_ns["__grader_serve__"] = server["Server"](wire, shell.user_ns, req_dir, rep_dir).serve
__grader_boot(WIRE, SERVER, REQ, REP)
del __grader_boot
"""


def boot_code(req_dir: str, rep_dir: str) -> str:
    """The code that installs the server in the learner's kernel."""
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "wire.py"), encoding="utf-8") as stream:
        wire_source = stream.read()
    with open(os.path.join(here, "server.py"), encoding="utf-8") as stream:
        server_source = stream.read()
    values = {"WIRE": wire_source, "SERVER": server_source, "REQ": req_dir, "REP": rep_dir}
    return BOOT.replace("(WIRE, SERVER, REQ, REP)", "(" + ", ".join(repr(values[k]) for k in values) + ")")
