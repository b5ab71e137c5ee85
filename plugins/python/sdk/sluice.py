"""Write a Sluice stream handler in Python as one plain function.

A handler is a function from a message to what it emits::

    import sluice

    def handle(msg: sluice.Message):
        if not msg.payload:
            raise sluice.Reject("empty payload")      # dead-lettered now, as `rejected`
        return msg.text().upper()                     # one emit to the default output

    MessageHandler = sluice.handler(handle)

Build it with ``sluice plugin build`` (or ``componentize-py -d wit -w handler
componentize app -o handler.wasm``) and try it with ``sluice plugin test``.

What a handler may return (each emit is published only if the call succeeds):

- ``None`` or ``[]``: nothing is emitted; the message is done.
- ``bytes``/``bytearray``, ``str`` (UTF-8), or a ``dict``/``list`` that is
  not a list of emits (JSON-encoded): one emit to the stage's default output.
- an :class:`Emit`, or a list of emits and payloads.

An emit that gives no ``key`` or ``headers`` keeps the input message's.
``Emit(..., delay=90)`` (seconds or a ``timedelta``) or
``Emit(..., deliver_at="2026-11-27T09:00:00Z")`` asks the broker to hold it
until then.

How a handler fails:

- ``raise sluice.Reject(reason)``: permanent; the message goes to the stage's
  dead-letter stream now, with kind ``rejected`` and the reason.
- ``raise sluice.Retry()`` or ``sluice.Retry(after_ms)``: transient; the
  message is delivered again after the stage's backoff (or ``after_ms``), and
  dead-lettered with kind ``retry`` once ``max_attempts`` is spent.
- any other exception: a bug. Its traceback goes to the stage's log and the
  call traps; the runtime retries it and dead-letters it as ``trap``, quoting
  the traceback's first and last lines.

A batch handler (a stage with ``batch:``) takes a list of messages and returns
one result per message, in order: a value as above, or a ``Reject``/``Retry``
instance (returned, not raised) for that item alone::

    BatchMessageHandler = sluice.batch_handler(handle_batch)

Stage config (YAML ``config:``) is read with :func:`config`; logs go through
:func:`log` (or ``print``, which reaches the stage's log as stdout).

On contract 0.2.0 (a project with ``wit/v0.2/plugin.wit``), a stage can
grant capabilities in YAML, and the handler uses them through ``sluice``:

- ``sluice.state`` (``state: true``): the stage's key-value store, committed
  with the message's outputs and ack: ``get``, ``get_text``,
  ``set(key, value, ttl=)``, ``delete``, ``compare_and_set``, ``increment``,
  ``list(prefix, limit)``;
- ``sluice.secrets`` (``secrets: [name]``): ``get(name)``;
- ``sluice.http`` (``http: {allow: [host]}``): ``get(url, headers=,
  timeout=)``, ``post(url, body= or json=)``, ... returning a
  :class:`Response`.

Their errors are exceptions (:class:`StateError`, :class:`SecretError`,
:class:`HttpError` and their subclasses); one the handler does not catch
retries the message when a later attempt may work (a store full or
unavailable, a timeout, a failed connection) and rejects it otherwise.
"""

import json as _json
import math
import sys
import traceback
from datetime import datetime, timedelta, timezone

from componentize_py_types import Err, Ok
from wit_world.imports import host as _host

try:
    from wit_world.imports import types as _types
except ImportError:
    # A world that imports wasi:http too has two `types` interfaces, and
    # componentize-py names both by their package.
    from wit_world.imports import sluice_plugin_types as _types


def _optional_import(*names):
    """The first generated import module of ``names`` the world has, or None.

    Imported when the app is, so at build time: a capability the world does
    not import (a 0.1.0 project, or a handler that does not use it) is None.
    """
    for name in names:
        try:
            return __import__("wit_world.imports." + name, fromlist=[name])
        except ImportError:
            pass
    return None


_state = _optional_import("state")
_secrets = _optional_import("secrets")
_outgoing = _optional_import("outgoing_handler")
_http_types = _optional_import("wasi_http_types") if _outgoing is not None else None
_streams = _optional_import("streams") if _outgoing is not None else None

