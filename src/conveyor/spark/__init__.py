"""Conveyor's Spark data source: queues, archives, streams and dead letters as Spark
DataFrames (batch and streaming), and writes into queues and streams.

    import conveyor.spark
    conveyor.spark.register(spark)
    spark.read.format("conveyor").option("dsn", dsn).option("queue", "jobs").load()

Needs the ``pipeline`` extra (PySpark 4, pyarrow). Nothing else in Conveyor imports this
package, so the broker runs without Spark installed. See docs/pipeline.md.
"""

from __future__ import annotations

from typing import Any

from conveyor.spark.source import ConveyorDataSource

__all__ = ["ConveyorDataSource", "register"]


def register(spark: Any) -> None:
    """Make ``format("conveyor")`` available in this Spark session."""
    spark.dataSource.register(ConveyorDataSource)
