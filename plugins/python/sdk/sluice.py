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
"""

import json as _json
import math
import sys
import traceback
from datetime import datetime, timedelta, timezone

from componentize_py_types import Err, Ok
from wit_world.imports import host as _host
from wit_world.imports import types as _types

__all__ = [
    "DELAY_HEADER",
    "DELIVER_AT_HEADER",
    "Emit",
    "Message",
    "Reject",
    "Retry",
    "batch_handler",
    "config",
    "handler",
    "log",
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


def _error(e):
    if isinstance(e, Reject):
        return _types.HandlerError_Reject(e.reason)
    return _types.HandlerError_Retry(e.after_ms)


def _outcome(fn, raw):
    try:
        return Ok(_emits(fn(Message(raw)), raw))
    except (Reject, Retry) as e:
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
            except (Reject, Retry) as e:
                return [Err(_error(e)) for _ in msgs]
            except BaseException:
                traceback.print_exc(file=sys.stderr)
                raise
            out = []
            for r, raw in zip(results, msgs):
                if isinstance(r, (Reject, Retry)):
                    out.append(Err(_error(r)))
                else:
                    out.append(Ok(_emits(r, raw)))
            return out

    return BatchMessageHandler
