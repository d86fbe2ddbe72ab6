"""Dead letters, written once for both buses: what a dead letter carries, and how it is parked.

``dead_letter(...)`` builds the ``DeadLetter`` event. It carries the original bytes: as ``payload``
text when they are faithful UTF-8 text that fits, else as ``payload_base64`` (with a short text
preview in ``payload``). Either way it stays under ``MAX_DEAD_LETTER_BYTES`` once encoded: past that
the original is cut and ``payload_sha256`` / ``payload_size`` describe the whole of it. Why: a
~200 KB message of control bytes dead-lettered as JSON text grew to over 1 MB of ``\\u0000``
escapes, which Kafka refused (``MessageSizeTooLargeError``), and the consumer retried that message
hundreds of times while its whole partition stood still.

``deliver(...)`` is the one policy for getting a dead letter out of the way: publish it, retrying
with backoff a bounded number of times; if the bus still refuses, append it to a local JSONL file
(``park_path``), log it and count it. It returns only once the letter is safely somewhere, and
raises only when even the file cannot be written; the caller commits the poison message's offset
only after it returned, so a message is never skipped without a trace.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson

from infra.logging import get_logger
from schemas import AnyEvent, DeadLetter, encode

log = get_logger(__name__)

_MAX_ERROR = 8192
# Kafka's default limits are 1 MiB a record (producer ``max.request.size``, broker
# ``message.max.bytes`` 1,048,588): a dead letter stays well under it, key and headers included.
MAX_DEAD_LETTER_BYTES = 1_000_000
_PREVIEW_CHARS = 2048
PUBLISH_ATTEMPTS = 5
DEFAULT_PARK_PATH = Path(".flywheel") / "deadletter-parked.jsonl"


def dead_letter(
    *,
    topic: str,
    partition: int | None,
    offset: int | None,
    key: str | None,
    group: str,
    error: BaseException | str,
    attempts: int,
    event: AnyEvent | None = None,
    raw: bytes | None = None,
    producer: str = "bus",
    max_bytes: int = MAX_DEAD_LETTER_BYTES,
) -> DeadLetter:
    """A dead letter for ``raw`` (the original bytes, preferred) or ``event`` (encoded again).

    ``error`` is an exception (its type and message are kept) or a reason string (type ``EventDecodeError``).
    """
    if isinstance(error, BaseException):
        error_type, message = type(error).__name__, str(error) or repr(error)
    else:
        error_type, message = "EventDecodeError", error
    original = raw if raw is not None else (encode(event) if event is not None else b"")
    letter = DeadLetter(
        original_topic=topic,
        partition=partition,
        offset=offset,
        key=key[:4096] if key is not None else None,
        consumer_group=group,
        error_type=error_type[:256],
        error=message[:_MAX_ERROR],
        attempts=attempts,
        payload_size=len(original),
        payload_sha256=hashlib.sha256(original).hexdigest(),
        producer=producer,
    )
    budget = max_bytes - len(encode(letter)) - 64  # what the payload fields may take, encoded
    text = original.decode("utf-8", errors="replace")
    faithful = text.encode("utf-8") == original
    if faithful and len(orjson.dumps(text)) <= budget:
        return letter.model_copy(update={"payload": text})
    preview = text[:_PREVIEW_CHARS]
    budget -= len(orjson.dumps(preview))
    keep = max(0, budget) // 4 * 3  # base64: 4 characters per 3 bytes
    return letter.model_copy(
        update={
            "payload": preview,
            "payload_base64": base64.b64encode(original[:keep]).decode("ascii"),
            "payload_truncated": keep < len(original),
        }
    )


class Parking:
    """Counts of this process's dead letters: published, and parked in the local file."""

    def __init__(self, path: Path = DEFAULT_PARK_PATH) -> None:
        self.path = path
        self.published = 0
        self.parked = 0


async def deliver(
    letter: DeadLetter,
    publish: Callable[[DeadLetter], Awaitable[None]],
    parking: Parking,
    *,
    attempts: int = PUBLISH_ATTEMPTS,
    backoff_s: float = 0.1,
) -> bool:
    """Publish ``letter`` (True) or, after ``attempts`` failed tries, park it in the file (False)."""
    failure: BaseException | None = None
    for attempt in range(1, attempts + 1):
        try:
            await publish(letter)
        except Exception as exc:  # any refusal: broker down, message too large, backlog full
            failure = exc
            log.warning(
                "bus.dead_letter_publish_failed",
                topic=letter.original_topic,
                offset=letter.offset,
                attempt=attempt,
                error=f"{type(exc).__name__}: {exc}"[:300],
            )
            if attempt < attempts:
                await asyncio.sleep(min(backoff_s * 2 ** (attempt - 1), 2.0))
            continue
        parking.published += 1
        return True
    await asyncio.to_thread(_append, parking.path, encode(letter))
    parking.parked += 1
    log.error(
        "bus.dead_letter_parked",
        topic=letter.original_topic,
        partition=letter.partition,
        offset=letter.offset,
        group=letter.consumer_group,
        path=str(parking.path),
        error=f"{type(failure).__name__}: {failure}"[:300],
    )
    return False


def _append(path: Path, line: bytes) -> None:
    """One JSON line, fsync'd before it returns (the offset is committed right after)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as out:
        out.write(line + b"\n")
        out.flush()
        os.fsync(out.fileno())
