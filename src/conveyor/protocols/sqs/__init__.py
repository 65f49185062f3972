"""The Amazon SQS wire protocol (JSON and Query), on Conveyor's queues."""
