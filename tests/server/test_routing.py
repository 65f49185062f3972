"""The router's short path (server/routing.py) finds exactly the route Starlette's own
router would, with the same path parameters, for every route of the indexed APIs, and
leaves everything else to Starlette."""

from __future__ import annotations

import re

import pytest
from starlette.applications import Starlette
from starlette.routing import Match, Mount, Route, Router

from conveyor.protocols.hq import routes as hq
from conveyor.protocols.queen import routes as queen
from conveyor.protocols.rest import routes as rest
from conveyor.server.app import create_app
from conveyor.server.routing import IndexedRouter, RouteIndex
from conveyor.settings import Settings

INDEXED = ("/v1", "/api/v1", hq.PREFIX)


@pytest.fixture(scope="module")
def router() -> IndexedRouter:
    app = create_app(Settings(), "postgresql://127.0.0.1:1/unused")  # never opened: no lifespan here
    assert isinstance(app.router, IndexedRouter)
    return app.router


def starlettes_choice(router: Router, method: str, path: str) -> tuple[Route, dict[str, str]] | None:
    """The route and parameters Starlette's router (then the mount's) picks: the first
    full match, in order; None when none matches fully."""
    scope = {"type": "http", "method": method, "path": path, "root_path": "", "path_params": {}}
    for outer in router.routes:
        match, child = outer.matches(scope)
        if match is not Match.FULL:
            continue
        if not isinstance(outer, Mount):
            return None  # a route of the server itself, outside the index
        inner_scope = {**scope, **child}
        sub = outer.app if isinstance(outer.app, Starlette) else outer.app.app  # hq's trailing-slash wrapper
        if path.endswith("/") and sub is not outer.app:
            inner_scope["path"] = path.rstrip("/")
        for route in sub.routes:
            match, inner = route.matches(inner_scope)
            if match is Match.FULL:
                assert isinstance(route, Route)
                return route, inner["path_params"]
        return None
    return None


def sample_paths() -> list[tuple[str, str]]:
    """Every indexed route's template with values in its parameters (some with characters
    a regex would trip on), in each of its methods and in a method it lacks, plus paths
    next to them: a trailing slash, an empty segment, an extra segment."""
    out = []
    tables = [("/v1", rest.ENDPOINTS), ("/api/v1", queen.ENDPOINTS), (hq.PREFIX, hq.ENDPOINTS)]
    for prefix, endpoints in tables:
        for e in endpoints:
            for value in ("jobs", "a.b-c_d", "lagging", "x%20y", "1"):
                path = prefix + re.sub(r"\{[^}]+\}", value, e.path)
                for method in (e.method, "GET", "POST", "DELETE", "PUT"):
                    out += [(method, path), (method, path + "/"), (method, path + "/extra")]
            out.append((e.method, prefix + re.sub(r"\{[^}]+\}", "", e.path)))
    out += [("GET", "/v1"), ("GET", "/v1/"), ("GET", "/livez"), ("GET", "/ui/"), ("GET", "/v2/queues"),
            ("GET", "/v1/openapi.json"), ("POST", "/api/v1/push"), ("GET", "/api/v1/pop")]
    return out


def test_the_index_picks_what_starlette_picks(router):
    found = 0
    for method, path in sample_paths():
        ours = router.index.find(method, path)
        theirs = starlettes_choice(router, method, path)
        if ours is None:
            # left to Starlette: only paths the index does not hold (a trailing slash, which
            # hq's wrapper trims first, or nothing at all)
            assert theirs is None or path.endswith("/"), (method, path, theirs)
            continue
        found += 1
        assert theirs is not None, (method, path)
        assert ours[0].route is theirs[0], (method, path)
        assert ours[1] == theirs[1], (method, path)
    assert found > 300


def test_only_the_named_mounts_are_indexed(router):
    assert router.index.find("GET", "/ui/") is None and router.index.find("GET", "/livez") is None
    target, params = router.index.find("POST", "/v1/queues/jobs/messages")
    assert target.route.path == "/queues/{name}/messages" and params == {"name": "jobs"}
    assert target.prefix == "/v1" and target.sub.state.version


def test_a_mount_with_middleware_is_refused():
    from starlette.middleware import Middleware
    from starlette.middleware.gzip import GZipMiddleware

    async def endpoint(request):  # pragma: no cover - never called
        raise AssertionError

    sub = Starlette(routes=[Route("/x", endpoint)], middleware=[Middleware(GZipMiddleware)])
    with pytest.raises(ValueError, match="without middleware"):
        RouteIndex([Mount("/m", sub)], ("/m",), on_error=lambda request, exc: None)
