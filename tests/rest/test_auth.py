"""Authentication modes: header (default), token with roles, none."""

from __future__ import annotations

import httpx
import pytest

from support.server import ServerProcess


def test_header_mode_needs_any_authorization_header(server):
    refused = httpx.get(server.url + "/v1/queues")
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == 'Bearer realm="conveyor"'
    r = httpx.get(server.url + "/v1/queues", headers={"Authorization": "anything"})
    assert r.status_code == 200
    for open_path in ("/livez", "/readyz", "/metrics"):
        assert httpx.get(server.url + open_path).status_code == 200
    assert httpx.get(server.url + "/v1/queues").json()["code"] == "Unauthorized"


@pytest.fixture(scope="module")
def token_server(module_dsn):
    proc = ServerProcess(module_dsn, env={"CONVEYOR_AUTH": "token",
                                          "CONVEYOR_AUTH_TOKENS": "r-tok:read,w-tok:write,a-tok:admin"}).start()
    yield proc
    proc.kill()


def _as(server, token: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=server.url, headers=headers)


def test_token_roles(token_server, queue_name):
    admin, writer, reader = (_as(token_server, t) for t in ("a-tok", "w-tok", "r-tok"))
    # who are you? 401 with a challenge; not allowed: 403
    assert _as(token_server, None).get("/v1/queues").status_code == 401
    wrong = _as(token_server, "wrong").get("/v1/queues")
    assert wrong.status_code == 401 and 'error="invalid_token"' in wrong.headers["www-authenticate"]
    assert httpx.get(token_server.url + "/v1/queues", headers={"Authorization": "Basic a-tok"}).status_code == 401

    assert reader.post("/v1/queues", json={"name": queue_name}).status_code == 403
    assert writer.post("/v1/queues", json={"name": queue_name}).status_code == 403
    assert admin.post("/v1/queues", json={"name": queue_name}).status_code == 201

    q = f"/v1/queues/{queue_name}"
    assert reader.post(q + "/messages", json={"message": "x"}).status_code == 403
    assert writer.post(q + "/messages", json={"message": "x"}).status_code == 201
    assert reader.get(q).status_code == 200 and reader.get("/v1/queues").status_code == 200
    assert reader.get(q + "/messages").status_code == 403  # receiving changes state
    assert len(writer.get(q + "/messages").json()) == 1
    assert writer.delete(q).status_code == 403
    assert writer.post(q + "/purge").status_code == 403
    assert admin.delete(q).status_code == 204
    denied = reader.post(q + "/messages", json={"message": "x"}).json()
    assert denied["code"] == "PermissionDenied" and "write" in denied["error"]


@pytest.fixture(scope="module")
def open_server(module_dsn):
    proc = ServerProcess(module_dsn, env={"CONVEYOR_AUTH": "none"}).start()
    yield proc
    proc.kill()


def test_none_mode(open_server):
    assert httpx.get(open_server.url + "/v1/queues").status_code == 200
