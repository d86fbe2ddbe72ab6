"""Times on the command line, one syntax for every command (``flywheel events``, ``flywheel replay``):
ISO 8601 (``2026-11-30``, ``2026-11-30T12:00``, ``...Z`` or an offset; UTC when no zone), ``now``, or a
span before now (``30m``, ``6h``, ``2d``, ``1w``)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d|w)$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_when(value: str, *, now: datetime | None = None) -> datetime:
    """``value`` as an aware datetime; ``ValueError`` with the accepted forms otherwise."""
    text = value.strip()
    now = now or datetime.now(UTC)
    if text == "now":
        return now
    m = _RELATIVE.match(text)
    if m:
        return now - timedelta(seconds=float(m.group(1)) * _UNITS[m.group(2)])
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"not a time: cannot read {value!r} as a time; use ISO 8601 (2026-11-30, 2026-11-30T12:00Z), "
            "'now', or a span before now (30m, 2h, 7d)"
        ) from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
