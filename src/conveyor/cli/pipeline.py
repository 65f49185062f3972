"""``conveyor pipeline``: the Spark jobs — ``archive`` (a stream or a queue's archive into
a Delta table, exactly once) and ``report`` (HTML with charts, and JSON, from the
archived data). Both take ``--master`` and Spark settings (``--conf key=value``) and
print progress on stderr. Needs the ``pipeline`` extra (PySpark, Java 17)."""

from __future__ import annotations

import contextlib
import signal
import threading
from pathlib import Path
from typing import Any

import click

from conveyor import errors
from conveyor.cli import context, output

_master = click.option("--master", default="local[*]", show_default=True, metavar="URL",
                       help="Spark master: local[N], spark://host:7077, yarn, k8s://... .")
_conf = click.option("--conf", "conf", multiple=True, metavar="KEY=VALUE",
                     help="A Spark setting, passed through (repeatable), e.g. spark.executor.memory=4g.")


def _modules() -> Any:
    try:
        from conveyor.pipeline import archive, human, report, session
    except ImportError as exc:
        raise click.ClickException(
            f"the pipeline needs the 'pipeline' extra (pip install 'conveyor[pipeline]'): {exc}") from None
    return archive, human, report, session


def _spark(session: Any, master: str, conf: tuple[str, ...], short: bool = False) -> Any:
    """A session started on first use (session.Lazy): small work never starts the JVM;
    ``short``: its work is small (session.Lazy)."""
    try:
        settings = session.parse_conf(conf)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--conf") from None
    return session.Lazy(master, settings, progress=output.note, short=short)


@click.group()
def pipeline() -> None:
    """Spark jobs over queues and streams: archive into a lake, report on it."""


@pipeline.command()
@click.option("--stream", metavar="NAME", help="Archive this stream (read as its own consumer).")
@click.option("--queue", metavar="NAME", help="Archive this queue's archive (completed and failed messages).")
@click.option("--path", "path", required=True, type=click.Path(path_type=Path), metavar="DIR",
              help="The Delta table to append to (created if missing), partitioned by date.")
@click.option("--consumer", default="conveyor-archive", show_default=True, metavar="NAME",
              help="The stream consumer the archive reads as (registered on the first run; its lag in "
                   "`conveyor status` is what is not archived yet).")
@click.option("--checkpoint", type=click.Path(path_type=Path), metavar="DIR",
              help="Spark checkpoint (default: DIR/_checkpoint, beside the data).")
@click.option("--once", is_flag=True, help="Archive everything available now, then stop (default: continuous).")
@click.option("--interval", default=10.0, show_default=True, metavar="SECONDS",
              help="Continuous mode: seconds between micro-batches.")
@click.option("--from", "start", type=click.Choice(["latest", "earliest"]),
              help="Where a new archive starts: earliest (default: the oldest event or archived message "
                   "still kept) or latest (only what arrives from now on).")
@click.option("--max-events", default=100_000, show_default=True, metavar="N",
              help="At most about N events per micro-batch (streams).")
@click.option("--partitions", default=4, show_default=True, metavar="N",
              help="At most N Spark tasks per micro-batch.")
@click.option("--rows-per-task", default=10_000, show_default=True, metavar="N",
              help="Each Spark task gets at least about N rows; a micro-batch of at most N rows is written "
                   "by the driver alone, without starting Spark.")
@_master
@_conf
@output.json_option
@click.pass_obj
def archive(obj: Any, stream: str | None, queue: str | None, path: Path, consumer: str, checkpoint: Path | None,
            once: bool, interval: float, start: str | None, max_events: int, partitions: int, rows_per_task: int,
            master: str, conf: tuple[str, ...]) -> None:
    """Archive a stream or a queue's archive into a Delta table, exactly once.

    Incremental: each run goes on where the last one stopped (the checkpoint). The Spark
    tasks write the Parquet files; every micro-batch is one atomic Delta commit of the
    files of its successful tasks, so any reader (Spark, DuckDB, pyarrow) sees each event
    once, even after a crash."""
    if (stream is None) == (queue is None):
        raise click.UsageError("give exactly one of --stream and --queue")
    archive_mod, human, _, session = _modules()
    stop = threading.Event()
    with context.database_url(obj.settings()) as dsn:
        try:
            job = archive_mod.ArchiveJob(
                dsn=dsn, path=path, stream=stream, queue=queue, consumer=consumer, checkpoint=checkpoint,
                once=once, interval=interval, starting_position=start, max_events=max_events,
                partitions=partitions, rows_per_task=rows_per_task)
        except errors.ConveyorError as exc:
            raise click.UsageError(exc.message) from None
        spark = _spark(session, master, conf)
        if stream is not None:
            output.note(f"reading stream {stream} as its consumer {consumer!r}: `conveyor status` shows its lag "
                        "(what is not archived yet)")
        if not once:
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda *_: stop.set())
            output.note("archiving continuously; Ctrl-C stops after the current micro-batch")
        try:
            result = archive_mod.run(spark, job, progress=output.note, stop=stop)
        except errors.ConveyorError as exc:
            raise click.ClickException(exc.message) from None
        finally:
            spark.stop()
    output.emit(
        {"source": job.source, "path": str(path), "batches": result.batches, "rows": result.rows,
         "files": result.files, "spark_batches": result.spark_batches, "replayed_batches_skipped": result.skipped,
         "stray_files_removed": result.swept, "seconds": round(result.seconds, 3),
         "table_version": result.table_version, "end_offset": result.end_offset},
        obj.as_json,
        f"archived {human.count(result.rows, 'row')} of {job.source} in {human.count(result.files, 'file')}, "
        f"{human.count(result.batches, 'micro-batch', 'micro-batches')}, in {human.duration(result.seconds)} "
        f"({human.rate(result.rows, result.seconds)}) into {path} (table version {result.table_version})")


