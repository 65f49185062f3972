"""Landed migrations are frozen: their text may not change, only new ones be added.

A database migrated by an earlier build keeps that build's functions; editing a landed
migration in place would leave such databases behind without anyone noticing (the server
refuses them by checksum, which is the runtime half of this rule). Append a new migration
and add its checksum here once it has landed.
"""

from __future__ import annotations

import re
from importlib import resources

from conveyor.db import migrate

LANDED = {
    "0001_queues": "efa8a3b4c0e4ad1b7666bde2538717dee598a26053ad53792299f3d2c0d04ded",
    "0002_redrive_and_attempts": "d61c1f37708ebebf7321a4da7ddd3af1ff6e7d3d17c76dcec08ca51feb15e53c",
    "0003_streams": "fa5d7ab3860fc844eda79ab14262c078e83a50112f0274c6dbadf30cd3e14387",
    "0004_schedules": "956971ff9cd559641c46a8c17fdf3e07136ae21fcc42dba5198d1a391a640662",
    "0005_topics": "bb4aa535c5a05930b15ceae6e6d706849354bece6b872f462c61ba419ab9f9e1",
    "0006_pipeline": "fb2f16e2912957b83cdc7b564df403eb811e4ba3671e23d9353fce250a56a855",
    "0007_deliveries": "4f81323bc1754d67a56544609bd64fdd52015ac8a93dc47a9e0d84f41153de05",
    "0008_grouped_receive": "2c2f2fc88abd77e2baacf95910345f5c4fb106d43e1a4465f758b7dec74930d8",
    "0009_partitioned_queues": "266ae1e3bcb165c5885a90d5b2e5252e9ed78f2bf0d491b8422a283c4f1f42e7",
    "0010_topic_fidelity": "fc59e63a98e1de50fcb7536871960eb2dc4b77dfb1822cb10d2d655ecf4498c3",
    "0011_spool": "3108e5e096b32715aaae1322fb9d42cf1792b6390e9590c5f8f6604fef38514a",
    "0012_dashboard_history": "88dae6ee1fb9e2c793a3bc035b15766f7d47c3afa3a8ac285dc32ecaba076558",
    "0013_stream_trace": "dd9e6b078661022242797dab57a5f9eb91eb43cf377251ed94a38fcb04452d37",
    "0014_message_plans_and_pop": "6a4a7186f8100fa70420c8af8e5cce50b790e82887878d9b11c2dab5b6feb0f3",
    "0015_partition_messages_reader": "5c46799bd9a2477e931270a116568af764a868a4c6f33ba8a353ed231cf5f47c",
    "0017_claim_by_key": "f1c22c5f8368fde6bc26e7784062dad131848d47cd11d016ab62ff0201d683b6",
    "0016_queue_storage_kinds": "0e391af8eb012df5fa2d1392090ca8aa181e6ff4c9a62c11b06ea6d1879e904f",
    "0018_statement_message_ids": "070a76b912e0177f7f2e7baef9dc64796ef0d078af52c94710b633072f078019",
    "0019_receive_limit": "1ab61920f01cba3b6bda0327340e9051e307b840389aa40716a0fe88e627e6db",
    "0020_flat_backlog": "ce112609f637441a2f523d3fdffa23f1e28ff6f634da03ec380894b63a01c953",
    "0021_queen_lease_fencing_and_queue_creation": "a04f811be48f7893d40a86aaa0d5b57f76397b5482bcdc644b50aeff75371676",
    "0022_aws_fidelity": "0506381e5fe4f3c0b162caeb580b3f2c43425a35fc962b9ad355877f51cbfdea",
    "0023_stream_cooperative_members": "1fdc03eff1ea05b930c913d5610a2890c9b8a7bc98d7ff85f56af5a57acd0939",
    "0024_fifo_semantics": "8f0db2cba65e42592c127443f042504a5f5f8a91caa42567937822e1df749ad1",
    "0025_lean_request_path": "e6dc2c34d012f3874b706ddeba68e0ea066066455d2958ef3df93b6517dbfdc8",
    "0026_delivery_policy": "001fe82a089fe92912b9b6ee25bd0ed1e93e2036c81cce46480b33fb1684d463",
}
LANDED_DIALECTS = {
    "pgmq/0001_pgmq": "195c507c3cb8ffbf696f0e7ce0eeebae0dc276d992ae16c3adee2627344c276d",
    "pgque/0001_pgque": "ebbffd71c9a7344814ba3c6685cfe644e4077333b714c7a7f45e0a7384cec1c9",
    "pgq/0001_pgq": "42481a22ac53578fe8e4d02efc10001f45dc9ff4fb76014a94beab4351d87e6c",
    "hq/0001_hq": "d61519b3f2b29daff0254c0f1e46e0e7e126f082bd5b52a8ab34b1fca1e4a4cd",
    "pgmq/0002_direct_paths": "6350f8672e3285d3bc5a340679cc3e3c4b37b09423ec63a78d4ee61b9073908e",
    "pgq/0002_static_appends": "8463da272fd7447196292d034836d7c080dff14f06ffe5d75de963d22b04cd0a",
    "pgmq/0003_storage_kinds": "03f6004b1c6612d7d054761eb0b48313b81493de8fd11050883c462b949b7ed0",
    "pgmq/0004_statement_message_ids": "f87c2d808b7458abae3d66d2a828582ac6febf1e1ffbf225f4f00b49ea15a35a",
    "pgq/0003_trigger_queries": "0c0cd5ed6b73127f2a0c2f266675dc72c0f7fcb9f3ee1152b9abbc54894b766b",
    "pgque/0002_cooperative_consumers": "43f1c73e804b2fd600d0173e75a0af4d669df8523012961b3527d2eb5040d6d4",
    "pgq/0004_tables_and_raw_calls": "79bd55617dc212305409690344239fb1cc734f551d853e29ef8e7893ce1452f4",
    "hq/0002_index_names": "0280b8f961138d8b025655293aadc5004a31317fa1c1d33b0c5d157db2336df7",
    "pgmq/0005_whole_api": "0f2a68c053903bb522fca8dcbe52392f3ad40de4c912a5b5e29dcce726882af2",
}


