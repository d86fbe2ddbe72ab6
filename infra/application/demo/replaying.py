"""``flywheel demo --source replay --from <run>``: a recorded demo run, replayed into a fresh warm start.

The recorded run is a finished ``flywheel demo`` (any source): its event log (``<run>/data/chdb``) holds
every ``EpisodeScored`` it trained on, with the token ids, the behaviour logprobs and the weight version
that sampled each call. This mode copies that event log into its own data directory (chdb opens one
directory per process, and the copy keeps the recorded run untouched), starts the embedded stack on a
fresh copy of the same seed's warm start with no rollouts requested, and runs :func:`infra.application.replay.replay`
on it: the recorded training episodes are republished as ``source=replay`` in the order they were
scored, and the trainer learns from them alone. The episodes are read before the stack starts: a chdb
query and the stack recorder's inserts on the same directory at once were seen to deadlock (both threads
blocked in ``chdb``'s ``Connection.query``), so the recorder only writes once the reading is done. It is what ``flywheel up`` + ``flywheel replay`` do, with
the demo's held-out evaluation around it.

Off-policy corrections are the trainer's (``trainer/loss.py``): truncated importance weights
``min(π_old / μ, tis_cap)`` against the recorded logprobs μ (Yao et al., 2025, "Your efficient RL
framework secretly brings you off-policy RL training"), and the staleness rule: a transition sampled more
than ``max_staleness`` versions before the trainer's version is dropped. Version numbers are the recorded
run's, so a fresh trainer that takes one step per recorded step stays about as far behind the recorded
policy as the recorded trainer was; a trainer that falls behind sees lag 0 (``max(0, ...)``) and keeps all.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra.application.replay import ReplayFilter, ReplayReport, replay
from infra.eventlog.models import EpisodeFilter
from schemas import EpisodeScored

if TYPE_CHECKING:
    from infra.application.stack import EmbeddedStack
    from trainer.service import TrainerService

STEP_METRICS = ("tis_mean", "tis_capped_fraction", "ratio_mean", "clip_fraction", "staleness_mean")


class RecordedRunError(ValueError):
    """The ``--from`` directory is not a finished demo run this replay can use (one line, says why)."""


@dataclass(frozen=True)
class RecordedRun:
    root: Path
    seed: int
    report: dict[str, Any]  # that seed's report.json

    @property
    def chdb(self) -> Path:
        return self.root / "data" / "chdb"

    def window(self) -> ReplayFilter:
        """The recorded seed's RL phase (runs with several seeds share one event log)."""
        window = self.report.get("rl_window")
        if window:
            return ReplayFilter(since=window["since"], until=window["until"], limit=1_000_000)
        return ReplayFilter(limit=1_000_000)


def recorded_run(root: Path, seed: int) -> RecordedRun:
    """The seed's recorded run under ``root`` (a ``flywheel demo --out`` directory)."""
    path = root / f"seed-{seed}" / "report.json"
    if not path.is_file():
        raise RecordedRunError(f"{root} holds no finished demo run for seed {seed} (no {path})")
    report = json.loads(path.read_text())
    run = RecordedRun(root, seed, report)
    if not run.chdb.is_dir():
        raise RecordedRunError(f"{root} has no event log ({run.chdb}): was it run with recording on?")
    top = json.loads((root / "report.json").read_text()) if (root / "report.json").is_file() else {}
    if len(top.get("seeds", [seed])) > 1 and not report.get("rl_window"):
        raise RecordedRunError(
            f"{root} recorded several seeds into one event log without their time windows; "
            "record each seed into its own --out directory"
        )
    return run


