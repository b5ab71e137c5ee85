"""Schemathesis hooks for the Sluice admin API (tests/tests/openapi.rs).

The batch endpoint takes JSON lines (`application/x-ndjson`,
`application/jsonl`); its document describes the body as an array of lines.
Schemathesis has no serializer for these media types: this one writes each
item of a generated array as one line of JSON, and anything else (the
negative cases: a string, a number, an object) as one line too, so the
server sees exactly the bytes a client would send.
"""

import json

import schemathesis


@schemathesis.serializer("application/x-ndjson", "application/jsonl")
def json_lines(ctx, value):
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    items = value if isinstance(value, list) else [value]
    return "\n".join(json.dumps(item) for item in items).encode()