__all__ = [
    "CapabilityError",
    "DELAY_HEADER",
    "DELIVER_AT_HEADER",
    "Emit",
    "Message",
    "Reject",
    "Retry",
    "SecretError",
    "StateError",
    "batch_handler",
    "config",
    "handler",
    "http",
    "log",
    "secrets",
    "state",
]

# The input's key and headers, when an emit does not give its own.
_INHERIT = object()

# Reserved headers that ask the broker to hold an output (a header, so the
# WIT contract stays as it is). The runtime matches them in any case and
# removes them on publish.
DELAY_HEADER = "sluice-delay"
DELIVER_AT_HEADER = "sluice-deliver-at"
_DELAY_HEADERS = (DELAY_HEADER, DELIVER_AT_HEADER)


class Reject(Exception):
    """A permanent failure: dead-letter the message now, with this reason."""

    def __init__(self, reason="rejected"):
        super().__init__(reason)
        self.reason = str(reason)


class Retry(Exception):
    """A transient failure: deliver the message again later.

    ``after_ms`` overrides the stage's backoff for this retry (milliseconds).
    """

    def __init__(self, after_ms=None):
        super().__init__(after_ms)
        if after_ms is not None and (not isinstance(after_ms, int) or after_ms < 0):
            raise TypeError("Retry(after_ms) takes a whole number of milliseconds >= 0")
        self.after_ms = after_ms


class Emit:
    """One output message.

    ``topic=""`` is the stage's default output (its first ``publish:`` topic).
    ``payload`` is bytes, text (UTF-8) or a JSON-encodable value. ``key`` and
    ``headers`` (a dict or a list of pairs) default to the input's.

    ``delay`` (seconds, int or float, or a ``timedelta``) or ``deliver_at``
    (an aware ``datetime`` or an RFC 3339 string) asks the broker to deliver
    the emit later, through a ``sluice-delay`` or ``sluice-deliver-at``
    header that replaces any the headers carry. The runtime refuses more
    than 365 days ahead; a time already past means now.
    """

    __slots__ = ("payload", "topic", "key", "headers", "_delay_header")

    def __init__(
        self, payload, topic="", key=_INHERIT, headers=_INHERIT, *, delay=None, deliver_at=None
    ):
        self.payload = payload
        self.topic = topic
        self.key = key
        self.headers = headers
        # Checked here, so a bad value fails on the handler's own line.
        self._delay_header = _delay_header_of(delay, deliver_at)


class Message:
    """One delivered message.

    Attributes: ``id`` (stable across redeliveries: a safe idempotency key),
    ``topic``, ``key`` (or None), ``headers`` (a list of ``(name, value)``
    pairs, in order; names may repeat), ``payload`` (bytes), ``attempt``
    (1 on the first delivery) and ``published_at`` (ms since the epoch).
    """

    __slots__ = ("_raw",)

    def __init__(self, raw):
        self._raw = raw

    id = property(lambda self: self._raw.id)
    topic = property(lambda self: self._raw.topic)
    key = property(lambda self: self._raw.key)
    headers = property(lambda self: self._raw.headers)
    payload = property(lambda self: self._raw.payload)
    attempt = property(lambda self: self._raw.attempt)
    published_at = property(lambda self: self._raw.published_at)

    def text(self):
        """The payload as UTF-8 text; a payload that is not UTF-8 is rejected."""
        try:
            return self._raw.payload.decode("utf-8")
        except UnicodeDecodeError as e:
            raise Reject(f"payload is not UTF-8 text ({e})") from None

    def json(self):
        """The payload parsed as JSON; a payload that is not JSON is rejected."""
        try:
            return _json.loads(self._raw.payload)
        except ValueError as e:
            raise Reject(f"payload is not JSON ({e})") from None

    def header(self, name, default=None):
        """The first value of header ``name``, or ``default``."""
        for k, v in self._raw.headers:
            if k == name:
                return v
        return default


def config(key, default=None):
    """The stage's ``config:`` value for ``key``, or ``default`` when absent."""
    value = _host.config_get(key)
    return default if value is None else value


