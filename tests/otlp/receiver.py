"""A minimal OTLP/HTTP trace receiver for the tests and the benchmark.

No collector binary can be had here, so this stands in for one: it accepts
`POST /v1/traces` (protobuf, gzip or not) as an OpenTelemetry Collector's
HTTP port does, decodes each request with the official protobuf types
(`opentelemetry-proto` from PyPI), and keeps the spans for `GET /spans`,
which answers them as JSON, one object per span:

    {"trace_id", "span_id", "parent_span_id", "name", "kind", "start_ns", "end_ns",
     "attributes": {...}, "status": {"code", "message"},
     "links": [{"trace_id", "span_id"}], "service": "..."}

With `--discard` it decodes nothing and keeps nothing (only counts
requests), for the benchmark, where the receiver must not be the bottleneck.

Prints `listening <port>` on stdout once it accepts connections.
"""

import argparse
import gzip
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

SPANS = []
REQUESTS = [0]
LOCK = threading.Lock()
RESPONSE = ExportTraceServiceResponse().SerializeToString()


def value(any_value):
    """An OTLP AnyValue as a JSON value."""
    kind = any_value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [value(v) for v in any_value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: value(kv.value) for kv in any_value.kvlist_value.values}
    if kind == "bytes_value":
        return any_value.bytes_value.hex()
    return getattr(any_value, kind)


def spans_of(request):
    for resource_spans in request.resource_spans:
        resource = {kv.key: value(kv.value) for kv in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                yield {
                    "trace_id": span.trace_id.hex(),
                    "span_id": span.span_id.hex(),
                    "parent_span_id": span.parent_span_id.hex(),
                    "name": span.name,
                    "kind": span.kind,
                    "start_ns": span.start_time_unix_nano,
                    "end_ns": span.end_time_unix_nano,
                    "attributes": {kv.key: value(kv.value) for kv in span.attributes},
                    "status": {"code": span.status.code, "message": span.status.message},
                    "links": [
                        {"trace_id": l.trace_id.hex(), "span_id": l.span_id.hex()}
                        for l in span.links
                    ],
                    "service": resource.get("service.name"),
                    "scope": scope_spans.scope.name,
                }


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    discard = False

    def log_message(self, *args):
        pass

    def reply(self, status, body, content_type):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        if self.path != "/v1/traces":
            self.reply(404, b"not found", "text/plain")
            return
        with LOCK:
            REQUESTS[0] += 1
        if not self.discard:
            if self.headers.get("Content-Encoding", "") == "gzip":
                body = gzip.decompress(body)
            request = ExportTraceServiceRequest()
            try:
                request.ParseFromString(body)
            except Exception as err:  # a bad request is the exporter's bug: say so
                self.reply(400, str(err).encode(), "text/plain")
                return
            spans = list(spans_of(request))
            with LOCK:
                SPANS.extend(spans)
        self.reply(200, RESPONSE, "application/x-protobuf")

    def do_GET(self):
        if self.path == "/spans":
            with LOCK:
                body = json.dumps({"requests": REQUESTS[0], "spans": SPANS}).encode()
            self.reply(200, body, "application/json")
        else:
            self.reply(404, b"not found", "text/plain")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--discard", action="store_true")
    args = parser.parse_args()
    Handler.discard = args.discard
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"listening {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
