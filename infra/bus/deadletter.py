"""Building the ``DeadLetter`` event both buses publish for a message a consumer could not process."""

from __future__ import annotations

from schemas import AnyEvent, DeadLetter, encode

_MAX_ERROR = 16384


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
) -> DeadLetter:
    """A dead letter for ``event`` (decoded) or ``raw`` (bytes that did not decode).

    ``error`` is an exception (its type and message are kept) or a reason string (type ``EventDecodeError``).
    """
    if isinstance(error, BaseException):
        error_type, message = type(error).__name__, str(error) or repr(error)
    else:
        error_type, message = "EventDecodeError", error
    if event is not None:
        payload = encode(event).decode()
    elif raw is not None:
        payload = raw.decode("utf-8", errors="replace")
    else:
        payload = ""
    return DeadLetter(
        original_topic=topic,
        partition=partition,
        offset=offset,
        key=key,
        consumer_group=group,
        error_type=error_type,
        error=message[:_MAX_ERROR],
        attempts=attempts,
        payload=payload,
        producer=producer,
    )