class _Log:
    """``sluice.log.info("...")`` and friends: lines in the daemon's log."""

    def trace(self, text):
        _host.log(_host.Level.TRACE, str(text))

    def debug(self, text):
        _host.log(_host.Level.DEBUG, str(text))

    def info(self, text):
        _host.log(_host.Level.INFO, str(text))

    def warn(self, text):
        _host.log(_host.Level.WARN, str(text))

    def error(self, text):
        _host.log(_host.Level.ERROR, str(text))


log = _Log()


# --- Capabilities (sluice:plugin@0.2.0) -------------------------------------
#
# Each is granted by the stage in YAML (`state: true`, `secrets: [...]`,
# `http: {allow: [...]}`), and a component imports only those its handler
# uses: `sluice plugin build` puts a capability in the world when the
# handler's source names it (`sluice.state`, `sluice.secrets`,
# `sluice.http`, or `from sluice import state`), so a handler that never
# reads a secret loads on a stage without `secrets:`.
#
# A capability's error that the handler does not catch settles the message
# as Rust's `?` does: what may work later (a store that cannot be read now
# or is full, a request that timed out or failed) is retried; what never
# will (a missing grant, an invalid key, a refused host or a bad URL) is
# rejected, with the reason.


def _missing(what, use):
    return RuntimeError(
        f"this component does not import {what}: `sluice plugin build` imports it when the "
        f"handler's source names `{use}` (a project on sluice:plugin@0.2.0, with "
        f"wit/v0.2/plugin.wit); reading it through another name hides it from the build"
    )


class CapabilityError(Exception):
    """A capability's error (state, secrets, HTTP): the host's reason under
    a prefix naming the kind, and whether an uncaught one retries the
    message (``retry``) or rejects it."""

    prefix = "capability error"
    retry = False

    def __init__(self, reason):
        super().__init__(reason)
        self.reason = str(reason)

    def __str__(self):
        return f"{self.prefix}: {self.reason}"


class StateError(CapabilityError):
    """Why a state operation failed; ``reason`` says why in the host's words.

    Its subclasses are the kinds: :class:`StateNotGranted` (the stage has no
    ``state:``), :class:`StateStoreFull` (the store is at its ``max_bytes``),
    :class:`StateInvalid` (a key or value the store does not take) and
    :class:`StateUnavailable` (the store cannot be read now). Uncaught in a
    handler, full and unavailable retry the message, the others reject it.
    """

    prefix = "state error"
    retry = False


class StateNotGranted(StateError):
    prefix = "state not granted"


class StateStoreFull(StateError):
    prefix = "state store full"
    retry = True


class StateInvalid(StateError):
    prefix = "invalid state operation"


class StateUnavailable(StateError):
    prefix = "state unavailable"
    retry = True


_STATE_ERRORS = {
    "NotGranted": StateNotGranted,
    "StoreFull": StateStoreFull,
    "Invalid": StateInvalid,
    "Unavailable": StateUnavailable,
}


class SecretError(CapabilityError):
    """Why a secret could not be read: :class:`SecretNotGranted`, the stage
    does not list it. Uncaught in a handler, it rejects the message (the
    reason names the secret, never a value)."""

    prefix = "secret error"
    retry = False


class SecretNotGranted(SecretError):
    prefix = "secret not granted"


def _variant_kind(value, prefix):
    """``StoreFull`` for a generated ``StateError_StoreFull(...)``."""
    name = type(value).__name__
    return name[len(prefix) :] if name.startswith(prefix) else name


def _state_error(err):
    """The :class:`StateError` for the host's ``Err(state-error)``."""
    value = err.value
    cls = _STATE_ERRORS.get(_variant_kind(value, "StateError_"), StateError)
    return cls(getattr(value, "value", value))


def _ttl_ms(ttl):
    """A TTL in seconds (int or float) or a ``timedelta``, in whole ms."""
    if ttl is None:
        return None
    if isinstance(ttl, timedelta):
        ms = ttl / timedelta(milliseconds=1)
    elif isinstance(ttl, (int, float)) and not isinstance(ttl, bool):
        ms = ttl * 1000
    else:
        raise TypeError(f"ttl takes seconds (int or float) or a timedelta, not {type(ttl).__name__}")
    if ms != ms or ms < 0:
        raise ValueError(f"ttl must be a number of seconds >= 0, not {ttl!r}")
    # Millisecond precision, saturating as the host's u64 does.
    return min(int(ms), 2**64 - 1) if ms != float("inf") else 2**64 - 1


