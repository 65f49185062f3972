"""The two AWS wire formats, shared by SQS and SNS.

JSON protocol: ``POST`` with ``Content-Type: application/x-amz-json-1.0`` and
``X-Amz-Target: <Prefix>.<Action>``; the body is the input as JSON; answers are JSON;
errors carry ``__type`` and, for services that used to speak Query (SQS), the header
``x-amzn-query-error: <QueryCode>;Sender|Receiver`` from which SDKs recover the old code.

Query protocol: form fields (body, or query string) with ``Action=<Action>``; answers are
XML ``<ActionResponse><ActionResult>...</ActionResult><ResponseMetadata>``; errors are
``<ErrorResponse><Error><Type/><Code/><Message/></Error><RequestId/>``.

A Query request that asks for JSON (``Accept: application/json``) is answered in the
JSON form AWS gives such requests (protocol ``query-json``): the XML document's outer
elements as objects, ``{"<Action>Response": {"<Action>Result": {...}, "ResponseMetadata":
{...}}}``, errors as ``{"Error": {"Type", "Code", "Message"}, "RequestId"}``; the result's
members are the JSON protocol's.

Both are parsed into a ``Call`` with typed parameters through the service's shapes, so
the handlers behind never see which one was used.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

import orjson
from starlette.responses import Response

from conveyor import json_input
from conveyor.protocols.aws import shapes

JSON_CONTENT_TYPE = "application/x-amz-json-1.0"
MAX_FORM_FIELDS = 10_000  # fields of a Query request, in its body and in its query string each


@dataclass(frozen=True)
class Service:
    """What differs between AWS services on the wire."""

    target_prefix: str  # X-Amz-Target prefix, e.g. "AmazonSQS"
    json_type_prefix: str  # __type prefix, e.g. "com.amazonaws.sqs#"
    namespace: str  # XML namespace of Query responses
    inputs: Mapping[str, shapes.Struct]
    outputs: Mapping[str, shapes.Struct]
    query_compatible: bool = False  # send x-amzn-query-error with JSON errors
    error_detail: bool = True  # an empty <Detail/> in Query errors (SQS writes one, SNS does not)


@dataclass(frozen=True)
class ErrorInfo:
    name: str  # the JSON __type suffix, or the whole __type when it has its own namespace
    query_code: str  # the Query protocol's <Code>
    status: int
    sender: bool
    message: str


@dataclass(frozen=True)
class Call:
    service: Service
    protocol: str  # "json" | "query" | "query-json" (a Query request answered in JSON)
    action: str
    params: dict[str, Any]
    request_id: str


class WireError(Exception):
    """The request could not be read; ``kind`` names an error of the service's table."""

    def __init__(self, kind: str, message: str, protocol: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.protocol = protocol


def new_request_id() -> str:
    return str(uuid.uuid4())


def is_json(headers: Mapping[str, str]) -> bool:
    return headers.get("content-type", "").split(";")[0].strip().lower() == JSON_CONTENT_TYPE


def protocol(headers: Mapping[str, str]) -> str:
    """The protocol a request speaks, and how it is answered: JSON by its Content-Type;
    otherwise Query, answered in XML unless it accepts ``application/json`` (and not XML)."""
    if is_json(headers):
        return "json"
    accept = headers.get("accept", "").lower()
    return "query-json" if "application/json" in accept and "xml" not in accept else "query"


def form_fields(body: bytes, query_string: str) -> dict[str, str]:
    """Query-protocol fields from the query string and a form-encoded body (body wins).
    At most ``MAX_FORM_FIELDS`` in each: the largest real request (a batch of ten entries
    with ten message attributes each) has about 500."""
    try:
        fields = dict(parse_qsl(query_string, keep_blank_values=True, max_num_fields=MAX_FORM_FIELDS))
        if body:
            fields.update(parse_qsl(body.decode("utf-8"), keep_blank_values=True, max_num_fields=MAX_FORM_FIELDS))
    except UnicodeDecodeError:
        raise WireError("InvalidParameterValue", "The request body is not valid UTF-8.", "query") from None
    except ValueError:  # parse_qsl: "Max number of fields exceeded"
        raise WireError("InvalidParameterValue", f"The request has more than {MAX_FORM_FIELDS} parameters.",
                        "query") from None
    return fields


def parse_json(service: Service, target: str, body: bytes, request_id: str) -> Call:
    prefix, _, action = target.partition(".")
    if prefix != service.target_prefix or action not in service.inputs:
        raise WireError("InvalidAction", f"The action {action or target} is not valid for this endpoint.", "json")
    try:
        data = json_input.loads(body) if body.strip() else {}
    except json_input.TooDeep as exc:
        raise WireError("SerializationException", f"The request body is {exc.msg}.", "json") from None
    except orjson.JSONDecodeError:
        raise WireError("SerializationException", "The request body is not valid JSON.", "json") from None
    try:
        params = shapes.from_json(service.inputs[action], data)
    except shapes.ShapeError as exc:
        raise WireError("InvalidParameterValue", _shape_message(exc), "json") from None
    return Call(service, "json", action, params, request_id)


def parse_query(service: Service, fields: Mapping[str, str], request_id: str, protocol: str = "query") -> Call:
    action = fields.get("Action", "")
    if action not in service.inputs:
        raise WireError("InvalidAction", f"The action {action or '(none)'} is not valid for this endpoint.", protocol)
    try:
        params = shapes.from_query(service.inputs[action], fields)
    except shapes.ShapeError as exc:
        raise WireError("InvalidParameterValue", _shape_message(exc), protocol) from None
    return Call(service, protocol, action, params, request_id)


def _shape_message(exc: shapes.ShapeError) -> str:
    return f"Value for parameter {exc.path} is invalid. Reason: {exc.reason}."


# -- responses ---------------------------------------------------------------------------

def result(call: Call, value: Mapping[str, Any] | None) -> Response:
    headers = {"x-amzn-RequestId": call.request_id}
    if call.protocol == "json":
        return Response(orjson.dumps(value or {}, default=_blob), media_type=JSON_CONTENT_TYPE, headers=headers)
    action = call.action
    if call.protocol == "query-json":
        document: dict[str, Any] = {"ResponseMetadata": {"RequestId": call.request_id}}
        if action in call.service.outputs:
            document[f"{action}Result"] = value or {}
        return Response(orjson.dumps({f"{action}Response": document}, default=_blob),
                        media_type="application/json", headers=headers)
    inner = ""
    output = call.service.outputs.get(action)
    if output is not None:
        inner = f"<{action}Result>{shapes.to_xml(output, value or {})}</{action}Result>"
    xml = (f'<?xml version="1.0"?><{action}Response xmlns="{call.service.namespace}">{inner}'
           f"<ResponseMetadata><RequestId>{call.request_id}</RequestId></ResponseMetadata>"
           f"</{action}Response>")
    return Response(xml, media_type="text/xml", headers=headers)


def _blob(value: Any) -> str:
    """Blobs travel as base64 text in the JSON protocol (orjson asks only for what it
    cannot write itself). Handlers leave absent members out rather than set them None."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def error(service: Service, protocol: str, info: ErrorInfo, request_id: str) -> Response:
    headers = {"x-amzn-RequestId": request_id}
    if protocol == "json":
        if service.query_compatible:
            headers["x-amzn-query-error"] = f"{info.query_code};{'Sender' if info.sender else 'Receiver'}"
        json_type = info.name if "#" in info.name else service.json_type_prefix + info.name
        body = {"__type": json_type, "message": info.message}
        return Response(orjson.dumps(body), status_code=info.status, media_type=JSON_CONTENT_TYPE,
                        headers=headers)
    if protocol == "query-json":
        document = {"Error": {"Type": "Sender" if info.sender else "Receiver", "Code": info.query_code,
                              "Message": info.message}, "RequestId": request_id}
        return Response(orjson.dumps(document), status_code=info.status, media_type="application/json",
                        headers=headers)
    xml = (f'<?xml version="1.0"?><ErrorResponse xmlns="{service.namespace}"><Error>'
           f"<Type>{'Sender' if info.sender else 'Receiver'}</Type>"
           f"<Code>{shapes.xml_text(info.query_code)}</Code>"
           f"<Message>{shapes.xml_text(info.message)}</Message>{'<Detail/>' if service.error_detail else ''}</Error>"
           f"<RequestId>{request_id}</RequestId></ErrorResponse>")
    return Response(xml, status_code=info.status, media_type="text/xml", headers=headers)
