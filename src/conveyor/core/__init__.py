"""Core operations: thin async functions over the SQL API, each taking the connection it
runs on (so an application can enqueue inside its own transaction)."""