def copy_event_log(run: RecordedRun, data_dir: Path) -> Path:
    """A fresh copy of the recorded event log as ``data_dir/chdb`` (replaces an older copy)."""
    target = data_dir / "chdb"
    if target.resolve() == run.chdb.resolve():
        raise RecordedRunError("--out must differ from --from: the replay writes its own event log")
    shutil.rmtree(target, ignore_errors=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    # chdb links its databases and tables into store/ with relative symlinks: copy the links as links
    shutil.copytree(run.chdb, target, symlinks=True)
    return target


class LoadedEpisodes:
    """The recorded episodes, read from the event log already (a ``ScoredEpisodeSource`` for replay)."""

    def __init__(self, events: list[EpisodeScored]) -> None:
        self.events = events

    def select_scored_episodes(
        self, f: EpisodeFilter, *, latest_per_episode: bool = True
    ) -> Iterator[EpisodeScored]:
        return iter(self.events)  # selected with the same filter when they were read


def load_episodes(run: RecordedRun, data_dir: Path) -> LoadedEpisodes:
    """Copy the recorded event log into ``data_dir`` and read the seed's scored episodes from the copy."""
    from infra.eventlog.store import ChdbStore

    store = ChdbStore(copy_event_log(run, data_dir))
    try:
        episodes = list(store.select_scored_episodes(run.window().to_episode_filter()))
    finally:
        store.close()
    return LoadedEpisodes(episodes)


def stale_counts(trainer: TrainerService) -> dict[str, int]:
    """What the trainer dropped for staleness so far (its Prometheus counters)."""
    registry = trainer.metrics.registry
    return {
        reason: int(
            registry.get_sample_value("flywheel_trainer_skipped_events_total", {"reason": reason}) or 0
        )
        for reason in ("stale_transition", "stale_episode")
    }


def _summary(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {
        "mean": round(sum(values) / len(values), 5),
        "min": round(min(values), 5),
        "max": round(max(values), 5),
    }


async def replay_phase(
    stack: EmbeddedStack,
    run: RecordedRun,
    episodes: LoadedEpisodes,
    *,
    rl_seconds: float,
    max_steps: int | None,
    say: Callable[[str], None],
    steps_seen: Callable[[], list[dict[str, float]]],
) -> dict[str, Any]:
    """Replay the recorded run into the stack's fresh trainer; train until it is used up or time is out.

    ``steps_seen`` gives the metrics of the trainer steps so far (the demo's monitor).
    """
    assert stack.bus is not None and stack.trainer is not None
    trainer = stack.trainer
    sent_transitions = 0

    def on_sent(event: EpisodeScored) -> None:
        nonlocal sent_transitions
        sent_transitions += len(event.transitions)

    t0 = time.perf_counter()
    training = stack.start_training(max_steps)
    report: ReplayReport = await replay(episodes, stack.bus, run.window(), on_sent=on_sent)
    say(
        f"[seed {run.seed}] replayed {report.sent} recorded episodes in {report.groups} groups "
        f"({report.flat_groups} with one reward for all; skipped {dict(report.skipped)}) "
        f"in {time.perf_counter() - t0:.0f}s"
    )
    prefix = f"r{report.run_id}-"
    while time.perf_counter() - t0 < rl_seconds and not training.done():
        status = trainer.status()
        consumed = sum(1 for g in trainer.intake.consumed if g.startswith(prefix))
        if consumed >= report.groups and status.ready_groups == 0 and status.pending_groups == 0:
            break  # every replayed group was taken into a batch; stop_training lets the last step finish
        # The trainer exposes no "batch taken" event: poll its counters (cheap) under the budget.
        await asyncio.sleep(0.5)
    await stack.stop_training()
    seconds = time.perf_counter() - t0
    stale = stale_counts(trainer)
    steps = steps_seen()
    trained_transitions = int(sum(m.get("transitions", 0.0) for m in steps))
    return {
        "rl_seconds": seconds,
        "replay": {
            **report.as_dict(),
            "from": str(run.root),
            "transitions_sent": sent_transitions,
            "transitions_trained": trained_transitions,
            "replay_episodes_trained": int(sum(m.get("replay_episodes", 0.0) for m in steps)),
        },
        # Per-step means as the trainer reports them, summarised over the steps (mean, min, max).
        "importance": {name: _summary([m[name] for m in steps if name in m]) for name in STEP_METRICS},
        "stale": {
            **stale,
            "share_of_sent_transitions": round(stale["stale_transition"] / sent_transitions, 4)
            if sent_transitions
            else 0.0,
        },
        "on_policy": {
            key: run.report.get(key) for key in ("before", "after", "delta", "rl_steps", "rl_seconds")
        },
    }
