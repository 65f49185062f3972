"""The ``conveyor`` Python data source (PySpark 4's ``pyspark.sql.datasource``)."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.types import StructType

from conveyor import errors
from conveyor.spark import options as opts
from conveyor.spark import schemas, slices, streaming, writers


class BatchReader(DataSourceReader):
    def __init__(self, options: opts.Options) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        return list(slices.plan(self.options))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, slices.Slice)
        return slices.read(self.options, partition)


class ConveyorDataSource(DataSource):
    """``spark.read.format("conveyor").option("dsn", ...).option("queue" | "stream" |
    "partitionedQueue", name)``; see docs/pipeline.md for every option."""

    @classmethod
    def name(cls) -> str:
        return "conveyor"

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.parsed = opts.parse(options)

    def schema(self) -> str:
        return schemas.ddl(self.parsed.fields)

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(self.parsed)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        make: type[streaming.PartitionedReader | streaming.StreamReader | streaming.ArchiveReader]
        if self.parsed.partitioned_queue is not None:
            make = streaming.PartitionedReader
        elif self.parsed.stream is not None:
            make = streaming.StreamReader
        else:
            make = streaming.ArchiveReader
        return streaming.Several(self.parsed, make) if self.parsed.several else make(self.parsed)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        self._check_write(schema, overwrite)
        return writers.BatchWriter(self.parsed)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        self._check_write(schema, overwrite)
        return writers.StreamWriter(self.parsed)

    def _check_write(self, schema: StructType, overwrite: bool) -> None:
        if self.parsed.several:
            raise errors.InvalidInput("write into one queue or stream at a time (not a list or a pattern)")
        if self.parsed.partitioned_queue is not None:
            raise errors.InvalidInput("the conveyor data source reads partitioned queues but does not write them: "
                                      "push through Queen's API (POST /api/v1/push) or conveyor.pqueue_push")
        if overwrite:
            raise errors.InvalidInput("queues and streams are appended to: use mode append")
        writers.check_schema(schema, self.parsed)
