"""Off-policy replay: past scored episodes from the event log, republished as ``source=replay``.

``flywheel replay`` (docs/architecture.md, flow 3) selects ``EpisodeScored`` events in ClickHouse by time range,
tenant, weight version, reward and task, checks each one can still be trained on, and publishes a
copy on ``flywheel.transitions``. The copy keeps what off-policy correction needs — the transitions
with their behaviour logprobs and the weight version that generated them — and changes what must
change for the trainer to take it as new data:

- a new ``event_id`` (consumers deduplicate on it) and ``emitted_at``;
- ``source=replay``, and ``recorded_source`` the source it was recorded with;
- a new ``group_id`` per original group (``r<run>-<original>``): the trainer skips episodes of a
  group it already trained on, and a replayed group is compared only with the members replayed with
  it; ``group_size`` is the number of members sent, ``sample_index`` is renumbered 0..n-1.

The ``episode_id`` stays, so a replayed sample can be traced back to its recorded calls.

A production session (``source=production``: a deployed agent's session, rated by its user) is a group
of one. Its copy keeps ``recorded_source=production``, so the trainer takes it as it takes a live one
(:func:`trainer.groups.is_production_session`): alone, with its advantage against its tenant's running
baseline (:mod:`trainer.baselines`, keyed by the ``tenant`` and ``reward_source`` the copy keeps).
``source`` in the filter selects production traffic only (``production``) or the training rollouts
(``live``).

With a policy map, ``policy`` replays one policy's data only: each episode keeps the transitions of that
policy (``Transition.policy``, its adapter's calls), and an episode with none is skipped
(``other_policy``); the trainer then trains that policy's adapter alone from the replay.

Skipped, with the reason counted: episodes with no transitions (``no_transitions:<why>``),
transitions without behaviour logprobs (``no_logprobs``), logprobs that do not line up with the
response (``logprobs_length``), validation episodes (``not_train``), superseded attempts
(``superseded``) and episodes without a reward (``no_reward``).

**Paced by the trainer's steps** (``pace``, the command line's default): the groups are sent in the order
they completed in the recorded run (the order the recorded trainer took them), ``groups_per_step`` at a
time, and the next step's groups only once the trainer reported a step (``TrainerStepCompleted`` on
``flywheel.control``). Sent all at once, a large replay is consumed out of order — the bus works a
topic's partitions concurrently, as Kafka does — so the trainer's batches mix the whole recorded run
and the staleness rule drops the early episodes (docs/replay.md measures it). Groups whose members all
carry the same return teach nothing and are left out of a paced replay (``no_signal``); each production
session counts as one group toward a step and is never left out (:mod:`flywheel.replay_pace`).

Nothing here parses command lines or prints: :mod:`flywheel.cli.replay_cmd` and
:mod:`flywheel.cli.eventlog_opts` do.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from flywheel.replay_pace import TrainerSteps, completion_order, has_signal, plan_steps
from infra.bus.base import Bus
from infra.eventlog.models import EpisodeFilter
from schemas import TRANSITIONS, EpisodeScored, EpisodeSource, Mode, new_event_id
from trainer.groups import is_production_session

__all__ = [  # completion_order and has_signal: flywheel.replay_pace's, kept importable from here
    "Pace",
    "ReplayFilter",
    "ReplayReport",
    "completion_order",
    "has_signal",
    "plan_replay",
    "replay",
]

MAX_GROUP_ID = 64


class ReplayFilterError(ValueError):
    """A replay filter that cannot be understood (bad date, negative rate, ...). One line."""


class TokenizerMismatchError(ReplayFilterError):
    """The selected episodes' token ids were made by another tokenizer than the target's. One line."""


def check_tokenizer(events: Sequence[EpisodeScored], expected: str) -> int:
    """Raise :class:`TokenizerMismatchError` when a transition of ``events`` was recorded with a tokenizer
    other than ``expected``; returns how many episodes carry no fingerprint (recorded before it was)."""
    foreign: Counter[str] = Counter()
    unknown = 0
    for event in events:
        seen = {t.tokenizer for t in event.transitions}
        unknown += int(None in seen)
        for other in seen - {None, expected}:
            foreign[str(other)] += 1
    if foreign:
        found = ", ".join(f"{fp} ({n} episodes)" for fp, n in foreign.most_common(3))
        raise TokenizerMismatchError(
            f"the selected episodes were recorded with tokenizer {found}, not the target's {expected}: "
            "their token ids mean other tokens to it; replay them into the model they were recorded "
            "with (docs/replay.md, 'Replay into a new model')"
        )
    return unknown


class ReplayStalledError(RuntimeError):
    """A paced replay saw no trainer step within its timeout after sending a step's groups. One line."""


