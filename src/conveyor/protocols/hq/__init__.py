"""hq's HTTP API (seed 003) over Conveyor queues: docs/dialects/hq.md."""
