"""The server's router: Starlette's, with a short path to the routes of the mounted APIs
(REST at /v1, Queen's at /api/v1, hq's at /hq).

Starlette finds a mounted route by trying each ``Mount``'s regular expression, entering
the sub-application (its own error middleware, exception middleware and router) and trying
each of its routes' regular expressions in turn: 26-29 us of a single-message request's
~170 us of server CPU, against 5-6 us for the AWS endpoints that skip it (measured with
bench/path_profile.py; docs/benchmarks.md, "The request path"). ``RouteIndex`` is an index
over the same ``Route`` objects, built once: routes by method and number of path
segments, matched segment by segment in the routers' own order. A request it finds is
handed to the route's own ASGI app with the scope Starlette's ``Mount``, sub-application
and router would have given it (``app``, ``root_path``, ``route``, ``path_params`` and the
sub-application's exception handlers), so handlers, errors and metrics labels are the
same either way. What it does not find (unknown paths, a wrong method, a trailing slash,
the dashboard, health) goes through Starlette's router as before: the index is a shortcut
to the routes, never a second table of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.routing import BaseRoute, Mount, Route, Router
from starlette.types import ExceptionHandler, Receive, Scope, Send


@dataclasses.dataclass(frozen=True)
class Target:
    """One route of a mounted sub-application, as the index matches it."""

    segments: tuple[str | None, ...]  # the path split on "/": a literal, or None for a parameter
    names: tuple[str, ...]  # the parameters' names, in order
    prefix: str  # the mount's path
    sub: Starlette
    route: Route
    handlers: tuple[dict[Any, ExceptionHandler], dict[int, ExceptionHandler]]

    def match(self, parts: list[str]) -> dict[str, str] | None:
        values = []
        for literal, part in zip(self.segments, parts, strict=True):
            if literal is None:
                if not part:
                    return None
                values.append(part)
            elif literal != part:
                return None
        return dict(zip(self.names, values, strict=True))


def _starlette(mount: Mount) -> Starlette:
    """The Starlette application a mount serves, directly or through a wrapper that only
    adjusts the path and keeps it as ``.app`` (hq's trailing-slash layer, see
    ``RouteIndex``). Its routes are served without its middleware, so it may have none."""
    app = mount.app if isinstance(mount.app, Starlette) else getattr(mount.app, "app", None)
    if not isinstance(app, Starlette) or app.user_middleware or app.max_body_size is not None:
        raise ValueError(f"the mount at {mount.path} is not a Starlette application without middleware")
    return app


def _segments(path: str) -> tuple[tuple[str | None, ...], tuple[str, ...]] | None:
    """A route template's segments and parameter names; None for what the index does not
    match itself (a parameter with a convertor, or one inside a segment)."""
    segments: list[str | None] = []
    names: list[str] = []
    for part in path.split("/"):
        if part.startswith("{") and part.endswith("}") and ":" not in part:
            segments.append(None)
            names.append(part[1:-1])
        elif "{" in part or "}" in part:
            return None
        else:
            segments.append(part)
    return tuple(segments), tuple(names)


def _handlers(sub: Starlette, on_error: ExceptionHandler
              ) -> tuple[dict[Any, ExceptionHandler], dict[int, ExceptionHandler]]:
    """The sub-application's exception handlers as its exception middleware hands them to
    its routes, plus its error handler (``Exception``; the server's ``on_error`` when it
    has none), which its server-error middleware would have called."""
    by_type: dict[Any, ExceptionHandler] = {}
    by_status: dict[int, ExceptionHandler] = {}
    error = on_error
    for key, handler in sub.exception_handlers.items():
        if key in (500, Exception):
            error = handler
        elif isinstance(key, int):
            by_status[key] = handler
        else:
            by_type[key] = handler
    by_type[Exception] = error
    return by_type, by_status


class RouteIndex:
    """The routes of the Starlette sub-applications mounted at ``prefixes`` (see the
    module's docstring), by method and number of path segments, each bucket in the
    routers' order. A mount's wrapper (hq's trailing-slash layer) is skipped only for
    paths it leaves unchanged: a trailing slash never matches a segment here."""

    def __init__(self, routes: Sequence[BaseRoute], prefixes: Collection[str], on_error: ExceptionHandler) -> None:
        self._buckets: dict[tuple[str, int], list[Target]] = {}
        for mount in routes:
            if not isinstance(mount, Mount) or mount.path not in prefixes:
                continue
            sub = _starlette(mount)
            handlers = _handlers(sub, on_error)
            for route in sub.routes:
                shape = _segments(mount.path + route.path) if isinstance(route, Route) else None
                if shape is None or not isinstance(route, Route) or route.methods is None:
                    continue
                target = Target(shape[0], shape[1], mount.path, sub, route, handlers)
                for method in route.methods:
                    self._buckets.setdefault((method, len(shape[0])), []).append(target)

    def find(self, method: str, path: str) -> tuple[Target, dict[str, str]] | None:
        parts = path.split("/")
        for target in self._buckets.get((method, len(parts)), ()):
            params = target.match(parts)
            if params is not None:
                return target, params
        return None


class IndexedRouter(Router):
    """Starlette's router with ``RouteIndex`` in front (see the module's docstring)."""

    def __init__(self, routes: Sequence[BaseRoute], *, indexed: Collection[str], lifespan: Any,
                 on_error: ExceptionHandler) -> None:
        super().__init__(routes, lifespan=lifespan)
        self.index = RouteIndex(self.routes, indexed, on_error)

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        # (behind a root_path, paths are left to Starlette, which strips it)
        found = (self.index.find(scope["method"], scope["path"])
                 if scope["type"] == "http" and not scope.get("root_path") else None)
        if found is None:
            await super().app(scope, receive, send)
            return
        target, params = found
        # the scope Mount, the sub-application and its router would have set
        root_path = scope.get("root_path", "")
        scope.setdefault("router", self)
        scope["app_root_path"] = scope.get("app_root_path", root_path)
        scope["root_path"] = root_path + target.prefix
        scope["app"] = target.sub
        scope["starlette.exception_handlers"] = target.handlers
        scope["route"] = target.route
        scope["endpoint"] = target.route.endpoint
        scope["path_params"] = params
        await target.route.app(scope, receive, send)