def test_landed_migrations_are_unchanged():
    found = {m.label: m.checksum for m in migrate.migrations()}
    found.update({m.label: m.checksum for d in migrate.DIALECTS for m in migrate.migrations(d)})
    changed = {label for label, checksum in {**LANDED, **LANDED_DIALECTS}.items() if found.get(label) != checksum}
    assert not changed, f"landed migrations edited in place (add a new migration instead): {sorted(changed)}"


# The migrations landed before functions moved to sql/functions/ hold the functions of
# their time: stored compressed as history, so that readers and the duplicate finder meet
# each function once, where it stands now (docs/architecture.md).
# The last such migration of each scope (later ones hold no functions and stay plain text).
HISTORY_LAST = {"": 18, "pgmq": 4, "pgq": 3, "pgque": 1, "hq": 1}
HISTORY = {label for label in {*LANDED, *LANDED_DIALECTS}
           if int(label.rpartition("/")[2][:4]) <= HISTORY_LAST[label.rpartition("/")[0]]}


def test_the_history_with_old_function_bodies_is_stored_compressed():
    sql = resources.files("conveyor") / "sql"
    for label in HISTORY:
        dialect, _, stem = label.rpartition("/")
        folder = sql / "dialects" / dialect if dialect else sql / "migrations"
        assert (folder / f"{stem}.sql.gz").is_file() and not (folder / f"{stem}.sql").is_file(), label


# Functions that a table's definition uses (a generated column's expression, a default, a
# check constraint, an index expression) are part of that table: the migration that makes
# the table creates them, before the table (tests/db/test_schema_equivalence.py checks that
# a table does depend on each).
TABLE_FUNCTIONS = {"pgmq/0005_whole_api": {"pgmq._topic_regex"}}

