"""``flywheel demo --source replay --from <run>``: a recorded demo run, replayed into a fresh warm start.

The recorded run is a finished ``flywheel demo`` (any source): its event log (``<run>/data/chdb``) holds
every ``EpisodeScored`` it trained on, with the token ids, the behaviour logprobs and the weight version
that sampled each call. This mode copies that event log into its own data directory (chdb opens one
directory per process, and the copy keeps the recorded run untouched), starts the embedded stack on a
fresh copy of the same seed's warm start with no rollouts requested, and republishes the recorded
training episodes as ``source=replay`` (:func:`flywheel.replay.plan_replay`, what ``flywheel
replay`` sends); the trainer learns from them alone. The episodes are read before the stack starts: a
chdb query and the stack recorder's inserts on the same directory at once were seen to deadlock (both
threads blocked in ``chdb``'s ``Connection.query``), so the recorder only writes once the reading is done.

How it replays, and why (docs/replay.md has the measurements):

* **At the recorded pace.** The groups are cut into the recorded trainer's steps — B groups each, in the
  order they completed in the recorded run, which is the order its trainer took them — and step ``k``'s
  groups are published only once step ``k − 1`` was trained. Published all at once (as before), the
  burst was consumed out of order: the bus spreads a topic over partitions by key and works them
  concurrently (as Kafka does), so the fresh trainer's batches mixed groups from the whole run — its
  first seven steps swept recorded versions 0 to 43 on seed 0 — the late, better policy's episodes
  trained first and the early ones late, where the staleness rule dropped them (28 % of the transitions
  on seed 0 here; 21 %, with lags up to 83 versions, on a 331-step recorded run). Paced, each batch
  meets the fresh trainer at the version it met the recorded one (lag ≤ 2, as on-policy), and the
  truncated importance weights ``min(π_old / μ, tis_cap)`` (``trainer/loss.py``) only correct a small drift.
* **Checked on validation tasks, and safe by default.** The served policy is evaluated on validation
  tasks (held out, disjoint from the report's held-out tasks) on the warm start and a few times during
  the replay; the phase ends serving the best of these checkpoints, the warm start included — early
  stopping on a validation split — so a replay never leaves the policy worse than the warm start by more
  than the validation's noise, and the report says which checkpoint was chosen and why.
* **Says when there is nothing to learn.** Groups whose members all got the same reward carry no GRPO
  signal; with fewer than ``ReplayOptions.min_signal_groups`` groups that do, nothing is trained and the
  report says so (``replay.too_little_signal``).
* **Production recordings replay as production.** A run recorded with ``--source production`` holds
  rated sessions, each a group of one: they are replayed as sessions (``recorded_source=production``),
  each trained against its tenant's running baseline as it was live, a step taking as many sessions as
  the recorded run's did (B × G).
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from examples.demo.checkpoints import Checkpoint, Validation, choose, serve
from examples.demo.ledger import summary
from flywheel.replay import ReplayFilter, ReplayReport, completion_order, has_signal, plan_replay
from flywheel.replay_pace import is_production_group
from infra.eventlog.models import EpisodeFilter
from infra.eventlog.store import ChdbStore
from schemas import TRANSITIONS, EpisodeScored

if TYPE_CHECKING:
    from examples.demo.pipeline import EvalResult
    from flywheel.stack import EmbeddedStack
    from trainer.service import TrainerService

ReplayOrder = Literal["recorded", "shuffled", "late"]
# the trainer's per-step figures the report summarises (mean, min, max over the steps)
STEP_METRICS = (
    "tis_mean",
    "tis_capped_fraction",
    "ratio_mean",
    "clip_fraction",
    "staleness_mean",
    "behaviour_kl",
    "reference_kl",
    "nll",
    "advantage_abs_mean",
)


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


# ------------------------------------------------------------------------------- the plan


@dataclass
class ReplayPlan:
    """The replayed groups cut into the trainer's steps, in the order the recorded trainer took them."""

    steps: list[list[list[EpisodeScored]]]  # step → group → members
    groups: int
    signal_groups: int

    @property
    def events(self) -> int:
        return sum(len(g) for step in self.steps for g in step)


