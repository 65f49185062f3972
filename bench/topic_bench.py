"""Topic fan-out throughput and webhook delivery rate.

    ./bin/bench topic_bench.py [--seconds 3] [--repeat 3] [--clients 8] [--deliveries 3000]

Rows, each measured in this one run against the same PostgreSQL:
  publish, N matching queue subscriptions   one topic with N = 1, 10 and 100 SQS-queue
                                            subscriptions; a publish lands one message in
                                            every queue inside its transaction. Reported:
                                            publishes/s and messages landed/s (= x N).
      sns publish (http)                    SNS Publish (Query protocol) to `conveyor
                                            serve` from --clients concurrent connections;
                                            the server signs each envelope (RSA-2048)
      moto sns publish                      the same requests to moto_server (the peer:
                                            an in-memory SNS with SQS fan-out)
      sql topic_publish                     conveyor.core.topics.publish (the SQL function
                                            conveyor.topic_publish) from --clients psycopg
                                            connections, envelopes unsigned
  webhook delivery                          --deliveries outbox rows (one publish to that
                                            many HTTP subscriptions of a local aiohttp
                                            endpoint answering 200), then a `conveyor
                                            serve` delivers them: rows delivered per second,
                                            from the first delivery's arrival to the last
                                            (CONVEYOR_WEBHOOK_BATCH --webhook-batch,
                                            CONVEYOR_WEBHOOK_POLL 0.05)

Every cell is bounded by --seconds and --max-publishes; the delivery run by --deliveries
and a 120 s limit. The load generator, the endpoint, the server and PostgreSQL share this
machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import time
from collections.abc import Awaitable, Callable

import aiohttp
import boto3
import psycopg
from aiohttp import web

from conveyor import types
from conveyor.core import topics
from queue_bench import Cell, Server, fresh_database, run_clients
from sqs_bench import start_moto

BODY = "x" * 100
ACCOUNT = "000000000000"
FANOUTS = (1, 10, 100)
URLS = types.TopicUrls()
# an (unsigned) SigV4 credential scope: moto_server routes a request to a service by it
AUTH = {"Authorization": "AWS4-HMAC-SHA256 Credential=bench/20260101/us-east-1/sns/aws4_request, "
                         "SignedHeaders=host, Signature=0"}
DELIVERY_LIMIT = 120.0


async def setup_topic(dsn: str, topic: str, fanout: int) -> None:
    """A topic object and ``fanout`` queues subscribed to it."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await topics.create(conn, topic)
        for i in range(fanout):
            queue = f"{topic}_q{i}"
            await conn.execute("SELECT conveyor.queue_create(%s)", (queue,))
            await topics.subscribe(conn, types.NewSubscription(pattern=topic, protocol="sqs", queue=queue))


def setup_moto_topic(url: str, topic: str, fanout: int) -> str:
    """The same topic and queues on moto_server, made through boto3; the topic's ARN."""
    session = boto3.session.Session(aws_access_key_id="bench", aws_secret_access_key="bench",
                                    region_name="us-east-1")
    sns, sqs = session.client("sns", endpoint_url=url), session.client("sqs", endpoint_url=url)
    arn = sns.create_topic(Name=topic)["TopicArn"]
    for i in range(fanout):
        queue_url = sqs.create_queue(QueueName=f"{topic}_q{i}")["QueueUrl"]
        queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        sns.subscribe(TopicArn=arn, Protocol="sqs", Endpoint=queue_arn)
    return arn


async def sns_cell(url: str, arn: str, clients: int, seconds: float, max_ops: int) -> Cell:
    form = {"Action": "Publish", "Version": "2010-03-31", "Message": BODY, "TopicArn": arn}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def make(_: int) -> Callable[[], Awaitable[bool]]:
            async def op() -> bool:
                async with session.post(url + "/", data=form, headers=AUTH) as r:
                    text = await r.text()
                    assert r.status == 200 and "<PublishResponse" in text, text
                return True
            return op
        return await run_clients(clients, seconds, max_ops, make)


async def sql_cell(dsn: str, topic: str, clients: int, seconds: float, max_ops: int) -> Cell:
    conns = [await psycopg.AsyncConnection.connect(dsn, autocommit=True) for _ in range(clients)]
    publication = types.Publication(body=BODY)
    try:
        async def make(n: int) -> Callable[[], Awaitable[bool]]:
            async def op() -> bool:
                await topics.publish(conns[n], topic, publication, signer=None, urls=URLS)
                return True
            return op
        return await run_clients(clients, seconds, max_ops, make)
    finally:
        for conn in conns:
            await conn.close()


