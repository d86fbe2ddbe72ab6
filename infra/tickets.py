"""Self-certifying episode URLs: a gateway admits an episode's calls without having heard of it.

Whoever opens a training episode and holds the shared key (``FLYWHEEL_EPISODE_KEY``: the rollout
worker, a gateway's own admin route) signs a ticket: the episode id, its GRPO group and an expiry
time. The ticket travels in the episode URL's one path segment::

    {gateway}/episodes/{episode_id}.{claims}.{signature}/v1

``claims`` is base64url JSON (``{"g": group_id, "x": expires_at, "m": model}``; ``m``, the model the
episode asks for, is optional: a version, ``policy@v12``, routes it to that version), ``signature`` the first 16 bytes
of HMAC-SHA256 over ``episode_id.claims`` with the key. A gateway holding the same key verifies the
segment in constant time and opens the episode on its first call, so it never needs to read
``flywheel.episodes`` to learn which episodes exist: its cost does not grow with other gateways'
traffic. Without a key nothing is signed and gateways learn episodes from the topic, as before.

A segment that is not a valid ticket (no key, a bad signature, expired, malformed) is just an episode
id, looked up the old way; :meth:`TicketKey.read` says which it was.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from dataclasses import dataclass

import orjson

SIGNATURE_BYTES = 16  # 128 bits of HMAC-SHA256: forging one is a 2^-128 guess per try


class TicketError(ValueError):
    """A segment that looks like a ticket (three dotted parts) and is not a valid one."""


@dataclass(frozen=True, slots=True)
class EpisodeTicket:
    episode_id: str
    group_id: str | None
    expires_at: float  # unix seconds; the gateway refuses the episode's calls after this
    model: str | None = None  # the model the episode asks for: a version (``policy@v12``) routes it


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class TicketKey:
    """Signs and verifies episode tickets with one shared secret."""

    def __init__(self, secret: str) -> None:
        if len(secret) < 16:
            raise ValueError("FLYWHEEL_EPISODE_KEY must be at least 16 characters")
        self._key = secret.encode("utf-8")

    def _mac(self, message: str) -> bytes:
        return hmac.new(self._key, message.encode("ascii"), hashlib.sha256).digest()[:SIGNATURE_BYTES]

    def sign(self, ticket: EpisodeTicket) -> str:
        """The URL path segment carrying ``ticket``."""
        fields: dict[str, object] = {"g": ticket.group_id, "x": round(ticket.expires_at, 3)}
        if ticket.model is not None:
            fields["m"] = ticket.model
        claims = _b64(orjson.dumps(fields))
        head = f"{ticket.episode_id}.{claims}"
        return f"{head}.{_b64(self._mac(head))}"

    def read(self, segment: str, *, now: float | None = None) -> EpisodeTicket | None:
        """The ticket in ``segment``; None when it is a plain episode id (no dots).

        Raises :class:`TicketError` for a segment shaped like a ticket that does not verify or has
        expired (the gateway answers 404 without looking further).
        """
        parts = segment.rsplit(".", 2)
        if len(parts) != 3:
            return None
        episode_id, claims, signature = parts
        head = f"{episode_id}.{claims}"
        try:
            given = _unb64(signature)
        except (ValueError, UnicodeEncodeError):
            raise TicketError("the episode URL's ticket is not valid") from None
        if not head.isascii() or not hmac.compare_digest(given, self._mac(head)):
            raise TicketError("the episode URL's ticket is not valid")
        try:
            data = orjson.loads(_unb64(claims))
            group = data["g"]
            expires = float(data["x"])
            model = data.get("m")
        except (ValueError, KeyError, TypeError, AttributeError, orjson.JSONDecodeError):
            raise TicketError("the episode URL's ticket is not valid") from None
        if (group is not None and not isinstance(group, str)) or (
            model is not None and (not isinstance(model, str) or not 0 < len(model) <= 256)
        ):
            raise TicketError("the episode URL's ticket is not valid")
        if (time.time() if now is None else now) > expires:
            raise TicketError("the episode URL's ticket has expired")
        return EpisodeTicket(episode_id, group, expires, model)


def episode_id_of(segment: str) -> str:
    """The episode id in an episode URL's segment, ticket or not (for logs and error bodies)."""
    parts = segment.rsplit(".", 2)
    return parts[0] if len(parts) == 3 else segment
