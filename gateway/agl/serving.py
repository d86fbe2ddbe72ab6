"""Agent Lightning's rollout, event, model and pause operations on Flywheel (no FastAPI here).

Every change goes the same way (``_commit``): published on the bus through the gateway's recorder
(bus first, its spool when the bus cannot take it; ``RecordingError`` → 503 and nothing changed),
then journaled, then applied to the tenant's state, then answered. Besides the ``AglRecorded`` copy,
what Flywheel's other services understand is published as their own events: an attempt's first event
opens an episode (``EpisodeStarted``), a ``reward`` event is a ``RewardReported``, a terminal status
finishes the last attempt's episode (``EpisodeFinished`` with the last reward), so the reward service
and the trainer take AGL rollouts like any other.

Errors: :class:`AglError` carries AGL's status and ``detail`` text (404 unknown rollout, 409 a
transition the state machine forbids, 400/422 bad input, 429 paused, 503 no server).

Tenants: a key belongs to one tenant, and a tenant sees only its own rollouts, models and pause
state (AGL has one shared key; here ``--key`` is tenant ``default`` and ``flywheel keys create`` adds
others).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import math
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from gateway.agl.journal import Journal
from gateway.agl.models import (
    DEFAULT_ATTEMPT_ID,
    TERMINAL,
    TRANSITIONS,
    Event,
    Model,
    PauseRequest,
    PauseState,
    Rollout,
    RolloutConfig,
    RolloutCreate,
    RolloutDetail,
    RolloutMetadata,
    RolloutPatch,
    RolloutState,
    TerminalItem,
    TerminalPage,
)
from gateway.agl.state import (
    Record,
    TenantState,
    keep_last_per_prompt,
    new_event,
    to_triplet,
    without_routes,
)
from gateway.episodes.registry import EpisodeRegistry, EpisodeState
from schemas import (
    AglRecorded,
    AnyEvent,
    EpisodeFinished,
    EpisodeSource,
    EpisodeStarted,
    EpisodeStatus,
    Mode,
    RewardOrigin,
    RewardReported,
    Task,
    decode_any,
)


class AglError(Exception):
    """An AGL-format error: ``{"detail": detail}`` (or ``body``) with ``status``."""

    def __init__(
        self, status: int, detail: str, *, headers: dict[str, str] | None = None, body: Any = None
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = headers or {}
        self.body = body if body is not None else {"detail": detail}


def not_found(rollout_id: str) -> AglError:
    return AglError(404, f"Rollout not found: {rollout_id}")


def _salt(path: Path) -> bytes:
    """A per-install secret, so episode ids derived from caller-chosen rollout ids stay unguessable."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.write_bytes(secrets.token_bytes(32))
        path.chmod(0o600)
    return path.read_bytes()