def _value_bytes(value):
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    raise TypeError(f"a state value is bytes or str, not {type(value).__name__}")


class _State:
    """``sluice.state``: the stage's key-value store (``state: true``).

    A call's writes are buffered and the call reads its own writes; they
    commit with the message's outputs and its ack only if the call
    succeeds (no ``Reject``, ``Retry`` or exception), so a counter per key
    counts each message exactly once::

        n = sluice.state.increment(f"count/{msg.key}")

    Concurrency is optimistic: if a value the call read changed before the
    commit, the call runs again on the new value (kind ``state-conflict``).
    ``compare_and_set(key, 0, value, ttl=30)`` is an expiring lock. The
    ``batch-handler`` world has no state.
    """

    Error = StateError
    NotGranted = StateNotGranted
    StoreFull = StateStoreFull
    Invalid = StateInvalid
    Unavailable = StateUnavailable

    def _raw(self):
        if _state is None:
            raise _missing("sluice:plugin/state", "sluice.state")
        return _state

    def _call(self, name, *args):
        raw = self._raw()
        try:
            return getattr(raw, name)(*args)
        except Err as e:
            raise _state_error(e) from None

    def get(self, key):
        """The entry at ``key`` (``.value`` bytes, ``.revision``), or None if
        absent or expired. A value this call wrote has revision 2**64 - 1."""
        return self._call("get", key)

    def get_text(self, key):
        """The value at ``key`` as text, or None; a value that is not UTF-8
        raises :class:`StateInvalid`."""
        entry = self.get(key)
        if entry is None:
            return None
        try:
            return bytes(entry.value).decode("utf-8")
        except UnicodeDecodeError:
            raise StateInvalid(f"the value at `{key}` is not UTF-8") from None

    def set(self, key, value, ttl=None):
        """Sets ``key`` to ``value`` (bytes or str), expiring after ``ttl``
        (seconds or a ``timedelta``, millisecond precision) if given."""
        self._call("set", key, _value_bytes(value), _ttl_ms(ttl))

    def delete(self, key):
        """Deletes ``key`` (absent is fine)."""
        self._call("delete", key)

    def compare_and_set(self, key, revision, value, ttl=None):
        """Sets ``key`` to ``value`` only if its revision is still
        ``revision`` (0: only if absent); returns whether it did."""
        return self._call("compare_and_set", key, revision, _value_bytes(value), _ttl_ms(ttl))

    def increment(self, key, delta=1):
        """Adds ``delta`` to the decimal number at ``key`` (absent counts as
        0) and returns the new value; the value keeps its expiry."""
        return self._call("increment", key, delta)

    def list(self, prefix="", limit=1000):
        """The keys starting with ``prefix``, in order, at most ``limit``
        (at most 1,000)."""
        return self._call("list", prefix, limit)

    @staticmethod
    def describe(error):
        """What went wrong, in words."""
        return str(error)


state = _State()


class _Secrets:
    """``sluice.secrets``: the secrets the stage lists under ``secrets:``.

    The host removes every value from the handler's log lines, stdout,
    stderr and reject reasons. A secret that only goes into a request
    header need not be read at all: the stage's ``http.headers`` can put it
    in (``Bearer {secret:api_token}``), so the handler never holds it.
    """

    Error = SecretError
    NotGranted = SecretNotGranted

    def get(self, name):
        """The value of the secret ``name``; :class:`SecretNotGranted` when
        the stage does not list it."""
        if _secrets is None:
            raise _missing("sluice:plugin/secrets", "sluice.secrets")
        try:
            return _secrets.get(name)
        except Err as e:
            value = e.value
            if _variant_kind(value, "SecretError_") == "NotGranted":
                raise SecretNotGranted(value.value) from None
            raise SecretError(getattr(value, "value", value)) from None

    @staticmethod
    def describe(error):
        """What went wrong, in words."""
        return str(error)


secrets = _Secrets()


