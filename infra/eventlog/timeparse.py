"""Times on the command line: ISO 8601 (UTC when no zone) or relative to now (``30m``, ``6h``, ``2d``)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d|w)$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_when(value: str, *, now: datetime | None = None) -> datetime:
    text = value.strip()
    m = _RELATIVE.match(text)
    if m:
        return (now or datetime.now(UTC)) - timedelta(seconds=float(m.group(1)) * _UNITS[m.group(2)])
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"not a time: {value!r} (use ISO 8601 like 2026-11-30T12:00 or 30m, 6h, 2d)"
        ) from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
