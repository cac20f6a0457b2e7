"""An OpenTelemetry collector's OTLP/HTTP traces endpoint, for the tracing tests: a small
http.server (a stubserver.StubServer) on 127.0.0.1 accepting `POST /v1/traces` with
`Content-Type: application/x-protobuf` (gzip-encoded or not), decoded with `opentelemetry-proto`
(ExportTraceServiceRequest), answered with an empty ExportTraceServiceResponse.

    with OTLPReceiver() as receiver:
        receiver.url                       http://127.0.0.1:PORT/v1/traces
        receiver.spans                     every span received so far (Span objects, below)
        receiver.wait_for(predicate, 10)   the spans once predicate(spans) holds (no sleeping)
        receiver.refused                   requests it refused (wrong path, type or body), as strings

Each `Span` has name, kind ("server", "client", "internal"…), trace_id and span_id and
parent_span_id (hex, "" for none), attributes (dict: key → Python value), resource (the
attributes of its resource) and scope (the instrumentation scope's name).
"""

import gzip
from dataclasses import dataclass, field

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, ExportTraceServiceResponse
from opentelemetry.proto.trace.v1.trace_pb2 import Span as SpanMessage

from sandbox.stubserver import StubHandler, StubServer

KINDS = {value: name.removeprefix("SPAN_KIND_").lower() for name, value in SpanMessage.SpanKind.items()}


def any_value(value):
    """The Python value of an OTLP AnyValue."""
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [any_value(item) for item in value.array_value.values]
    if which == "kvlist_value":
        return {item.key: any_value(item.value) for item in value.kvlist_value.values}
    return getattr(value, which)


def attributes(key_values):
    return {item.key: any_value(item.value) for item in key_values}


@dataclass
class Span:
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict
    resource: dict = field(default_factory=dict)
    scope: str = ""
    status_code: int = 0

    def __repr__(self):
        return (f"<Span {self.name!r} {self.kind} trace={self.trace_id} id={self.span_id} "
                f"parent={self.parent_span_id or '-'} {self.attributes}>")


def decode(body):
    """The spans of one ExportTraceServiceRequest (protobuf bytes)."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(Span(name=span.name, kind=KINDS.get(span.kind, str(span.kind)), trace_id=span.trace_id.hex(),
                                  span_id=span.span_id.hex(), parent_span_id=span.parent_span_id.hex(),
                                  attributes=attributes(span.attributes), resource=resource,
                                  scope=scope_spans.scope.name, status_code=span.status.code))
    return spans


class OTLPReceiver(StubServer):
    """OTLP/HTTP (protobuf) traces receiver on 127.0.0.1, in a daemon thread."""

    def __init__(self):
        self.exports = 0
        self.refused = []
        receiver = self

        class Handler(StubHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.read_body()
                content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
                if self.path.split("?")[0] != "/v1/traces":
                    return self.refuse(404, f"POST {self.path}")
                if content_type != "application/x-protobuf":
                    return self.refuse(415, f"Content-Type {content_type!r}")
                try:
                    if (self.headers.get("Content-Encoding") or "").lower() == "gzip":
                        body = gzip.decompress(body)
                    spans = decode(body)
                except Exception as error:  # noqa: BLE001 - anything undecodable is refused and recorded
                    return self.refuse(400, f"undecodable body: {error!r}")
                with receiver.condition:
                    receiver.exports += 1
                    receiver.record(*spans)
                self.reply(200, ExportTraceServiceResponse().SerializeToString(), "application/x-protobuf")

            def do_GET(self):
                self.refuse(405, f"GET {self.path}")

            def refuse(self, status, why):
                with receiver.condition:
                    receiver.refused.append(why)
                    receiver.condition.notify_all()
                self.reply(status, why.encode(), "text/plain")

        super().__init__(Handler, path="/v1/traces")
        self.spans = self.received  # every span received, in StubServer's record

    def wait_for(self, predicate, timeout=15.0, what="the expected spans"):
        """The spans received, once `predicate(spans)` holds; AssertionError after `timeout`."""
        return self.wait_received(predicate, timeout, lambda spans: (
            f"OTLP receiver: {what} not within {timeout}s; received {len(spans)} spans "
            f"in {self.exports} exports: {[s.name for s in spans]}; refused: {self.refused}"))