class HttpError(CapabilityError):
    """Why a request got no answer: :class:`Refused` (a host the stage's
    ``http.allow`` does not list, a redirect to one, or a private address),
    :class:`Timeout`, :class:`Failed` (connection, TLS, a host held after a
    ``Retry-After``) or :class:`InvalidUrl`. Uncaught in a handler, a
    timeout or failure retries the message; a refusal or bad URL rejects
    it. An answer with any status is not an error: check ``status``."""

    prefix = "request error"
    retry = False


class Refused(HttpError):
    prefix = "request refused"


class Timeout(HttpError):
    prefix = "request timed out"
    retry = True


class Failed(HttpError):
    prefix = "request failed"
    retry = True


class InvalidUrl(HttpError):
    prefix = "invalid URL"


class Response:
    """An answer, its body read in full: ``status``, ``headers`` (a list of
    ``(name, value)`` pairs, names lowercase, in order) and ``body``
    (bytes)."""

    __slots__ = ("status", "headers", "body")

    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers
        self.body = body

    def __repr__(self):
        return f"Response(status={self.status}, {len(self.body)} bytes)"

    @property
    def ok(self):
        """Whether the status is 2xx."""
        return 200 <= self.status < 300

    def header(self, name, default=None):
        """The first value of header ``name`` (any case), or ``default``."""
        name = name.lower()
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return default

    def text(self):
        """The body as text (invalid UTF-8 replaced)."""
        return self.body.decode("utf-8", errors="replace")

    def json(self):
        """The body parsed as JSON; a body that is not JSON rejects the
        message (raise it yourself to do otherwise: catch ``Reject``)."""
        try:
            return _json.loads(self.body)
        except ValueError as e:
            raise Reject(f"the answer is not the JSON expected: {e}") from None


# The largest chunk written to a request body at once (wasi:io allows 4,096
# bytes per blocking write).
_WRITE_CHUNK = 4096
_REDIRECTS = (301, 302, 303, 307, 308)
_NO_JSON = object()


def _split_url(url):
    """``(https, authority, path_with_query)`` of an http(s) URL."""
    if not isinstance(url, str):
        raise InvalidUrl(f"a URL is a str, not {type(url).__name__}")
    if url.startswith("https://"):
        https, rest = True, url[len("https://") :]
    elif url.startswith("http://"):
        https, rest = False, url[len("http://") :]
    else:
        raise InvalidUrl(f"`{url}` is not an http:// or https:// URL")
    end = len(rest)
    for c in "/?#":
        i = rest.find(c)
        if i != -1:
            end = min(end, i)
    authority, path = rest[:end], rest[end:]
    if not authority or "@" in authority:
        raise InvalidUrl(f"`{url}` has no host, or carries credentials (put those in headers)")
    path = path.split("#", 1)[0]
    if not path.startswith("/"):
        path = "/" + path
    return https, authority, path


def _redirect(response):
    """The ``Location`` of a redirect the client follows, or None."""
    if response.status in _REDIRECTS:
        return response.header("location")
    return None


def _resolve_location(base, location):
    """``location`` against the URL that answered it."""
    if location.startswith("http://") or location.startswith("https://"):
        return location
    https, authority, path = _split_url(base)
    scheme = "https" if https else "http"
    if location.startswith("//"):
        return f"{scheme}:{location}"
    if location.startswith("/"):
        return f"{scheme}://{authority}{location}"
    directory = path.rsplit("/", 1)[0]
    return f"{scheme}://{authority}{directory}/{location}"


def _from_code(code):
    """The :class:`HttpError` for a wasi:http ``error-code``."""
    kind = _variant_kind(code, "ErrorCode_")
    if kind == "HttpRequestDenied":
        return Refused("the host is not in the stage's `http.allow`")
    if kind == "DestinationIpProhibited":
        return Refused("the host resolves to a private address the stage does not allow")
    if kind in ("ConnectionTimeout", "ConnectionReadTimeout", "HttpResponseTimeout"):
        return Timeout(kind)
    if kind == "InternalError" and getattr(code, "value", None):
        return Failed(code.value)
    return Failed(kind)


