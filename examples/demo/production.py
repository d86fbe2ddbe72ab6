"""``flywheel demo --source production``: the calculator agent as a deployed service, simulated users.

Nothing here is part of Flywheel's services: this module plays the two parties a production deployment
has around the gateway.

* :class:`CalcService` is the deployed agent: ``examples/demo_agents/calc_agent``'s plain ``openai`` code with its
  client pointed at the gateway's production endpoint (``{gateway}/v1``, ``Authorization: Bearer
  <tenant key>``), one ``X-Flywheel-Session`` per conversation. It sees the question only, never the
  answer.
* :class:`Users` are the people using it: each simulated user asks a problem of the RL split, reads the
  agent's answer, gives a thumbs up (``POST /v1/feedback``, rating +1) when it is right and a thumbs down
  (rating −1) otherwise, and ends the session (``POST /v1/sessions/{id}/end``). ``concurrency`` users do
  so at the same time, one session after another. Which problems each user asks is fixed by the seed
  (user ``u`` draws from its own task stream); what the model answers is sampled, as in production.
  ``mistake_rate`` makes users rate that share of sessions the wrong way (drawn from the same per-user
  seeded stream); the demo's users make none. The ``--tiny`` smoke run's toy model never answers right,
  so there its users err on a quarter of the sessions: the rewards then vary and the trainer has
  production samples to train on, which is what that run checks.
* ``--feedback-delay`` (:class:`FeedbackDelay`) makes users rate late, as production users do: a share of
  them ends the session at once and rates it seconds to minutes later, when the trainer has moved tens
  of versions on. Ratings still pending when the run stops never arrive (counted as ``ratings_unsent``).

The gateway turns each session into a ``source=production`` episode, the reward service maps the rating
to its reward (thumbs: −1 → 0, +1 → 1), and the trainer, which requests no rollouts in this mode, learns
from those sessions only.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from openai import AsyncOpenAI, DefaultAioHttpClient

from examples.demo_agents.calc_agent import tasks as calc_tasks
from examples.demo_agents.calc_agent.agent import solve
from gateway.keys import KeyStore

if TYPE_CHECKING:
    from flywheel.stack import EmbeddedStack

TENANT = "calc-demo-users"


class ProductionError(RuntimeError):
    """The gateway refused a production request (the status and body are in the message)."""


class CalcService:
    """The calculator agent deployed behind the gateway, as its operator would run it."""

    def __init__(self, gateway_url: str, key: str, model: str = "policy") -> None:
        self.base_url = f"{gateway_url}/v1"
        self.key = key
        self.model = model
        self._http: DefaultAioHttpClient | None = None
        self._client: AsyncOpenAI | None = None

    async def __aenter__(self) -> CalcService:
        # One connection pool for every conversation (see examples/demo_agents/calc_agent/agent.py's _Pool).
        self._http = DefaultAioHttpClient(timeout=120.0)
        self._client = AsyncOpenAI(
            base_url=self.base_url, api_key=self.key, max_retries=2, http_client=self._http
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._http is not None:
            await self._http.aclose()
        self._http = self._client = None

    async def answer(self, question: str, session_id: str) -> str:
        """One conversation: the agent's answer to ``question`` (``""`` when it gave none)."""
        if self._client is None:
            raise RuntimeError("use CalcService as an async context manager")
        client = self._client.with_options(default_headers={"X-Flywheel-Session": session_id})
        result = await solve(client, self.model, {"input": {"question": question}})
        return str(result["output"]["answer"])


class FeedbackDelayError(ValueError):
    """A ``--feedback-delay`` that does not parse (the message is one line)."""


@dataclass(frozen=True)
class FeedbackDelay:
    """When users rate, as shares of sessions: ``"0.5:0,0.5:120-240"`` is half at once, half after a delay
    drawn uniformly from 120-240 s. Shares must add up to 1; ``""`` is everyone at once."""

    parts: tuple[tuple[float, float, float], ...] = ((1.0, 0.0, 0.0),)  # (share, low s, high s)

    @classmethod
    def parse(cls, spec: str) -> FeedbackDelay:
        if not spec.strip():
            return cls()
        parts: list[tuple[float, float, float]] = []
        try:
            for item in spec.split(","):
                share, _, span = item.partition(":")
                low, _, high = span.partition("-")
                parts.append((float(share), float(low), float(high or low)))
        except ValueError:
            raise FeedbackDelayError(
                f"--feedback-delay {spec!r}: expected SHARE:SECONDS or SHARE:LOW-HIGH, comma-separated "
                "(e.g. 0.5:0,0.5:120-240)"
            ) from None
        if (
            any(s < 0 or lo < 0 or hi < lo for s, lo, hi in parts)
            or abs(sum(s for s, _, _ in parts) - 1) > 1e-6
        ):
            raise FeedbackDelayError(
                f"--feedback-delay {spec!r}: shares must be >= 0 and add up to 1, and each LOW <= HIGH"
            )
        return cls(tuple(parts))

    def draw(self, rng: random.Random) -> float:
        """Seconds until this session's rating (0: at once)."""
        u = rng.random()
        for share, low, high in self.parts:
            if u < share:
                return rng.uniform(low, high) if high > low else low
            u -= share
        return self.parts[-1][1]

    def __str__(self) -> str:
        return ",".join(f"{s:g}:{lo:g}" + (f"-{hi:g}" if hi > lo else "") for s, lo, hi in self.parts)


