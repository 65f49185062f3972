"""Conveyor's pipeline jobs on Spark: ``archive`` (a stream or a queue's archive into a
Delta table, exactly once across crashes) and ``report`` (Spark SQL over the archived
data into HTML with charts, and JSON). Needs the ``pipeline`` extra; see docs/pipeline.md.
"""
