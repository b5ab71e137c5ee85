"""Loads ``sluice.py`` against fakes of the modules componentize-py generates.

The SDK imports ``componentize_py_types`` and ``wit_world.imports.*`` (the
bindings of the world it is built against). Here each test gets a fresh
copy of the SDK over fakes that record the calls and answer as the host
would, so the SDK's own logic (conversions, error mapping, the HTTP
client's redirects and stream handling) runs on CPython. What the host
itself does is tested end to end (tests/tests/handler_languages.rs).
"""

import importlib.util
import pathlib
import sys
import types
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import pytest

SDK = pathlib.Path(__file__).resolve().parent.parent / "sluice.py"

T = TypeVar("T")


@dataclass
class Ok(Generic[T]):
    value: Any


@dataclass
class Err(Exception):
    value: Any


def _variants(module, prefix, names, payload=True):
    for name in names:
        fields = {"__annotations__": {"value": Any}} if payload else {}
        cls = dataclass(type(f"{prefix}_{name}", (), fields))
        setattr(module, f"{prefix}_{name}", cls)


def _types_module():
    m = types.ModuleType("types")

    @dataclass
    class Emit:
        topic: str
        key: Any
        headers: Any
        payload: bytes

    m.Emit = Emit
    _variants(m, "HandlerError", ["Retry", "Reject"])
    return m


def _host_module():
    m = types.ModuleType("host")

    class Level:
        TRACE, DEBUG, INFO, WARN, ERROR = range(5)

    m.Level = Level
    m.lines = []
    m.config = {}
    m.log = lambda level, text: m.lines.append((level, text))
    m.config_get = lambda key: m.config.get(key)
    return m


class FakeState(types.ModuleType):
    """``wit_world.imports.state`` over a dict: each call is recorded, and
    ``fail`` makes the next call fail with the given variant."""

    def __init__(self):
        super().__init__("state")
        _variants(self, "StateError", ["NotGranted", "StoreFull", "Invalid", "Unavailable"])

        @dataclass
        class Entry:
            value: bytes
            revision: int

        self.Entry = Entry
        self.store = {}
        self.calls = []
        self.fail = None

    def _answer(self, name, *args):
        self.calls.append((name, *args))
        if self.fail is not None:
            fail, self.fail = self.fail, None
            raise Err(fail)

    def get(self, key):
        self._answer("get", key)
        return self.store.get(key)

    def set(self, key, value, ttl_ms):
        self._answer("set", key, value, ttl_ms)
        self.store[key] = self.Entry(value, 2**64 - 1)

    def delete(self, key):
        self._answer("delete", key)
        self.store.pop(key, None)

    def compare_and_set(self, key, revision, value, ttl_ms):
        self._answer("compare_and_set", key, revision, value, ttl_ms)
        current = self.store.get(key)
        if (current.revision if current else 0) != revision:
            return False
        self.store[key] = self.Entry(value, 2**64 - 1)
        return True

    def increment(self, key, delta):
        self._answer("increment", key, delta)
        current = self.store.get(key)
        n = int(current.value) if current else 0
        self.store[key] = self.Entry(str(n + delta).encode(), 2**64 - 1)
        return n + delta

    def list(self, prefix, limit):
        self._answer("list", prefix, limit)
        return sorted(k for k in self.store if k.startswith(prefix))[:limit]


class FakeSecrets(types.ModuleType):
    def __init__(self):
        super().__init__("secrets")
        _variants(self, "SecretError", ["NotGranted"])
        self.values = {}

    def get(self, name):
        if name not in self.values:
            raise Err(self.SecretError_NotGranted(f"stage `s` does not list `{name}`"))
        return self.values[name]


class Resource:
    """A resource whose drop (``with``'s exit) is recorded in order."""

    drops = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        Resource.drops.append(type(self).__name__)
        return None


