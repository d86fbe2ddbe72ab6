"""Per-episode state: which episodes are open, call numbering, and extension detection.

Training episodes are opened by ``EpisodeStarted`` (from a worker, through the bus) or by hand; they
are reachable only at ``/episodes/{id}/v1`` and only while open. Production episodes are opened by the
gateway, one per (tenant, session). Memory is bounded: at most ``max_episodes`` open episodes are kept
and a bounded set of recently finished ids answers 404 at once. Past ``max_episodes`` (a last resort:
each tenant's sessions are capped first, ``ProductionSessions``) the least recently used episode of the
same owner as the new one goes (a tenant's own session; training episodes, which have no tenant, among
themselves), else the least recently used of the owner holding the most, never another tenant's first.

Abandoned episodes are forgotten (:meth:`EpisodeRegistry.expire`): an agent that crashes never finishes
its episode, and a gateway admitting episodes by ticket reads no ``EpisodeFinished`` from the topic. One
admitted by ticket is forgotten once its ticket expired (its calls are refused from then on); any other
once it has had no call for ``idle_s`` (the reward service closes such an episode after the same
silence, ``FLYWHEEL_IDLE_TIMEOUT_S``). A forgotten episode counts as finished: a late call is a 404, and
feedback on a forgotten session still reaches the reward service within the feedback window.

``call_seq`` survives restarts: a gateway learns every recorded call of an episode from the bus (its
``flywheel.episodes`` subscription replays the topic, its own earlier calls included) and from its
spool (calls not on the bus yet), and numbers the next call after the highest it saw
(:meth:`EpisodeRegistry.saw_call`). The gateway serves calls only once its subscription has caught up
with the topic (``Gateway`` waits for a lag of 0 at start), so a restarted gateway continues an
episode's numbering instead of starting again at 0.

Extension (docs/architecture.md, "Token-faithful capture"): a call extends the previous one when its prompt ids
start with the previous prompt ids followed by one of the previous choices' ids. Anything else after a
first call is a ``prefix_mismatch``; the ids are never spliced.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.episodes.seqs import BLOCK, SeqJournal
from gateway.errors import NotFoundError
from gateway.upstream.tokens_in import Turn
from infra.tickets import EpisodeTicket
from schemas import EpisodeSource, EpisodeStarted, Mode, is_valid_episode_id

if TYPE_CHECKING:
    from gateway.prompts import ActivePrompt


@dataclass(slots=True)
class EpisodeState:
    episode_id: str
    source: EpisodeSource = EpisodeSource.live
    tenant: str | None = None
    session_id: str | None = None
    model: str = "policy"
    mode: Mode = Mode.train
    task_id: str | None = None
    group_id: str | None = None
    attempt: int = 0
    opened_at: float = field(default_factory=time.time)
    last_active: float = field(default_factory=time.monotonic)
    expires_at: float | None = None  # unix seconds: the ticket it was admitted on expires (then forgotten)
    next_seq: int = 0
    reserved: int = 0  # numbers below this are reserved in the gateway's SeqJournal (ticket mode)
    calls: int = 0
    prefix_mismatches: int = 0
    prev_prompt: list[int] | None = None
    prev_responses: list[list[int]] = field(default_factory=list)
    turn: Turn | None = None  # the previous chat call, for tokens-in (gateway/upstream/tokens_in.py)
    # the prompt version that serves it (gateway/prompts.py), set at its first call: an episode without
    # a group keeps its own pin, so it is forgotten with the episode
    prompt_pinned: bool = False
    prompt_pin: ActivePrompt | None = None

    def take_seq(self) -> int:
        seq = self.next_seq
        self.next_seq += 1
        self.last_active = time.monotonic()
        return seq

    def check_extension(self, prompt: list[int] | None) -> bool | None:
        """True/False against the previous recorded call; None for the first call or without ids."""
        if prompt is None or self.prev_prompt is None:
            return None
        base = self.prev_prompt
        n = len(base)
        if prompt[:n] != base:
            return False
        rest = prompt[n:]
        return any(rest[: len(r)] == r for r in self.prev_responses)

    def remember(
        self, prompt: list[int] | None, responses: Sequence[list[int] | None], mismatch: bool
    ) -> None:
        self.calls += 1
        if mismatch:
            self.prefix_mismatches += 1
        if prompt is not None and all(r is not None for r in responses):
            self.prev_prompt = prompt
            self.prev_responses = [r for r in responses if r is not None]
        else:
            self.prev_prompt, self.prev_responses = None, []

    def summary(self) -> dict[str, object]:
        return {
            "episode_id": self.episode_id,
            "source": self.source.value,
            "tenant": self.tenant,
            "session_id": self.session_id,
            "model": self.model,
            "task_id": self.task_id,
            "group_id": self.group_id,
            "calls": self.calls,
            "prefix_mismatches": self.prefix_mismatches,
            "opened_at": self.opened_at,
        }


class EpisodeRegistry:
    def __init__(self, *, max_episodes: int = 20_000, wait_s: float = 2.0, max_waiters: int = 10_000) -> None:
        self.max_episodes = max_episodes
        self.wait_s = wait_s
        self.max_waiters = max_waiters
        self._open: OrderedDict[str, EpisodeState] = OrderedDict()
        # the same episodes by owner (a production tenant; None: training), least recently used first
        self._owned: dict[str | None, OrderedDict[str, None]] = {}
        self._finished: OrderedDict[str, float] = OrderedDict()  # episode → when it ended (monotonic)
        self._waiters: dict[str, asyncio.Event] = {}
        self._sessions: dict[tuple[str, str], str] = {}
        self._session_history: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._calls: OrderedDict[str, tuple[str, str | None, int]] = OrderedDict()
        # the next call_seq each recently seen episode must start from (calls recorded before this
        # process saw its EpisodeStarted: from the spool, or a topic replayed out of order)
        self._seq_floor: OrderedDict[str, int] = OrderedDict()
        self.prefix_mismatches = 0
        self.journal: SeqJournal | None = (
            None  # set when episodes are admitted by ticket (gateway/episodes/seqs.py)
        )

    def use_journal(self, journal: SeqJournal) -> None:
        """Number ticket-admitted episodes after what a predecessor on this data directory reserved."""
        self.journal = journal
        for episode_id, upto in journal.load().items():
            self.saw_call(episode_id, upto - 1)

    def __len__(self) -> int:
        return len(self._open)

    def open_episodes(self) -> list[EpisodeState]:
        return list(self._open.values())

    def open_of(self, tenant: str) -> int:
        """How many episodes of ``tenant`` are open."""
        owned = self._owned.get(tenant)
        return len(owned) if owned is not None else 0

    def least_recent_of(self, tenant: str) -> EpisodeState | None:
        """The open episode of ``tenant`` used least recently, if any."""
        owned = self._owned.get(tenant)
        return self._open[next(iter(owned))] if owned else None

    def _touch(self, state: EpisodeState) -> None:
        self._open.move_to_end(state.episode_id)
        owned = self._owned.get(state.tenant)
        if owned is not None and state.episode_id in owned:
            owned.move_to_end(state.episode_id)

    def _pop_open(self, episode_id: str) -> EpisodeState | None:
        state = self._open.pop(episode_id, None)
        if state is not None:
            owned = self._owned.get(state.tenant)
            if owned is not None:
                owned.pop(episode_id, None)
                if not owned:
                    del self._owned[state.tenant]
        return state

    def _evict_one(self, newcomer: EpisodeState) -> None:
        """Over ``max_episodes``: the same owner's least recently used first, else the biggest owner's."""
        owned = self._owned.get(newcomer.tenant)
        if owned is None or len(owned) < 2:  # the newcomer is its owner's only one
            owned = max((o for t, o in self._owned.items() if t != newcomer.tenant), key=len)
        old = self._pop_open(next(iter(owned)))  # never the newcomer: it is its owner's most recent
        if old is not None and old.tenant is not None and old.session_id is not None:
            self._sessions.pop((old.tenant, old.session_id), None)

    def _insert(self, state: EpisodeState) -> EpisodeState:
        self._open[state.episode_id] = state
        self._owned.setdefault(state.tenant, OrderedDict())[state.episode_id] = None
        self._touch(state)
        while len(self._open) > self.max_episodes and len(self._open) > 1:
            self._evict_one(state)
        waiter = self._waiters.pop(state.episode_id, None)
        if waiter is not None:
            waiter.set()
        return state

    def open(self, started: EpisodeStarted) -> EpisodeState:
        """Open (idempotently) the episode an ``EpisodeStarted`` announces."""
        existing = self._open.get(started.episode_id)
        if existing is not None or started.episode_id in self._finished:
            return existing or EpisodeState(started.episode_id)
        state = EpisodeState(
            episode_id=started.episode_id,
            source=started.source,
            tenant=started.tenant,
            session_id=started.session_id,
            model=started.model,
            mode=started.mode,
            task_id=started.task_id,
            group_id=started.group_id,
            attempt=started.attempt,
        )
        if state.tenant is not None and state.session_id is not None:
            self._sessions[(state.tenant, state.session_id)] = state.episode_id
        state.next_seq = self._seq_floor.pop(state.episode_id, 0)
        return self._insert(state)

    def saw_call(self, episode_id: str, call_seq: int) -> None:
        """A call of ``episode_id`` numbered ``call_seq`` is recorded (by any gateway, any process):
        this episode's next call is numbered after it."""
        state = self._open.get(episode_id)
        if state is not None:
            if call_seq >= state.next_seq:
                state.next_seq = call_seq + 1
            return
        if episode_id in self._finished:
            return
        floor = self._seq_floor.get(episode_id, 0)
        self._seq_floor[episode_id] = max(floor, call_seq + 1)
        self._seq_floor.move_to_end(episode_id)
        while len(self._seq_floor) > self.max_episodes:
            self._seq_floor.popitem(last=False)

    def finish(self, episode_id: str) -> EpisodeState | None:
        state = self._pop_open(episode_id)
        self._finished.setdefault(episode_id, time.monotonic())
        while len(self._finished) > self.max_episodes:
            self._finished.popitem(last=False)
        if state is not None and state.tenant is not None and state.session_id is not None:
            key = (state.tenant, state.session_id)
            if self._sessions.get(key) == episode_id:
                del self._sessions[key]
            self._session_history[key] = episode_id
            while len(self._session_history) > self.max_episodes:
                self._session_history.popitem(last=False)
        return state

    def get(self, episode_id: str) -> EpisodeState | None:
        return self._open.get(episode_id)

    def expire(
        self, idle_s: float, *, now: float | None = None, wall: float | None = None
    ) -> list[EpisodeState]:
        """Forget the abandoned open episodes (module docstring) as finished; returns them."""
        now = time.monotonic() if now is None else now
        wall = time.time() if wall is None else wall
        gone = [
            state
            for state in self._open.values()
            if (
                wall >= state.expires_at
                if state.expires_at is not None
                else now - state.last_active >= idle_s
            )
        ]
        for state in gone:
            self.finish(state.episode_id)
        return gone

    def ended_s_ago(self, episode_id: str) -> float | None:
        """Seconds since the episode ended; None when it is open or no longer remembered."""
        ended = self._finished.get(episode_id)
        return None if ended is None else time.monotonic() - ended

    async def training(self, episode_id: str, *, wait: bool = True) -> EpisodeState:
        """The open training episode ``episode_id``; waits briefly for its ``EpisodeStarted``."""
        state = self._open.get(episode_id)
        if state is None and wait and is_valid_episode_id(episode_id) and episode_id not in self._finished:
            if len(self._waiters) < self.max_waiters:
                waiter = self._waiters.setdefault(episode_id, asyncio.Event())
                try:
                    await asyncio.wait_for(waiter.wait(), self.wait_s)
                except TimeoutError:
                    self._waiters.pop(episode_id, None)
            state = self._open.get(episode_id)
        if state is None or state.source is EpisodeSource.production:
            raise NotFoundError(
                f"episode {episode_id[:64]!r} is not open", code="episode_not_found", episode_id=episode_id
            )
        self._touch(state)
        return state

    def admit(self, ticket: EpisodeTicket) -> EpisodeState:
        """The training episode a verified ticket vouches for, opened on its first call."""
        state = self._open.get(ticket.episode_id)
        if state is None:
            if ticket.episode_id in self._finished:
                raise NotFoundError(
                    f"episode {ticket.episode_id!r} has finished",
                    code="episode_not_found",
                    episode_id=ticket.episode_id,
                )
            state = EpisodeState(ticket.episode_id, group_id=ticket.group_id, expires_at=ticket.expires_at)
            if ticket.model is not None:
                state.model = ticket.model  # a version it names routes it (gateway/releases.py)
            state.next_seq = self._seq_floor.pop(ticket.episode_id, 0)
            self._insert(state)
        elif state.source is EpisodeSource.production:
            raise NotFoundError(
                f"episode {ticket.episode_id!r} is not open",
                code="episode_not_found",
                episode_id=ticket.episode_id,
            )
        else:
            self._touch(state)
        return state

    def reserve(self, state: EpisodeState, seq: int) -> None:
        """Before call ``seq`` is served: with a journal, its number is reserved durably first."""
        if self.journal is not None and seq >= state.reserved:
            state.reserved = seq + BLOCK
            self.journal.reserve(state.episode_id, state.reserved)

    def session(self, tenant: str, session_id: str) -> EpisodeState | None:
        """The open episode of a tenant's session (now its most recently used)."""
        episode_id = self._sessions.get((tenant, session_id))
        state = self._open.get(episode_id) if episode_id else None
        if state is not None:
            self._touch(state)
        return state

    def session_episode_id(self, tenant: str, session_id: str) -> str | None:
        """The open, else the most recently finished, episode of a session (for late feedback)."""
        key = (tenant, session_id)
        return self._sessions.get(key) or self._session_history.get(key)

    def note_call(self, call_id: str, state: EpisodeState, seq: int) -> None:
        self._calls[call_id] = (state.episode_id, state.tenant, seq)
        while len(self._calls) > self.max_episodes * 4:
            self._calls.popitem(last=False)

    def call(self, call_id: str) -> tuple[str, str | None, int] | None:
        return self._calls.get(call_id)
