"""infra/journal.py: the schema version, the fsync policy, transactions and batch delete, shared by the
gateway's spool and call_seq blocks, the AGL server's records and the reward service's episodes."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from infra.journal import DELETE_CHUNK, Journal, JournalVersionError

pytestmark = pytest.mark.timeout(30)

TABLES = ("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v TEXT)",)


def _pragma(path: Path, name: str) -> int | str:
    with sqlite3.connect(path) as db:
        return db.execute(f"PRAGMA {name}").fetchone()[0]  # type: ignore[no-any-return]


def test_a_new_file_carries_the_version_and_wal(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "a" / "j.sqlite", tables=TABLES, version=3, durability="normal")
    assert journal.version == 3
    assert journal.query("PRAGMA synchronous") == [(1,)]  # NORMAL
    journal.close()
    assert _pragma(tmp_path / "a" / "j.sqlite", "user_version") == 3
    assert _pragma(tmp_path / "a" / "j.sqlite", "journal_mode") == "wal"
    full = Journal(tmp_path / "f.sqlite", tables=TABLES, version=1, durability="full")
    assert full.query("PRAGMA synchronous") == [(2,)]  # FULL: every commit fsync'd
    full.close()


def test_a_file_from_before_versions_is_adopted_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:
        db.execute(TABLES[0])
        db.execute("INSERT INTO t (v) VALUES ('kept')")
    journal = Journal(path, tables=TABLES, version=1, durability="normal")
    assert journal.version == 1
    assert journal.query("SELECT v FROM t") == [("kept",)]
    journal.close()


def test_another_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    Journal(path, tables=TABLES, version=2, durability="normal").close()
    with pytest.raises(JournalVersionError, match="schema version 2, this Flywheel reads version 1") as info:
        Journal(path, tables=TABLES, version=1, durability="normal")
    assert (info.value.found, info.value.expected) == (2, 1)
    with pytest.raises(ValueError, match="starts at 1"):
        Journal(tmp_path / "z.sqlite", tables=TABLES, version=0, durability="normal")


def test_delete_many_is_one_transaction_over_chunks(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite", tables=TABLES, version=1, durability="full")
    n = 2 * DELETE_CHUNK + 7
    with journal.transaction() as db:
        db.executemany("INSERT INTO t (id, v) VALUES (?, 'x')", [(i,) for i in range(n)])
    assert journal.delete_many("t", "id", [*range(n - 1), 10**9]) == n - 1
    assert journal.query("SELECT id FROM t") == [(n - 1,)]
    assert journal.delete_many("t", "id", []) == 0
    with pytest.raises(ValueError, match="not a table"):
        journal.delete_many("t; DROP TABLE t", "id", [1])
    journal.close()


def test_a_failed_transaction_leaves_nothing(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite", tables=TABLES, version=1, durability="normal")
    with pytest.raises(sqlite3.IntegrityError), journal.transaction() as db:
        db.execute("INSERT INTO t (id, v) VALUES (1, 'a')")
        db.execute("INSERT INTO t (id, v) VALUES (1, 'b')")
    assert journal.query("SELECT count(*) FROM t") == [(0,)]
    journal.begin()  # held open across calls until commit()
    journal.execute("INSERT INTO t (id, v) VALUES (2, 'c')")
    journal.commit()
    journal.close()
    with sqlite3.connect(tmp_path / "j.sqlite") as db:
        assert db.execute("SELECT v FROM t").fetchall() == [("c",)]