@dataclass(frozen=True)
class Pace:
    """Send ``groups_per_step`` groups (the trainer's batch), then wait for its step, at most ``step_timeout_s``."""

    groups_per_step: int
    step_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.groups_per_step < 1:
            raise ReplayFilterError(f"groups per step must be at least 1, got {self.groups_per_step}")
        if not self.step_timeout_s > 0:
            raise ReplayFilterError(f"the step timeout must be positive, got {self.step_timeout_s}")


class ScoredEpisodeSource(Protocol):
    """What replay reads from: the event store (``infra.eventlog.store``), or anything shaped like it."""

    def select_scored_episodes(
        self, f: EpisodeFilter, *, latest_per_episode: bool = True
    ) -> Iterator[EpisodeScored]: ...


class ReplayFilter(BaseModel):
    """Which past episodes to replay (JSON-ready: the admin API of a running stack takes it as a body)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    since: datetime | None = None
    until: datetime | None = None
    tenant: str | None = None
    min_reward: float | None = None
    min_weight_version: int | None = Field(default=None, ge=0)
    max_weight_version: int | None = Field(default=None, ge=0)
    task_pattern: str | None = Field(default=None, description="a glob on task_id: sql-*")
    policy: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="only this policy's transitions (LoRA adapter)",
    )
    source: Literal["live", "production"] | None = Field(
        default=None, description="only episodes recorded with this source (None: any)"
    )
    limit: int = Field(default=10_000, ge=1, le=1_000_000)
    tokenizer: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{16}$",
        description="the target model's tokenizer fingerprint: episodes recorded with another are refused",
    )

    def to_episode_filter(self) -> EpisodeFilter:
        like = None
        if self.task_pattern is not None:
            escaped = self.task_pattern.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            like = escaped.replace("*", "%").replace("?", "_")
        try:
            return EpisodeFilter(
                since=self.since,
                until=self.until,
                tenant=self.tenant,
                min_reward=self.min_reward,
                min_weight_version=self.min_weight_version,
                max_weight_version=self.max_weight_version,
                task_id_like=like,
                source=self.source,
                limit=self.limit,
            )
        except ValueError as exc:
            raise ReplayFilterError(first_error(exc)) from exc


@dataclass
class ReplayReport:
    selected: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    tokenizer_unknown: int = 0  # checked episodes recorded without a tokenizer fingerprint (replayed)
    sent: int = 0
    groups: int = 0
    flat_groups: int = 0  # groups whose members all have the same reward: no GRPO signal
    production: int = 0  # production sessions (groups of one, trained against their tenant's baseline)
    dry_run: bool = False
    run_id: str = ""
    paced: bool = False
    steps: int = 0  # paced: the steps planned
    steps_taken: int = 0  # paced: steps the trainer reported after its groups were sent

    @property
    def eligible(self) -> int:
        return self.selected - sum(self.skipped.values())

    def as_dict(self) -> dict[str, object]:
        return {
            "run_id": self.run_id,
            "dry_run": self.dry_run,
            "selected": self.selected,
            "eligible": self.eligible,
            "skipped": dict(sorted(self.skipped.items())),
            "tokenizer_unknown": self.tokenizer_unknown,
            "sent": self.sent,
            "groups": self.groups,
            "flat_groups": self.flat_groups,
            "production": self.production,
            "paced": self.paced,
            "steps": self.steps,
            "steps_taken": self.steps_taken,
        }


# --------------------------------------------------------------------------------- errors


def first_error(exc: ValueError) -> str:
    """A validation error's first message, in one line (pydantic's list, else the text's first line)."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        found = errors()
        if found:
            msg = str(found[0].get("msg", exc))
            return msg.removeprefix("Value error, ")
    return str(exc).splitlines()[0]


# ------------------------------------------------------------------------------- selection


def skip_reason(event: EpisodeScored) -> str | None:
    """Why ``event`` cannot be replayed into training, or None when it can."""
    if event.mode != Mode.train:
        return "not_train"
    if event.superseded:
        return "superseded"
    if not event.transitions:
        return f"no_transitions:{event.unusable_reason or 'unknown'}"
    if event.reward is None:
        return "no_reward"
    for t in event.transitions:
        if not t.behaviour_logprobs:
            return "no_logprobs"
        if len(t.behaviour_logprobs) != len(t.response_ids):
            return "logprobs_length"
    return None


def replay_group_id(run_id: str, original: str) -> str:
    return f"r{run_id}-{original}"[:MAX_GROUP_ID]


def for_policy(event: EpisodeScored, policy: str) -> EpisodeScored | None:
    """``event`` with only ``policy``'s transitions, or None when it has none."""
    kept = [t for t in event.transitions if t.policy == policy]
    if not kept:
        return None
    return event if len(kept) == len(event.transitions) else event.model_copy(update={"transitions": kept})


