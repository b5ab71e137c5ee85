"""Test kit: a Python handler written against the raw componentize-py
bindings, with no SDK, to prove the contract alone is enough.

Emits the payload upper-cased; rejects an empty payload; asks for a retry
after 5 ms when the payload is `retry`.
"""

from componentize_py_types import Err, Ok
from wit_world import exports
from wit_world.imports import types


class MessageHandler(exports.MessageHandler):
    def handle(self, msg: types.Message):
        if not msg.payload:
            return Err(types.HandlerError_Reject("empty payload"))
        if msg.payload == b"retry":
            return Err(types.HandlerError_Retry(5))
        return Ok([types.Emit(topic="", key=msg.key, headers=msg.headers, payload=msg.payload.upper())])
