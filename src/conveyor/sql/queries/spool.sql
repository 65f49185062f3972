-- The failover spool's replay ledger (migration 0011, conveyor.server.spool).

-- name: spool_claim
SELECT conveyor.spool_claim(%(keys)s::text[])

-- name: spool_forget
SELECT conveyor.spool_forget(%(prefix)s::text)
