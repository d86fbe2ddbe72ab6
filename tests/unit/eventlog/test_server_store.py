"""The ClickHouse-server store without a server: URL handling and a clear error when it is unreachable.

(No ClickHouse server runs here; the shared queries and DDL are exercised on chdb, which is ClickHouse.)
"""

from __future__ import annotations

import pytest

from infra.eventlog.errors import EventLogError, EventLogUnavailableError
from infra.eventlog.store import ServerStore, _chdb_param, open_store


@pytest.mark.timeout(30)
def test_unreachable_server_is_one_clear_line() -> None:
    with pytest.raises(EventLogUnavailableError) as info:
        ServerStore("http://default:secret@127.0.0.1:1/flywheel_test")
    message = str(info.value)
    assert message.startswith("cannot reach ClickHouse at http://127.0.0.1:1/flywheel_test")
    assert "secret" not in message and "\n" not in message


@pytest.mark.parametrize("url", ["ftp://host/db", "localhost:8123", "http:///db"])
def test_malformed_url(url: str) -> None:
    with pytest.raises(EventLogError, match="must look like"):
        ServerStore(url)


def test_bad_database_name_in_url() -> None:
    with pytest.raises(ValueError, match="database name"):
        ServerStore("http://127.0.0.1:1/bad-name")


def test_no_store_configured() -> None:
    with pytest.raises(EventLogError, match="no event log configured"):
        open_store()


def test_chdb_parameters_render_as_clickhouse_text() -> None:
    from datetime import UTC, datetime

    assert _chdb_param(datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)) == "2026-01-02 03:04:05.678"
    assert _chdb_param(["a", "it's", "b\\c"]) == "['a','it\\'s','b\\\\c']"
    assert _chdb_param(5) == "5"
