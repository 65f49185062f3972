"""A database's schema as PostgreSQL's catalogs describe it, object by object, for comparing
two databases (tests/db/test_schema_equivalence.py): every object keyed by its name, so a
difference names the object; OIDs, and the bookkeeping tables' rows, are left out."""

from __future__ import annotations

import psycopg

SCHEMAS = ("conveyor", "pgmq", "pgq", "pgque", "hq")

# (kind, query returning (key, value) rows); %(schemas)s is the list of schemas compared
_QUERIES = {
    "schema": """
        SELECT n.nspname, concat_ws(' | ', n.nspacl::text, obj_description(n.oid, 'pg_namespace'))
          FROM pg_namespace n WHERE n.nspname = ANY(%(schemas)s)""",
    "relation": """
        SELECT n.nspname || '.' || c.relname,
               concat_ws(' | ', c.relkind, c.relpersistence, c.relrowsecurity, c.reloptions::text, c.relacl::text,
                         pg_get_partkeydef(c.oid), pg_get_expr(c.relpartbound, c.oid),
                         obj_description(c.oid, 'pg_class'))
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = ANY(%(schemas)s) AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S', 'c')""",
    "column": """
        SELECT n.nspname || '.' || c.relname || '.' || a.attname,
               concat_ws(' | ', a.attnum, format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attidentity,
                         a.attgenerated, pg_get_expr(d.adbin, d.adrelid), a.attacl::text,
                         col_description(c.oid, a.attnum))
          FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
          LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE n.nspname = ANY(%(schemas)s) AND a.attnum > 0 AND NOT a.attisdropped
           AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'c')""",
    "index": """
        SELECT n.nspname || '.' || c.relname, pg_get_indexdef(c.oid)
          FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = ANY(%(schemas)s)""",
    "constraint": """
        SELECT n.nspname || '.' || coalesce(r.relname, t.typname) || '.' || k.conname,
               concat_ws(' | ', k.contype, pg_get_constraintdef(k.oid), k.condeferrable, k.condeferred)
          FROM pg_constraint k JOIN pg_namespace n ON n.oid = k.connamespace
          LEFT JOIN pg_class r ON r.oid = k.conrelid LEFT JOIN pg_type t ON t.oid = k.contypid
         WHERE n.nspname = ANY(%(schemas)s)""",
    "sequence": """
        SELECT s.schemaname || '.' || s.sequencename,
               concat_ws(' | ', s.data_type, s.start_value, s.min_value, s.max_value, s.increment_by, s.cycle,
                         s.cache_size)
          FROM pg_sequences s WHERE s.schemaname = ANY(%(schemas)s)""",
    "view": """
        SELECT n.nspname || '.' || c.relname, pg_get_viewdef(c.oid)
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = ANY(%(schemas)s) AND c.relkind IN ('v', 'm')""",
    "trigger": """
        SELECT n.nspname || '.' || c.relname || '.' || g.tgname, concat_ws(' | ', pg_get_triggerdef(g.oid), g.tgenabled)
          FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE NOT g.tgisinternal
           AND (n.nspname = ANY(%(schemas)s)
                OR g.tgfoid IN (SELECT p.oid FROM pg_proc p JOIN pg_namespace pn ON pn.oid = p.pronamespace
                                 WHERE pn.nspname = ANY(%(schemas)s)))""",
    "type": """
        SELECT n.nspname || '.' || t.typname,
               concat_ws(' | ', t.typtype, format_type(t.typbasetype, t.typtypmod), t.typnotnull, t.typdefault,
                         (SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder) FROM pg_enum e
                           WHERE e.enumtypid = t.oid), t.typacl::text)
          FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
         WHERE n.nspname = ANY(%(schemas)s) AND t.typtype IN ('e', 'd', 'c', 'r', 'm')
           AND (t.typrelid = 0 OR (SELECT relkind FROM pg_class WHERE oid = t.typrelid) = 'c')""",
    "function": """
        SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid)
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = ANY(%(schemas)s) AND p.prokind IN ('f', 'p', 'w')""",
    "function settings": """
        SELECT p.oid::regprocedure::text, p.proconfig::text
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = ANY(%(schemas)s) AND p.proconfig IS NOT NULL""",
    "function grants": """
        SELECT p.oid::regprocedure::text, concat_ws(' | ', p.proacl::text, obj_description(p.oid, 'pg_proc'))
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = ANY(%(schemas)s)""",
    "inheritance": """
        SELECT h.inhrelid::regclass::text, string_agg(h.inhparent::regclass::text, ',' ORDER BY h.inhseqno)
          FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = ANY(%(schemas)s) GROUP BY h.inhrelid""",
    "policy": """
        SELECT schemaname || '.' || tablename || '.' || policyname,
               concat_ws(' | ', permissive, roles::text, cmd, qual, with_check)
          FROM pg_policies WHERE schemaname = ANY(%(schemas)s)""",
    "default privileges": """
        SELECT coalesce(n.nspname, '') || '.' || d.defaclobjtype::text, d.defaclacl::text
          FROM pg_default_acl d LEFT JOIN pg_namespace n ON n.oid = d.defaclnamespace
         WHERE n.nspname = ANY(%(schemas)s)""",
}


def snapshot(dsn: str, schemas: tuple[str, ...] = SCHEMAS) -> dict[str, str]:
    """``"kind name" -> description`` of every object of ``schemas``."""
    found: dict[str, str] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for kind, query in _QUERIES.items():
            for key, value in conn.execute(query, {"schemas": list(schemas)}).fetchall():
                found[f"{kind} {key}"] = value
    return found


def differences(a: dict[str, str], b: dict[str, str]) -> list[str]:
    """What differs between two snapshots, one line per object (empty when equal)."""
    out = []
    for key in sorted(set(a) | set(b)):
        if key not in b:
            out.append(f"only in the first: {key}")
        elif key not in a:
            out.append(f"only in the second: {key}")
        elif a[key] != b[key]:
            out.append(f"differs: {key}\n  first:  {a[key][:4000]!r}\n  second: {b[key][:4000]!r}")
    return out
