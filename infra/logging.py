"""structlog setup: JSON lines when stderr is not a TTY, console rendering otherwise.

Secrets never reach a log line: any key that looks like a credential is masked by a processor,
so a careless ``log.info("req", headers=...)`` cannot leak an Authorization header.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

_SECRET_KEYS = ("authorization", "api_key", "apikey", "token", "password", "secret", "x-api-key")


def _mask(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: ("***" if any(s in str(k).lower() for s in _SECRET_KEYS) else _mask(v))
            for k, v in value.items()
        }
    return value


def _redact(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key in list(event_dict):
        if any(s in key.lower() for s in _SECRET_KEYS):
            event_dict[key] = "***"
        else:
            event_dict[key] = _mask(event_dict[key])
    return event_dict


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is at write time (test runners swap and close it)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure_logging(level: str = "INFO", json: bool | None = None) -> None:
    if json is None:
        json = not sys.stderr.isatty()
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _redact,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    return structlog.get_logger(name)  # type: ignore[no-any-return]
