"""The OpenAPI 3.1 document, generated from the endpoint table and the pydantic models."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel

from conveyor.protocols.rest import models

_REF = "#/components/schemas/{model}"
_ID = {"type": "integer", "minimum": 1, "maximum": 2**63 - 1}
_PATH_PARAMS: dict[str, dict[str, Any]] = {
    "id": _ID,
    "batch_id": _ID,
    "consumer": {"type": "string", "pattern": models.CONSUMER_NAME_PATTERN},
    "routing_key": {"type": "string", "pattern": models.ROUTING_KEY_PATTERN, "maxLength": 289},
    "pattern": {"type": "string", "pattern": models.ROUTING_PATTERN_PATTERN, "maxLength": 289},
}
# {name} names a queue, except under these collections
_NAME_PATTERNS = {"/streams": models.STREAM_NAME_PATTERN, "/schedules": models.SCHEDULE_NAME_PATTERN}
_ARRAY_RESPONSES = {("GET", "/queues"), ("GET", "/queues/{name}/messages"), ("GET", "/streams"),
                    ("GET", "/streams/{name}/consumers"), ("GET", "/streams/{name}/dead-letters"),
                    ("GET", "/events/{pattern}/subscriptions"), ("GET", "/queues/{name}/subscriptions")}
# Bodies and answers that are one object or an array of them (201 {id} or {ids}).
_ONE_OR_MANY: dict[type[BaseModel], type[BaseModel]] = {models.MessageIn: models.SendBatch,
                                                         models.EventIn: models.EventBatch}

# OpenAPI links: what a created queue or message leads to (lets clients and stateful
# testers chain calls).
_QUEUE_OPS = ["get_queue", "alter_queue", "delete_queue", "purge_queue", "send", "receive", "delete_batch"]
_MESSAGE_OPS = ["delete_one", "change_visibility", "complete", "fail"]
_LINKS = {
    ("POST", "/queues", 201): {op: {"operationId": op, "parameters": {"name": "$response.body#/name"}}
                               for op in _QUEUE_OPS},
    ("POST", "/queues/{name}/messages", 201): {
        op: {"operationId": op, "parameters": {"name": "$request.path.name", "id": "$response.body#/id"}}
        for op in _MESSAGE_OPS},
}
_STREAM_OPS = ["get_stream", "alter_stream", "delete_stream", "stream_stats", "append_events", "list_consumers",
               "subscribe", "list_dead_letters", "purge_dead_letters", "replay_dead_letters"]
_CONSUMER_OPS = ["receive_batch", "unsubscribe"]
_BATCH_OPS = ["ack_batch", "nack_event", "dead_letter_event"]
_LINKS.update({
    ("POST", "/streams", 201): {op: {"operationId": op, "parameters": {"name": "$response.body#/name"}}
                                for op in _STREAM_OPS},
    ("POST", "/streams/{name}/consumers", 201): {
        op: {"operationId": op, "parameters": {"name": "$request.path.name", "consumer": "$response.body#/name"}}
        for op in _CONSUMER_OPS},
    ("GET", "/streams/{name}/consumers/{consumer}/batch", 200): {
        op: {"operationId": op, "parameters": {"name": "$request.path.name", "batch_id": "$response.body#/batch_id"}}
        for op in _BATCH_OPS},
})


def _schema(model: type[BaseModel], components: dict[str, Any]) -> dict[str, Any]:
    schema = model.model_json_schema(ref_template=_REF)
    components.update(schema.pop("$defs", {}))
    components[model.__name__] = schema
    return {"$ref": _REF.format(model=model.__name__)}


def _query_parameters(model: type[BaseModel]) -> list[dict[str, Any]]:
    schema = model.model_json_schema(ref_template=_REF)
    return [{"name": name, "in": "query", "required": False, "schema": prop,
             "description": prop.get("description", "")}
            for name, prop in schema["properties"].items()]


def _path_schema(path: str, param: str) -> dict[str, Any]:
    if param != "name":
        return dict(_PATH_PARAMS[param])
    collection = "/" + path.split("/")[1]
    return {"type": "string", "pattern": _NAME_PATTERNS.get(collection, models.QUEUE_NAME_PATTERN)}


def _operation(e: Any, components: dict[str, Any]) -> dict[str, Any]:
    params = [{"name": p, "in": "path", "required": True, "schema": _path_schema(e.path, p)}
              for p in re.findall(r"{(\w+)}", e.path)]
    if e.query is not None:
        params += _query_parameters(e.query)
    op: dict[str, Any] = {
        "operationId": e.handler.__name__,
        "summary": e.summary,
        "parameters": params,
        "security": [{"authorization": []}],
        "responses": {},
    }
    if e.body is not None:
        body_schema = _schema(e.body, components)
        if e.body in _ONE_OR_MANY:
            body_schema = {"oneOf": [body_schema, _schema(_ONE_OR_MANY[e.body], components)]}
        op["requestBody"] = {"required": e.body_required,
                             "content": {"application/json": {"schema": body_schema}}}
    for status, model in sorted(e.responses.items()):
        response: dict[str, Any] = {"description": _describe(status)}
        if model is not None:
            schema = _schema(model, components)
            if status == 200 and (e.method, e.path) in _ARRAY_RESPONSES:
                schema = {"type": "array", "items": schema}
            if model is models.Sent:
                schema = {"oneOf": [schema, _schema(models.SentBatch, components)]}
            response["content"] = {"application/json": {"schema": schema}}
        if (e.method, e.path, status) in _LINKS:
            response["links"] = _LINKS[(e.method, e.path, status)]
        op["responses"][str(status)] = response
    for status in (400, 403, 503):
        op["responses"].setdefault(str(status), {
            "description": _describe(status),
            "content": {"application/json": {"schema": _schema(models.Error, components)}}})
    return op


def _describe(status: int) -> str:
    return {200: "OK", 201: "Created", 204: "No content", 400: "Invalid request",
            403: "Missing credentials or insufficient role", 404: "Not found",
            409: "Conflict", 413: "Too large", 503: "Database unavailable"}.get(status, "Response")


def document(endpoints: list[Any], version: str) -> dict[str, Any]:
    components: dict[str, Any] = {}
    paths: dict[str, Any] = {}
    for e in endpoints:
        paths.setdefault("/v1" + e.path, {})[e.method.lower()] = _operation(e, components)
    return {
        "openapi": "3.1.0",
        "info": {"title": "Conveyor REST API", "version": version,
                 "description": "Queues, messages and event streams on PostgreSQL. See docs/rest-api.md."},
        "paths": paths,
        "components": {
            "schemas": dict(sorted(components.items())),
            "securitySchemes": {"authorization": {
                "type": "apiKey", "in": "header", "name": "Authorization",
                "description": "Any value in `header` mode; `Bearer <token>` in `token` mode"}},
        },
    }
