"""What the server's edge adds per request, measured in process (no network, no database),
where a busy machine's noise is smallest:

1. uvicorn's httptools protocol against Conveyor's (server/connections.py: the idle and
   header deadlines, the connection table) and uvicorn's h11 protocol, each serving keep-alive requests to a
   minimal ASGI app through an in-memory transport: CPU microseconds per request, and per
   request whose headers arrive in two reads (the path where a header deadline is armed).
2. orjson.loads against conveyor.json_input.loads (the nesting limit) on the SQS hot
   path's SendMessage body and on a REST batch of 100 messages.

    .venv/bin/python bench/edge_bench.py [--requests 20000] [--repeat 9]

The variants take turns within each repeat (A B B A ...); medians of --repeat runs are
reported with their spread. CPU time is this process's (time.process_time).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import timeit
from collections.abc import Callable
from typing import Any

import orjson
import uvicorn
import uvloop
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from conveyor import json_input
from conveyor.server import connections

REQUEST = (b"POST / HTTP/1.1\r\nHost: 127.0.0.1:9324\r\nContent-Type: application/x-amz-json-1.0\r\n"
           b"X-Amz-Target: AmazonSQS.SendMessage\r\nContent-Length: 2\r\n\r\n{}")


class Transport(asyncio.Transport):
    """Takes what the protocol writes; a response is complete when its body has been written."""

    def __init__(self) -> None:
        super().__init__()
        self.answered = asyncio.Event()
        self.closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if bytes(data).endswith(b"ok"):
            self.answered.set()

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 9324), "peername": ("127.0.0.1", 40000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def app(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def serve(protocol_class: type[asyncio.Protocol], requests: int, split: bool) -> float:
    """CPU microseconds per request over ``requests`` keep-alive requests on one connection."""
    config = uvicorn.Config(app, http=protocol_class, lifespan="off", log_config=None, access_log=False)
    config.load()
    proto: Any = protocol_class(config=config, server_state=ServerState(), app_state={})  # type: ignore[call-arg]
    transport = Transport()
    proto.connection_made(transport)
    head, tail = REQUEST[:40], REQUEST[40:]
    started = time.process_time()
    for _ in range(requests):
        if split:
            proto.data_received(head)
            proto.data_received(tail)
        else:
            proto.data_received(REQUEST)
        await transport.answered.wait()
        transport.answered.clear()
    elapsed = time.process_time() - started
    proto.connection_lost(None)
    return elapsed / requests * 1e6


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):6.2f} (min {min(values):.2f}, max {max(values):.2f})"


def protocols(args: argparse.Namespace) -> None:
    guarded = connections.protocol(10000, 5.0, lambda reason: None)
    variants: dict[str, type[asyncio.Protocol]] = {
        "uvicorn httptools": HttpToolsProtocol, "conveyor (guarded)": guarded, "uvicorn h11": H11Protocol}
    for split in (False, True):
        runs: dict[str, list[float]] = {name: [] for name in variants}
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            for cls in variants.values():  # warm-up
                runner.run(serve(cls, 2000, split))
            for i in range(args.repeat):
                order = list(variants.items()) if i % 2 == 0 else list(variants.items())[::-1]
                for name, cls in order:
                    runs[name].append(runner.run(serve(cls, args.requests, split)))
        what = "headers in two reads" if split else "whole request in one read"
        print(f"\nprotocol, {what}: CPU us per request")
        for name, values in runs.items():
            print(f"  {name:<20} {spread(values)}")
        base, ours = statistics.median(runs["uvicorn httptools"]), statistics.median(runs["conveyor (guarded)"])
        print(f"  guarded - httptools: {ours - base:+.2f} us per request ({ours / base - 1:+.1%})")


def bodies(args: argparse.Namespace) -> None:
    send = orjson.dumps({"QueueUrl": "http://127.0.0.1:9324/000000000000/bench", "MessageBody": "x" * 100})
    batch = orjson.dumps([{"message": {"order": i, "items": [{"sku": "a", "n": 1}]}} for i in range(100)])
    for label, body in (("SendMessage body", send), ("REST batch of 100 (over 127 brackets: checked)", batch)):
        runs: dict[str, list[float]] = {"orjson.loads": [], "json_input.loads": []}
        number = max(1, 2_000_000 // len(body))
        for i in range(args.repeat):
            order = ["orjson.loads", "json_input.loads"] if i % 2 == 0 else ["json_input.loads", "orjson.loads"]
            for name in order:
                fn = orjson.loads if name == "orjson.loads" else json_input.loads
                runs[name].append(timeit.timeit(lambda fn=fn, body=body: fn(body), number=number, timer=time.process_time)
                                  / number * 1e6)
        print(f"\n{label} ({len(body)} bytes): us per parse")
        for name, values in runs.items():
            print(f"  {name:<20} {spread(values)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=20000, help="requests per run (default 20000)")
    p.add_argument("--repeat", type=int, default=9, help="runs per variant; medians reported (default 9)")
    args = p.parse_args()
    protocols(args)
    bodies(args)


if __name__ == "__main__":
    main()