class AglService:
    def __init__(
        self,
        *,
        journal: Journal,
        publish: Callable[[AnyEvent], Awaitable[None]],
        episodes: EpisodeRegistry,
        model_name: str,
        salt_path: Path,
        producer: str = "agl-server",
    ) -> None:
        self.journal = journal
        self.publish = publish
        self.episodes = episodes
        self.model_name = model_name
        self.producer = producer
        self._salt = _salt(salt_path)
        self.tenants: dict[str, TenantState] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.inflight: dict[str, int] = {}
        self._resumed: dict[str, asyncio.Event] = {}
        self._announced: set[str] = set()  # episodes whose EpisodeStarted is published (or replayed)
        self.replayed = 0
        self.replayed_events = 0
        for record in journal.replay():
            self.tenant(record.tenant).apply(record)
            self.replayed += 1

    # ------------------------------------------------------------------------------- plumbing
    def tenant(self, name: str) -> TenantState:
        state = self.tenants.get(name)
        if state is None:
            state = self.tenants[name] = TenantState()
        return state

    def _lock(self, tenant: str) -> asyncio.Lock:
        lock = self._locks.get(tenant)
        if lock is None:
            lock = self._locks[tenant] = asyncio.Lock()
        return lock

    def episode_id(self, tenant: str, rollout_id: str, attempt_id: str) -> str:
        msg = f"{tenant}\0{rollout_id}\0{attempt_id}".encode()
        return hmac.new(self._salt, msg, hashlib.sha256).hexdigest()[:32]

    def _scope(self, tenant: str, rollout_id: str | None) -> str:
        return hashlib.sha256(f"{tenant}\0{rollout_id or ''}".encode()).hexdigest()[:32]

    async def _commit(self, record: Record, *extra: AnyEvent) -> None:
        """Publish (bus or spool), journal, apply: the order that never answers for a lost change."""
        episode_id = (
            self.episode_id(record.tenant, record.rollout_id, record.attempt_id)
            if record.rollout_id is not None and record.attempt_id is not None
            else None
        )
        events = [
            *extra,
            AglRecorded(
                producer=self.producer,
                scope=self._scope(record.tenant, record.rollout_id),
                tenant=record.tenant,
                kind=record.kind,
                rollout_id=record.rollout_id,
                attempt_id=record.attempt_id,
                episode_id=episode_id,
                data=record.data,
            ),
        ]
        for event in events:
            await self.publish(event)
        self.journal.append(record, [e.model_dump_json() for e in events])
        self.tenant(record.tenant).apply(record)

    async def republish(self, logged: set[str]) -> int:
        """Publish again what the journal holds and the event log lacks (``logged``: the event ids it
        has), oldest first; returns how many. For the in-process bus, after a process died."""
        n = 0
        for raw in self.journal.outbox():
            event = decode_any(raw)
            if event.event_id not in logged:
                await self.publish(event)
                n += 1
        return n

    def _get(self, tenant: str, rollout_id: str) -> Rollout:
        rollout = self.tenant(tenant).rollouts.get(rollout_id)
        if rollout is None:
            raise not_found(rollout_id)
        return rollout

    # ------------------------------------------------------------------------------- rollouts
    async def create_rollouts(self, tenant: str, items: list[RolloutCreate]) -> list[Rollout]:
        out: list[Rollout] = []
        async with self._lock(tenant):
            for req in items:
                existing = self.tenant(tenant).rollouts.get(req.rollout_id or "")
                if existing is not None:  # idempotent on the caller's id: the rollout as it is now
                    out.append(existing)
                    continue
                now = time.time()
                if isinstance(req.metadata, RolloutMetadata):
                    metadata = req.metadata
                else:
                    metadata = RolloutMetadata(**(req.metadata or {}))
                rollout = Rollout.model_validate(
                    {
                        "rollout_id": req.rollout_id or uuid.uuid4().hex,
                        "input": req.input,
                        "is_train": req.is_train,
                        "config": req.config or RolloutConfig(),
                        "metadata": metadata,
                        "status": {"created_at": now, "updated_at": now},
                    }
                )
                data = {"rollout": rollout.model_dump(mode="json")}
                await self._commit(Record(tenant, "rollout_created", data, rollout.rollout_id))
                out.append(self.tenant(tenant).rollouts[rollout.rollout_id])
        return out

    def list_rollouts(self, tenant: str, states: list[RolloutState], limit: int) -> list[Rollout]:
        wanted = set(states)
        found = [r for r in self.tenant(tenant).rollouts.values() if r.status.state in wanted]
        return found[: max(0, limit)]

    def terminal_page(self, tenant: str, after: int, limit: int) -> TerminalPage:
        state = self.tenant(tenant)
        after, limit = max(0, after), max(1, limit)
        ids = state.terminal[after : after + limit]
        items = []
        for rid in ids:
            r = state.rollouts.get(rid)
            if r is None:  # deleted since it finished: its slot stays, so cursors stay valid
                continue
            inp = r.input
            data_id = str(inp.get("data_id") or inp.get("instance_id") or "") if isinstance(inp, dict) else ""
            items.append(
                TerminalItem(rollout_id=rid, state=r.status.state, data_id=data_id, is_train=r.is_train)
            )
        return TerminalPage(items=items, next_after=after + len(ids), total_terminal=len(state.terminal))

    def get_rollout(self, tenant: str, rollout_id: str) -> RolloutDetail:
        rollout = self._get(tenant, rollout_id)
        return RolloutDetail(rollout=rollout, attempts=self.tenant(tenant).attempts(rollout_id))

    async def patch_rollout(self, tenant: str, rollout_id: str, patch: RolloutPatch) -> Rollout:
        async with self._lock(tenant):
            rollout = self._get(tenant, rollout_id)
            updates = patch.status.model_dump(exclude_unset=True) if patch.status is not None else {}
            if not updates:
                return rollout
            new_state = updates.get("state")
            if "state" in updates and new_state not in TRANSITIONS[rollout.status.state]:
                shown = new_state.value if isinstance(new_state, RolloutState) else str(new_state)
                raise AglError(
                    409, f"Rollout {rollout_id}: cannot transition {rollout.status.state.value} -> {shown}"
                )
            status = rollout.status.model_copy(
                update={**updates, "version": rollout.status.version + 1, "updated_at": time.time()}
            )
            updated = rollout.model_copy(update={"status": status})
            terminal = "state" in updates and status.state in TERMINAL
            extra = [self._finished(tenant, updated)] if terminal else []
            data = {"rollout": updated.model_dump(mode="json"), "terminal": terminal}
            await self._commit(
                Record(tenant, "rollout_patched", data, rollout_id), *[e for e in extra if e is not None]
            )
            return self.tenant(tenant).rollouts[rollout_id]

    def _finished(self, tenant: str, rollout: Rollout) -> EpisodeFinished | None:
        """The last attempt's ``EpisodeFinished`` (its last reward reported), if that attempt ran."""
        attempt = rollout.status.last_attempt_id or DEFAULT_ATTEMPT_ID
        events = self.tenant(tenant).attempt_events(rollout.rollout_id, attempt)
        if not events:
            return None
        rewards = [e.data.get("value") for e in events if e.event_type == "reward"]
        reward = rewards[-1] if rewards and _finite(rewards[-1]) else None
        ok = rollout.status.state is RolloutState.SUCCEEDED
        return EpisodeFinished(
            producer=self.producer,
            episode_id=self.episode_id(tenant, rollout.rollout_id, attempt),
            status=EpisodeStatus.ok if ok else EpisodeStatus.error,
            error=None if ok else (rollout.status.error_message or "rollout failed")[:16384],
            reported_reward=float(reward) if reward is not None else None,
            num_calls=sum(1 for e in events if e.event_type == "model_request"),
            task_id=rollout.rollout_id[:256],
            attempt=int(attempt) if attempt.isdigit() else 0,
            tenant=tenant,
        )

    async def delete_rollout(self, tenant: str, rollout_id: str) -> None:
        async with self._lock(tenant):
            if rollout_id in self.tenant(tenant).rollouts:
                await self._commit(Record(tenant, "rollout_deleted", None, rollout_id))

    # --------------------------------------------------------------------------------- events
    def open_attempt(
        self, tenant: str, rollout: Rollout, attempt_id: str
    ) -> tuple[EpisodeState, EpisodeStarted | None]:
        """The gateway episode of an attempt (opened here if this process has not seen it yet) and
        the ``EpisodeStarted`` to publish when this is the attempt's first event (else None)."""
        episode_id = self.episode_id(tenant, rollout.rollout_id, attempt_id)
        known = bool(self.tenant(tenant).attempt_events(rollout.rollout_id, attempt_id))
        first = not known and episode_id not in self._announced
        self._announced.add(episode_id)  # at once: a concurrent first call must not announce it again
        state = self.episodes.get(episode_id)
        if state is None:
            state = self.episodes.open(self._started(tenant, rollout, attempt_id))
            if known:  # reopened after a restart: number the next call after the recorded ones
                state.next_seq = sum(
                    1
                    for e in self.tenant(tenant).attempt_events(rollout.rollout_id, attempt_id)
                    if e.event_type == "model_request"
                )
        return state, self._started(tenant, rollout, attempt_id) if first else None

    def _started(self, tenant: str, rollout: Rollout, attempt_id: str) -> EpisodeStarted:
        return EpisodeStarted(
            producer=self.producer,
            episode_id=self.episode_id(tenant, rollout.rollout_id, attempt_id),
            source=EpisodeSource.live,
            mode=Mode.train if rollout.is_train else Mode.val,
            model=self.model_name[:256],
            task=Task(task_id=rollout.rollout_id[:256], input=_json_value(rollout.input)),
            attempt=int(attempt_id) if attempt_id.isdigit() else 0,
            tenant=tenant,
        )

    async def post_event(
        self, tenant: str, rollout_id: str, attempt_id: str, event_type: str, data: dict[str, Any]
    ) -> Event:
        async with self._lock(tenant):
            rollout = self._get(tenant, rollout_id)
            _, started = self.open_attempt(tenant, rollout, attempt_id)
            extra: list[AnyEvent] = [started] if started is not None else []
            value = data.get("value")
            if event_type == "reward" and isinstance(value, int | float) and _finite(value):
                extra.append(
                    RewardReported(
                        producer=self.producer,
                        episode_id=self.episode_id(tenant, rollout_id, attempt_id),
                        value=float(value),
                        origin=RewardOrigin.agent,
                        message=str(data.get("message") or "")[:8192],
                        tenant=tenant,
                    )
                )
            event = new_event(rollout_id, attempt_id, event_type, data)
            await self._commit(
                Record(tenant, "event", event.model_dump(mode="json"), rollout_id, attempt_id), *extra
            )
            return event

    def append_call(
        self, tenant: str, rollout_id: str, attempt_id: str, data: dict[str, Any], call: AnyEvent | None
    ) -> None:
        """A proxied call's ``model_request`` event, journaled and applied at once (its bus copy is the
        gateway's ``LLMCallRecorded``, published before this runs; AGL appends it synchronously too)."""
        if rollout_id not in self.tenant(tenant).rollouts:
            return  # deleted while the call ran, as AGL drops it
        event = new_event(rollout_id, attempt_id, "model_request", data)
        record = Record(tenant, "event", event.model_dump(mode="json"), rollout_id, attempt_id)
        self.journal.append(record, [call.model_dump_json()] if call is not None else [])
        self.tenant(tenant).apply(record)

    def query_events(
        self,
        tenant: str,
        rollout_id: str,
        *,
        event_type: str | None,
        triplet: bool,
        routed_experts: bool,
    ) -> list[Event]:
        self._get(tenant, rollout_id)
        events = self.tenant(tenant).rollout_events(rollout_id)
        if event_type is not None:
            events = [e for e in events if e.event_type == event_type]
        if triplet:
            events = keep_last_per_prompt([to_triplet(e) for e in events])
        if not routed_experts:
            events = [without_routes(e) for e in events]
        return events

    # --------------------------------------------------------------------------------- models
    async def register_models(self, tenant: str, models: list[Model]) -> list[Model]:
        if models:
            data = [m.model_dump(mode="json") for m in models]
            async with self._lock(tenant):
                await self._commit(Record(tenant, "models_registered", data))
        return models

    async def clear_models(self, tenant: str) -> None:
        async with self._lock(tenant):
            await self._commit(Record(tenant, "models_cleared", None))

    # ---------------------------------------------------------------------------------- pause
    def resumed(self, tenant: str) -> asyncio.Event:
        ev = self._resumed.get(tenant)
        if ev is None:
            ev = self._resumed[tenant] = asyncio.Event()
            if not self.tenant(tenant).pause.paused:
                ev.set()
        return ev

    def pause_state(self, tenant: str) -> PauseState:
        return self.tenant(tenant).pause.view(self.inflight.get(tenant, 0))

    async def pause(self, tenant: str, req: PauseRequest) -> PauseState:
        async with self._lock(tenant):
            data = {"retry_after_seconds": req.retry_after_seconds, "reason": req.reason}
            await self._commit(Record(tenant, "paused", data))
            self.resumed(tenant).clear()
        return self.pause_state(tenant)

    async def resume(self, tenant: str) -> PauseState:
        async with self._lock(tenant):
            await self._commit(Record(tenant, "resumed", None))
            self.resumed(tenant).set()
        return self.pause_state(tenant)


def _finite(value: Any) -> bool:
    """A reward Flywheel can score with: a finite number (AGL stores NaN too; it is kept, not scored)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _json_value(value: Any) -> Any:
    """A rollout's input as JSON (it arrived as JSON; this only guards the Task field's type)."""
    import orjson

    return orjson.loads(orjson.dumps(value))
