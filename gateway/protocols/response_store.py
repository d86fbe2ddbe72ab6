"""The responses a Responses API ``previous_response_id`` can name: kept per episode, bounded.

A response is resolvable only from its own episode (a training episode's URL, or a production
tenant's session), and only while kept: at most ``per_episode`` of one episode, ``per_tenant_bytes``
of one production tenant (``FLYWHEEL_TENANT_RESPONSE_STORE_BYTES``, gateway/quotas.py) and
``max_bytes`` in all, least recently used out first. Each bound drops the owner's own responses first
(the tenant's; training episodes', which have no tenant, among themselves), so one tenant's flood never
breaks another tenant's ``previous_response_id`` chain; past ``max_bytes`` with the newcomer's owner
holding nothing else, the owner holding the most bytes loses its oldest. A production call that names
a previous response and no session continues that response's session, so a chain of responses is one
episode whatever the client sends.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
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
    ``per_episode`` for one episode (or production session), ``per_tenant_bytes`` for one tenant (0: no
    cap) and ``max_bytes`` in all. ``on_evicted(tenant)``: a tenant's response dropped for its quota."""

    def __init__(
        self,
        *,
        max_bytes: int = 64 << 20,
        per_episode: int = 64,
        per_tenant_bytes: int = 0,
        on_evicted: Callable[[str], None] | None = None,
    ) -> None:
        self.max_bytes = max_bytes
        self.per_episode = per_episode
        self.per_tenant_bytes = per_tenant_bytes
        self.on_evicted = on_evicted
        self._kept: OrderedDict[str, Kept] = OrderedDict()
        self._by_episode: dict[str, list[str]] = {}
        # the same responses by owner (a production tenant; None: training), least recently used first
        self._owned: dict[str | None, OrderedDict[str, None]] = {}
        self._owned_bytes: dict[str | None, int] = {}
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._kept)

    def bytes_of(self, tenant: str | None) -> int:
        """What the responses of ``tenant`` (None: training episodes) hold."""
        return self._owned_bytes.get(tenant, 0)

    def put(self, response_id: str, kept: Kept) -> None:
        self._drop(response_id)  # a response id is kept once
        self._kept[response_id] = kept
        self.bytes += kept.size
        owner = kept.tenant
        self._owned.setdefault(owner, OrderedDict())[response_id] = None
        self._owned_bytes[owner] = self._owned_bytes.get(owner, 0) + kept.size
        ids = self._by_episode.setdefault(kept.episode_id, [])
        ids.append(response_id)
        while len(ids) > self.per_episode:
            self._drop(ids[0])
        if owner is not None and self.per_tenant_bytes > 0:
            while self._owned_bytes.get(owner, 0) > self.per_tenant_bytes:
                self._drop(next(iter(self._owned[owner])))
                if self.on_evicted is not None:
                    self.on_evicted(owner)
        while self.bytes > self.max_bytes and self._kept:
            self._drop(self._oldest_to_drop(owner))

    def _oldest_to_drop(self, owner: str | None) -> str:
        """Past ``max_bytes``: the owner's own oldest, unless it holds only the newcomer (then the
        oldest of the owner holding the most bytes)."""
        owned = self._owned.get(owner)
        if owned is None or len(owned) < 2:
            others = [o for o in self._owned if o != owner]
            if others:
                owned = self._owned[max(others, key=lambda o: self._owned_bytes.get(o, 0))]
        return next(iter(owned)) if owned else next(iter(self._kept))

    def _drop(self, response_id: str) -> None:
        kept = self._kept.pop(response_id, None)
        if kept is None:
            return
        self.bytes -= kept.size
        owner = kept.tenant
        owned = self._owned.get(owner)
        if owned is not None:
            owned.pop(response_id, None)
            if not owned:
                del self._owned[owner]
        left = self._owned_bytes.get(owner, 0) - kept.size
        if left > 0:
            self._owned_bytes[owner] = left
        else:
            self._owned_bytes.pop(owner, None)
        ids = self._by_episode.get(kept.episode_id, [])
        if response_id in ids:
            ids.remove(response_id)
        if not ids:
            self._by_episode.pop(kept.episode_id, None)

    def get(self, response_id: str) -> Kept | None:
        kept = self._kept.get(response_id)
        if kept is not None:
            self._kept.move_to_end(response_id)
            owned = self._owned.get(kept.tenant)
            if owned is not None and response_id in owned:
                owned.move_to_end(response_id)
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