def median(cells: list[Cell]) -> Cell:
    return sorted(cells, key=lambda c: c.rate)[len(cells) // 2]


# -- webhook deliveries --------------------------------------------------------------------------

async def delivery_rate(dsn: str, deliveries: int, batch: int) -> tuple[float, float, int]:
    """(deliveries/s, seconds, delivered) of a server draining ``deliveries`` outbox rows,
    timed from the first delivery to arrive to the last (server start-up left out)."""
    received = 0
    first = last = 0.0
    done = asyncio.Event()

    async def handle(request: web.Request) -> web.Response:
        nonlocal received, first, last
        await request.read()
        received += 1
        last = time.perf_counter()
        first = first or last
        if received >= deliveries:
            done.set()
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for i in range(deliveries):
            await topics.subscribe(conn, types.NewSubscription(
                pattern="hooks", protocol="http", endpoint=f"http://127.0.0.1:{port}/hook/{i}"))
        published = await topics.publish(conn, "hooks", types.Publication(body=BODY), signer=None, urls=URLS)
    assert published.endpoints == deliveries
    server = Server(dsn, True, CONVEYOR_WEBHOOK_ALLOW="127.0.0.1/32", CONVEYOR_WEBHOOK_POLL="0.05",
                    CONVEYOR_WEBHOOK_BATCH=str(batch))
    try:
        await server.wait_ready()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), DELIVERY_LIMIT)
    finally:
        server.stop()
        await runner.cleanup()
    elapsed = last - first
    return (received - 1) / elapsed if elapsed > 0 else 0.0, elapsed, received


# -- main ----------------------------------------------------------------------------------------

async def main(args: argparse.Namespace) -> None:
    dsn = await fresh_database("conveyor_topic_bench")
    server = Server(dsn, True, CONVEYOR_WEBHOOK_ALLOW="none")
    moto = start_moto()
    rows: list[tuple[str, int, Cell]] = []
    try:
        await server.wait_ready()
        moto.wait_ready("/moto-api/")
        for fanout in FANOUTS:
            topic = f"bench_{fanout}"
            await setup_topic(dsn, topic, fanout)
            arn = f"arn:aws:sns:us-east-1:{ACCOUNT}:{topic}"
            moto_arn = setup_moto_topic(moto.url, topic, fanout)
            await sns_cell(server.url, arn, args.clients, 0.5, 1000)  # warm up: key loaded, pool open
            runs = {"sns publish (http)": lambda a=arn: sns_cell(server.url, a, args.clients, args.seconds,
                                                                  args.max_publishes),
                    "moto sns publish": lambda a=moto_arn: sns_cell(moto.url, a, args.clients, args.seconds,
                                                                     args.max_publishes),
                    "sql topic_publish": lambda t=topic: sql_cell(dsn, t, args.clients, args.seconds,
                                                                   args.max_publishes)}
            for label, run in runs.items():
                cell = median([await run() for _ in range(args.repeat)])
                rows.append((label, fanout, cell))
                print(f"  {label:<20} fan-out {fanout:>3}: {cell.rate:8.0f} publishes/s "
                      f"{cell.rate * fanout:9.0f} messages landed/s", flush=True)
    finally:
        server.stop()
        moto.stop()
    rates = []
    for _ in range(args.repeat):
        rate, elapsed, delivered = await delivery_rate(await fresh_database("conveyor_topic_bench_hooks"),
                                                       args.deliveries, args.webhook_batch)
        rates.append(rate)
        print(f"  webhook delivery: {delivered} in {elapsed:.2f} s = {rate:.0f}/s", flush=True)

    print()
    print(f"topic fan-out ({args.clients} clients, median of {args.repeat} runs of {args.seconds:g}s, "
          f"{len(BODY)}-byte messages, {os.cpu_count()} cores shared by everything)")
    print(f"{'path':<22}{'fan-out':>8}{'publishes/s':>14}{'landed/s':>12}")
    for label, fanout, cell in rows:
        print(f"{label:<22}{fanout:>8}{cell.rate:>14.0f}{cell.rate * fanout:>12.0f}")
    print()
    print(f"webhook delivery to a local endpoint: {statistics.median(rates):.0f} deliveries/s "
          f"(median of {args.repeat}; {args.deliveries} rows, batch {args.webhook_batch}, first to last arrival)")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=3.0, help="duration of each publish cell")
    p.add_argument("--repeat", type=int, default=3, help="runs per cell; the median is reported")
    p.add_argument("--clients", type=int, default=8, help="concurrent publishers")
    p.add_argument("--max-publishes", type=int, default=100_000, help="publishes per cell at most")
    p.add_argument("--deliveries", type=int, default=3000, help="outbox rows the delivery run drains")
    p.add_argument("--webhook-batch", type=int, default=50, help="CONVEYOR_WEBHOOK_BATCH of the delivery run")
    return p.parse_args()


if __name__ == "__main__":
    import uvloop

    uvloop.install()
    asyncio.run(main(parse_args()))
