"""The ASGI server: app assembly, middleware, and the background workers that make a
stateless Python process fast (request fusion, long-poll waiters, maintenance)."""