def _request_headers(headers):
    if headers is None:
        return []
    pairs = headers.items() if isinstance(headers, dict) else headers
    out = []
    for name, value in pairs:
        if isinstance(value, str):
            value = value.encode("utf-8")
        elif isinstance(value, (bytearray, memoryview)):
            value = bytes(value)
        elif not isinstance(value, bytes):
            value = str(value).encode("utf-8")
        out.append((str(name), value))
    return out


def _timeout_ns(timeout):
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        seconds = float(timeout)
    else:
        raise TypeError(f"timeout takes seconds or a timedelta, not {type(timeout).__name__}")
    if seconds != seconds or seconds < 0:
        raise ValueError(f"timeout must be seconds >= 0, not {timeout!r}")
    return min(int(seconds * 1e9), 2**64 - 1)


def _method(t, name):
    simple = {
        "GET": "Method_Get",
        "HEAD": "Method_Head",
        "POST": "Method_Post",
        "PUT": "Method_Put",
        "DELETE": "Method_Delete",
        "PATCH": "Method_Patch",
        "OPTIONS": "Method_Options",
    }
    if name in simple:
        return getattr(t, simple[name])()
    return t.Method_Other(name)


def _send_once(method, url, headers, body, timeout_ns):
    """One request over wasi:http/outgoing-handler, its answer read in full."""
    t, streams = _http_types, _streams
    https, authority, path = _split_url(url)
    fields = t.Fields()
    for name, value in headers:
        try:
            fields.append(name, value)
        except Err as e:
            raise Failed(f"header `{name}`: {type(e.value).__name__}") from None
    request = t.OutgoingRequest(fields)

    def setting(what, setter, value):
        try:
            setter(value)
        except Err:
            raise InvalidUrl(f"{what} of {url}") from None

    setting("the method", request.set_method, _method(t, method))
    setting("the scheme", request.set_scheme, t.Scheme_Https() if https else t.Scheme_Http())
    setting("the host", request.set_authority, authority)
    setting("the path", request.set_path_with_query, path)
    options = None
    if timeout_ns is not None:
        options = t.RequestOptions()
        for setter in (options.set_connect_timeout, options.set_first_byte_timeout):
            try:
                setter(timeout_ns)
            except Err:
                pass
    outgoing = request.body()
    with outgoing.write() as stream:
        for i in range(0, len(body), _WRITE_CHUNK):
            try:
                stream.blocking_write_and_flush(body[i : i + _WRITE_CHUNK])
            except Err as e:
                raise Failed(f"writing the body: {type(e.value).__name__}") from None
    try:
        pending = _outgoing.handle(request, options)
    except Err as e:
        raise _from_code(e.value) from None
    try:
        t.OutgoingBody.finish(outgoing, None)
    except Err as e:
        raise _from_code(e.value) from None
    with pending:
        while True:
            result = pending.get()
            if result is not None:
                break
            with pending.subscribe() as pollable:
                pollable.block()
    # option<result<result<incoming-response, error-code>>>, as values.
    if isinstance(result, Err):
        raise Failed("the answer was taken twice")
    inner = result.value
    if isinstance(inner, Err):
        raise _from_code(inner.value)
    with inner.value as response:
        status = response.status()
        with response.headers() as answer_headers:
            pairs = [
                (n.lower(), bytes(v).decode("utf-8", errors="replace"))
                for n, v in answer_headers.entries()
            ]
        chunks = []
        with response.consume() as incoming:
            with incoming.stream() as stream:
                while True:
                    try:
                        chunks.append(stream.blocking_read(64 * 1024))
                    except Err as e:
                        if _variant_kind(e.value, "StreamError_") == "Closed":
                            break
                        raise Failed("reading the answer failed") from None
    return Response(status, pairs, b"".join(chunks))