def plan_steps(
    log: list[EpisodeScored], planned: list[EpisodeScored], batch_groups: int, order: ReplayOrder, seed: int
) -> ReplayPlan:
    """Cut ``plan_replay``'s copies (``planned``) of the recorded ``log`` into steps of ``batch_groups`` groups.

    ``recorded``: groups in the order they completed in the recorded run (their last member's place in
    the log), which is the order its trainer took them, so step ``k`` of the replay trains on what step
    ``k`` of the recorded run trained on. ``shuffled``: the same groups in a random order (``seed``).
    ``late``: only the second half of the recorded order (the better policy's episodes).
    """
    groups = completion_order(log, planned)
    if order == "shuffled":
        random.Random(f"replay-{seed}").shuffle(groups)
    elif order == "late":
        groups = groups[len(groups) // 2 :]
    steps = [groups[i : i + batch_groups] for i in range(0, len(groups), batch_groups)]
    # a rated production session's signal is its reward against its tenant's baseline, not a group's
    signal = sum(1 for g in groups if is_production_group(g) or has_signal(g))
    return ReplayPlan(steps, len(groups), signal)


def _taken(trainer: TrainerService, paced: bool, done_before: int, run_id: str, sent_groups: int) -> bool:
    """Paced: the step's batch was taken (trained, or skipped without signal). Unpaced: every group was."""
    if paced:
        return trainer.step + trainer.batches_without_signal > done_before
    consumed = sum(1 for g in trainer.intake.consumed if g.startswith(f"r{run_id}-"))
    status = trainer.status()
    return consumed >= sent_groups and status.ready_groups == 0 and status.pending_groups == 0


# ----------------------------------------------------------------------------- the phase


@dataclass(frozen=True)
class ReplayOptions:
    order: ReplayOrder = "recorded"
    checkpoints: int = 6  # validation evaluations after the warm start's, evenly spaced over the steps
    min_signal_groups: int = 16  # fewer groups with signal than this: too little to train on
    step_timeout_s: float = 180.0  # one step's data taken and trained (a failing backend stops the replay)
    # For comparisons only (docs/replay.md): publish every group at once, as the replay first did, and
    # serve the last weights whatever the validation says.
    paced: bool = True
    select: bool = True


async def replay_phase(
    stack: EmbeddedStack,
    run: RecordedRun,
    episodes: LoadedEpisodes,
    *,
    rl_seconds: float,
    max_steps: int | None,
    say: Callable[[str], None],
    steps_seen: Callable[[], list[dict[str, float]]],
    batch_groups: int,
    validate: Callable[[], Awaitable[EvalResult]],
    warm_weights: Path,
    work_dir: Path,
    options: ReplayOptions | None = None,
) -> dict[str, Any]:
    """Replay the recorded run into the stack's fresh trainer, one recorded step at a time.

    The groups of step ``k`` are published only once step ``k − 1`` was trained, so the fresh trainer
    trains on each recorded batch at the same weight version as the recorded trainer did, and the data is
    as fresh for it as it was for the recorded one (the staleness rule then measures what it should).
    ``validate`` evaluates the served policy on validation tasks (held out, disjoint from the report's
    held-out tasks): once on the warm start, then ``options.checkpoints`` times evenly over the steps. The
    phase ends serving the checkpoint with the best validation success, the warm start included, so a
    replay never leaves the policy worse than it found it by more than the validation's noise.
    """
    assert stack.bus is not None and stack.trainer is not None
    opts = options or ReplayOptions()
    trainer = stack.trainer
    events = await asyncio.to_thread(
        lambda: list(episodes.select_scored_episodes(run.window().to_episode_filter()))
    )
    report = ReplayReport(run_id=uuid.uuid4().hex[:8])
    planned = plan_replay(events, run_id=report.run_id, report=report)
    plan = plan_steps(events, planned, batch_groups, opts.order, run.seed)
    steps = plan.steps[:max_steps] if max_steps is not None else plan.steps
    say(
        f"[seed {run.seed}] replay plan: {plan.groups} groups ({plan.signal_groups} with signal, "
        f"{report.flat_groups} with one reward for all) in {len(steps)} steps, order {opts.order}"
    )
    t0 = time.perf_counter()
    validation = Validation(trainer, validate, warm_weights, work_dir, say, run.seed)
    points, checkpoint = validation.points, validation.take
    too_little = plan.signal_groups < opts.min_signal_groups
    if too_little:
        say(
            f"[seed {run.seed}] the recorded run carries too little signal to train on: {plan.signal_groups} "
            f"groups with different rewards (at least {opts.min_signal_groups} needed); nothing replayed"
        )
        steps = []
    await checkpoint(0, 0)
    eval_after = {round(len(steps) * (i + 1) / opts.checkpoints) for i in range(opts.checkpoints)} - {0}
    eval_s = points[0].seconds
    # Started only with something to train: a trainer loop stopped before it first ran would clear the
    # stop request when it starts (``TrainerService.run``) and never return.
    training = stack.start_training(None) if steps else None
    units = steps if opts.paced else [[g for step in steps for g in step]]
    sent_groups, sent_transitions, eval_s = await _send_steps(
        stack, units, validation, report, training, opts, eval_after, n_steps=len(steps),
        started=t0, eval_s=eval_s, rl_seconds=rl_seconds,
    )  # fmt: skip
    if training is not None:
        await stack.stop_training()
    if steps and (not points or points[-1].step != trainer.step):
        await checkpoint(trainer.step, sent_groups)
    best = choose(points) if opts.select else points[-1]
    served = trainer.weights.serving_version
    if best is not points[-1]:
        served = await serve(trainer, best.weights)
        say(
            f"[seed {run.seed}] serving the best validation checkpoint: step {best.step} "
            f"({100 * best.success:.1f}%) rather than the last ({100 * points[-1].success:.1f}%)"
        )
    seconds = time.perf_counter() - t0
    report.groups = plan.groups
    replayed = {
        **report.as_dict(),
        "from": str(run.root),
        "order": opts.order,
        "signal_groups": plan.signal_groups,
        "too_little_signal": too_little,
        "steps_planned": len(steps),
        "groups_sent": sent_groups,
        "transitions_sent": sent_transitions,
    }
    return {
        "rl_seconds": seconds,
        **_phase_figures(run, replayed, points, best, served, stale_counts(trainer), steps_seen(), eval_s),
    }


def _phase_figures(
    run: RecordedRun,
    replayed: dict[str, Any],
    points: list[Checkpoint],
    best: Checkpoint,
    served: int,
    stale: dict[str, int],
    seen: list[dict[str, float]],
    eval_s: float,
) -> dict[str, Any]:
    """The replay phase's report: what was sent and trained, the checkpoints and the one served, the
    importance weights, what went stale, and the recorded run's own figures."""
    sent_transitions = replayed["transitions_sent"]
    return {
        "replay": {
            **replayed,
            "transitions_trained": int(sum(m.get("transitions", 0.0) for m in seen)),
            "replay_episodes_trained": int(sum(m.get("replay_episodes", 0.0) for m in seen)),
            "validation_seconds": round(eval_s, 1),
        },
        "checkpoints": [p.as_dict() for p in points],
        "chosen": {**best.as_dict(), "served_version": served, "last": best is points[-1]},
        # Per-step means as the trainer reports them, summarised over the steps (mean, min, max).
        "importance": {
            name: summary([m[name] for m in seen if name in m], digits=5) for name in STEP_METRICS
        },
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


async def _send_steps(
    stack: EmbeddedStack,
    units: list[list[list[EpisodeScored]]],
    validation: Validation,
    report: ReplayReport,
    training: asyncio.Task[Any] | None,
    opts: ReplayOptions,
    eval_after: set[int],
    *,
    n_steps: int,
    started: float,
    eval_s: float,
    rl_seconds: float,
) -> tuple[int, int, float]:
    """Publish the replay unit by unit (a recorded step, or everything when unpaced), each once the
    trainer took the one before, validating at the ``eval_after`` steps, until the budget is spent;
    returns the groups and transitions sent and the seconds spent validating."""
    assert stack.bus is not None
    trainer = validation.trainer
    sent_transitions = sent_groups = 0
    timed_out = False
    for index, step in enumerate(units, start=1):
        done_before = trainer.step + trainer.batches_without_signal
        for members in step:
            for event in members:
                await stack.bus.publish(TRANSITIONS, event)
                report.sent += 1
                sent_transitions += len(event.transitions)
        sent_groups += len(step)

        # The trainer exposes no "batch taken" event: poll its counters (cheap) under a deadline.
        deadline = time.perf_counter() + opts.step_timeout_s * (1 if opts.paced else n_steps)
        while (
            training is not None
            and not _taken(trainer, opts.paced, done_before, report.run_id, sent_groups)
            and not training.done()
        ):
            if time.perf_counter() > deadline or time.perf_counter() - started - eval_s > rl_seconds:
                timed_out = True
                break
            await asyncio.sleep(0.02)
        if timed_out or training is None or training.done():
            validation.say(
                f"[seed {validation.seed}] replay stopped at step {index} of {len(units)}: budget spent or trainer stuck"
            )
            break
        if index in eval_after:
            await validation.take(trainer.step, sent_groups)
            eval_s += validation.points[-1].seconds
        if time.perf_counter() - started - eval_s > rl_seconds:
            validation.say(
                f"[seed {validation.seed}] replay budget of {rl_seconds:.0f}s spent at step {index} of {n_steps}"
            )
            break
    return sent_groups, sent_transitions, eval_s
