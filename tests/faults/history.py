"""A history checker: the whole event log of a run, plus what the clients saw, against the properties the
bus and the services promise (issue #54, deliverable 4).

Input: every record read back from the topics (``Logged``: the event, its topic, partition and offset),
every logical call the agents made (``ClientCall``: its episode and the HTTP status of each attempt), and
how far the trainer's consumer group got on ``flywheel.transitions`` (committed offset per partition).
``check`` returns one ``Violation`` per broken property; an empty list is a correct history.

Properties (each one a ``Violation.rule``):

- ``call-recorded-once``: after dedup by event id, each call id is recorded once, and each episode has
  as many recorded calls as its agent got 2xx answers for.
- ``call-seq-unique``: no two recorded calls of one episode share a call number (``call_seq``).
- ``scored-once``: every finished episode (not superseded) is scored, once per score revision.
- ``scored-from-all-calls``: the latest score of an episode counts every recorded call of it.
- ``transitions-trained``: every EpisodeScored with transitions lies below the trainer's committed
  offset of its partition.
- ``no-5xx``: a 5xx is allowed only on the documented retry path: a 503 with ``Retry-After`` (or a
  connection error, status 0, while a gateway restarts) followed by a retry, and the call's last
  attempt answers 2xx.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from schemas import TRANSITIONS, AnyEvent, EpisodeFinished, EpisodeScored, LLMCallRecorded


@dataclass(frozen=True)
class Logged:
    """One record read back from a topic."""

    event: AnyEvent
    topic: str
    partition: int = 0
    offset: int = 0


@dataclass(frozen=True)
class Attempt:
    """One HTTP attempt of a call: its status (0: no answer, the connection failed)."""

    status: int
    retry_after: bool = False


@dataclass(frozen=True)
class ClientCall:
    """One logical call an agent made, with every attempt it took."""

    episode_id: str
    attempts: tuple[Attempt, ...]

    @property
    def ok(self) -> bool:
        return bool(self.attempts) and 200 <= self.attempts[-1].status < 300


@dataclass(frozen=True)
class Violation:
    rule: str
    episode_id: str
    detail: str


@dataclass
class Figures:
    """What the history holds, for the results page."""

    calls_recorded: int = 0
    duplicate_records: int = 0
    client_calls: int = 0
    retried_calls: int = 0
    episodes_finished: int = 0
    episodes_scored: int = 0
    violations: dict[str, int] = field(default_factory=dict)


def dedup(logged: Sequence[Logged]) -> list[Logged]:
    """The records with each event id once (the first one read), as a consumer that dedups sees them."""
    seen: set[str] = set()
    out: list[Logged] = []
    for rec in logged:
        if rec.event.event_id not in seen:
            seen.add(rec.event.event_id)
            out.append(rec)
    return out


def _check_calls(
    calls: Sequence[LLMCallRecorded], client: Sequence[ClientCall], out: list[Violation]
) -> None:
    by_episode: dict[str, list[LLMCallRecorded]] = defaultdict(list)
    for call in calls:
        by_episode[call.episode_id].append(call)
    answered = Counter(c.episode_id for c in client if c.ok)
    for episode_id in sorted(set(by_episode) | set(answered)):
        recorded = by_episode.get(episode_id, [])
        ids = Counter(c.call_id for c in recorded)
        for call_id, n in sorted(ids.items()):
            if n > 1:
                out.append(Violation("call-recorded-once", episode_id, f"call {call_id} recorded {n} times"))
        if episode_id in answered and len(ids) != answered[episode_id]:
            out.append(
                Violation(
                    "call-recorded-once",
                    episode_id,
                    f"{answered[episode_id]} calls answered 2xx, {len(ids)} recorded",
                )
            )
        seqs = Counter({c.call_id: c.call_seq for c in recorded}.values())
        for seq, n in sorted(seqs.items()):
            if n > 1:
                out.append(Violation("call-seq-unique", episode_id, f"call_seq {seq} on {n} calls"))


def _check_scores(
    calls: Sequence[LLMCallRecorded],
    finished: Sequence[EpisodeFinished],
    scored: Sequence[EpisodeScored],
    out: list[Violation],
) -> None:
    n_calls = Counter(ep for ep, _ in {(c.episode_id, c.call_id) for c in calls})
    by_episode: dict[str, list[EpisodeScored]] = defaultdict(list)
    for s in scored:
        by_episode[s.episode_id].append(s)
    for fin in finished:
        if fin.superseded:
            continue
        scores = by_episode.get(fin.episode_id, [])
        if not scores:
            out.append(Violation("scored-once", fin.episode_id, "finished, never scored"))
            continue
        revisions = Counter(s.score_revision for s in scores)
        for rev, n in sorted(revisions.items()):
            if n > 1:
                out.append(
                    Violation("scored-once", fin.episode_id, f"score revision {rev} published {n} times")
                )
        latest = max(scores, key=lambda s: s.score_revision)
        if latest.num_calls != n_calls[fin.episode_id]:
            out.append(
                Violation(
                    "scored-from-all-calls",
                    fin.episode_id,
                    f"scored from {latest.num_calls} calls, {n_calls[fin.episode_id]} recorded",
                )
            )


def _check_trained(
    scored: Sequence[Logged], committed: Mapping[int, int] | None, out: list[Violation]
) -> None:
    if committed is None:
        return
    for rec in scored:
        event = rec.event
        if not isinstance(event, EpisodeScored) or not event.transitions:
            continue
        position = committed.get(rec.partition, 0)
        if rec.offset >= position:
            out.append(
                Violation(
                    "transitions-trained",
                    event.episode_id,
                    f"partition {rec.partition} offset {rec.offset} not below the trainer's {position}",
                )
            )


def _check_status(client: Sequence[ClientCall], out: list[Violation]) -> None:
    for call in client:
        *earlier, last = call.attempts or (Attempt(0),)
        for attempt in earlier:
            if attempt.status >= 500 and not (attempt.status == 503 and attempt.retry_after):
                out.append(Violation("no-5xx", call.episode_id, f"{attempt.status} outside the retry path"))
        if not 200 <= last.status < 300:
            out.append(Violation("no-5xx", call.episode_id, f"last attempt answered {last.status}"))


def check(
    logged: Sequence[Logged],
    client: Sequence[ClientCall],
    trainer_committed: Mapping[int, int] | None = None,
) -> tuple[list[Violation], Figures]:
    """Every violation of the history's properties (empty: correct) and its figures.

    ``trainer_committed``: the trainer's committed offset per partition of ``flywheel.transitions``;
    None skips ``transitions-trained`` (a run without a trainer)."""
    unique = dedup(logged)
    calls = [r.event for r in unique if isinstance(r.event, LLMCallRecorded)]
    finished = [r.event for r in unique if isinstance(r.event, EpisodeFinished)]
    scored_recs = [r for r in unique if isinstance(r.event, EpisodeScored) and r.topic.endswith(TRANSITIONS)]
    scored = [r.event for r in scored_recs if isinstance(r.event, EpisodeScored)]
    out: list[Violation] = []
    _check_calls(calls, client, out)
    _check_scores(calls, finished, scored, out)
    _check_trained(scored_recs, trainer_committed, out)
    _check_status(client, out)
    figures = Figures(
        calls_recorded=len(calls),
        duplicate_records=len(logged) - len(unique),
        client_calls=len(client),
        retried_calls=sum(1 for c in client if len(c.attempts) > 1),
        episodes_finished=len({f.episode_id for f in finished}),
        episodes_scored=len({s.episode_id for s in scored}),
        violations=dict(Counter(v.rule for v in out)),
    )
    return out, figures
