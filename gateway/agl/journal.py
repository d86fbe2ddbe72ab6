"""The durable store ``flywheel agl-server`` rebuilds its state from on start: records in SQLite.

One table, append-only, on the shared journal (``infra/journal.py``, durability ``normal``): a committed append survives the
process being killed (SIGKILL included; only a power loss may lose the last appends). Each record
keeps the bus events it was published as (its outbox: ``AglRecorded`` and Flywheel's own events), so
what the in-process bus still held when the process died (its queue dies with it, before the
recorder wrote it) is published again on the next start and reaches the event log (duplicates are
absorbed there by ``event_id``).

    journal = Journal(data_dir / "agl" / "journal.sqlite")
    journal.append(record, outbox)           # returns once committed
    for record in journal.replay(): …        # oldest first
    for event_json in journal.outbox(): …    # every event the records were published as
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson

from gateway.agl.state import Record
from infra.journal import Journal as SqliteJournal

VERSION = 1  # the records table's schema (infra/journal.py)
_TABLES = (
    "CREATE TABLE IF NOT EXISTS records (seq INTEGER PRIMARY KEY AUTOINCREMENT, tenant TEXT NOT NULL,"
    " kind TEXT NOT NULL, rollout_id TEXT, attempt_id TEXT, data BLOB NOT NULL,"
    " outbox BLOB NOT NULL DEFAULT '[]')",
)


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._journal = SqliteJournal(path, tables=_TABLES, version=VERSION, durability="normal")

    def append(self, record: Record, outbox: list[str]) -> None:
        """Commit ``record`` with the JSON of the bus events it was published as."""
        data, box = orjson.dumps(record.data), orjson.dumps(outbox)
        self._journal.execute(
            "INSERT INTO records (tenant, kind, rollout_id, attempt_id, data, outbox) VALUES (?, ?, ?, ?, ?, ?)",
            (record.tenant, record.kind, record.rollout_id, record.attempt_id, data, box),
        )

    def outbox(self) -> Iterator[str]:
        for (box,) in self._journal.query("SELECT outbox FROM records ORDER BY seq"):
            yield from orjson.loads(box)

    def replay(self) -> Iterator[Record]:
        rows = self._journal.query(
            "SELECT tenant, kind, rollout_id, attempt_id, data FROM records ORDER BY seq"
        )
        for tenant, kind, rollout_id, attempt_id, data in rows:
            yield Record(str(tenant), str(kind), orjson.loads(data), rollout_id, attempt_id)

    def close(self) -> None:
        self._journal.close()
