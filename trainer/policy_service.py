"""The trainer with a policy map: one stream of scored episodes, one LoRA adapter per policy.

The loop is :class:`~trainer.service.TrainerService`'s (intake, groups, pause, control, inbox); what a
step does with its groups differs::

    split every group by policy (Transition.policy, set from the call's adapter by the reward service):
        a policy's sub-group holds the members that have transitions of that policy, with only those
        transitions, plus the members without any transition (their reward is baseline, as always);
        members whose transitions are all another policy's are not in it: a GRPO group never mixes
        policies
    per policy with a sub-group: build the batch against that adapter's own version (staleness) and
        production baselines, train its adapter (trainer/lora.py), export it, and run the weight-update
        protocol for that adapter alone (WeightUpdateRequested.adapter = the policy: gateways drain and
        pause only that adapter's calls, the engine swaps only that adapter's tensors)
    transitions of no policy in the map are counted (skipped "no_policy") and not trained: the base is
        frozen
    SFT mode (``FLYWHEEL_TRAINER_OBJECTIVE=sft``): a policy's batch is its sub-groups' episodes that pass
        ``trainer.sft.select_episodes`` (reward ≥ ``sft_reward_threshold``) with that policy's transitions
        only, and its adapter takes a cross-entropy step on them (no advantages, no baselines)

One step may so update several adapters from one batch. Each adapter has its own Adam state, version
counter, production baselines and checkpoints (``<trainer_root>/policies/<name>/checkpoints/...``,
the same layout as the full model's); the shared ``<trainer_root>/checkpoints`` keeps the step, the
consumed group ids and the bus offsets, and the inbox is the trainer's one inbox. In async mode each
adapter's update runs while the next batch is collected (one outstanding per adapter); in sync mode
the step waits for it.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from infra.bus.base import Bus, Message
from infra.logging import get_logger
from schemas import (
    CONTROL,
    EpisodeScored,
    EpisodeSource,
    InferenceDrained,
    InferenceResumed,
    StepMetrics,
    TrainerStepCompleted,
)
from trainer.backends.base import BackendError
from trainer.baselines import ProductionBaselines
from trainer.batching import TrainBatch
from trainer.checkpoints import CheckpointMeta, CheckpointStore
from trainer.groups import Group, Intake
from trainer.loop import LoopConfig, export_keeping_three
from trainer.lora import AdapterBackend, LoraPolicies
from trainer.rollouts import RolloutPlanner
from trainer.service import TrainerService
from trainer.settings import TrainerSettings
from trainer.status import TrainerStatus
from trainer.weights import (
    PipelinedUpdates,
    UpdateResult,
    WeightSink,
    WeightSync,
    WeightUpdate,
)

log = get_logger(__name__)


def split_by_policy(groups: Sequence[Group], names: Sequence[str]) -> tuple[dict[str, list[Group]], int]:
    """Per policy, its sub-groups (see the module docstring); and the transitions of no known policy."""
    known = set(names)
    out: dict[str, list[Group]] = {}
    unmatched = 0
    for group in groups:
        per: dict[str, dict[str, EpisodeScored]] = {}
        bare: dict[str, EpisodeScored] = {}
        for eid, episode in group.members.items():
            if not episode.transitions:
                bare[eid] = episode
                continue
            by: dict[str, list[Any]] = {}
            for t in episode.transitions:
                if t.policy is None or t.policy not in known:
                    unmatched += 1
                else:
                    by.setdefault(t.policy, []).append(t)
            for policy, ts in by.items():
                per.setdefault(policy, {})[eid] = episode.model_copy(update={"transitions": ts})
        for policy, members in per.items():
            sub = Group(
                group.group_id, group.group_size, group.first_seen, {**members, **bare}, group.expired
            )
            out.setdefault(policy, []).append(sub)
    return out, unmatched


class PolicyTrainerService(TrainerService):
    def __init__(
        self,
        *,
        policies: LoraPolicies,
        adapter_sinks: Callable[[str], Sequence[WeightSink]],
        expected_gateways: int = 1,
        drain_timeout_s: float = 30.0,
        **kw: Any,
    ) -> None:
        super().__init__(backend=policies, **kw)  # the shared loop's "backend": versions, vocabulary
        self.policies = policies
        self.adapter_stores = {
            name: CheckpointStore(self.store.root / "policies" / name, keep=self.store.keep)
            for name in policies.adapters
        }
        self.adapter_weights = {
            name: WeightSync(
                self.bus,
                list(adapter_sinks(name)),
                model=self.loop.model,
                adapter=name,
                expected_gateways=expected_gateways,
                drain_timeout_s=drain_timeout_s,
            )
            for name in policies.adapters
        }
        self.adapter_baselines = {name: ProductionBaselines() for name in policies.adapters}
        self.adapter_samples: dict[str, Counter[str]] = {name: Counter() for name in policies.adapters}
        self.adapter_metrics: dict[str, StepMetrics] = {name: StepMetrics() for name in policies.adapters}
        self._adapter_updates = {
            name: PipelinedUpdates(sync, self._adapter_update_done(name))
            for name, sync in self.adapter_weights.items()
        }

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Restore the shared state and every adapter's checkpoint, push trained adapters, subscribe."""
        await self._restore_and_listen()
        for name, adapter in self.policies.adapters.items():
            info = self.adapter_stores[name].latest()
            if info is None:
                continue
            adapter.load_checkpoint(info.path, info.meta.version)
            self.adapter_baselines[name] = ProductionBaselines.from_json(info.meta.baselines)
            self.adapter_samples[name].update(info.meta.samples)
            log.info("adapter_resumed", adapter=name, version=info.meta.version, path=str(info.path))
        if self.loop.push_on_start:
            for name, adapter in self.policies.adapters.items():
                if adapter.version > 0:
                    path = self._export_adapter(name)
                    await self.adapter_weights[name].update(
                        WeightUpdate(adapter.version, adapter.state_dict, path)
                    )
        await self._load_untrained()
        await self._consume_transitions()
        self._write_status()

    async def _load_untrained(self) -> None:
        """Version 0 of each untrained adapter into the engines that serve an adapter's name only once
        loaded (vLLM: ``loads_untrained``); its ``B`` factors are zero, so it answers as the base does.
        No gateway drains for it: no call of that adapter could be served before. A failure (vLLM started
        without ``--enable-lora``, a rank above its ``--max-lora-rank``) raises :class:`WeightLoadError`."""
        for name, adapter in self.policies.adapters.items():
            sinks = [s for s in self.adapter_weights[name].sinks if getattr(s, "loads_untrained", False)]
            if adapter.version > 0 or not sinks:
                continue
            path = await asyncio.to_thread(self._export_adapter, name)
            for sink in sinks:
                await sink.load(WeightUpdate(0, adapter.state_dict, path))
            log.info("adapter_loaded_untrained", adapter=name, sinks=[s.name for s in sinks])

    async def run(self, max_steps: int | None = None) -> None:
        await super().run(max_steps)
        for updates in self._adapter_updates.values():
            await updates.finish()

    async def stop(self, *, checkpoint: bool = True) -> None:
        for updates in self._adapter_updates.values():
            await updates.finish()
        await super().stop(checkpoint=checkpoint)
        for sync in self.adapter_weights.values():
            await sync.aclose()

    async def _on_control(self, msg: Message) -> None:
        event = msg.event
        if isinstance(event, InferenceDrained | InferenceResumed) and event.adapter in self.adapter_weights:
            await self.adapter_weights[event.adapter].observe(event)
            return
        await super()._on_control(msg)

    # ------------------------------------------------------------------ one step
    async def step_on(self, groups: list[Group], gen_seconds: float) -> bool:
        by_policy, unmatched = split_by_policy(groups, list(self.policies.adapters))
        if unmatched:
            self.intake.skipped["no_policy"] += unmatched
            self.metrics.skipped.labels("no_policy").inc(unmatched)
        trained: list[str] = []
        for name, subgroups in by_policy.items():
            adapter = self.policies.adapters[name]
            batch = self._batch(subgroups, adapter.version, self.adapter_baselines[name])
            if batch.samples and await self._train_adapter(name, adapter, batch, gen_seconds):
                trained.append(name)
        if not trained:
            self.batches_without_signal += 1
            log.info("batch_without_signal", groups=len(groups), policies=sorted(by_policy))
            return False
        self.step += 1
        self._gen_started = time.perf_counter()
        if self.step % self.loop.checkpoint_every == 0:
            self.checkpoint()
        self._write_status()
        return True

    async def _train_adapter(
        self, name: str, adapter: AdapterBackend, batch: TrainBatch, gen_seconds: float
    ) -> bool:
        t0 = time.perf_counter()
        try:
            if self.loop.objective == "sft":
                train_metrics = await asyncio.to_thread(adapter.sft_step, batch.samples)
            else:
                train_metrics = await asyncio.to_thread(adapter.train_step, batch)
        except (BackendError, RuntimeError, ValueError) as exc:
            log.error("adapter_step_failed", adapter=name, error=str(exc), groups=len(batch.group_ids))
            return False
        self.samples_trained.update(batch.stats.samples_by_source)
        self.adapter_samples[name].update(batch.stats.samples_by_source)
        t_export = time.perf_counter()
        path = await asyncio.to_thread(self._export_adapter, name)
        export_s = time.perf_counter() - t_export
        update = WeightUpdate(adapter.version, adapter.state_dict, path)
        if self.loop.release_every and adapter.version % self.loop.release_every == 0:
            await self.propose(adapter.version, name, path, self.adapter_stores[name].root)
        updates = self._adapter_updates[name]
        await updates.submit(update)
        if self.loop.mode == "sync":
            await updates.finish()
        last = updates.last
        metrics = {
            **batch.stats.as_metrics(),
            **train_metrics,
            "version": float(adapter.version),
            "serving_version": float(self.adapter_weights[name].serving_version),
            "gen_seconds": gen_seconds,
            "step_seconds": time.perf_counter() - t0,
            "export_seconds": export_s,
            "adapter_bytes": float(sum(f.stat().st_size for f in path.iterdir() if f.is_file())),
            "drain_ms": last.drain_ms,
            "load_ms": last.load_ms,
            "weight_update_failed": 0.0 if last.activated else 1.0,
        }
        step_metrics = StepMetrics.model_validate(metrics)
        self.adapter_metrics[name] = self.last_metrics = step_metrics
        self.metrics.observe_step(metrics)
        self.tracker.log(self.step + 1, {f"{name}/{k}": v for k, v in metrics.items()})
        log.info(
            "adapter_step", adapter=name, step=self.step + 1, **{k: round(v, 5) for k, v in metrics.items()}
        )
        await self.bus.publish(
            CONTROL,
            TrainerStepCompleted(
                model=self.loop.model,
                adapter=name,
                step=self.step + 1,
                version=adapter.version,
                metrics=step_metrics,
                samples={src: batch.stats.samples_by_source[src.value] for src in EpisodeSource},
                producer="trainer",
            ),
        )
        return True

    def _adapter_update_done(self, name: str) -> Callable[[UpdateResult], None]:
        def done(result: UpdateResult) -> None:
            self.metrics.weight_updates.labels("activated" if result.activated else "failed").inc()
            self.adapter_metrics[name] = self.adapter_metrics[name].updated(
                {
                    "serving_version": float(result.serving_version),
                    "drain_ms": result.drain_ms,
                    "load_ms": result.load_ms,
                }
            )
            self._write_status()

        return done

    # ------------------------------------------------------------------ persistence
    def _export_adapter(self, name: str) -> Path:
        """The adapter as peft's directory under ``policies/<name>/exports``; keeps the last three."""
        adapter = self.policies.adapters[name]
        return export_keeping_three(adapter.export_weights, adapter.version, self.adapter_stores[name].root)

    def checkpoint(self) -> Path:
        config = {
            "algorithm": self.algo.model_dump(mode="json"),
            "loop": asdict(self.loop),
            "lora": self.policies.options.model_dump(mode="json"),
        }
        for name, adapter in self.policies.adapters.items():
            if adapter.version == 0:
                continue  # never trained: the base is what it holds
            meta = CheckpointMeta(
                version=adapter.version,
                step=self.step,
                model=name,
                base_model=self.base_model,
                config=config,
                metrics=self.adapter_metrics[name].as_dict(),
                baselines=self.adapter_baselines[name].to_json(),
                samples=dict(self.adapter_samples[name]),
            )
            self.adapter_stores[name].save(meta, adapter.save_checkpoint)
        # the step names the shared state's directory: it has no weights of its own
        return self._save_shared(self._shared_meta(self.step, config), lambda _: None)

    def status(self) -> TrainerStatus:
        status = super().status()
        status.adapters = {name: a.version for name, a in self.policies.adapters.items()}
        status.serving_adapters = {name: s.serving_version for name, s in self.adapter_weights.items()}
        return status


