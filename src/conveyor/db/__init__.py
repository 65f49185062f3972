"""The database layer: named SQL, the one execute funnel, pools, migrations, the embedded cluster.

Only this package imports psycopg; everything above it passes connections through as
opaque values and receives Conveyor's own value types and errors.
"""
