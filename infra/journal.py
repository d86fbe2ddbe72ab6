"""One SQLite journal for the local durable state of the services; each keeps its own tables.

Users: the gateway's spool (``gateway/recording/publishing.py``), its ``call_seq`` blocks (``gateway/episodes/seqs.py``),
the AGL server's records (``gateway/agl/journal.py``) and the reward service's open episodes
(``reward_service/state.py``). What they share is here, once:

* WAL, autocommit (``isolation_level=None``: a statement outside a transaction commits alone), one
  connection guarded by a re-entrant lock (``journal.lock``: hold it to keep a statement and the
  caller's own bookkeeping together), usable from any thread;
* the fsync policy, :data:`Durability`: ``full`` fsyncs every commit before it returns (the spool: an
  event the agent was told is recorded survives a power loss); ``normal`` survives the process being
  killed (SIGKILL included), a power loss may lose the last commits;
* the schema version in SQLite's ``user_version``: a new file is created at the journal's version; a
  file written before journals carried one (0) is adopted (its tables are created ``IF NOT EXISTS``);
  any other version is refused with :class:`JournalVersionError` rather than misread;
* batch delete: :meth:`Journal.delete_many`, one transaction (one fsync) for any number of rows.

Errors: ``sqlite3.Error`` from the statements themselves (the callers translate them at their own
boundary, e.g. the spool's ``RecordingError``); :class:`JournalVersionError` on opening.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

Durability = Literal["full", "normal"]
DELETE_CHUNK = 500  # rows per DELETE … IN (…): below SQLite's 999 bound variables of old builds


class JournalVersionError(RuntimeError):
    """The file's schema version is not the one this code reads."""

    def __init__(self, path: Path, found: int, expected: int) -> None:
        super().__init__(
            f"{path}: journal schema version {found}, this Flywheel reads version {expected} "
            "(move the file aside to start empty)"
        )
        self.path = path
        self.found = found
        self.expected = expected


class Journal:
    """A SQLite file with ``tables`` (``CREATE TABLE IF NOT EXISTS …`` and index statements)."""

    def __init__(self, path: Path, *, tables: Sequence[str], version: int, durability: Durability) -> None:
        if version < 1:
            raise ValueError(f"a journal's schema version starts at 1, not {version}")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.lock = threading.RLock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=30)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={'FULL' if durability == 'full' else 'NORMAL'}")
            found = int(self._db.execute("PRAGMA user_version").fetchone()[0])
            if found not in (0, version):
                raise JournalVersionError(path, found, version)
            with self.transaction():
                for statement in tables:
                    self._db.execute(statement)
                self._db.execute(f"PRAGMA user_version={int(version)}")
        except BaseException:
            self._db.close()
            raise

    @property
    def version(self) -> int:
        return int(self.query("PRAGMA user_version")[0][0])

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement (committed at once outside a transaction); the rows it changed."""
        with self.lock:
            return self._db.execute(sql, params).rowcount

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self.lock:
            return self._db.execute(sql, params).fetchall()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """Statements on the yielded connection commit together (one fsync), or not at all."""
        with self.lock:
            self._db.execute("BEGIN")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def begin(self) -> None:
        """Open a transaction that stays open across calls until :meth:`commit` (the reward service
        batches every event between two offset commits into one)."""
        self.execute("BEGIN")

    def commit(self) -> None:
        self.execute("COMMIT")

    def delete_many(self, table: str, column: str, values: Sequence[Any]) -> int:
        """Delete the rows whose ``column`` is in ``values``, in one transaction; the rows deleted."""
        if not (table.isidentifier() and column.isidentifier()):
            raise ValueError(f"not a table and column name: {table!r}, {column!r}")
        if not values:
            return 0
        removed = 0
        with self.transaction() as db:
            for i in range(0, len(values), DELETE_CHUNK):
                chunk = values[i : i + DELETE_CHUNK]
                marks = ",".join("?" * len(chunk))
                removed += db.execute(f"DELETE FROM {table} WHERE {column} IN ({marks})", chunk).rowcount
        return removed

    def close(self) -> None:
        with self.lock:
            self._db.close()
