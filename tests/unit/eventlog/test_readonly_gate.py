"""The lexical read-only gate of ``query(sql)`` (the engine's readonly setting is tested with chdb)."""

from __future__ import annotations

import pytest

from infra.eventlog.errors import ReadOnlyQueryError
from infra.eventlog.readonly import check_read_only


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT 1", "SELECT 1"),
        ("  select * from flywheel.events  ;  ", "select * from flywheel.events"),
        ("WITH x AS (SELECT 1 AS a) SELECT a FROM x;;", "WITH x AS (SELECT 1 AS a) SELECT a FROM x"),
        ("SHOW TABLES FROM flywheel", "SHOW TABLES FROM flywheel"),
        ("DESCRIBE TABLE flywheel.events", "DESCRIBE TABLE flywheel.events"),
        ("EXPLAIN SELECT 1", "EXPLAIN SELECT 1"),
        ("(SELECT 1) UNION ALL (SELECT 2)", "(SELECT 1) UNION ALL (SELECT 2)"),
        ("SELECT 'DROP TABLE x; INSERT' AS s -- ; DELETE\n", "SELECT 'DROP TABLE x; INSERT' AS s"),
        ('SELECT "insert" FROM t', 'SELECT "insert" FROM t'),
        ("/* leading */ SELECT 1", "/* leading */ SELECT 1"),
        ("SELECT replaceAll(type, 'a', 'b') FROM t", "SELECT replaceAll(type, 'a', 'b') FROM t"),
    ],
)
def test_reads_pass(sql: str, expected: str) -> None:
    assert check_read_only(sql) == expected


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        ("", "empty"),
        ("  ; ;", "empty"),
        ("-- only a comment", "empty"),
        ("INSERT INTO flywheel.events (event_id) VALUES ('x')", "not INSERT"),
        ("/* SELECT */ INSERT INTO t VALUES (1)", "not INSERT"),
        ("SELECT 1; DROP TABLE flywheel.events", "one statement"),
        ("SELECT 1; SELECT 2", "one statement"),
        ("WITH x AS (SELECT 1) INSERT INTO t SELECT * FROM x", "INSERT is not allowed"),
        ("SELECT * FROM t INTO OUTFILE '/tmp/x'", "INTO is not allowed"),
        ("ALTER TABLE flywheel.events DELETE WHERE 1", "not ALTER"),
        ("OPTIMIZE TABLE flywheel.events FINAL", "not OPTIMIZE"),
        ("TRUNCATE TABLE flywheel.events", "not TRUNCATE"),
        ("SET readonly = 0", "not SET"),
        ("SELECT 1 SETTINGS readonly = 0; SYSTEM STOP MERGES", "one statement"),
        ("SELECT * FROM file('/etc/passwd', 'LineAsString')", "file()"),
        ("SELECT * FROM url('http://x/', 'CSV')", "url()"),
        ("SELECT * FROM remote('h', system.one)", "remote()"),
        ("SELECT * FROM executable('sh', 'CSV', 'x String')", "executable()"),
        ("SELECT 'unterminated", "unterminated"),
        ("DELETE FROM flywheel.events WHERE 1", "not DELETE"),
        ("select 1; /* hidden */ drop table t", "one statement"),
    ],
)
def test_writes_and_tricks_are_refused(sql: str, reason: str) -> None:
    with pytest.raises(ReadOnlyQueryError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        check_read_only(sql)


def test_refusal_is_one_line() -> None:
    with pytest.raises(ReadOnlyQueryError) as info:
        check_read_only("SELECT 1;\n\nDROP TABLE t")
    assert "\n" not in str(info.value)
