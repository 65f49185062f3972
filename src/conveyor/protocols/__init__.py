"""Wire protocols: each parses its requests, calls the broker and core ops, and renders
results and errors in its own format. No SQL here."""