class _Http:
    """``sluice.http``: a small blocking client over the standard
    ``wasi:http/outgoing-handler`` (``http: {allow: [...]}`` on the stage)::

        answer = sluice.http.post("https://api.example.com/charge", json=order, timeout=5)
        if not answer.ok:
            raise sluice.Retry()
        return answer.json()

    Only the hosts the stage's ``http.allow`` lists are reachable. The host
    adds ``Idempotency-Key: <message id>:<n>`` to the call's n-th request
    unless the handler sets one, and the stage's ``http.headers`` (secrets
    included). One redirect (301, 302, 303, 307, 308) is followed with a new
    request, which the host checks like the first. A request counts against
    the stage's ``timeout``; ``timeout=`` (seconds or a ``timedelta``)
    bounds connecting and the answer's start further.
    """

    Response = Response
    Error = HttpError
    Refused = Refused
    Timeout = Timeout
    Failed = Failed
    InvalidUrl = InvalidUrl

    def request(self, method, url, *, headers=None, body=None, json=_NO_JSON, timeout=None):
        """Sends ``method`` to ``url`` and returns the :class:`Response`.

        ``headers`` is a dict or a list of pairs (names may repeat);
        ``body`` bytes or str; ``json`` a value sent as JSON with
        ``content-type: application/json`` (unless ``headers`` sets one).
        """
        if _outgoing is None or _http_types is None:
            raise _missing("wasi:http/outgoing-handler", "sluice.http")
        method = str(method).upper()
        pairs = _request_headers(headers)
        if json is not _NO_JSON:
            if body is not None:
                raise ValueError("a request takes body= or json=, not both")
            body = _json.dumps(json, separators=(",", ":")).encode("utf-8")
            if not any(n.lower() == "content-type" for n, _ in pairs):
                pairs.append(("content-type", b"application/json"))
        body = b"" if body is None else _value_bytes(body)
        timeout_ns = _timeout_ns(timeout)
        first = _send_once(method, url, pairs, body, timeout_ns)
        location = _redirect(first)
        if location is None:
            return first
        if first.status == 303:
            method, body = "GET", b""
        return _send_once(method, _resolve_location(url, location), pairs, body, timeout_ns)

    def get(self, url, **kwargs):
        """A ``GET`` to ``url``; takes ``headers=`` and ``timeout=``."""
        return self.request("GET", url, **kwargs)

    def post(self, url, **kwargs):
        """A ``POST`` to ``url``; takes ``body=`` or ``json=``, ``headers=``, ``timeout=``."""
        return self.request("POST", url, **kwargs)

    def put(self, url, **kwargs):
        """A ``PUT`` to ``url``."""
        return self.request("PUT", url, **kwargs)

    def delete(self, url, **kwargs):
        """A ``DELETE`` to ``url``."""
        return self.request("DELETE", url, **kwargs)


http = _Http()


def _payload(value):
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    try:
        return _json.dumps(value, separators=(",", ":")).encode("utf-8")
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"cannot emit a {type(value).__name__}: return bytes, str, a JSON value, "
            f"an Emit or a list of them ({e})"
        ) from None


def _headers(value):
    if isinstance(value, dict):
        return [(str(k), str(v)) for k, v in value.items()]
    return [(str(k), str(v)) for k, v in value]


def _delay_header_of(delay, deliver_at):
    """The ``(name, value)`` delay header an emit asks for, or None."""
    if delay is not None and deliver_at is not None:
        raise ValueError("Emit takes delay or deliver_at, not both")
    if delay is not None:
        # The sign is read before rounding, so -0.1 ms is refused too.
        if isinstance(delay, timedelta):
            negative, ms = delay < timedelta(0), round(delay / timedelta(milliseconds=1))
        elif isinstance(delay, int) and not isinstance(delay, bool):
            negative, ms = delay < 0, delay * 1000
        elif isinstance(delay, float):
            if not math.isfinite(delay * 1000):
                raise ValueError(f"Emit(delay=) must be a finite number of seconds, not {delay}")
            negative, ms = delay < 0, round(delay * 1000)
        else:
            raise TypeError(
                f"Emit(delay=) takes seconds (int or float) or a timedelta, not {type(delay).__name__}"
            )
        if negative:
            raise ValueError(f"Emit(delay=) must not be negative, not {delay!r}")
        return (DELAY_HEADER, f"{ms}ms")
    if deliver_at is not None:
        if isinstance(deliver_at, datetime):
            if deliver_at.utcoffset() is None:
                raise ValueError(
                    "Emit(deliver_at=) needs an aware datetime (e.g. datetime.now(timezone.utc)); "
                    "a naive one names no time zone"
                )
            at = deliver_at.astimezone(timezone.utc).isoformat(timespec="milliseconds")
            return (DELIVER_AT_HEADER, at.replace("+00:00", "Z"))
        if isinstance(deliver_at, str):
            # The runtime parses it and refuses what is not RFC 3339.
            return (DELIVER_AT_HEADER, deliver_at)
        raise TypeError(
            "Emit(deliver_at=) takes an aware datetime or an RFC 3339 string, "
            f"not {type(deliver_at).__name__}"
        )
    return None


