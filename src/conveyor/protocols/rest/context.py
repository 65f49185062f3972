"""Where REST handlers find the broker: on the app's state, put there by the server."""

from __future__ import annotations

from starlette.requests import Request

from conveyor.protocols.broker import Broker


def broker(request: Request) -> Broker:
    found: Broker = request.app.state.broker
    return found
