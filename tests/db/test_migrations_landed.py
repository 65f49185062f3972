"""Landed migrations are frozen: their text may not change, only new ones be added.

A database migrated by an earlier build keeps that build's functions; editing a landed
migration in place would leave such databases behind without anyone noticing (the server
refuses them by checksum, which is the runtime half of this rule). Append a new migration
and add its checksum here once it has landed.
"""

from __future__ import annotations

from conveyor.db import migrate

LANDED = {
    "0001_queues": "efa8a3b4c0e4ad1b7666bde2538717dee598a26053ad53792299f3d2c0d04ded",
    "0002_redrive_and_attempts": "d61c1f37708ebebf7321a4da7ddd3af1ff6e7d3d17c76dcec08ca51feb15e53c",
    "0003_streams": "fa5d7ab3860fc844eda79ab14262c078e83a50112f0274c6dbadf30cd3e14387",
    "0004_schedules": "956971ff9cd559641c46a8c17fdf3e07136ae21fcc42dba5198d1a391a640662",
    "0005_topics": "bb4aa535c5a05930b15ceae6e6d706849354bece6b872f462c61ba419ab9f9e1",
    "0006_pipeline": "fb2f16e2912957b83cdc7b564df403eb811e4ba3671e23d9353fce250a56a855",
    "0007_deliveries": "4f81323bc1754d67a56544609bd64fdd52015ac8a93dc47a9e0d84f41153de05",
}


def test_landed_migrations_are_unchanged():
    found = {m.label: m.checksum for m in migrate.migrations()}
    changed = {label for label, checksum in LANDED.items() if found.get(label) != checksum}
    assert not changed, f"landed migrations edited in place (add a new migration instead): {sorted(changed)}"
