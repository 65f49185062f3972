"""The server's brokers, one per concept, each owning its fusion lanes and waiters:
``queues`` (standard and FIFO queues), ``partitioned`` (Queen's partitioned queues),
``streams``, ``topics``; ``sealing`` (encryption at rest) and ``failover`` (the spool on
the write path) serve them, and ``base`` is what they share. ``conveyor.server.broker``
composes them into the one object the protocols are given."""