@dataclass(frozen=True)
class Rating:
    t: float  # seconds since the users started, when the agent answered
    session_id: str
    liked: bool
    calls_answered: bool  # the agent gave an answer at all (right or wrong)
    delay_s: float = 0.0  # how long after the answer the user rated


@dataclass
class UserStats:
    sessions: int = 0
    feedback: int = 0
    errors: int = 0
    ratings_unsent: int = 0  # late ratings still pending when the users stopped
    ratings: list[Rating] = field(default_factory=list)
    error_messages: list[str] = field(default_factory=list)

    def thumbs_up_rate(self, since: float = 0.0, until: float = float("inf")) -> float | None:
        window = [r for r in self.ratings if since <= r.t < until]
        return sum(r.liked for r in window) / len(window) if window else None

    def series(self, window_s: float, until: float) -> list[dict[str, float]]:
        """The thumbs-up rate per ``window_s`` seconds, up to ``until``: ``[{t, rate, n}, ...]``."""
        out: list[dict[str, float]] = []
        start = 0.0
        while start < until:
            end = min(start + window_s, until)
            window = [r for r in self.ratings if start <= r.t < end]
            if window:
                rate = sum(r.liked for r in window) / len(window)
                out.append({"t": round(end, 1), "rate": round(rate, 4), "n": float(len(window))})
            start = end
        return out


def user_problems(seed: int, user: int) -> Iterator[dict[str, Any]]:
    """What user ``user`` of a seed asks, in order: its own endless stream of RL-split problems."""
    return calc_tasks.tasks("rl", 1_000_003 * (seed + 1) + user)