@pipeline.command()
@click.option("--path", "path", required=True, type=click.Path(exists=True, path_type=Path), metavar="DIR",
              help="The Delta table (written by `pipeline archive`).")
@click.option("--retention-hours", default=168, show_default=True, metavar="N",
              help="Keep the files of versions younger than N hours (time travel); older unlisted files go.")
@output.json_option
@click.pass_obj
def compact(obj: Any, path: Path, retention_hours: int) -> None:
    """Merge a table's small files and delete the ones no recent version lists (delta-rs
    optimize + vacuum; no Spark). Safe while an archive appends."""
    try:
        from conveyor.pipeline import human, lake
    except ImportError as exc:
        raise click.ClickException(f"the pipeline needs the 'pipeline' extra: {exc}") from None
    if retention_hours < 0:
        raise click.BadParameter("must be at least 0", param_hint="--retention-hours")
    try:
        done = lake.compact(path, retention_hours)
    except errors.ConveyorError as exc:
        raise click.ClickException(exc.message) from None
    output.emit({"path": str(path), **done}, obj.as_json,
                f"{path}: {human.count(done['files_replaced'], 'file')} merged into {done['files_added']}, "
                f"{human.count(done['files_deleted'], 'file')} deleted")


@pipeline.command()
@click.argument("lake", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--out", required=True, type=click.Path(path_type=Path), metavar="DIR",
              help="Where report.html, report.json and the charts go.")
@click.option("--dead-letters/--no-dead-letters", default=True, show_default=True,
              help="Count streams' dead letters in the database (--database-url / DATABASE_URL, else the "
                   "embedded one).")
@_master
@_conf
@output.json_option
@click.pass_obj
def report(obj: Any, lake: tuple[Path, ...], out: Path, dead_letters: bool, master: str,
           conf: tuple[str, ...]) -> None:
    """Report on archived data: throughput per minute, latency percentiles, retries and
    dead letters per queue and stream.

    LAKE: Delta tables written by `conveyor pipeline archive`, or directories of them."""
    _, human, report_mod, session = _modules()
    spark = _spark(session, master, conf, short=report_mod.small(lake))
    try:
        with (context.database_url(obj.settings()) if dead_letters else contextlib.nullcontext()) as dsn:
            figures = report_mod.build(spark.get(), list(lake), dsn=dsn, progress=output.note)
    except errors.ConveyorError as exc:
        raise click.ClickException(exc.message) from None
    finally:
        spark.stop()
    output.note("writing the report")
    from conveyor.pipeline import render  # matplotlib: imported only here

    files = render.write(figures, out)
    output.emit(figures.to_json() | {"files": {k: str(v) for k, v in files.items()}}, obj.as_json,
                lambda: "\n".join([f"report: {files['html']}", f"figures: {files['json']}",
                                   *(_summary(human, s) for s in figures.sources)]))


def _summary(human: Any, s: Any) -> str:
    """One source's line: its count and latencies, saying what they measure."""
    def pcts(values: dict[str, float]) -> str:
        return ", ".join(f"{k} {human.milliseconds(values[k])}" for k in ("p50", "p99") if k in values) or "-"

    line = f"{s.kind} {s.name}: {human.count(s.messages, 'message' if s.kind == 'queue' else 'event')}"
    if s.kind == "queue":
        return f"{line}; enqueue to first delivery {pcts(s.first_delivery_ms)}; enqueue to ack {pcts(s.latency_ms)}"
    return f"{line}; append to archive {pcts(s.latency_ms)} (when the archive ran)"
