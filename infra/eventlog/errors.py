"""Errors of the event log, translated at the boundary from chdb / clickhouse-connect / httpx.

    EventLogError
     ├── EventLogLockedError       the chdb directory is held by another process
     ├── EventLogUnavailableError  the store (server, or a running process's admin API) cannot be reached
 │    └── EventLogTimeoutError  a call did not finish within its deadline (the store is busy or stuck)
     ├── ReadOnlyQueryError        ``query()`` was given something other than one read statement
     └── EventLogQueryError        the engine rejected a query (bad SQL, unknown column, ...)

Every message is one line, so the CLI can print ``ErrorName: message`` and exit.
"""

from __future__ import annotations

from pathlib import Path


class EventLogError(Exception):
    def __str__(self) -> str:
        return " ".join(super().__str__().split())


class EventLogLockedError(EventLogError):
    def __init__(self, path: Path, pid: int | None) -> None:
        owner = f"pid {pid}" if pid is not None else "pid unknown"
        super().__init__(
            f"{path} is in use by another Flywheel process ({owner}); run the command against it with "
            "--url http://HOST:PORT (or FLYWHEEL_ADMIN_URL) or stop it"
        )
        self.path = path
        self.pid = pid


class EventLogUnavailableError(EventLogError):
    pass


class EventLogTimeoutError(EventLogUnavailableError):
    pass


class ReadOnlyQueryError(EventLogError):
    pass


class EventLogQueryError(EventLogError):
    pass