_CREATE = re.compile(r"^\s*CREATE\s+(?:OR\s+REPLACE\s+)?(FUNCTION|PROCEDURE|VIEW|TRIGGER)\s+([\w.\"]+)\s*(\(?)",
                     re.IGNORECASE | re.MULTILINE)
_TYPE_WORDS = {"double", "character", "timestamp", "time", "bit"}
_ALIASES = {"int": "integer", "int4": "integer", "int8": "bigint", "bool": "boolean", "int2": "smallint",
            "timestamp with time zone": "timestamptz", "varchar": "character varying"}


def _code(sql: str) -> str:
    """The statements of a SQL file without comments and without what is dollar-quoted
    (function bodies, which may hold CREATE statements of their own)."""
    sql = re.sub(r"(\$[A-Za-z_]*\$).*?\1", "$$", sql, flags=re.DOTALL)
    return re.sub(r"--[^\n]*", "", sql)


def _arguments(code: str, start: int) -> str:
    depth, i = 1, start
    while depth:
        depth += {"(": 1, ")": -1}.get(code[i], 0)
        i += 1
    types = []
    for arg in re.split(r",(?![^()]*\))", code[start:i - 1]):
        words = re.split(r"\s+(?:DEFAULT|=)\s+|\s*=\s*", arg.strip(), flags=re.IGNORECASE)[0].split()
        if words and words[0].lower() in ("in", "out", "inout", "variadic"):
            if words[0].lower() == "out":
                continue
            words = words[1:]
        if len(words) > 1 and words[0].lower() not in _TYPE_WORDS:
            words = words[1:]
        kind = " ".join(words).lower()
        types.append(_ALIASES.get(kind, kind))
    return ",".join(t for t in types if t)


def _created(sql: str) -> list[tuple[str, str]]:
    """(kind, name with argument types) of each CREATE FUNCTION, PROCEDURE, VIEW or TRIGGER."""
    code = _code(sql)
    found = []
    for match in _CREATE.finditer(code):
        kind, name = match[1].upper(), match[2].lower().replace('"', "")
        if kind in ("FUNCTION", "PROCEDURE"):
            name += f"({_arguments(code, match.end())})"
        found.append((kind, name))
    return found


def _unlanded() -> list[migrate.Migration]:
    landed = {**LANDED, **LANDED_DIALECTS}
    every = migrate.migrations() + [m for d in migrate.DIALECTS for m in migrate.migrations(d)]
    return [m for m in every if m.label not in landed]


def test_migrations_after_the_landed_ones_define_no_functions():
    """From 0019 (and each dialect's first unlanded migration) on, a function's or view's
    definition lives in a functions file (sql/functions/, sql/dialects/<dialect>/functions/),
    re-applied whenever it changes; numbered migrations hold tables, types, indexes, data
    and DROPs (docs/architecture.md, "Where each SQL function's current definition lives")."""
    misplaced = {}
    for m in _unlanded():
        allowed = TABLE_FUNCTIONS.get(m.label, set())
        found = [f"{kind} {name}" for kind, name in _created(m.sql) if name.split("(")[0] not in allowed]
        if found:
            misplaced[m.label] = found
    assert not misplaced, ("define these in the functions files instead (a changed signature: DROP FUNCTION in "
                           f"the migration, the new definition in the file): {misplaced}")


def test_each_function_is_defined_once_where_it_stands_now():
    """Among the functions files and the migrations not landed yet, each function, view and
    trigger is created once: the text a reader finds is the one the database runs."""
    seen: dict[tuple[str, str], str] = {}
    twice = []
    for dialect in (None, *migrate.DIALECTS):
        for f in migrate.functions(dialect):
            for key in _created(f.sql):
                if key in seen:
                    twice.append(f"{key[0]} {key[1]}: {seen[key]} and {f.label}")
                seen[key] = f.label
    for m in _unlanded():
        for key in _created(m.sql):
            if key in seen:
                twice.append(f"{key[0]} {key[1]}: {seen[key]} and {m.label}")
            seen[key] = m.label
    assert not twice, twice
    assert ("FUNCTION", "conveyor._claim(conveyor.queues,integer,integer)") in seen
