-- Queries over the move task functions of migration 0002.

-- name: move_task_start
SELECT * FROM conveyor.move_task_start(%(source)s::text, %(destination)s::text, %(max_per_second)s::integer)

-- name: move_task_cancel
SELECT * FROM conveyor.move_task_cancel(%(handle)s::uuid)

-- name: move_task_list
SELECT * FROM conveyor.move_task_list(%(source)s::text, %(max_results)s::integer)

-- name: move_task_step
SELECT conveyor.move_task_step(%(max_rows)s::integer)