def plan_replay(
    events: Iterable[EpisodeScored], *, run_id: str, report: ReplayReport, policy: str | None = None
) -> list[EpisodeScored]:
    """The events to publish (copies with new ids, grouped per original group); counts skips in ``report``.

    A production session is a group of its own (keyed by its episode). ``policy``: each event narrowed
    to that policy's transitions (:func:`for_policy`)."""
    by_group: dict[str, list[EpisodeScored]] = {}
    for event in events:
        report.selected += 1
        reason = skip_reason(event)
        if reason is not None:
            report.skipped[reason] += 1
            continue
        if policy is not None:
            narrowed = for_policy(event, policy)
            if narrowed is None:
                report.skipped["other_policy"] += 1
                continue
            event = narrowed
        key = event.episode_id if is_production_session(event) else event.group_id
        by_group.setdefault(key, []).append(event)
    now = datetime.now(UTC)
    out: list[EpisodeScored] = []
    for original, members in by_group.items():
        group_id = replay_group_id(run_id, original)
        rewards = {m.reward for m in members}
        report.groups += 1
        if is_production_session(members[0]):
            report.production += 1  # no group to compare with: its tenant's baseline is the signal
        else:
            report.flat_groups += int(len(rewards) <= 1)
        for index, member in enumerate(members):
            out.append(
                member.model_copy(
                    update={
                        "event_id": new_event_id(),
                        "emitted_at": now,
                        "producer": "replay",
                        "source": EpisodeSource.replay,
                        "recorded_source": member.recorded_source or member.source,
                        "group_id": group_id,
                        "group_size": len(members),
                        "sample_index": index,
                        "superseded": False,
                    }
                )
            )
    return out


class _Pacer:
    """At most ``rate`` publishes per second (no limit when None)."""

    def __init__(self, rate: float | None) -> None:
        self.interval = 1.0 / rate if rate else 0.0
        self.next_at = time.monotonic()

    async def wait(self) -> None:
        if not self.interval:
            return
        now = time.monotonic()
        if self.next_at > now:
            await asyncio.sleep(self.next_at - now)
        self.next_at = max(self.next_at, now) + self.interval


async def replay(
    source: ScoredEpisodeSource,
    bus: Bus | None,
    flt: ReplayFilter,
    *,
    rate: float | None = None,
    pace: Pace | None = None,
    dry_run: bool = False,
    report: ReplayReport | None = None,
    on_planned: Callable[[int], None] | None = None,
    on_sent: Callable[[EpisodeScored], None] | None = None,
) -> ReplayReport:
    """Select, check and (unless ``dry_run``) publish. ``bus`` must be started; unused on a dry run.

    ``pace``: send the groups in their recorded order, one trainer step's worth at a time (module
    docstring); raises :class:`ReplayStalledError` when the trainer does not step. ``report`` (a fresh
    one when None) is filled in as the replay goes, so a caller can show its progress.
    """
    report = report or ReplayReport()
    report.dry_run, report.paced = dry_run, pace is not None
    report.run_id = report.run_id or uuid.uuid4().hex[:8]
    episode_filter = flt.to_episode_filter()
    # The store's reads are synchronous (chdb / clickhouse-connect): keep the event loop free.
    events = await asyncio.to_thread(lambda: list(source.select_scored_episodes(episode_filter)))
    if flt.tokenizer is not None:
        report.tokenizer_unknown = check_tokenizer(events, flt.tokenizer)
    planned = plan_replay(events, run_id=report.run_id, report=report, policy=flt.policy)
    steps: list[list[list[EpisodeScored]]] = [[[e] for e in planned]]
    trains = [False]
    if pace is not None:
        paced = plan_steps(events, planned, pace.groups_per_step)
        if paced.no_signal:
            report.skipped["no_signal"] += paced.no_signal
        steps, trains = paced.steps, paced.trains
        report.steps = len(steps)
        planned = [e for step in steps for g in step for e in g]
    if on_planned is not None:
        on_planned(len(planned))
    if dry_run or not planned:
        return report
    if bus is None:
        raise ValueError("a bus is needed to publish a replay")
    pacer = _Pacer(rate)
    watch = TrainerSteps(bus) if pace is not None else None
    if watch is not None:
        await watch.start()
    try:
        for index, step in enumerate(steps, start=1):
            seen = watch.count if watch is not None else 0
            for members in step:
                for event in members:
                    await pacer.wait()
                    await bus.publish(TRANSITIONS, event)
                    report.sent += 1
                    if on_sent is not None:
                        on_sent(event)
            if watch is None or pace is None or len(step) < pace.groups_per_step:
                continue  # a last, partial step trains with the trainer's next batch
            if not trains[index - 1]:
                continue  # production sessions at their baseline: the trainer takes them, reports no step
            if not await watch.wait_beyond(seen, pace.step_timeout_s):
                raise ReplayStalledError(
                    f"no trainer step within {pace.step_timeout_s:g} s after sending step {index} of "
                    f"{len(steps)} ({report.sent} episodes sent): is a trainer consuming "
                    f"{TRANSITIONS} with batches of {pace.groups_per_step} groups?"
                )
            report.steps_taken += 1
    finally:
        if watch is not None:
            await watch.stop()
    return report
