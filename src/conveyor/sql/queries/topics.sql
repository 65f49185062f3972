-- Queries over the topic functions of migrations 0005 and 0008: topics, subscriptions,
-- publish, the webhook outbox and the signing key. Every parameter is cast so NULLs get a type.

-- name: topic_create
SELECT * FROM conveyor.topic_create(%(name)s::text, %(attributes)s::jsonb, %(tags)s::jsonb)

-- name: topic_delete
SELECT conveyor.topic_delete(%(name)s::text)

-- name: topic_get
SELECT * FROM conveyor.topic_get(%(name)s::text)

-- name: topic_list
SELECT * FROM conveyor.topic_list(%(prefix)s::text, %(after)s::text, %(limit)s::integer)

-- name: topic_set_attributes
SELECT * FROM conveyor.topic_set_attributes(%(name)s::text, %(attributes)s::jsonb)

-- name: topic_tag
SELECT conveyor.topic_tag(%(name)s::text, %(tags)s::jsonb)

-- name: topic_untag
SELECT conveyor.topic_untag(%(name)s::text, %(keys)s::text[])

-- name: topic_publish
SELECT queues, endpoints, sequence_number, messages, sealed FROM conveyor.topic_publish(%(routing_key)s::text, %(message)s::jsonb)

-- name: topic_pattern_matches
SELECT conveyor.topic_pattern_matches(%(pattern)s::text, %(key)s::text)

-- name: topic_filter_matches
SELECT conveyor.filter_policy_matches(%(policy)s::jsonb, %(scope)s::text, %(attributes)s::jsonb, %(body)s::text)

-- name: subscription_create
SELECT * FROM conveyor.subscription_create_v2(%(pattern)s::text, %(protocol)s::text, %(queue)s::text,
                                              %(endpoint)s::text, %(raw_delivery)s::boolean,
                                              %(filter_policy)s::jsonb, %(filter_policy_scope)s::text,
                                              %(attributes)s::jsonb, %(confirmed)s::boolean,
                                              %(queue_must_exist)s::boolean)

-- name: subscription_delete
SELECT conveyor.subscription_delete(%(ref)s::text)

-- name: subscription_get
SELECT * FROM conveyor.subscription_get(%(ref)s::text)

-- name: subscription_set_attributes
SELECT * FROM conveyor.subscription_set_attributes(%(ref)s::text, %(changes)s::jsonb)

-- name: subscription_list
SELECT * FROM conveyor.subscription_list(%(pattern)s::text, %(queue)s::text, %(after_id)s::bigint,
                                         %(limit)s::integer)

-- name: delivery_claim
SELECT * FROM conveyor.delivery_claim(%(limit)s::integer, %(lease_seconds)s::integer)

-- name: delivery_succeeded
SELECT conveyor.delivery_succeeded(%(ids)s::bigint[])

-- name: delivery_failed
SELECT * FROM conveyor.delivery_failed(%(id)s::bigint, %(error)s::text, %(retry_in)s::double precision,
                                       %(attempts)s::integer, %(region)s::text)

-- name: delivery_defer
SELECT conveyor.delivery_defer(%(ids)s::bigint[], %(seconds)s::double precision)

-- name: delivery_policies
SELECT * FROM conveyor.delivery_policies(%(subscription_ids)s::bigint[], %(topics)s::text[])

-- name: delivery_hold
SELECT * FROM conveyor.delivery_hold(%(id)s::bigint, %(reason)s::text)

-- name: delivery_retry
SELECT conveyor.delivery_retry(%(ids)s::bigint[])

-- name: delivery_list
SELECT * FROM conveyor.delivery_list(%(state)s::text, %(subscription)s::text, %(limit)s::integer)

-- name: delivery_stats
SELECT * FROM conveyor.deliveries_stats()

-- name: signing_key_get
SELECT private_key, certificate FROM conveyor.signing_key_get()

-- name: signing_key_create
SELECT private_key, certificate FROM conveyor.signing_key_create(%(private_key)s::text, %(certificate)s::text)

-- name: signing_key_certificate
SELECT conveyor.signing_certificate()

-- name: delivery_send
SELECT conveyor.delivery_send(%(subscription)s::uuid, %(payload)s::text, %(headers)s::jsonb, %(message_id)s::uuid)