def _with_delay_header(headers, header):
    """``headers`` with ``header`` in place of any delay headers (in any case)."""
    if header is None:
        return headers
    return [(k, v) for k, v in headers if k.lower() not in _DELAY_HEADERS] + [header]


def _emit(value, raw):
    if isinstance(value, Emit):
        if not isinstance(value.topic, str):
            raise TypeError("Emit.topic must be a str")
        headers = raw.headers if value.headers is _INHERIT else _headers(value.headers)
        return _types.Emit(
            topic=value.topic,
            key=raw.key if value.key is _INHERIT else value.key,
            headers=_with_delay_header(headers, value._delay_header),
            payload=_payload(value.payload),
        )
    return _types.Emit(topic="", key=raw.key, headers=raw.headers, payload=_payload(value))


def _emits(value, raw):
    # The commonest returns first, without the general checks: one text or
    # bytes payload to the default output (every call pays for this path).
    kind = type(value)
    if kind is str:
        return [_types.Emit(topic="", key=raw.key, headers=raw.headers, payload=value.encode("utf-8"))]
    if kind is bytes:
        return [_types.Emit(topic="", key=raw.key, headers=raw.headers, payload=value)]
    if value is None:
        return []
    if isinstance(value, list) and all(isinstance(v, (Emit, bytes, bytearray, str)) for v in value):
        return [_emit(v, raw) for v in value]
    return [_emit(value, raw)]


# What a handler raises that settles its message (the rest trap).
_SETTLING = (Reject, Retry, StateError, SecretError, HttpError)


def _failure(e):
    """The ``Reject`` or ``Retry`` an exception of :data:`_SETTLING` means."""
    if isinstance(e, (Reject, Retry)):
        return e
    return Retry() if e.retry else Reject(str(e))


def _error(e):
    e = _failure(e)
    if isinstance(e, Reject):
        return _types.HandlerError_Reject(e.reason)
    return _types.HandlerError_Retry(e.after_ms)


def _outcome(fn, raw):
    try:
        return Ok(_emits(fn(Message(raw)), raw))
    except _SETTLING as e:
        return Err(_error(e))
    except BaseException:
        # Printed first, so the trap's error (which quotes the first and last
        # lines of stderr) names the exception.
        traceback.print_exc(file=sys.stderr)
        raise


def handler(fn):
    """The ``MessageHandler`` export for ``fn(msg) -> emits``."""

    class MessageHandler:
        def handle(self, msg):
            return _outcome(fn, msg)

    return MessageHandler


def batch_handler(fn):
    """The ``BatchMessageHandler`` export for ``fn(msgs) -> [result per msg]``.

    Each result is what a handler returns, or a ``Reject``/``Retry`` instance
    for that item alone. Raising fails the whole batch the same way.
    """

    class BatchMessageHandler:
        def handle_batch(self, msgs):
            try:
                results = fn([Message(m) for m in msgs])
                if not isinstance(results, list) or len(results) != len(msgs):
                    raise TypeError(
                        f"a batch handler returns a list with one result per message "
                        f"({len(msgs)}), not {type(results).__name__}"
                        + (f" of {len(results)}" if isinstance(results, list) else "")
                    )
            except _SETTLING as e:
                return [Err(_error(e)) for _ in msgs]
            except BaseException:
                traceback.print_exc(file=sys.stderr)
                raise
            out = []
            for r, raw in zip(results, msgs):
                if isinstance(r, _SETTLING):
                    out.append(Err(_error(r)))
                else:
                    out.append(Ok(_emits(r, raw)))
            return out

    return BatchMessageHandler
