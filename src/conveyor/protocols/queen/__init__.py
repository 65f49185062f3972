"""Queen MQ's HTTP API (``/api/v1/...``, seed 004) over Conveyor's partitioned queues, so
that Queen's own clients work against Conveyor unmodified. docs/queen.md."""