def _http_modules():
    """Fakes of ``wasi_http_types``, ``streams``, ``poll`` and
    ``outgoing_handler``: ``handler.answers`` is a list of what each
    request gets (a ``(status, headers, body)`` or an ``ErrorCode_*``),
    ``handler.sent`` what each request was."""
    t = types.ModuleType("wasi_http_types")
    for name in ["Get", "Head", "Post", "Put", "Delete", "Patch", "Options"]:
        setattr(t, f"Method_{name}", dataclass(type(f"Method_{name}", (), {})))
    _variants(t, "Method", ["Other"])
    for name in ["Http", "Https"]:
        setattr(t, f"Scheme_{name}", dataclass(type(f"Scheme_{name}", (), {})))
    _variants(
        t,
        "ErrorCode",
        [
            "HttpRequestDenied",
            "DestinationIpProhibited",
            "ConnectionTimeout",
            "ConnectionRefused",
            "HttpResponseTimeout",
            "InternalError",
        ],
    )
    streams = types.ModuleType("streams")
    _variants(streams, "StreamError", ["LastOperationFailed"])
    streams.StreamError_Closed = dataclass(type("StreamError_Closed", (), {}))
    poll = types.ModuleType("poll")

    class Fields(Resource):
        def __init__(self, entries=None):
            self._entries = list(entries or [])

        def append(self, name, value):
            assert isinstance(value, bytes), value
            self._entries.append((name, value))

        def entries(self):
            return list(self._entries)

    class OutputStream(Resource):
        def __init__(self, sink):
            self.sink = sink

        def blocking_write_and_flush(self, chunk):
            assert len(chunk) <= 4096, "wasi:io takes at most 4,096 bytes per blocking write"
            self.sink.append(bytes(chunk))

    class OutgoingBody(Resource):
        def __init__(self):
            self.chunks = []
            self.finished = False

        def write(self):
            return OutputStream(self.chunks)

        @classmethod
        def finish(cls, this, trailers):
            this.finished = True

    class OutgoingRequest(Resource):
        def __init__(self, headers):
            self.headers = headers
            self.method = self.scheme = self.authority = self.path = None
            self._body = OutgoingBody()

        def body(self):
            return self._body

        def set_method(self, m):
            self.method = m

        def set_scheme(self, s):
            self.scheme = s

        def set_authority(self, a):
            self.authority = a

        def set_path_with_query(self, p):
            self.path = p

    class RequestOptions(Resource):
        def __init__(self):
            self.connect = self.first_byte = None

        def set_connect_timeout(self, ns):
            self.connect = ns

        def set_first_byte_timeout(self, ns):
            self.first_byte = ns

    class InputStream(Resource):
        def __init__(self, body):
            self.left = body

        def blocking_read(self, n):
            if not self.left:
                raise Err(streams.StreamError_Closed())
            chunk, self.left = self.left[:n], self.left[n:]
            return chunk

    class IncomingBody(Resource):
        def __init__(self, body):
            self.body = body

        def stream(self):
            return InputStream(self.body)

    class IncomingResponse(Resource):
        def __init__(self, status, headers, body):
            self._status, self._headers, self._body = status, headers, body

        def status(self):
            return self._status

        def headers(self):
            return Fields([(n, v.encode()) for n, v in self._headers])

        def consume(self):
            return IncomingBody(self._body)

    class Pollable(Resource):
        def __init__(self, future):
            self.future = future

        def block(self):
            self.future.ready = True

    class FutureIncomingResponse(Resource):
        def __init__(self, answer):
            self.answer = answer
            # Not ready at first: the client must wait on its pollable.
            self.ready = False

        def subscribe(self):
            return Pollable(self)

        def get(self):
            if not self.ready:
                return None
            if isinstance(self.answer, tuple):
                return Ok(Ok(IncomingResponse(*self.answer)))
            return Ok(Err(self.answer))

    for cls in [Fields, OutgoingBody, OutgoingRequest, RequestOptions]:
        setattr(t, cls.__name__, cls)

    handler = types.ModuleType("outgoing_handler")
    handler.answers = []
    handler.sent = []

    def handle(request, options):
        handler.sent.append(
            {
                "method": type(request.method).__name__
                + (f"({request.method.value})" if hasattr(request.method, "value") else ""),
                "scheme": type(request.scheme).__name__,
                "authority": request.authority,
                "path": request.path,
                "headers": request.headers.entries(),
                "body": b"".join(request._body.chunks),
                "options": options,
            }
        )
        answer = handler.answers.pop(0)
        if isinstance(answer, tuple) or not answer.__class__.__name__.startswith("Refuse"):
            return FutureIncomingResponse(answer)
        raise Err(answer.code)

    handler.handle = handle
    return t, streams, poll, handler


def load_sdk(monkeypatch, *, state=False, secrets=False, http=False, qualified_types=False):
    """A fresh ``sluice`` module over fakes of the world's imports: the
    capabilities given are in the world, the others are not."""
    Resource.drops = []
    modules = {}
    cpt = types.ModuleType("componentize_py_types")
    cpt.Ok, cpt.Err = Ok, Err
    modules["componentize_py_types"] = cpt
    ww = types.ModuleType("wit_world")
    ww.__path__ = []
    imports = types.ModuleType("wit_world.imports")
    imports.__path__ = []
    modules["wit_world"] = ww
    modules["wit_world.imports"] = imports
    fakes = types.SimpleNamespace()
    fakes.host = _host_module()
    fakes.types = _types_module()
    world = {"host": fakes.host}
    # With wasi:http in the world, componentize-py names both `types`
    # interfaces by their package.
    world["sluice_plugin_types" if qualified_types else "types"] = fakes.types
    if state:
        fakes.state = FakeState()
        world["state"] = fakes.state
    if secrets:
        fakes.secrets = FakeSecrets()
        world["secrets"] = fakes.secrets
    if http:
        t, streams, poll, handler = _http_modules()
        fakes.http_types, fakes.handler = t, handler
        world.update(
            {"wasi_http_types": t, "streams": streams, "poll": poll, "outgoing_handler": handler}
        )
    for name, module in world.items():
        modules[f"wit_world.imports.{name}"] = module
        setattr(imports, name, module)
    for name in list(sys.modules):
        if name == "wit_world" or name.startswith("wit_world.") or name == "componentize_py_types":
            monkeypatch.delitem(sys.modules, name)
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    spec = importlib.util.spec_from_file_location("sluice_under_test", SDK)
    sdk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sdk)
    fakes.Ok, fakes.Err = Ok, Err
    return sdk, fakes


@pytest.fixture
def sdk(monkeypatch):
    """The SDK over a world with every capability."""
    return load_sdk(monkeypatch, state=True, secrets=True, http=True, qualified_types=True)


class Refuse:
    """An answer that ``outgoing-handler.handle`` itself fails with."""

    def __init__(self, code):
        self.code = code