def adapter_versions(root: Path) -> Mapping[str, int]:
    """The newest checkpointed version of each adapter under a trainer directory (``flywheel weights ls``)."""
    out: dict[str, int] = {}
    policies = root / "policies"
    if policies.is_dir():
        for d in sorted(p for p in policies.iterdir() if p.is_dir()):
            info = CheckpointStore(d).latest()
            if info is not None:
                out[d.name] = info.meta.version
    return out


def start_policies(settings: TrainerSettings, model_dir: Path | None = None) -> LoraPolicies:
    """The base in ``model_dir`` (default: the trainer's base model) with one adapter per policy."""
    from infra.policies import PolicyMap
    from trainer.lora import load_policies

    names = PolicyMap.parse(settings.policies).names
    path = model_dir or settings.trainer_base_model
    if path is None:
        raise ValueError("FLYWHEEL_TRAINER_BASE_MODEL (or --model) must name a Hugging Face model directory")
    return load_policies(
        path,
        names,
        settings.trainer_algo,
        settings.trainer_lora,
        device=settings.trainer_device,
        torch_threads=settings.trainer_torch_threads,
        model_options=settings.trainer_model_options,
    )


def build_policy_trainer(
    settings: TrainerSettings,
    bus: Bus,
    policies: LoraPolicies,
    sinks: Callable[[str], Sequence[WeightSink]],
    loop: LoopConfig,
    *,
    planner: RolloutPlanner | None = None,
) -> PolicyTrainerService:
    """The trainer for ``settings`` with a policy map (``loop``: ``trainer.app.loop_config(settings)``);
    the caller starts the bus, then ``start()``."""
    from trainer.metrics import make_tracker

    root = settings.trainer_root
    return PolicyTrainerService(
        policies=policies,
        adapter_sinks=sinks,
        expected_gateways=settings.trainer_expected_gateways,
        drain_timeout_s=settings.trainer_drain_timeout_s,
        bus=bus,
        weights=WeightSync(bus, [], model=settings.model, expected_gateways=0),  # the base: frozen
        store=CheckpointStore(root, keep=settings.trainer_keep_checkpoints),
        intake=Intake(
            group_timeout_s=settings.trainer_group_timeout_s,
            partial=settings.trainer_partial_groups,
            min_partial=settings.trainer_min_partial,
            vocab_size=policies.vocab_size,
        ),
        algo=settings.trainer_algo,
        loop=loop,
        tracker=make_tracker(
            settings.trainer_tracker, logdir=root / "tb", config=settings.trainer_algo.model_dump(mode="json")
        ),
        planner=planner,
        base_model=str(settings.trainer_base_model or ""),
    )
