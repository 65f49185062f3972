"""The native REST API under ``/v1`` (seed 000's table, plus hq's complete/fail)."""
