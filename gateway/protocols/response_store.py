"""The responses a Responses API ``previous_response_id`` can name: kept per episode, bounded.

A response is resolvable only from its own episode (a training episode's URL, or a production
tenant's session), and only while kept: at most ``per_episode`` of one episode and ``max_bytes`` in
all, least recently used out first. A production call that names a previous response and no session
continues that response's session, so a chain of responses is one episode whatever the client sends.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from gateway.episodes.registry import EpisodeState
from gateway.errors import NotFoundError

JSON = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Kept:
    """What a later ``previous_response_id`` needs of a response."""

    episode_id: str
    tenant: str | None
    session_id: str | None
    history: list[JSON]  # the conversation as chat messages, the reply last (instructions left out)
    setting: bytes  # digest of what else the template renders (instructions, tools)
    prompt_token_ids: list[int] | None
    reply_token_ids: list[int] | None
    size: int


class ResponseStore:
    """Responses kept for ``previous_response_id``, least recently used out first: at most
    ``per_episode`` for one episode (or production session) and ``max_bytes`` in all."""

    def __init__(self, *, max_bytes: int = 64 << 20, per_episode: int = 64) -> None:
        self.max_bytes = max_bytes
        self.per_episode = per_episode
        self._kept: OrderedDict[str, Kept] = OrderedDict()
        self._by_episode: dict[str, list[str]] = {}
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._kept)

    def put(self, response_id: str, kept: Kept) -> None:
        self._kept[response_id] = kept
        self.bytes += kept.size
        ids = self._by_episode.setdefault(kept.episode_id, [])
        ids.append(response_id)
        while len(ids) > self.per_episode:
            self._drop(ids[0])
        while self.bytes > self.max_bytes and self._kept:
            self._drop(next(iter(self._kept)))

    def _drop(self, response_id: str) -> None:
        kept = self._kept.pop(response_id, None)
        if kept is None:
            return
        self.bytes -= kept.size
        ids = self._by_episode.get(kept.episode_id, [])
        if response_id in ids:
            ids.remove(response_id)
        if not ids:
            self._by_episode.pop(kept.episode_id, None)

    def get(self, response_id: str) -> Kept | None:
        kept = self._kept.get(response_id)
        if kept is not None:
            self._kept.move_to_end(response_id)
        return kept

    def session_of(self, tenant: str, data: JSON) -> str | None:
        """A production call continuing a response continues that response's session."""
        pid = data.get("previous_response_id")
        kept = self._kept.get(pid) if isinstance(pid, str) else None
        return kept.session_id if kept is not None and kept.tenant == tenant else None

    def resolve(self, response_id: str, episode: EpisodeState) -> Kept:
        kept = self.get(response_id)
        if kept is None or kept.episode_id != episode.episode_id:
            raise NotFoundError(
                f"previous response {response_id[:128]!r} not found (unknown, from another episode or "
                "session, stored with store=false, or no longer held)",
                param="previous_response_id",
                code="previous_response_not_found",
                episode_id=episode.episode_id,
            )
        return kept
