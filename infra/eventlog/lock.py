"""Who holds a chdb directory.

chdb runs one embedded server per process, and the server takes an exclusive ``flock`` on
``<dir>/status``, a file it fills with ``PID: N``. That is the lock file with the owner's pid, written
by the owner: we test the lock without taking it for long, read the pid, and say so in one line. chdb's
own "Cannot lock file … status" error is the backstop for the (tiny) race between test and open.

Within one process the directory may be opened several times (chdb shares its engine); a second,
different directory is refused with a clear error instead of chdb's "already initialized".
"""

from __future__ import annotations

import fcntl
import os
import re
import threading
from pathlib import Path

from infra.eventlog.errors import EventLogError, EventLogLockedError

_lock = threading.Lock()
_open: dict[Path, int] = {}  # directories this process has open, with how many stores use each
_PID = re.compile(r"PID:\s*(\d+)")


def chdb_holder(path: Path) -> EventLogLockedError | None:
    """An error naming the other process that holds ``path``, or None when nobody else does."""
    status = path / "status"
    try:
        fd = os.open(status, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            try:
                text = os.read(fd, 4096).decode("utf-8", "replace")
            except OSError:
                text = ""
            m = _PID.search(text)
            return EventLogLockedError(path, int(m.group(1)) if m else None)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def claim_path(path: Path) -> None:
    """Register that this process opens ``path``; raise if another process or directory is in the way."""
    with _lock:
        if path in _open:
            _open[path] += 1
            return
        if _open:
            other = next(iter(_open))
            raise EventLogError(
                f"this process already has the chdb directory {other} open; chdb allows one directory per process"
            )
        holder = chdb_holder(path)
        if holder is not None:
            raise holder
        _open[path] = 1


def release_path(path: Path) -> None:
    with _lock:
        count = _open.get(path, 0)
        if count <= 1:
            _open.pop(path, None)
        else:
            _open[path] = count - 1


def is_held_elsewhere(path: Path) -> bool:
    """True when another process holds ``path`` (this process's own use does not count)."""
    with _lock:
        if path.resolve() in _open:
            return False
    return chdb_holder(path.resolve()) is not None