class Users:
    """``concurrency`` simulated users, each asking, rating and ending one session after another."""

    def __init__(
        self,
        service: CalcService,
        gateway_url: str,
        key: str,
        *,
        seed: int,
        concurrency: int,
        think_s: float = 0.0,
        mistake_rate: float = 0.0,
        feedback_delay: FeedbackDelay | None = None,
    ) -> None:
        self.service = service
        self.feedback_delay = feedback_delay or FeedbackDelay()
        self._late: set[asyncio.Task[None]] = set()
        self.seed = seed
        self.concurrency = concurrency
        self.think_s = think_s
        self.mistake_rate = mistake_rate
        self.stats = UserStats()
        self._http = httpx.AsyncClient(
            base_url=gateway_url, headers={"Authorization": f"Bearer {key}"}, timeout=60.0
        )
        self._closing = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._t0 = time.perf_counter()

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self._tasks = [
            asyncio.create_task(self._user(u), name=f"demo-user-{u}") for u in range(self.concurrency)
        ]

    async def stop(self, grace_s: float = 60.0) -> None:
        """No new sessions; let the open ones finish (rated and ended) for up to ``grace_s``."""
        self._closing.set()
        if self._tasks:
            _, late = await asyncio.wait(self._tasks, timeout=grace_s)
            for task in late:
                task.cancel()
            for task in self._tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self.stats.ratings_unsent += len(self._late)
        for task in list(self._late):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._http.aclose()

    async def _post(self, path: str, body: dict[str, Any] | None = None) -> None:
        response = await self._http.post(path, json=body)
        if response.status_code >= 400:
            raise ProductionError(f"POST {path}: {response.status_code} {response.text[:300]}")

    async def _user(self, user: int) -> None:
        problems = user_problems(self.seed, user)
        rng = random.Random(f"user-{self.seed}-{user}")
        n = 0
        while not self._closing.is_set():
            task = next(problems)
            session_id = f"demo-s{self.seed}-u{user}-{n}"
            n += 1
            try:
                mistaken = rng.random() < self.mistake_rate
                await self._session(session_id, task, mistaken, self.feedback_delay.draw(rng))
            except Exception as exc:  # a refused call or feedback: counted and reported, the user goes on
                self.stats.errors += 1
                if len(self.stats.error_messages) < 10:
                    self.stats.error_messages.append(f"{type(exc).__name__}: {exc}"[:300])
            if self.think_s:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), self.think_s)

    async def _session(self, session_id: str, task: dict[str, Any], mistaken: bool, delay_s: float) -> None:
        self.stats.sessions += 1
        liked, answered = await self._judge(session_id, task, mistaken)
        rating = Rating(time.perf_counter() - self._t0, session_id, liked, answered, delay_s)
        if delay_s <= 0:
            await self._rate(rating)
            await self._post(f"/v1/sessions/{session_id}/end")
            return
        # a late rater: the session ends now (scored without a reward), the thumbs come later
        await self._post(f"/v1/sessions/{session_id}/end")
        late = asyncio.create_task(self._rate_later(rating), name=f"late-rating-{session_id}")
        self._late.add(late)
        late.add_done_callback(self._late.discard)

    async def _judge(self, session_id: str, task: dict[str, Any], mistaken: bool) -> tuple[bool, bool]:
        """Ask the agent; (the user likes the answer, the agent gave one)."""
        answer = await self.service.answer(task["input"]["question"], session_id)
        return (answer == task["answer"]) != mistaken, bool(answer)

    async def _rate(self, rating: Rating) -> None:
        await self._post(
            "/v1/feedback", {"session_id": rating.session_id, "rating": 1 if rating.liked else -1}
        )
        self.stats.feedback += 1
        self.stats.ratings.append(rating)

    async def _rate_later(self, rating: Rating) -> None:
        await asyncio.sleep(rating.delay_s)
        try:
            await self._rate(rating)
        except Exception as exc:  # counted and reported like a refused call
            self.stats.errors += 1
            if len(self.stats.error_messages) < 10:
                self.stats.error_messages.append(f"{type(exc).__name__}: {exc}"[:300])


def create_key(data_dir: Path, tenant: str = TENANT) -> str:
    """A key of ``tenant`` for the demo's users, in the gateway's key store (as ``flywheel keys create``
    does)."""
    _, key = KeyStore(data_dir / "gateway" / "keys.json").create(tenant)
    return key


async def production_phase(
    stack: EmbeddedStack,
    key: str,
    *,
    seed: int,
    users: int,
    rl_seconds: float,
    max_steps: int | None,
    say: Callable[[str], None],
    mistake_rate: float = 0.0,
    window_s: float = 30.0,
    feedback_delay: FeedbackDelay | None = None,
) -> dict[str, Any]:
    """Users on the deployed agent while the trainer learns from their sessions for ``rl_seconds``."""
    delay = feedback_delay or FeedbackDelay()
    async with CalcService(stack.gateway_url, key) as service:
        crowd = Users(
            service,
            stack.gateway_url,
            key,
            seed=seed,
            concurrency=users,
            mistake_rate=mistake_rate,
            feedback_delay=delay,
        )
        t0 = time.perf_counter()
        training = stack.start_training(max_steps)
        crowd.start()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(training), rl_seconds)
        await stack.stop_training()
        seconds = time.perf_counter() - t0
        await crowd.stop()
    stats = crowd.stats
    first = stats.thumbs_up_rate(0.0, 60.0)
    last = stats.thumbs_up_rate(max(0.0, seconds - 60.0), seconds)
    say(
        f"[seed {seed}] {stats.sessions} sessions, {stats.feedback} rated, {stats.errors} errors; "
        f"thumbs up {_pct(first)} in the first minute, {_pct(last)} in the last"
    )
    return {
        "rl_seconds": seconds,
        "users": users,
        "user_mistake_rate": mistake_rate,
        "feedback_delay": str(delay),
        "sessions": stats.sessions,
        "feedback": stats.feedback,
        "feedback_late": sum(1 for r in stats.ratings if r.delay_s > 0),
        "ratings_unsent": stats.ratings_unsent,
        "user_errors": stats.errors,
        "user_error_examples": stats.error_messages,
        "thumbs_up": {
            "rate": stats.thumbs_up_rate(0.0, seconds),
            "first_minute": first,
            "last_minute": last,
            "window_s": window_s,
            "series": stats.series(window_s, seconds),
        },
    }


def _pct(rate: float | None) -> str:
    return "-" if rate is None else f"{100 * rate:.1f}%"
