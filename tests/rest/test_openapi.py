"""The OpenAPI document validates, and schemathesis finds no server error in the API."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
from openapi_spec_validator import validate

pytestmark = pytest.mark.long(30)  # seconds on a quiet machine: started first (tests/support/parallel.py)


def test_document_is_valid_openapi_31(server):
    doc = httpx.get(server.url + "/v1/openapi.json").json()
    assert doc["openapi"] == "3.1.0"
    validate(doc)
    paths = doc["paths"]
    for path, methods in {
        "/v1/queues": {"get", "post"},
        "/v1/queues/{name}": {"get", "patch", "delete"},
        "/v1/queues/{name}/purge": {"post"},
        "/v1/queues/{name}/messages": {"get", "post", "delete"},
        "/v1/queues/{name}/messages/{id}": {"delete", "patch"},
        "/v1/queues/{name}/messages/{id}/complete": {"post"},
        "/v1/queues/{name}/messages/{id}/fail": {"post"},
    }.items():
        assert methods <= set(paths[path]), path


def test_schemathesis_finds_no_server_errors(server, tmp_path):
    """Property-based requests from the document: no 5xx, responses match their schemas."""
    cmd = [sys.executable, "-m", "schemathesis.cli", "run", server.url + "/v1/openapi.json",
           "--url", server.url, "-H", "Authorization: schemathesis",
           "--checks", "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
           "--max-examples", "25", "--seed", "1", "--workers", "2",
           "--request-timeout", "30", "--suppress-health-check", "all",
           "--phases", "examples,fuzzing,stateful"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
