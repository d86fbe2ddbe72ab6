"""``call_seq`` across a gateway restart, for episodes admitted by ticket (no ``flywheel.episodes`` read).

A gateway that learns episodes from the topic also learns every recorded call there, so a restarted
one numbers an episode's next call after the highest it saw. A gateway admitting episodes by signed
URL (infra/tickets.py) reads nothing, so it keeps its own record instead: before it serves call
``seq`` of an episode and ``seq`` is not below the block it reserved, it reserves the next block of
:data:`BLOCK` numbers in a local SQLite file (one row per episode, written once per ``BLOCK`` calls;
the shared journal of ``infra/journal.py``, durability ``normal``: a row survives the process being killed). A restarted gateway
starts every episode it meets again at the end of its reserved block: numbers stay unique and in the
calls' order, with a gap of at most ``BLOCK`` at the restart (the reward service orders by
``call_seq`` and does not need them dense).

Two gateways admitting calls of the same episode number them independently (0, 0, 1, 1 when calls
alternate): the reward service keeps every call by ``call_id`` and orders an episode whose numbers repeat
by the conversation itself (reward_service/ordering.py), so an episode's calls may reach any gateway
(docs/operating.md, "Gateway replicas").
"""

from __future__ import annotations

import time
from pathlib import Path

from infra.journal import Journal

BLOCK = 64
KEEP_S = 7 * 24 * 3600.0  # rows of episodes not seen for this long are dropped at start
VERSION = 1  # the reserved table's schema (infra/journal.py)
_TABLES = (
    "CREATE TABLE IF NOT EXISTS reserved (episode_id TEXT PRIMARY KEY, upto INTEGER NOT NULL, at REAL NOT NULL)",
)


class SeqJournal:
    def __init__(self, path: Path) -> None:
        self._journal = Journal(path, tables=_TABLES, version=VERSION, durability="normal")

    def load(self) -> dict[str, int]:
        """Every remembered episode's first free number (after its reserved block); prunes old rows."""
        self._journal.execute("DELETE FROM reserved WHERE at < ?", (time.time() - KEEP_S,))
        rows = self._journal.query("SELECT episode_id, upto FROM reserved")
        return {str(r[0]): int(r[1]) for r in rows}

    def reserve(self, episode_id: str, upto: int) -> None:
        """Numbers below ``upto`` may be in use for ``episode_id``."""
        self._journal.execute(
            "INSERT INTO reserved (episode_id, upto, at) VALUES (?, ?, ?) ON CONFLICT (episode_id) "
            "DO UPDATE SET upto = max(upto, excluded.upto), at = excluded.at",
            (episode_id, upto, time.time()),
        )

    def close(self) -> None:
        self._journal.close()
